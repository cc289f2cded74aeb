"""Iteration time of the compiled loop: CRL vs the GRPO baseline, and 1 vs N vmapped seeds.

    python experiments/bench/iteration.py [--steps 3] [--seeds 8] [--json OUT] [key=value ...]

(`--seeds 1`: CRL vs GRPO only.)

Both methods run the same compiled program (the method is a traced flag), so the ratio measures the
work the bank adds: retrieval, distillation, credit, extractor update and merge. The seed sweep runs
`crl_jax.infra.sweep.vmapped_chunk` (what `crl-jax sweep` uses: step counter and flags unbatched, so the conds
stay conds; `--plain-vmap`: plain `jax.vmap`, the conds become selects). Compile time is excluded (reported apart).

Timed steps start from a state trained `--warmup` steps first (default 8), so the timed regime is the steady one:
the extractor's sample buffer holds a ready batch (the extractor trains; from a fresh state it does not until
step 3 of the default) and the bank holds entries. The run reports the fraction of timed CRL steps in which the
extractor trained (`crl_extractor_ready`) and the entries merged per step. Earlier the steps were
timed from a fresh state, where the extractor was not yet training: the CRL / GRPO and vmap ratios of that day's
H200 run and earlier left the extractor update out. CRL and GRPO are timed call by call in turn, and
`crl_over_grpo_min_med_max` gives the ratio per repeat (this 2-core CPU drifts up to 1.5x between runs).
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


def timed_interleaved(fn, states: dict, steps, reps):
    """`fn(state)` for each of {name: state}, timed call by call in turn (one call of each per repeat, so machine
    drift hits all alike) -> ({name: [seconds per step of each call]}, {name: metrics of its last call})."""
    times, mets = {n: [] for n in states}, {}
    for state in states.values():
        jax.block_until_ready(fn(state))
    for _ in range(reps):
        for n, state in states.items():
            t0 = time.time()
            out = fn(state)
            jax.block_until_ready(out)
            times[n].append((time.time() - t0) / steps)
            mets[n] = out[1]
    return times, mets


def spread(xs):
    """[min, median, max] of a list."""
    xs = sorted(xs)
    return [xs[0], xs[len(xs) // 2], xs[-1]]


def warmed(chunk, state, warmup: int, steps: int):
    """`state` after ceil(warmup / steps) calls of the `steps`-step chunk (the steady regime to time from)."""
    for _ in range(-(-warmup // steps)):
        state, _ = chunk(state, jnp.int32(10**6))
    return state


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=8, help="steps trained before the timed ones (steady regime)")
    p.add_argument("--merge-every", type=int, default=1,
                   help="extraction.merge_every of the timed runs (1: a merge every step, CRL's worst case; only "
                        "with extraction.merge=true, which the embedded default leaves off)")
    p.add_argument("--plain-vmap", action="store_true", help="seeds by plain jax.vmap (conds become selects)")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    rows = {}
    cfgs = {m: load(None, list(a.overrides) + [f"method={m}", "eval.every=0",
                                                     f"extraction.merge_every={a.merge_every}"])
            for m in ("crl", "grpo")}
    rt = build(cfgs["crl"])
    chunk = jax.jit(lambda s, last: loop.run_steps(rt, s, a.steps, last))
    t0 = time.time()
    jax.block_until_ready(chunk(loop.init_state(rt, jax.random.key(0), cfgs["crl"]), jnp.int32(10**6)))
    rows["compile_s"] = time.time() - t0
    # warmed-up CRL states of every seed: seed 0 is the single run timed below, all of them the vmapped one
    seeds = [warmed(chunk, loop.init_state(rt, jax.random.key(i), cfgs["crl"]), a.warmup, a.steps)
             for i in range(a.seeds)]
    # last_step far away: no evaluation inside the timed steps; merges (when on) every --merge-every steps
    states = {m: seeds[0] if m == "crl" else warmed(chunk, loop.init_state(rt, jax.random.key(0), cfg), a.warmup,
                                                    a.steps) for m, cfg in cfgs.items()}
    times, mets = timed_interleaved(lambda s: chunk(s, jnp.int32(10**6)), states, a.steps, a.reps)
    for m, met in mets.items():
        rows[f"{m}_step_s"] = spread(times[m])[1]
        rows[f"{m}_extractor_ready"] = float(met["extractor_ready"].mean())
        rows[f"{m}_merged_per_step"] = float(met["merged_entries"].mean())
        rows[f"{m}_bank_size"] = float(met["bank_size"].mean())
    rows["warmup_steps"] = -(-a.warmup // a.steps) * a.steps
    # per repeat (CRL and GRPO timed back to back), min / median / max
    rows["crl_over_grpo_min_med_max"] = spread([c / g for c, g in zip(times["crl"], times["grpo"])])
    rows["crl_over_grpo"] = rows["crl_over_grpo_min_med_max"][1]
    print(json.dumps(rows), flush=True)
    if a.seeds > 1:
        vmapped(rt, a, seeds, rows)
    rows["device"] = str(jax.devices()[0].device_kind)
    print(json.dumps(rows, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


def vmapped(rt, a, seeds, rows):
    """Adds the step time of the `a.seeds` warmed-up seeds run as one vmapped program, and its ratio to one seed."""
    if a.plain_vmap:
        # Plain jax.vmap batches the step counter too, so every lax.cond of the iteration (evaluation, merge,
        # extractor update) becomes a select that runs both branches for every seed.
        states = jax.tree.map(lambda *x: jnp.stack(x), *seeds)
        vchunk = jax.jit(jax.vmap(lambda s: loop.run_steps(rt, s, a.steps, jnp.int32(10**6))))
        tag = f"vmap{a.seeds}_plain"
    else:
        # What `crl-jax sweep` runs: the step counter and (one method) the flags stay unbatched, conds stay conds.
        states, fb = sweep.stack_states(seeds)
        sweep_chunk = sweep.vmapped_chunk(rt, a.steps, fb)
        vchunk = lambda s: sweep_chunk(s, jnp.int32(10**6))  # noqa: E731
        tag = f"vmap{a.seeds}"
    times, _ = timed_interleaved(vchunk, {tag: states}, a.steps, a.reps)
    rows[f"{tag}_step_s"] = spread(times[tag])[1]
    rows[f"{tag}_over_1"] = rows[f"{tag}_step_s"] / rows["crl_step_s"]


if __name__ == "__main__":
    main()
