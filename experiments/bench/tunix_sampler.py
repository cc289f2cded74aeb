"""Sampler tokens/s: ours (`crl_jax.sampling.generate`) vs Tunix 0.1.7's vanilla `Sampler`.

    bash experiments/bench/tunix_setup.sh                      # once: the separate Tunix venv
    python experiments/bench/tunix_sampler.py --quick          # short run
    python experiments/bench/tunix_sampler.py --batches 1,8,64,256 --prompt-len 128 --new-tokens 128  # GPU
    python experiments/bench/tunix_sampler.py --results bench.md --date YYYY-MM-DD \
        --hardware '2-core CPU'

Same model (a small Llama-3 shape, `tunix_common.bench_shape`), same weights (Tunix's
`create_dummy_model(scale=0.1)` exported to our layout; the logits of both models on a fixed batch are
compared and printed), same integer prompts of P tokens, N generated tokens at temperature 1 with no
early stop on either side, same hardware, never at the same time but INTERLEAVED: per batch size both
sides are warmed (first call incl. compile, reported), then each repeat times one call of ours and one
of Tunix (a persistent worker, `tunix_common.WorkerSession`). The machine is
shared, so a ratio is taken per repeat (the calls of one repeat see about the same load) and reported as
min / median / max over repeats, with the 1-minute load average at the start and end of each row.
tokens/s = B * N / wall time of one whole call (prefill + decode + copying tokens to the host; Tunix's
call also detokenizes, which is what its API does); the table shows each side's median.
Both sides hold their weights as a sampler object does: Tunix's `Sampler` its model's per-layer arrays, ours
`sampling.prepare`'s decode weights, made once before the timed calls (`--weights per-call`: sliced and fused
inside every call instead, as before `sampling.prepare`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_common as tc  # noqa: E402

from crl_jax import sampling as S  # noqa: E402


def ours_call(model, shape, B, P, N, seed) -> dict:
    """{"seconds"} of one whole `generate` call of ours at batch B (prompts seeded by B, as the worker's).
    `model`: (graphdef, params), or `sampling.prepare` of them (the decode weights computed once, beforehand,
    as Tunix's `Sampler` holds its model's)."""
    prompt = jnp.asarray(np.random.default_rng(B).integers(2, shape["vocab_size"], (B, P)), jnp.int32)
    plen = jnp.full((B,), P, jnp.int32)
    t0 = time.perf_counter()
    toks, _, _ = S.generate(model, prompt, plen, jax.random.key(seed), max_new_tokens=N, temperature=1.0)
    np.asarray(toks)
    return dict(seconds=time.perf_counter() - t0)


def tunix_call(tunix, B, N, seed) -> dict:
    """The worker's answer ({"seconds", ...}) for one Tunix `Sampler.__call__` at batch B."""
    out = tunix.request(batch=B, seed=seed)
    assert out["tokens_per_row"] == N, f"Tunix generated {out['tokens_per_row']} tokens, not {N}"
    return out


def tok_s(row, name, N):
    return statistics.median(row["batch"] * N / r["seconds"] for r in row["runs"][name])


def ms_call(row, name):
    return 1e3 * statistics.median(r["seconds"] for r in row["runs"][name])


def table(rows, P, N) -> str:
    out = ["| batch | P | N | ours tok/s | Tunix tok/s | ours / Tunix (min / med / max) | ours / Tunix ms/call | "
           "load 1 min start / end |"]
    out.append("|" + "---|" * (out[0].count("|") - 1))
    for o in rows:
        cells = [str(o["batch"]), str(P), str(N), f"{tok_s(o, 'ours', N):,.0f}"]
        cells += [f"{tok_s(o, 'tunix', N):,.0f}", "x" + tc.fmt_spread(tc.speedups(o, "ours", "tunix"))]
        cells += [f"{ms_call(o, 'ours'):.1f} / {ms_call(o, 'tunix'):.1f}",
                  f"{o['load'][0]} / {o['load'][1]}"]
        out.append("| " + " | ".join(cells) + " |")
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
    ap.add_argument("--quick", action="store_true", help="batches 1,8; P=16, N=8; 3 reps")
    ap.add_argument("--weights", choices=("prepared", "per-call"), default="prepared",
                    help="ours: decode weights prepared once (`sampling.prepare`, the default), "
                         "or sliced and fused inside every call (before)")
    ap.add_argument("--results", default="", help="append the table to this markdown file")
    ap.add_argument("--date", default="")
    ap.add_argument("--hardware", default="")
    a = ap.parse_args(argv)
    if a.quick:
        a.batches, a.prompt_len, a.new_tokens, a.reps = "1,8", 16, 8, 3
    batches = [int(b) for b in a.batches.split(",")]
    shape = tc.bench_shape(a.vocab)
    with tempfile.TemporaryDirectory() as d:
        gd, pa, info = tc.load_shared_weights(a.venv, shape, a.seed, os.path.join(d, "w.npz"))
    print(f"model {shape}, {info['num_params'] / 1e6:.2f}M params; Tunix jax {info['jax']} {info['devices']}; "
          f"ours jax {jax.__version__} {jax.devices()}; same weights: max |logit diff| = "
          f"{info['logit_max_abs_diff']:.2e}", flush=True)
    P, N = a.prompt_len, a.new_tokens
    ours = S.prepare((gd, pa)) if a.weights == "prepared" else (gd, pa)
    print(f"ours: decode weights {a.weights}", flush=True)
    setup = dict(kind="sampler", shape=shape, seed=a.seed, prompt_len=P, new_tokens=N)
    rows = []
    with tc.WorkerSession(a.venv, setup) as tunix:
        for B in batches:
            calls = {"ours": partial(ours_call, ours, shape, B, P, N), "tunix": partial(tunix_call, tunix, B, N)}
            row = tc.interleave(calls, a.reps, batch=B)
            rows.append(row)
            print(f"B={B}: load {row['load'][0]} -> {row['load'][1]}; ours / Tunix x"
                  f"{tc.fmt_spread(tc.speedups(row, 'ours', 'tunix'))} (min / med / max)", flush=True)
    tab = table(rows, P, N)
    print(tab)
    comp = ", ".join(f"B={o['batch']}: " + " / ".join(f"{o['first'][k]:.1f}" for k in o["first"]) for o in rows)
    print(f"first call incl. compile, ours / Tunix (s): {comp}")
    if a.results:
        cmd = "python experiments/bench/tunix_sampler.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(a.results, "a") as f:
            f.write(f"\n### Sampler vs Tunix 0.1.7 ({a.date}, {a.hardware or platform.processor()}, "
                    f"jax {jax.__version__})\n\n`{cmd}`\n\nModel: Llama-3 shape {shape}, "
                    f"{info['num_params'] / 1e6:.2f}M params, float32, weights shared (max |logit diff| "
                    f"{info['logit_max_abs_diff']:.1e}); {a.reps} interleaved repeats per row; our decode weights "
                    f"{a.weights}.\n\n{tab}\n\n"
                    f"First call incl. compile, ours / Tunix (s): {comp}\n")


if __name__ == "__main__":
    main()
