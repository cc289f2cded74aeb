"""Where the time of one training step goes: the phases of `crl_jax.loop.iteration` timed apart.

    python experiments/bench/step_breakdown.py [--reps 3] [key=value ...]

Each phase is jitted on its own (prepare = tasks + retrieval; play = the multi-turn rollouts;
finish = credit + distillation + co-update + merge; eval = the four greedy evaluations), run once to
compile, then timed (median of --reps). Compile times are printed apart. The state is advanced past
the extractor's warm-up so every phase does its full work.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from crl_jax import loop
from crl_jax.actor.evaluate import evaluate_all
from crl_jax.config import load
from crl_jax.loop.runtime import build


def _time(fn, *args, reps):
    t0 = time.time()
    jax.block_until_ready(fn(*args))
    compile_s = time.time() - t0
    ts = []
    for _ in range(reps):
        t0 = time.time()
        jax.block_until_ready(fn(*args))
        ts.append(time.time() - t0)
    return compile_s, sorted(ts)[len(ts) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warm", type=int, default=0, help="iterations run before timing (fills bank/buffer)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    cfg = load(a.config, a.overrides)
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    if a.warm:
        state, _ = loop.compiled_chunk(rt, a.warm)(state, jnp.int32(10**6))
    c = rt.cfg

    prep = jax.jit(lambda s: loop.prepare(rt, s))

    def play_fn(s, p):  # what the loop plays (`loop.iteration`): the backend's rollouts with their options
        return rt.backend.play(rt, s, p, loop.step_keys(s).roll)

    play_j = jax.jit(play_fn)
    fin = jax.jit(lambda s, p, e: loop.finish(rt, s, p, e))
    ev = jax.jit(lambda s: evaluate_all(rt, s))
    whole = jax.jit(lambda s: loop.iteration(rt, s))

    p = prep(state)
    ep = play_j(state, p)
    rows = [("prepare", *_time(prep, state, reps=a.reps)),
            ("play", *_time(play_j, state, p, reps=a.reps)),
            ("finish", *_time(fin, state, p, ep, reps=a.reps)),
            ("iteration (all)", *_time(whole, state, reps=a.reps)),
            ("eval (4 pools)", *_time(ev, state, reps=a.reps))]
    print(f"prompt width P={ep.prompts.shape[-1]}  N={ep.prompts.shape[0]}  T={ep.prompts.shape[1]}  "
          f"played turns={int(ep.turns.sum())}")
    print(f"{'phase':18s} {'compile s':>10s} {'run s':>8s}")
    for name, comp, run in rows:
        print(f"{name:18s} {comp:10.1f} {run:8.3f}")
    print(f"eval per step at eval.every={c.eval.every}: {rows[-1][2] / max(c.eval.every, 1):.3f} s")


if __name__ == "__main__":
    main()
