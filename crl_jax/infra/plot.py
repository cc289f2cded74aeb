"""Learning curves of one or more runs as a PNG (`crl-jax plot DIR [DIR ...] --out FILE`).

Runs are grouped by label (`run_label`: the explicit label in config.json, `crl-jax train --label` or a
sweep's point; else the parent folder of a `seed<N>` folder; else the folder name): a group's curve is
the mean over its runs, aligned by step; the band is the 95% t-interval over seeds from 3 runs on, and
the min-max range for 2 runs (a 2-sample t-interval is 12.7 standard errors wide and says little).
Training-success panels are smoothed by a centred moving average that is exact at the ends and skips NaN
(`smooth_series`; the figure says so and gives the window), with the raw means drawn faintly. Success
panels are clipped to [0, 1]. One colour per group in every panel, one legend for the figure. Panels:
first the headline comparison (`HEADLINE`: held-in evaluation of each group's deployed policy, with
experience where the group has a bank, else without, the demo table's first paired difference), then
training success of guided and free rollouts, evaluation with and without experience (held-in and
held-out), bank size, extractor reward; then the extractor's learning: its ADD rate on successful (solid) and
failed (dashed) episodes, the op token's entropy, and the share of the bank's plans that replay to success.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure

from crl_jax.config import ConfigError
from crl_jax.infra.errors import read_json
from crl_jax.infra.metrics import _complete, column, read_csv

HEADLINE = "heldin_deployed"  # pseudo-column: eval_heldin_with_exp where a group has it, else _without_exp
ADD_RATES = "add_rates"  # pseudo-column: ops_add_rate_success (solid) and ops_add_rate_fail (dashed)
PANELS = (
    (HEADLINE, "held-in eval: with experience if a bank, else without"),
    ("success_guided", "train success, guided"),
    ("success_free", "train success, free"),
    ("eval_heldin_with_exp", "held-in eval, with experience"),
    ("eval_heldin_without_exp", "held-in eval, without experience"),
    ("eval_heldout_with_exp", "held-out eval, with experience"),
    ("eval_heldout_without_exp", "held-out eval, without experience"),
    ("bank_size", "bank size"),
    ("extractor_reward_mean", "extractor reward"),
    (ADD_RATES, "ADD rate: success (solid), failure (dashed)"),
    ("op_entropy", "extractor op-token entropy (nats)"),
    ("bank_replay_success", "bank entries that replay to success"),
)
PAIRS = {ADD_RATES: ("ops_add_rate_success", "ops_add_rate_fail")}  # pseudo-columns drawn as two lines
PLOTTED = ("step",) + tuple(c for col, _ in PANELS if col != HEADLINE for c in PAIRS.get(col, (col,)))
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
    """The group a run is averaged in: the explicit label of its config.json (`crl-jax train --label`, a
    sweep's point name), else the parent folder for a `seed<N>` folder (`OUT/<label>/seed<N>/`), else the
    folder's own name. Never the method alone: two different crl runs are two curves."""
    cfg = os.path.join(run_dir, "config.json")
    if os.path.exists(cfg):
        label = read_json(cfg, error=ConfigError, what="run config").get("label")
        if label:
            return str(label)
    path = os.path.normpath(os.path.abspath(run_dir))
    name = os.path.basename(path)
    if re.fullmatch(r"seed\d+", name):
        return os.path.basename(os.path.dirname(path))
    return name


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.csv, without rows cut short by a kill mid-write (as a resume drops them); a cell
    that is not a number is a ConfigError naming the file, step and column."""
    rows = read_csv(path)
    fields = list(rows[0]) if rows else []
    rows = [r for r in rows if _complete(r, fields)]
    for r in rows:
        for c in PLOTTED:
            v = r.get(c)
            if v not in ("", None):
                try:
                    float(v)
                except ValueError:
                    raise ConfigError(f"{path}: step {r['step']}, column {c!r} holds {v!r}, not a number") from None
    return rows


def checked_rows(run_dir: str, rows: list[dict]) -> list[dict]:
    """The rows of a run folder's metrics.csv, one per step (the last of a duplicated step), with a warning for
    an empty file and for duplicated steps (two runs wrote into one folder); a file with fewer rows than its
    summary.json counts (cut between complete lines, or edited) is a ConfigError naming both."""
    path = os.path.join(run_dir, "metrics.csv")
    if not rows:
        warnings.warn(f"{path} holds no rows: the run is left out of the plot", stacklevel=2)
        return rows
    summary = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary):
        s = read_json(summary, error=ConfigError, what="run summary")
        steps, want = s.get("steps"), s.get("rows")
        if isinstance(steps, int) and isinstance(want, int):
            have = sum(int(r["step"]) <= steps for r in rows)
            if have < want:
                raise ConfigError(f"{path} holds {have} rows up to step {steps}, but {summary} counts {want}: the "
                                  "file was cut short or edited; rerun the command that wrote it")
    by_step = {int(r["step"]): r for r in rows}
    if len(by_step) < len(rows):
        warnings.warn(f"{path}: {len(rows) - len(by_step)} duplicated step(s) (two runs or sweeps wrote into one "
                      "folder?); the plot uses the last row of each step", stacklevel=2)
        rows = [by_step[k] for k in sorted(by_step)]
    return rows


def smooth_series(v: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average that skips NaN and is exact at the ends: the window at index i is
    `min(window // 2, i, n - 1 - i)` steps on each side, so the first and last points are their own values
    (the last one is what readers look at); all-NaN windows stay NaN."""
    v = np.asarray(v, float)
    n, h = len(v), max(int(window), 1) // 2
    out = np.full(n, np.nan)
    for i in range(n):
        r = min(h, i, n - 1 - i)
        w = v[i - r: i + r + 1]
        w = w[~np.isnan(w)]
        if len(w):
            out[i] = w.mean()
    return out


def group_series(runs: list[list[dict]], col: str, smooth: int = 1):
    """Drawn series of one group and column: (steps [S], mean, low, high, raw mean) over the union of the
    runs' steps (a run without a step is NaN there, not cut to the shortest run); each run is smoothed with
    `smooth_series` first when `smooth > 1`; steps where every run is NaN are dropped."""
    steps = np.array(sorted({int(r["step"]) for rows in runs for r in rows}), dtype=float)
    index = {int(s): i for i, s in enumerate(steps)}
    vals = np.full((len(runs), len(steps)), np.nan)
    for j, rows in enumerate(runs):
        for r, x in zip(rows, column(rows, col)):
            vals[j, index[int(r["step"])]] = x
    keep = ~np.all(np.isnan(vals), axis=0)
    steps, vals = steps[keep], vals[:, keep]
    with np.errstate(all="ignore"):
        raw = np.nanmean(vals, axis=0) if vals.size else np.array([])
    if smooth > 1:
        vals = np.stack([smooth_series(v, smooth) for v in vals]) if len(vals) else vals
    mean, lo, hi = band(vals) if vals.size else (np.array([]),) * 3
    return steps, mean, lo, hi, raw


def deployed_column(runs: list[list[dict]]) -> str:
    """The held-in column of a group's deployed policy: with experience if any of its runs evaluated with
    one (CRL and the bank methods), else without (GRPO)."""
    with_exp = [x for rows in runs for x in column(rows, "eval_heldin_with_exp")]
    return "eval_heldin_with_exp" if np.any(np.isfinite(with_exp)) else "eval_heldin_without_exp"


def plot_runs(run_dirs: list[str], out: str, *, smooth: int = 3) -> str:
    """PNG of the learning curves of `run_dirs`; success panels are smoothed over `smooth` steps (said in
    the figure), with the unsmoothed group means drawn faintly behind."""
    groups: dict[str, list[list[dict]]] = defaultdict(list)
    for d in run_dirs:
        path = os.path.join(d, "metrics.csv")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no metrics.csv in run folder {d!r}")
        rows = checked_rows(d, read_metrics(path))
        if rows:
            groups[run_label(d)].append(rows)
    if not groups:
        raise ConfigError(f"nothing to plot: the metrics.csv of {', '.join(map(repr, run_dirs))} hold no rows")
    # A bare Figure (no pyplot): drawn by the Agg canvas on save, whatever backend the process has chosen
    fig = Figure(figsize=(15, 16))
    axes = fig.subplots(4, 3)
    colors = {label: f"C{i % 10}" for i, label in enumerate(sorted(groups))}
    handles = {}
    for ax, (col, title) in zip(axes.flat, PANELS):
        bounded = col.startswith(("success", "eval", "bank_replay")) or col == HEADLINE
        smoothed = smooth > 1 and (col.startswith("success") or col == ADD_RATES)  # per-step rates are noisy
        for label, runs in sorted(groups.items()):
            for src in PAIRS.get(col, (deployed_column(runs) if col == HEADLINE else col,)):
                steps, mean, lo, hi, raw = group_series(runs, src, smooth if smoothed else 1)
                if not len(steps):
                    continue
                if bounded:
                    lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
                c = colors[label]
                if smoothed:
                    ax.plot(steps, raw, color=c, alpha=0.3, linewidth=0.8, marker=".", markersize=3)
                dashed = src.endswith(("without_exp", "_fail"))
                (line,) = ax.plot(steps, mean, color=c, label=f"{label} (n={len(runs)})",
                                  marker="o" if len(steps) < 12 else None, linestyle="--" if dashed else "-")
                ax.fill_between(steps, lo, hi, color=c, alpha=0.15)
                if not dashed or label not in handles:  # the legend shows solid lines (a later panel's)
                    handles[label] = line
        ax.set_title(title + (f" (smoothed, {smooth}-step window)" if smoothed else ""), fontsize=10)
        ax.set_xlabel("step")
        if bounded:
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    sizes = {len(r) for r in groups.values()}
    what = "95% t-interval" if min(sizes) >= 3 else ("min-max range" if max(sizes) <= 2 else
                                                      "min-max (n=2) / 95% t-interval (n>=3)")
    note = (f"; train-success and ADD-rate panels: centred {smooth}-step moving average (shorter at the ends, NaN skipped), "
            "raw means faint") if smooth > 1 else ""
    fig.legend([handles[k] for k in sorted(handles)], [handles[k].get_label() for k in sorted(handles)],
               loc="lower center", ncol=min(len(handles), 6) or 1, fontsize=9,
               title=f"mean over seeds; band: {what}{note}")
    axes.flat[0].text(0.02, 0.97, "solid: with experience; dashed: without", transform=axes.flat[0].transAxes,
                      fontsize=8, va="top")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if not os.path.splitext(out)[1]:  # savefig would add ".png": return the path it writes
        out += ".png"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=90)
    return out
