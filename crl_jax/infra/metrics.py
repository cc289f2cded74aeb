"""Metric rows -> `metrics.csv`, TensorBoard event files, `summary.json`, and learning-curve plots.

Compiled code returns metrics as a dict of arrays with a leading step axis; this module is the host
side. Values that do not exist for a method (NaN) are written as empty CSV cells. Floats are written
with 7 significant digits so the same run gives a byte-identical file.
"""

from __future__ import annotations

import csv
import math
import os

import numpy as np

from crl_jax.atomic import write_json_atomic

try:  # a core dependency; a run without it writes no event files
    from tensorboardX import SummaryWriter
except ImportError:  # pragma: no cover
    SummaryWriter = None

COLUMNS = ("step", "env_steps", "success_guided", "success_free", "eval_heldin_with_exp", "eval_heldin_without_exp",
           "eval_heldout_with_exp", "eval_heldout_without_exp", "bank_size", "extractor_reward_mean", "actor_loss",
           "extractor_loss")
# Is the extractor learning? (crl_jax/loop/diagnostics.py; bank_replay_success at evaluation steps only)
LEARNING = ("ops_add_rate_success", "ops_add_rate_fail", "ops_update_rate_success", "ops_update_rate_fail",
            "retrieved_credit_pos", "op_entropy", "bank_replay_success")
EXTRA = ("success_all", "retrieved_frac", "episode_turns", "ops_add", "ops_update", "ops_return", "ops_invalid",
         "merged_entries", "buffer_overflow", "credit_dropped", "extractor_ready", "adv_abs_mean", "actor/clip_frac",
         "actor/approx_kl", "actor/entropy", "extractor/ratio_mean", "actor/nonfinite", "extractor/nonfinite",
         "ops_return_trained", "ops_update_unretrieved", "ops_invalid_trained") + LEARNING
ALL_COLUMNS = COLUMNS + EXTRA
# Columns of runs with an option on only (the entry forms, `extraction.forms`): a run's file has them when its
# rows do, so other runs' files are unchanged
OPTIONAL = ("forms_fact", "forms_fact_share")


def columns_of(rows) -> tuple[str, ...]:
    """The CSV columns of a run whose rows are `rows`: `ALL_COLUMNS`, then the `OPTIONAL` ones its rows hold."""
    return ALL_COLUMNS + tuple(c for c in OPTIONAL if rows and c in rows[0])


def rows_from_chunk(metrics: dict, first_step: int) -> list[dict]:
    """Stacked metrics {name: [S]} of steps first_step+1 .. first_step+S -> list of row dicts."""
    m = {k: np.asarray(v) for k, v in metrics.items()}
    n = len(next(iter(m.values())))
    rows = []
    for i in range(n):
        row = {"step": first_step + i + 1}
        for k, v in m.items():
            row[k] = float(v[i])
        row["actor_loss"] = row.get("actor/loss", float("nan"))
        ready = row.get("extractor_ready", 0.0) > 0
        row["extractor_loss"] = row.get("extractor/loss", float("nan")) if ready else float("nan")
        rows.append(row)
    return rows


def _fmt(v) -> str:
    if isinstance(v, int):
        return str(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.7g}"


class MetricsWriter:
    """Appends rows to RUN_DIR/metrics.csv (and TensorBoard) and can truncate after a resume.

    `purge_step`: the first step this process will write. TensorBoard event files are append-only, so
    rows of steps >= `purge_step` written before a crash stay in the old files; tensorboardX's
    `purge_step` marks them superseded (TensorBoard drops them when it reads the new file), as
    `truncate_after` drops them from the CSV."""

    def __init__(self, run_dir: str, tensorboard: bool = True, purge_step: int | None = None):
        self.path = os.path.join(run_dir, "metrics.csv")
        self._tb = None
        if tensorboard and SummaryWriter is not None:
            tb_dir = os.path.join(run_dir, "tb")
            purge = purge_step if purge_step is not None and os.path.isdir(tb_dir) else None
            self._tb = SummaryWriter(tb_dir, purge_step=purge)

    def truncate_after(self, step: int) -> None:
        """Keep only the complete rows of steps 1..`step` (rows after the last checkpoint, and a row cut
        short by a kill mid-write, are dropped)."""
        if not os.path.exists(self.path):
            return
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            # (complete against the file's own header: a run written before a column was added keeps its rows,
            # the new column empty)
            keep = [r for r in reader if _complete(r, reader.fieldnames or ()) and int(r["step"]) <= step]
        cols = columns_of(keep)
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in keep:
                w.writerow([r.get(c, "") for c in cols])
        os.replace(tmp, self.path)  # a kill during the rewrite leaves the old file, never half of it

    def write(self, rows: list[dict]) -> None:
        new = not os.path.exists(self.path)
        if new:
            cols = columns_of(rows)
        else:  # a resumed run keeps the optional columns its file has
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), ())
            cols = ALL_COLUMNS + tuple(c for c in OPTIONAL if c in header)
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(cols)
            for r in rows:
                w.writerow([_fmt(r.get(c, float("nan"))) for c in cols])
        if self._tb is not None:
            for r in rows:
                for c in cols[1:]:
                    v = r.get(c)
                    if v is not None and not (isinstance(v, float) and math.isnan(v)):
                        self._tb.add_scalar(c, v, r["step"])
            self._tb.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def _complete(row: dict, fields) -> bool:
    """A CSV row with every column of its file's header `fields` and an integer step (not one cut short by a
    kill mid-write)."""
    if None in row or "step" not in fields or any(row.get(c) is None for c in fields):
        return False
    return row["step"].isdigit()


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def column(rows: list[dict], name: str) -> np.ndarray:
    return np.array([float(r[name]) if r.get(name, "") != "" else np.nan for r in rows])


def summary_from_rows(rows: list[dict]) -> dict:
    """Final evaluation (last row with evaluations) plus last-10-step training success."""
    out: dict = {}
    ev = [r for r in rows if r.get("eval_heldin_without_exp", "") != ""]
    last = ev[-1] if ev else (rows[-1] if rows else {})
    for c in COLUMNS + ("bank_replay_success",):  # (the bank's replay at the final evaluation)
        v = last.get(c, "")
        out[c] = float(v) if v not in ("", None) else None
    tail = rows[-10:]
    for c in ("success_guided", "success_free", "success_all"):
        vals = column(tail, c) if tail else np.array([])
        vals = vals[~np.isnan(vals)]
        out[f"{c}_last10"] = float(vals.mean()) if len(vals) else None
    out["late"] = late_means(rows)
    out["rows"] = len(rows)  # what metrics.csv held: a file cut later between complete lines is detected by it
    return out


EVAL_COLUMNS = ("eval_heldin_with_exp", "eval_heldin_without_exp", "eval_heldout_with_exp",
                "eval_heldout_without_exp")


def late_means(rows: list[dict]) -> dict:
    """Each eval column's (and `LEARNING` column's) mean over the rows of the run's second half (step > last
    step / 2) that have it: single evaluations swing by +-0.15, so comparisons use this. None where there is
    no value."""
    if not rows:
        return {c: None for c in EVAL_COLUMNS + LEARNING}
    last = max(float(r["step"]) for r in rows)
    half = [r for r in rows if float(r["step"]) > last / 2]
    out = {}
    for c in EVAL_COLUMNS + LEARNING + tuple(c for c in OPTIONAL if c in rows[0]):
        v = column(half, c) if half else np.array([])
        v = v[~np.isnan(v)]
        out[c] = float(v.mean()) if len(v) else None
    return out


def write_summary(run_dir: str, summary: dict) -> None:
    """RUN_DIR/summary.json, replaced atomically (a sweep's resume and `crl-jax demo` read it)."""
    write_json_atomic(os.path.join(run_dir, "summary.json"), summary, sort_keys=True)
