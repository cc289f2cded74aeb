"""What the extractor writes over a run, per quarter of its iterations, for a point and its base over seeds.

Two measures, paired 95% t-intervals over seeds:
- the FACT share of the writes (`metrics.csv`'s `forms_fact_share`, the entry forms' runs) averaged over each
  quarter of the iterations: what the extractor chooses to write, step by step;
- the replay share of the final bank's entries last written in the last quarter (`crl-jax bank replay`'s "by
  last write" line, computed here on each seed's newest checkpoint). Entries written earlier that are still in
  the bank are the ones eviction kept, so only the last quarter compares writes as they were written.

    python experiments/write_quarters.py DIR 600-607 --point crl_cf --base static_online_def
"""

import argparse
import os

import numpy as np

from crl_jax.infra.bank_report import entry_outcomes, write_spans
from crl_jax.infra.cli import _restore_run
from crl_jax.infra.metrics import column, read_csv
from paired_table import _fmt  # experiments/, the script's own folder

QUARTERS = 4


def fact_quarters(run: str) -> np.ndarray:
    """[QUARTERS] mean FACT share of the writes over each quarter of the run's iterations."""
    share = column(read_csv(os.path.join(run, "metrics.csv")), "forms_fact_share")
    return np.array([np.nanmean(q) for q in np.array_split(share, QUARTERS)])


def last_quarter_replay(run: str) -> tuple[int, float]:
    """(entries, replay share) of the final bank's entries last written in the run's last quarter."""
    _, rt, state, _ = _restore_run(run)
    valid, ok, fact = entry_outcomes(rt, state.bank)
    _, _, n, share, _ = write_spans(np.asarray(state.bank.updated_step), valid, ok, fact, int(state.step),
                                    QUARTERS)[-1]
    return n, share


def _ms(x) -> str:
    x = np.asarray(x, float)
    return f"{x.mean():.3f} ± {x.std(ddof=1):.3f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="a sweep folder: OUT/<point>/seed<s>")
    p.add_argument("seeds", help="first-last")
    p.add_argument("--point", required=True)
    p.add_argument("--base", required=True)
    a = p.parse_args()
    lo, hi = (int(x) for x in a.seeds.split("-"))
    runs = {m: [os.path.join(a.out, m, f"seed{s}") for s in range(lo, hi + 1)] for m in (a.point, a.base)}
    fact = {m: np.array([fact_quarters(r) for r in rs]) for m, rs in runs.items()}
    late = {m: [last_quarter_replay(r) for r in rs] for m, rs in runs.items()}
    print(f"FACT share of the writes, mean over each quarter of the iterations (seeds {a.seeds}):")
    for m in runs:
        print(f"  {m:20s}", " / ".join(_ms(fact[m][:, i]) for i in range(QUARTERS)))
    d = fact[a.point][:, -1] - fact[a.point][:, 0]
    print(f"  {a.point}, last - first quarter: {_fmt(d)}  seeds:", " ".join(f"{v:+.2f}" for v in d))
    print(f"  {a.point} - {a.base}, last quarter: {_fmt(fact[a.point][:, -1] - fact[a.base][:, -1])}")
    print("replay share of the final bank's entries last written in the last quarter:")
    for m in runs:
        print(f"  {m:20s} {_ms([s for _, s in late[m]])}  per seed:", " ".join(f"{s:.2f}" for _, s in late[m]),
              " entries:", " ".join(str(n) for n, _ in late[m]))
    print(f"  {a.point} - {a.base}: {_fmt(np.array([x[1] - y[1] for x, y in zip(late[a.point], late[a.base])]))}")


if __name__ == "__main__":
    main()
