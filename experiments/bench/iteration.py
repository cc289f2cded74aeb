"""Iteration time of the compiled loop: CRL vs the GRPO baseline, and 1 vs N vmapped seeds.

    python experiments/bench/iteration.py [--steps 3] [--seeds 8] [--json OUT] [key=value ...]

Both methods run the same compiled program (the method is a traced flag), so the ratio measures the
work the bank adds: retrieval, distillation, credit, extractor update and merge. The seed sweep runs
`crl_jax.infra.sweep.vmapped_chunk` (what `crl-jax sweep` uses: step counter and flags unbatched, so the conds
stay conds; `--plain-vmap`: plain `jax.vmap`, the conds become selects). Compile time is excluded (reported apart).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

from crl_jax import loop
from crl_jax.config import load
from crl_jax.infra import sweep
from crl_jax.loop.runtime import build


def timed_chunk(fn, state, steps, reps):
    out = fn(state, jnp.int32(steps))
    jax.block_until_ready(out)
    times = []
    for _ in range(reps):
        t0 = time.time()
        out = fn(state, jnp.int32(steps))
        jax.block_until_ready(out)
        times.append(time.time() - t0)
    return sorted(times)[len(times) // 2] / steps


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--plain-vmap", action="store_true", help="seeds by plain jax.vmap (conds become selects)")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    rows = {}
    cfgs = {m: load(None, list(a.overrides) + [f"method={m}", "eval.every=0", "extraction.merge_every=1"])
            for m in ("crl", "grpo")}
    rt = build(cfgs["crl"])
    chunk = jax.jit(lambda s, last: loop.run_steps(rt, s, a.steps, last))
    t0 = time.time()
    jax.block_until_ready(chunk(loop.init_state(rt, jax.random.key(0), cfgs["crl"]), jnp.int32(10**6)))
    rows["compile_s"] = time.time() - t0
    for m, cfg in cfgs.items():
        # last_step far away: no evaluation inside the timed steps; merge every step (worst case for CRL)
        state = loop.init_state(rt, jax.random.key(0), cfg)
        rows[f"{m}_step_s"] = timed_chunk(lambda s, _: chunk(s, jnp.int32(10**6)), state, a.steps, a.reps)
    rows["crl_over_grpo"] = rows["crl_step_s"] / rows["grpo_step_s"]
    print(json.dumps(rows), flush=True)
    if a.plain_vmap:
        # Plain jax.vmap batches the step counter too, so every lax.cond of the iteration (evaluation, merge,
        # extractor update) becomes a select that runs both branches for every seed.
        keys = jnp.stack([jax.random.key(i) for i in range(a.seeds)])
        states = jax.vmap(lambda k: loop.init_state(rt, k, cfgs["crl"]))(keys)
        vchunk = jax.jit(jax.vmap(lambda s: loop.run_steps(rt, s, a.steps, jnp.int32(10**6))))
        tag = f"vmap{a.seeds}_plain"
    else:
        # What `crl-jax sweep` runs: the step counter and (one method) the flags stay unbatched, conds stay conds.
        states, fb = sweep.stack_states([loop.init_state(rt, jax.random.key(i), cfgs["crl"]) for i in range(a.seeds)])
        sweep_chunk = sweep.vmapped_chunk(rt, a.steps, fb)
        vchunk = lambda s: sweep_chunk(s, jnp.int32(10**6))  # noqa: E731
        tag = f"vmap{a.seeds}"
    jax.block_until_ready(vchunk(states))
    rows[f"{tag}_step_s"] = timed_chunk(lambda s, _: vchunk(s), states, a.steps, a.reps)
    rows[f"{tag}_over_1"] = rows[f"{tag}_step_s"] / rows["crl_step_s"]
    rows["device"] = str(jax.devices()[0].device_kind)
    print(json.dumps(rows, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
