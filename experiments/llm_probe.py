"""What SmolLM2-135M-Instruct does with the loop's own prompts, before any training (CPU-sized).

    python experiments/llm_probe.py [--episodes 8] [--turns 3] [--reply 48] [--extract 192] [--lit]
        [--no-greedy] [--no-extract] [--json OUT.jsonl] [key=value ...]

Trailing `key=value` arguments are config overrides, e.g. the prompt variants of `llm_prompt`
(`llm_prompt.prefill=false llm_prompt.example=false llm_prompt.think=true llm_prompt.extractor_prefill=false`).

Plays `--episodes` episodes of `--turns` turns with the LLM path's compiled rollout (`crl_jax.backends.llm.rollout.play`,
free-text replies of at most `--reply` tokens, sampled at temperature 1 and greedy), then asks the extractor
for operations on each episode (the distillation prompt, sampler and JSON parser of `crl_jax.backends.llm.distill`,
at most `--extract` tokens), and prints the
fraction of replies with a valid `<answer>move</answer>`, success, how many extractor answers parse as JSON
operations, and a few decoded replies. No training, no bank: a measure of what the untrained model can do.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import loop
from crl_jax.backends.llm.adapters import actor_params, extractor_params
from crl_jax.loop.runtime import build
from crl_jax.backends.llm.distill import distill_prompts, parse_responses
from crl_jax.backends.llm.rollout import play
from crl_jax.config import load
from crl_jax.sampling import SamplerConfig, sample_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--reply", type=int, default=48, help="reply token budget (rollout.max_action_tokens)")
    ap.add_argument("--extract", type=int, default=192, help="extractor token budget (extraction.max_new_tokens)")
    ap.add_argument("--lit", action="store_true", help="lit room (default: the preset's dark room)")
    ap.add_argument("--show", type=int, default=3, help="decoded replies / extractor answers to print")
    ap.add_argument("--no-greedy", action="store_true", help="only the sampled (T=1) rollouts")
    ap.add_argument("--no-extract", action="store_true", help="skip the extractor")
    ap.add_argument("--json", default="", help="append one JSON line of the numbers to this file")
    ap.add_argument("--variant", action="append", default=[],
                    help="a space-separated override list probed as one variant (repeatable; one process, the "
                         "weights loaded once); the trailing overrides apply to every variant")
    ap.add_argument("--adapters", default="",
                    help="a format-prior cache file (format-prior-<id>.npz): start from base + these adapters "
                         "instead of the config's own prior (e.g. a prior trained on the dark room, probed lit)")
    ap.add_argument("overrides", nargs="*", help="config overrides key=value")
    a = ap.parse_args(argv)
    return [probe(a, a.overrides + v.split()) for v in (a.variant or [""])]


def probe(a, overrides: list[str]) -> dict:
    ov = [f"rollout.max_action_tokens={a.reply}", f"env.max_turns={a.turns}", f"extraction.max_new_tokens={a.extract}",
          "extraction.prompt_len=1024", "actor.dtype=float32", "extractor.dtype=float32", "env.num_train_tasks=16",
          "env.num_eval_tasks=4", "rollout.groups=1", "rollout.group_size=2", "bank.capacity=64"]
    if a.lit:
        ov.append("env.params.dark=false")
    ov += overrides
    cfg = load(os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"), ov)
    t0 = time.time()
    rt = build(cfg)
    if a.adapters:
        from crl_jax.backends.llm import format_prior as fpm

        fpm._MEMO[fpm.format_prior_id(rt.cfg)] = fpm._load(a.adapters, fpm.adapter_template(rt))
        cfg = dataclasses.replace(cfg, format_prior=dataclasses.replace(cfg.format_prior, enabled=True))
    t_prior = time.time()
    state = loop.init_state(rt, jax.random.key(0), cfg)
    if cfg.format_prior.enabled:
        from crl_jax.backends.llm import format_prior as fpm

        print(f"format prior {fpm.format_prior_id(rt.cfg)}: {time.time() - t_prior:.0f}s (trained or loaded)")
    N = a.episodes
    tasks = jnp.arange(N, dtype=jnp.int32) % cfg.env.num_train_tasks
    exp = jnp.zeros((N, cfg.bank.entry_len), jnp.int32)
    common = dict(env=rt.env, renderer=rt.renderer, tasks=tasks, task_tokens=rt.train_task_tokens[tasks],
                  task_len=rt.train_task_len[tasks], exp=exp, exp_len=jnp.zeros((N,), jnp.int32),
                  has_exp=jnp.zeros((N,), bool))
    tok = rt.tokenizer
    print(f"build {time.time() - t0:.0f}s; {'lit' if a.lit else 'dark'} room, {N} episodes x {a.turns} turns, "
          f"replies <= {a.reply} tokens")
    result = {"room": "lit" if a.lit else "dark", "episodes": N, "turns": a.turns, "reply": a.reply,
              "overrides": overrides}
    a_params = jax.jit(actor_params)(state)  # LoRA (lora.train): base + adapters; else the full weights
    for name, temp in (("sampled (T=1)", 1.0), ("greedy", 0.0))[: 1 if a.no_greedy else 2]:
        t1 = time.time()
        f = jax.jit(lambda p, k, temp=temp: play(rt, p, k, temperature=temp, **common))
        ep = jax.device_get(f(a_params, jax.random.key(1)))
        played = int(ep.turns.sum())
        print(f"\n{name}: {time.time() - t1:.0f}s; valid answers {played - int(ep.invalid.sum())}/{played} turns, "
              f"success {int(ep.success.sum())}/{N}")
        tag = "sampled" if temp else "greedy"
        result[f"{tag}_valid"], result[f"{tag}_turns"] = played - int(ep.invalid.sum()), played
        result[f"{tag}_success"] = int(ep.success.sum())
        for i in range(min(a.show, N)):
            rows = np.nonzero(ep.loss_mask[i])[0]
            if rows.size:
                print(f"  episode {i}'s replies:", repr(tok.decode(ep.tokens[i][rows].tolist())[:300]))
    if a.no_extract:
        return _write(a.json, result)
    # The extractor on the sampled episodes (no entry retrieved): the distillation's own prompts, sampler
    # and host JSON parser (`crl_jax.backends.llm.distill`), without touching a bank.
    t1 = time.time()
    scfg = SamplerConfig(max_new_tokens=cfg.extraction.max_new_tokens, temperature=cfg.extraction.temperature,
                         stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)

    def extract(params, ep_, key):
        prompts, plen = distill_prompts(rt, common["task_tokens"], common["task_len"], ep_, exp, common["exp_len"],
                                        common["has_exp"])
        resp, _, rlen = sample_tokens(rt.extractor_graphdef, params, prompts, plen, key, scfg)
        return resp, rlen, parse_responses(rt, resp, rlen)

    ep = f(a_params, jax.random.key(1))
    e_params = jax.jit(extractor_params)(state.extractor.params)
    resp, rlen, ops = jax.device_get(jax.jit(extract)(e_params, ep, jax.random.key(2)))
    n_ok = int(ops["valid"].sum())
    n_add = int((ops["mask"] & (ops["op"] == 0)).sum())
    n_ret = int((ops["valid"] & ~ops["mask"].any(1)).sum())  # parsed answers without an operation that writes
    print(f"\nextractor ({time.time() - t1:.0f}s, <= {a.extract} tokens): {n_ok}/{N} answers parse as JSON "
          f"operations, {n_add} add operations, {n_ret} answers only return")
    for i in range(min(a.show, N)):
        print("  ", repr(tok.decode(resp[i][: int(rlen[i])].tolist())[:400]))
    lessons = [tok.decode(ops["entry"][i, m][: int(ops["entry_len"][i, m])].tolist())
               for i in range(N) for m in range(ops["op"].shape[1]) if ops["mask"][i, m] and ops["op"][i, m] == 0]
    result.update(extract_valid=n_ok, extract_n=N, extract_adds=n_add, extract_returns=n_ret,
                  extract_lessons=lessons)  # the added lessons: a bank for experiments/llm_merge_probe.py
    return _write(a.json, result)


def _write(path: str, result: dict) -> dict:
    import json

    print("RESULT", json.dumps(result))
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result

if __name__ == "__main__":
    main()
