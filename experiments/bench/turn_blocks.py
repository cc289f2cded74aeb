"""What `rollout.turn_block` saves in the agentic rollout, and where it comes from.

    python experiments/bench/turn_blocks.py                  # 8 and 64 episodes, 10 turns, 5 repeats
    python experiments/bench/turn_blocks.py --episodes 64 --turns 5

The agentic benchmark's setting (`tunix_agentic.py`: FrozenLake 6x6 text view, the Llama-3 bench shape with
random weights, the task line shared, temperature 1), our `play` only, three ways:

- one batch: `turn_block` 0, every episode at the packed width every turn (finished ones masked);
- blocks, full width: `turn_block` B with one width (the packed one): finished episodes skipped and rows run
  B at a time, but every block as wide as the packed prompt;
- blocks, trimmed: `turn_block` B as the library runs it (each block at the smallest multiple of
  `TURN_WIDTH_STEP` slots that covers its longest prompt).

The full-width variant is selected here by setting `rollout.TURN_WIDTH_STEP` to the packed width before
tracing (the old paths stay selectable in the benchmark, not in the library). Timing is interleaved, each
repeat times one call of every variant, and each speed-up over the one-batch call is taken per repeat (min /
median / max). The matmul FLOPs each call computed come from `tunix_agentic.ours_flops`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_agentic as ta  # noqa: E402
import tunix_common as tc  # noqa: E402

from crl_jax.actor import rollout  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", default="8,64")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--block", type=int, default=8, help="rollout.turn_block of the blocked variants")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    env, tok, renderer, a_ids, seg = ta.setup(a.turns)
    shape = tc.bench_shape(tok.vocab_size)
    gd, pa = tr.split(tr.create(tc.crl_config(shape), jax.random.key(0)))
    Lp = len(tok.encode(env.task_text + "\n"))
    print(f"jax {jax.__version__} {jax.devices()}; bench shape {shape}; FrozenLake text view, {a.turns} turns, "
          f"task line ({Lp} tokens) shared; turn_block {a.block}, width step {rollout.TURN_WIDTH_STEP}", flush=True)
    lines = ["| episodes | variant | ms per call (median) | speed-up over one batch (min / med / max) | "
             "GFLOP per call | GFLOP/s | first call incl. compile (s) |", "|---|---|---|---|---|---|---|"]
    for n in [int(x) for x in a.episodes.split(",")]:
        fns, first = {}, {}
        step = rollout.TURN_WIDTH_STEP
        for name, tb, width_step in (("one batch", 0, step), ("blocks, full width", a.block, 10 ** 6),
                                     ("blocks, trimmed", a.block, step)):
            rollout.TURN_WIDTH_STEP = width_step  # read when `play` is traced: trace (first call) now
            fn = ta.ours_fn(gd, env, tok, renderer, a_ids, seg, n, a.turns, True, tb)
            t0 = time.perf_counter()
            ep = jax.block_until_ready(fn(pa, jax.random.key(0)))
            first[name] = time.perf_counter() - t0
            fns[name] = (fn, tb)
        rollout.TURN_WIDTH_STEP = step
        P = int(ep.prompts.shape[2])
        secs, flop = {k: [] for k in fns}, {k: [] for k in fns}
        for r in range(a.reps):
            for name, (fn, tb) in fns.items():
                t0 = time.perf_counter()
                ep = jax.block_until_ready(fn(pa, jax.random.key(r + 1)))
                secs[name].append(time.perf_counter() - t0)
                # full width: one width, the packed one (a step of P - Lp)
                w_step = (P - Lp) if name == "blocks, full width" else rollout.TURN_WIDTH_STEP
                flop[name].append(ta.ours_flops(ep, shape, prompt_width=P, prefix_len=Lp, prefix_rows=max(1, n // 8),
                                                turn_block=tb, width_step=w_step))
        base = secs["one batch"]
        for name in fns:
            sp = [b / s for b, s in zip(base, secs[name])]
            med = statistics.median(secs[name])
            gf = statistics.median(flop[name]) / 1e9
            lines.append(f"| {n} | {name} | {1000 * med:.0f} | x{tc.fmt_spread(sp)} | {gf:.1f} | "
                         f"{statistics.median(f / s for f, s in zip(flop[name], secs[name])) / 1e9:.1f} | "
                         f"{first[name]:.1f} |")
        print(f"{n} episodes: mean turns played {float(np.asarray(ep.turns).mean()):.1f} of {a.turns}, P = {P}",
              flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
