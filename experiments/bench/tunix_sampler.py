"""Sampler tokens/s: ours (`crl_jax.sampling.generate`) vs Tunix 0.1.7's vanilla `Sampler`.

    bash experiments/bench/tunix_setup.sh                      # once: the separate Tunix venv
    python experiments/bench/tunix_sampler.py --quick          # short run
    python experiments/bench/tunix_sampler.py --batches 1,8,64,256 --prompt-len 128 --new-tokens 128  # GPU
    python experiments/bench/tunix_sampler.py --results experiments/bench/RESULTS.md --date 2026-12-01 \
        --hardware '2-core CPU'

Same model (a small Llama-3 shape, `tunix_common.bench_shape`), same weights (Tunix's
`create_dummy_model(scale=0.1)` exported to our layout; the logits of both models on a fixed batch are
compared and printed), same integer prompts of P tokens, N generated tokens at temperature 1 with no
early stop on either side, same hardware, run one after the other (never at the same time).
tokens/s = B * N / median wall time of one whole call (prefill + decode + copying tokens to the host;
Tunix's call also detokenizes, which is what its API does).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_common as tc  # noqa: E402

from crl_jax import sampling as S  # noqa: E402


def bench_ours(gd, pa, shape, batches, P, N, reps):
    rows = []
    for B in batches:
        prompt = jnp.asarray(np.random.default_rng(B).integers(2, shape["vocab_size"], (B, P)), jnp.int32)
        plen = jnp.full((B,), P, jnp.int32)

        def call(seed):
            toks, _, _ = S.generate((gd, pa), prompt, plen, jax.random.key(seed), max_new_tokens=N, temperature=1.0)
            return np.asarray(toks)

        t0 = time.perf_counter()
        call(0)
        first = time.perf_counter() - t0
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            call(r + 1)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        rows.append(dict(batch=B, seconds=t, tok_s=B * N / t, first_s=first))
    return rows


def table(ours, theirs, P, N) -> str:
    out = ["| batch | P | N | ours tok/s | Tunix tok/s | ours / Tunix | ours ms/call | Tunix ms/call |",
           "|---|---|---|---|---|---|---|---|"]
    for o, t in zip(ours, theirs):
        out.append(f"| {o['batch']} | {P} | {N} | {o['tok_s']:,.0f} | {t['tok_s']:,.0f} | "
                   f"x{o['tok_s'] / t['tok_s']:.2f} | {1e3 * o['seconds']:.1f} | {1e3 * t['seconds']:.1f} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=tc.DEFAULT_VENV)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="batches 1,8; P=16, N=8; 2 reps")
    ap.add_argument("--results", default="", help="append the table to this markdown file")
    ap.add_argument("--date", default="")
    ap.add_argument("--hardware", default="")
    a = ap.parse_args(argv)
    if a.quick:
        a.batches, a.prompt_len, a.new_tokens, a.reps = "1,8", 16, 8, 2
    batches = [int(b) for b in a.batches.split(",")]
    shape = tc.bench_shape(a.vocab)
    with tempfile.TemporaryDirectory() as d:
        gd, pa, info = tc.load_shared_weights(a.venv, shape, a.seed, os.path.join(d, "w.npz"))
    print(f"model {shape}, {info['num_params'] / 1e6:.2f}M params; Tunix jax {info['jax']} {info['devices']}; "
          f"ours jax {jax.__version__} {jax.devices()}; same weights: max |logit diff| = "
          f"{info['logit_max_abs_diff']:.2e}", flush=True)
    ours = bench_ours(gd, pa, shape, batches, a.prompt_len, a.new_tokens, a.reps)
    theirs = tc.run_worker(a.venv, "sampler", dict(shape=shape, seed=a.seed, batches=batches, prompt_len=a.prompt_len,
                                                   new_tokens=a.new_tokens, reps=a.reps))["rows"]
    for t in theirs:
        assert t["tokens_per_row"] == a.new_tokens, f"Tunix generated {t['tokens_per_row']} tokens, not {a.new_tokens}"
    tab = table(ours, theirs, a.prompt_len, a.new_tokens)
    print(tab)
    comp = ", ".join(f"B={o['batch']}: {o['first_s']:.1f} / {t['first_s']:.1f}" for o, t in zip(ours, theirs))
    print(f"first call incl. compile, ours / Tunix (s): {comp}")
    if a.results:
        cmd = "python experiments/bench/tunix_sampler.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(a.results, "a") as f:
            f.write(f"\n### Sampler vs Tunix 0.1.7 ({a.date}, {a.hardware or platform.processor()}, "
                    f"jax {jax.__version__})\n\n`{cmd}`\n\nModel: Llama-3 shape {shape}, "
                    f"{info['num_params'] / 1e6:.2f}M params, float32, weights shared (max |logit diff| "
                    f"{info['logit_max_abs_diff']:.1e}).\n\n{tab}\n\nFirst call incl. compile, ours / Tunix (s): "
                    f"{comp}\n")


if __name__ == "__main__":
    main()
