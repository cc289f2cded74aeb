"""Paired tables (same seed, 95% t-intervals) for a sweep's run folders OUT/<point>/seed<s>/summary.json.

The demo's comparison table, e.g. after experiments/configs/confirm_8seeds.yaml:

    python experiments/paired_table.py runs/confirm_8seeds 10-17

`--crl POINT` lets another point play CRL's part in that table (a candidate against grpo, static_online and
archive run beside it), `--role static_online=POINT` (likewise grpo, archive) a control's. `--candidates a,b,...
[--base crl]` instead writes one row per point (held-in with experience, guided - free, the extractor's write
rates, bank replay) and each point minus the base, paired:

    python experiments/paired_table.py runs/coevolve_tune 300-303 --candidates outcome_last,paired --base crl
"""
import argparse
import json
import os

import numpy as np

from crl_jax.infra.demo import _get, comparison_table
from crl_jax.infra.metrics import column, read_csv
from crl_jax.infra.plot import t_interval

# (label, a summary key or ("+" / "-", key_a, key_b): a within-run sum or difference) of the candidate table
CANDIDATE_ROWS = (("held-in with exp (late)", "late.eval_heldin_with_exp"),
                  ("held-in without exp (late)", "late.eval_heldin_without_exp"),
                  ("guided - free (late)", "train.guided_minus_free_late"),
                  ("guided - free (last 10)", ("-", "success_guided_last10", "success_free_last10")),
                  ("ADD on failure (late)", "late.ops_add_rate_fail"),
                  ("ADD on failure (last 20)", "train.add_rate_fail_last20"),
                  ("ADD on success (late)", "late.ops_add_rate_success"),
                  ("ADD+UPDATE on success (late)", ("+", "late.ops_add_rate_success", "late.ops_update_rate_success")),
                  ("retrieved credit > 0 (late)", "late.retrieved_credit_pos"),
                  ("op entropy (late)", "late.op_entropy"),
                  ("bank replay success (final)", "bank_replay_success"))


def _value(summary: dict, key) -> float:
    """A summary value, or ("+" / "-", a, b): a + b or a - b of one run."""
    if isinstance(key, str):
        return _get(summary, key)
    op, a, b = key
    return _get(summary, a) + _get(summary, b) if op == "+" else _get(summary, a) - _get(summary, b)


def _load(run_dir: str) -> dict:
    """summary.json plus "train": second-half means from metrics.csv that the summary does not keep (guided -
    free training success over steps > last / 2; the ADD rate on failed episodes over the last 20 steps)."""
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    last = max(int(r["step"]) for r in rows)
    half = [r for r in rows if int(r["step"]) > last / 2]
    tail = [r for r in rows if int(r["step"]) > last - 20]
    s["train"] = {"guided_minus_free_late": float(np.nanmean(column(half, "success_guided") - column(half, "success_free"))),
                  "add_rate_fail_last20": float(np.nanmean(column(tail, "ops_add_rate_fail")))}
    return s


def _fmt(x: np.ndarray) -> str:
    mean, hw = t_interval(x)
    return f"{mean:+.3f} [{mean - hw:+.3f}, {mean + hw:+.3f}]"


def candidate_table(res: dict, base: str) -> str:
    """Per point: mean ± 95% half-width of each row; then point - base per row, paired by seed."""
    names = list(res)
    w = max([18] + [len(m) + 2 for m in names])  # a column per point, wide enough for its name
    lines = [f"{'metric':30s}" + "".join(f"{m:>{w}s}" for m in names)]
    for label, key in CANDIDATE_ROWS:
        cells = []
        for m in names:
            mean, hw = t_interval(np.array([_value(s, key) for s in res[m]], float))
            cells.append("n/a" if np.isnan(mean) else f"{mean:.3f} ± {hw:.3f}")
        lines.append(f"{label:30s}" + "".join(f"{c:>{w}s}" for c in cells))
    lines += ["", f"paired differences, point - {base} (same seed), mean [95% CI]:"]
    for m in names:
        if m == base:
            continue
        for label, key in CANDIDATE_ROWS:
            d = np.array([_value(a, key) - _value(b, key) for a, b in zip(res[m], res[base])], float)
            if not np.isnan(d).all():
                lines.append(f"{m + ': ' + label:52s} {_fmt(d)}   seeds: " + " ".join(f"{x:+.2f}" for x in d))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("seeds", nargs="?", default="10-17", help="first-last")
    p.add_argument("--crl", default="crl", help="the point that plays CRL's part in the demo table")
    p.add_argument("--role", action="append", default=[], metavar="ROLE=POINT",
                   help="a point that plays a control's part in the demo table (grpo, static_online, archive)")
    p.add_argument("--candidates", default="", help="comma-separated points: the candidate table instead")
    p.add_argument("--base", default="crl", help="the candidate table's baseline point")
    a = p.parse_args()
    lo, hi = (int(x) for x in a.seeds.split("-"))
    load = lambda m: [_load(os.path.join(a.out, m, f"seed{s}")) for s in range(lo, hi + 1)]  # noqa: E731
    if a.candidates:
        names = [a.base] + [m for m in a.candidates.split(",") if m != a.base]
        t = candidate_table({m: load(m) for m in names}, a.base)
        path = os.path.join(a.out, "candidates.txt")
    else:
        roles = {"crl": a.crl, "grpo": "grpo", "static_online": "static_online", "archive": "archive"}
        roles.update(r.split("=", 1) for r in a.role)
        t = comparison_table({r: load(m) for r, m in roles.items() if os.path.isdir(os.path.join(a.out, m))})
        path = os.path.join(a.out, "comparison.txt" if a.crl == "crl" else f"comparison_{a.crl}.txt")
    with open(path, "w") as f:
        f.write(t + "\n")
    print(t)


if __name__ == "__main__":
    main()
