"""Sweeps of the tiny loop: seeds x hyperparameters (x methods) as a few vmapped programs.

    python experiments/sweep.py --config experiments/configs/sweep_example.yaml --out runs/sweep \
        [--seeds 3] [--steps N] [--chunk N] [--no-plot] [--dry-run]

The sweep file names a base config, common overrides, seeds and a grid of dotted keys (format in
`crl_jax/infra/sweep.py` and `experiments/configs/sweep_example.yaml`). Grid points that build the same
Runtime — differing only in seed, method, `loss.group_split` or `loss.advantage` —
run together as ONE compiled program, vmapped over every (point, seed) (on GPUs and TPUs; on CPUs, where
vmapping is slower, every run alone by default: `vmap_seeds` in the sweep file); points that change the Runtime
(learning rates, model widths, groups, env, ...) are separate programs run one after another, so keep
those axes short. `--seeds N` (seeds 0..N-1) and `--steps N` override the file; `--chunk N` sets the
steps per compiled call, between which every run folder gets its metrics rows and an Orbax checkpoint
(default: the whole run in one call).

Output: `OUT/<point>/seed<s>/` — ordinary run folders (config.json labelled with the point name,
metrics.csv, summary.json, checkpoints/) that `crl-jax plot` and `crl-jax eval` read — plus
`OUT/summary.md` and `OUT/summary.csv` (one row per point: mean ± 95% t-interval over seeds of the final
held-in / held-out evaluation with and without experience and of the last-10-step training success),
`OUT/curves.png` (mean ± 95% bands per point) and `OUT/sweep.json` (the grid and its programs).
Re-running the same command skips finished runs and resumes unfinished programs from their last common
checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from crl_jax.infra.cli import report_errors
from crl_jax.infra.sweep import plan, run_sweep
from crl_jax.infra.sweep_spec import expand, load_spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="sweep YAML (base config, overrides, seeds, grid)")
    ap.add_argument("--out", default="runs/sweep", help="sweep folder")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (0..N-1); default: the file's")
    ap.add_argument("--steps", type=int, default=None, help="training steps of every run; default: the file's")
    ap.add_argument("--chunk", type=int, default=None, help="steps per compiled call / between checkpoints")
    ap.add_argument("--no-plot", action="store_true", help="skip curves.png")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--dry-run", action="store_true", help="print the programs and their runs, run nothing")
    a = ap.parse_args(argv)
    return report_errors(_main, a, prog="sweep")  # bad input: one `sweep: error: ...` line, exit 2


def _main(a) -> int:
    spec = load_spec(a.config, seeds=a.seeds, steps=a.steps)
    if a.dry_run:
        programs = plan(expand(spec, a.out), spec.per_point, spec.vmap_seeds)
        for i, p in enumerate(programs):
            runs = ", ".join(f"{m.point}/seed{m.seed}" for m in p.members)
            print(f"program {i + 1}: {len(p.members)} runs x {p.steps} steps: {runs}")
        return 0
    run_sweep(spec, a.out, chunk=a.chunk, progress=not a.no_progress, plot=not a.no_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
