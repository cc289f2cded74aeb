"""How many merge replies of SmolLM2 (with the format prior) parse, per merge-prompt variant (issue #17 item 3).

    python experiments/llm_merge_probe.py --lessons PROBE.jsonl [--keys 3] [--key0 100] [--tokens 128] [--adapters F.npz]
        [--variant "llm_prompt.merge_example=false llm_prompt.merge_prefill=false"] ... [key=value ...]

Banks: the lessons the extractor wrote in `experiments/llm_probe.py` runs (its `--json` lines carry
`extract_lessons`); each line is one bank. Each bank is merged with the loop's own LLM merge
(`crl_jax.backends.llm.merge`: chunks of `extraction.merge_chunk` lessons, the carry, the JSON parser after
the prefill) under `--keys` sampling keys; every chunk's reply is recorded and counted: parsed (valid JSON
operations), and applied (at least one non-empty `add`: the chunk is rewritten). No training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import bank as bank_lib
from crl_jax import loop
from crl_jax.backends.llm import merge as llm_merge
from crl_jax.backends.llm.adapters import extractor_params
from crl_jax.backends.llm.prompt_pieces import merge_prefill
from crl_jax.config import load
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.extractor.merge_step import merge_into
from crl_jax.extractor.ops_json import parse_operations_with_stats
from crl_jax.loop.runtime import build
from crl_jax.sampling import SamplerConfig, sample_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_bank(rt, lessons):
    cfg, tok = rt.cfg, rt.tokenizer
    L_ = cfg.bank.entry_len
    b = bank_lib.init(cfg.bank.capacity, L_, cfg.bank.key_dim)
    for i, text in enumerate(lessons):
        ids = tok.encode(text)[:L_]
        key = jnp.ones((cfg.bank.key_dim,)) / np.sqrt(cfg.bank.key_dim)  # one key group (no similarity floor)
        b, _ = bank_lib.add(b, jnp.asarray(ids + [0] * (L_ - len(ids)), jnp.int32), jnp.int32(len(ids)), key,
                            jnp.int32(0), jnp.int32(0), jnp.int32(i))
    return b


def probe(a, banks, overrides):
    ov = ["actor.dtype=float32", "extractor.dtype=float32", "env.num_train_tasks=16", "env.num_eval_tasks=4",
          "env.max_turns=1", "rollout.groups=1", "rollout.group_size=2", "bank.capacity=64",
          "extraction.prompt_len=1024", f"extraction.max_new_tokens={a.tokens}", "rollout.max_action_tokens=16",
          "format_prior.enabled=true"] + overrides
    cfg = load(os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"), ov)
    rt = build(cfg)
    if a.adapters:
        from crl_jax.backends.llm import format_prior as fpm

        fpm._MEMO[fpm.format_prior_id(rt.cfg)] = fpm._load(a.adapters, fpm.adapter_template(rt))
    state = loop.init_state(rt, jax.random.key(0), cfg)
    params = jax.jit(extractor_params)(state.extractor.params)
    tok = rt.tokenizer
    scfg = SamplerConfig(max_new_tokens=cfg.extraction.max_new_tokens, temperature=cfg.extraction.temperature,
                         stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    records = []

    def parse_fn(r, n):
        jax.debug.callback(lambda r_, n_: records.append((np.asarray(r_), int(n_))), r, n, ordered=True)
        return llm_merge.parse_merge_response(rt, r, n)

    buf0 = buffer_lib.init(8, llm_merge.prompt_len(cfg, rt.merge_pieces), cfg.extraction.max_new_tokens)
    run = jax.jit(lambda b, k: merge_into(
        rt, b, buf0, k, jnp.int32(4), max_out=llm_merge.max_out(cfg), parse_fn=parse_fn,
        generate_fn=lambda p, n, kk: sample_tokens(rt.extractor_graphdef, params, p, n, kk, scfg))[2])
    prefill = merge_prefill(cfg.prompts, cfg.llm_prompt)
    out = {"overrides": overrides, "chunks": 0, "parsed": 0, "applied": 0, "adds": 0, "examples": []}
    t0 = time.time()
    for lessons in banks:
        bank = make_bank(rt, lessons)
        for k in range(a.keys):
            records.clear()
            applied = int(run(bank, jax.random.key(a.key0 + k)))
            jax.effects_barrier()
            done = [(r, n) for r, n in records if n > 0]
            out["chunks"] += len(done)
            out["applied"] += applied
            for r, n in done:
                text = tok.decode(r[:n].tolist())
                ops, stats = parse_operations_with_stats(prefill + text)
                out["parsed"] += int(stats.valid)
                out["adds"] += sum(o.op == "add" for o in ops)
                if len(out["examples"]) < a.show:
                    out["examples"].append(text[:300])
    out["seconds"] = round(time.time() - t0)
    print(f"{overrides or 'default'}: {out['parsed']}/{out['chunks']} merge replies parse, {out['applied']} chunks "
          f"applied, {out['adds']} add operations ({out['seconds']} s)")
    for e in out["examples"]:
        print("   ", repr(e))
    print("RESULT", json.dumps(out))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lessons", required=True, help="JSON lines of experiments/llm_probe.py (extract_lessons)")
    ap.add_argument("--keys", type=int, default=3, help="sampling keys per bank")
    ap.add_argument("--key0", type=int, default=100, help="the first sampling key (keys key0 .. key0 + keys - 1)")
    ap.add_argument("--tokens", type=int, default=128, help="merge reply budget (extraction.max_new_tokens)")
    ap.add_argument("--show", type=int, default=4)
    ap.add_argument("--adapters", default="", help="a format-prior cache file (format-prior-<id>.npz)")
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    with open(a.lessons) as f:
        banks = [r["extract_lessons"] for r in map(json.loads, f) if r.get("extract_lessons")]
    print(f"{len(banks)} banks of {[len(b) for b in banks]} lessons")
    return [probe(a, banks, a.overrides + v.split()) for v in (a.variant or [""])]


if __name__ == "__main__":
    main()
