"""`crl-jax sweep`: seeds x hyperparameters (x methods) of any config, from a sweep file.

    crl-jax sweep --config experiments/configs/sweep_example.yaml --out runs/sweep \\
        [--seeds 3] [--steps N] [--chunk N] [--no-plot] [--quiet] [--dry-run]

The sweep file names a base config, common overrides, seeds and a grid of dotted keys (format in
`crl_jax/infra/sweep.py` and `experiments/configs/sweep_example.yaml`). Tiny configs on one device: grid points
that build the same Runtime (differing only in seed, method, `loss.group_split` or `loss.advantage`) run together
as ONE compiled program, vmapped over every (point, seed) (on GPUs and TPUs; on CPUs every run alone by default:
`vmap_seeds` in the sweep file); points that change the Runtime are separate programs run one after another.
LLM configs, host-side environments, sharding meshes and multi-process jobs: every member runs through
`crl-jax train`'s engine in turn, with its mesh and checkpoints (`sweep.sequential`). `--seeds N` (seeds
0..N-1) and `--steps N` override the file; `--chunk N` sets the steps per compiled call of the vmapped programs,
between which every run folder gets its metrics rows and a checkpoint (default: the whole run in one call; train's
engine checkpoints every `checkpoint_every` steps instead).

Output: `OUT/<point>/seed<s>/`, ordinary run folders (config.json labelled with the point name, metrics.csv,
summary.json, checkpoints/) that `crl-jax plot` and `crl-jax eval` read, plus `OUT/summary.md` and
`OUT/summary.csv` (one row per point: mean ± 95% t-interval over seeds of the final evaluations and the
last-10-step training success), `OUT/curves.png` and `OUT/sweep.json` (the grid and its programs). The sweep
folder is locked while the sweep runs. Re-running the same command skips finished runs and resumes the others.
"""

from __future__ import annotations

import argparse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", required=True, help="sweep YAML (base config, overrides, seeds, grid)")
    ap.add_argument("--out", default="runs/sweep", help="sweep folder (default runs/sweep)")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (0..N-1); default: the file's")
    ap.add_argument("--steps", type=int, default=None, help="training steps of every run; default: the file's")
    ap.add_argument("--chunk", type=int, default=None,
                    help="steps per compiled call / between checkpoints of the vmapped programs (tiny configs)")
    ap.add_argument("--no-plot", action="store_true", help="skip curves.png")
    ap.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bar")
    ap.add_argument("--dry-run", action="store_true", help="print the programs and their runs, run nothing")


def plan_lines(programs) -> list[str]:
    """One line per program: its runs, and whether train's engine runs them."""
    lines = []
    for i, p in enumerate(programs):
        runs = ", ".join(f"{m.point}/seed{m.seed}" for m in p.members)
        how = " (train's engine)" if p.sequential else ""
        lines.append(f"program {i + 1}: {len(p.members)} runs x {p.steps} steps{how}: {runs}")
    return lines


def main(args) -> int:
    from crl_jax.infra.sweep import plan, run_sweep
    from crl_jax.infra.sweep_spec import expand, load_spec

    spec = load_spec(args.config, seeds=args.seeds, steps=args.steps)
    if args.dry_run:
        print("\n".join(plan_lines(plan(expand(spec, args.out), spec.per_point, spec.vmap_seeds))))
        return 0
    run_sweep(spec, args.out, chunk=args.chunk, progress=not args.quiet, plot=not args.no_plot)
    return 0
