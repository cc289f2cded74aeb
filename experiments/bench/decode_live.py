"""What `sample_tokens(..., live=)` saves: finished rows no longer keep the decode loop running.

    python experiments/bench/decode_live.py [--layers 4] [--batch 8] [--live 2] [--stop-at 4] [--new-tokens 16]

SmolLM2-135M shape (random float32 weights, the first `--layers` blocks), a 64-token prompt per row. The first
`--live` rows are forced (a per-step `allowed_tokens` mask) to emit the stop token at step `--stop-at`; the other
rows, like the finished episodes of a lock-step rollout, can never stop. Without `live` they hold the loop to
`--new-tokens` steps; with `live` they are dead from the start and the loop ends after `--stop-at` steps. Prints ms
per call of each (interleaved) and the per-call ratio; the live rows' tokens are checked equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from crl_jax import sampling as S  # noqa: E402
from crl_jax.models import presets  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--live", type=int, default=2)
    ap.add_argument("--stop-at", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    B, N, P = a.batch, a.new_tokens, 64
    cfg = presets.preset_config("smollm2-135m", num_layers=a.layers)
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    V, stop = cfg.vocab_size, 2
    prompt = jax.random.randint(jax.random.key(1), (B, P), 3, V, jnp.int32)
    plen = jnp.full((B,), P, jnp.int32)
    allowed = np.ones((B, N, V), bool)
    allowed[:, :, stop] = False  # nobody stops ...
    allowed[:a.live, a.stop_at - 1] = False
    allowed[:a.live, a.stop_at - 1, stop] = True  # ... but the live rows, at step stop_at
    allowed = jnp.asarray(allowed)
    scfg = S.SamplerConfig(max_new_tokens=N, temperature=1.0, stop_tokens=(stop,))
    live = jnp.arange(B) < a.live
    run = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    fns = {"all rows run": lambda: run(gd, pa, prompt, plen, jax.random.key(2), scfg, allowed, None),
           "live mask": lambda: run(gd, pa, prompt, plen, jax.random.key(2), scfg, allowed, live)}
    outs = {n: jax.block_until_ready(f()) for n, f in fns.items()}
    same = bool(np.array_equal(outs["all rows run"][0][:a.live], outs["live mask"][0][:a.live]))
    lengths = {n: np.asarray(o[2]).tolist() for n, o in outs.items()}
    t = {n: [] for n in fns}
    for _ in range(a.reps):
        for n, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            t[n].append(time.perf_counter() - t0)
    r = sorted(x / y for x, y in zip(t["all rows run"], t["live mask"]))
    print(f"SmolLM2 shape, {a.layers} layers, batch {B} ({a.live} live, stopping at step {a.stop_at}), prompt {P}, "
          f"<= {N} new tokens; live rows' tokens equal: {same}; lengths {lengths}")
    print("ms per call: " + ", ".join(f"{n} {1e3 * statistics.median(v):.1f}" for n, v in t.items()))
    print(f"all rows run / live mask per call: x{r[0]:.2f} / {statistics.median(r):.2f} / {r[-1]:.2f} "
          "(min / median / max)")


if __name__ == "__main__":
    main()
