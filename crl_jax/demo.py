"""The README's main job: CRL vs the GRPO baseline on the embedded default, several seeds, table + plot."""

from __future__ import annotations

import json
import os

import numpy as np

from crl_jax.plot import plot_runs, t_interval
from crl_jax.sweep import SweepSpec, _flat_overrides, expand, run_sweep

ROWS = (("eval_heldin_with_exp", "held-in, with exp"), ("eval_heldin_without_exp", "held-in, without exp"),
        ("eval_heldout_with_exp", "held-out, with exp"), ("eval_heldout_without_exp", "held-out, without exp"),
        ("success_all_last10", "train success (last 10 steps)"), ("env_steps", "env steps"))


def comparison_table(results: dict[str, list[dict]]) -> str:
    """results[method] = list of summaries (one per seed) -> a text table of mean ± 95% half-width."""
    methods = list(results)
    lines = [f"{'metric':32s}" + "".join(f"{m:>22s}" for m in methods)]
    for key, name in ROWS:
        cells = []
        for m in methods:
            v = np.array([s.get(key) if s.get(key) is not None else np.nan for s in results[m]], float)
            mean, hw = t_interval(v)
            cells.append("n/a" if np.isnan(mean) else f"{mean:.3f} ± {hw:.3f}")
        lines.append(f"{name:32s}" + "".join(f"{c:>22s}" for c in cells))
    return "\n".join(lines)


def demo(*, seeds: int = 3, out: str = "runs/demo", steps: int | None = None, config: str | None = None,
         overrides: list[str] = (), methods=("crl", "grpo")) -> dict:
    """Every method over `seeds` seeds (`crl_jax.sweep`), each run alone with the single-run program (one
    compilation for every run: method flags are traced; on 2 CPU cores ~1.5x faster than vmapping the
    seeds), run folders `out/<method>/seed<s>/` (resumable), then the comparison table and plot."""
    ov = _flat_overrides(list(overrides) + ([f"steps={steps}"] if steps else []))
    spec = SweepSpec(config=config, overrides=ov, grid={"method": list(methods)}, seeds=tuple(range(seeds)),
                     per_point=True, vmap_seeds=False)
    members = expand(spec, out)
    run_sweep(spec, out, chunk=members[0].cfg.checkpoint_every, plot=False, log=lambda *_: None)
    results: dict[str, list[dict]] = {m: [] for m in methods}
    for m in members:
        with open(os.path.join(m.run_dir, "summary.json")) as f:
            results[m.point].append(json.load(f))
    table = comparison_table(results)
    png = plot_runs([m.run_dir for m in members], os.path.join(out, "comparison.png"))
    with open(os.path.join(out, "comparison.txt"), "w") as f:
        f.write(table + "\n")
    print("\n" + table + f"\n\nplot: {png}\ntable: {os.path.join(out, 'comparison.txt')}")
    return results
