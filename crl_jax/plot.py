"""Learning curves of one or more runs as a PNG (`crl-jax plot DIR [DIR ...] --out FILE`).

Runs are grouped by label (the run's method, or the parent folder name when several seeds sit in one
folder each): a group's curve is the mean over its runs; the band is the 95% t-interval over seeds from 3
runs on, and the min-max range for 2 runs (a 2-sample t-interval is 12.7 standard errors wide and says
little). Success panels are clipped to [0, 1]. One colour per group in every panel, one legend for the
figure. Panels: training success of guided and free rollouts, evaluation with and without experience
(held-in and held-out), bank size, extractor reward.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from crl_jax.metrics import column, read_csv

PANELS = (
    ("success_guided", "train success, guided"),
    ("success_free", "train success, free"),
    ("eval_heldin_with_exp", "held-in eval, with experience"),
    ("eval_heldin_without_exp", "held-in eval, without experience"),
    ("eval_heldout_with_exp", "held-out eval, with experience"),
    ("eval_heldout_without_exp", "held-out eval, without experience"),
    ("bank_size", "bank size"),
    ("extractor_reward_mean", "extractor reward"),
)
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def t_interval(x: np.ndarray) -> tuple[float, float]:
    """Mean and 95% half-width over the first axis (nan-aware; 0 width for one value)."""
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return np.nan, np.nan
    if len(x) == 1:
        return float(x[0]), 0.0
    t = T975.get(len(x) - 1, 1.96)
    return float(x.mean()), float(t * x.std(ddof=1) / np.sqrt(len(x)))


def band(vals: np.ndarray):
    """vals [seeds, steps] -> (mean, low, high) per step: 95% t-interval from 3 seeds, min-max below."""
    stats = np.array([t_interval(vals[:, i]) for i in range(vals.shape[1])]).reshape(-1, 2)
    mean = stats[:, 0]
    if vals.shape[0] >= 3:
        return mean, mean - stats[:, 1], mean + stats[:, 1]
    with np.errstate(all="ignore"):
        return mean, np.nanmin(vals, axis=0), np.nanmax(vals, axis=0)


def run_label(run_dir: str) -> str:
    cfg = os.path.join(run_dir, "config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            c = json.load(f)
        return c.get("label") or c.get("method", os.path.basename(run_dir))
    return os.path.basename(os.path.normpath(run_dir))


def plot_runs(run_dirs: list[str], out: str, *, smooth: int = 3) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[list[dict]]] = defaultdict(list)
    for d in run_dirs:
        path = os.path.join(d, "metrics.csv")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no metrics.csv in run folder {d!r}")
        groups[run_label(d)].append(read_csv(path))
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    colors = {label: f"C{i % 10}" for i, label in enumerate(sorted(groups))}
    handles = {}
    for ax, (col, title) in zip(axes.flat, PANELS):
        bounded = col.startswith(("success", "eval"))
        for label, runs in sorted(groups.items()):
            n = min(len(r) for r in runs)
            steps = column(runs[0][:n], "step")
            vals = np.stack([column(r[:n], col) for r in runs])  # [seeds, steps]
            keep = ~np.all(np.isnan(vals), axis=0)
            if not keep.any():
                continue
            steps, vals = steps[keep], vals[:, keep]
            w = min(smooth, vals.shape[-1])  # a run shorter than the window: no wider kernel than the data
            if w > 1 and col.startswith("success"):
                k = np.ones(w) / w
                vals = np.stack([np.convolve(np.nan_to_num(v), k, mode="same") for v in vals])
            mean, lo, hi = band(vals)
            if bounded:
                lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
            c = colors[label]
            (line,) = ax.plot(steps, mean, color=c, label=f"{label} (n={len(runs)})",
                              marker="o" if len(steps) < 12 else None)
            ax.fill_between(steps, lo, hi, color=c, alpha=0.15)
            handles.setdefault(label, line)
        ax.set_title(title)
        ax.set_xlabel("step")
        if bounded:
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    sizes = {len(r) for r in groups.values()}
    what = "95% t-interval" if min(sizes) >= 3 else ("min-max range" if max(sizes) <= 2 else
                                                      "min-max (n=2) / 95% t-interval (n>=3)")
    fig.legend([handles[k] for k in sorted(handles)], [handles[k].get_label() for k in sorted(handles)],
               loc="lower center", ncol=min(len(handles), 6), fontsize=9, title=f"mean over seeds; band: {what}")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
