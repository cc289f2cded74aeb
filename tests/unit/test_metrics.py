"""Metric rows, CSV formatting/truncation, summaries and the plot."""

import numpy as np

from crl_jax.infra.metrics import COLUMNS, MetricsWriter, read_csv, rows_from_chunk, summary_from_rows
from crl_jax.infra.plot import band, deployed_column, plot_runs, t_interval


def _chunk(n, first, ev=False):
    m = {"success_guided": np.linspace(0, 1, n), "success_free": np.full(n, 0.5), "env_steps": np.arange(n) * 10.0,
         "bank_size": np.arange(n, dtype=float), "actor/loss": np.full(n, 0.25), "extractor/loss": np.ones(n),
         "extractor_ready": np.array([0.0] * (n - 1) + [1.0]),
         "eval_heldin_with_exp": np.array([np.nan] * (n - 1) + [0.75 if ev else np.nan])}
    return rows_from_chunk(m, first)


def test_rows_and_csv_roundtrip(tmp_path):
    rows = _chunk(3, 0) + _chunk(3, 3, ev=True)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert np.isnan(rows[0]["extractor_loss"]) and rows[2]["extractor_loss"] == 1.0  # only when ready
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(rows)
    back = read_csv(str(tmp_path / "metrics.csv"))
    assert list(back[0])[: len(COLUMNS)] == list(COLUMNS)
    assert back[0]["success_free"] == "0.5" and back[0]["eval_heldin_with_exp"] == ""
    assert back[5]["eval_heldin_with_exp"] == "0.75"
    w.truncate_after(4)
    assert [r["step"] for r in read_csv(str(tmp_path / "metrics.csv"))] == ["1", "2", "3", "4"]
    s = summary_from_rows(read_csv(str(tmp_path / "metrics.csv")))
    assert s["step"] == 4.0 and s["success_free_last10"] == 0.5


def test_truncate_keeps_the_rows_of_a_file_written_before_a_column_was_added(tmp_path):
    """A run folder from a version whose metrics.csv lacks a later column resumes with its rows kept (the new
    column empty), and a row cut short by a kill is still dropped."""
    import csv

    from crl_jax.infra.metrics import ALL_COLUMNS

    old = ALL_COLUMNS[:-1]
    rows = _chunk(3, 0)
    with open(tmp_path / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(old)
        for r in rows:
            w.writerow([r.get(c, "nan") for c in old])
        f.write("4,40,0.5")  # a row cut short by a kill mid-write
    MetricsWriter(str(tmp_path), tensorboard=False).truncate_after(10)
    back = read_csv(str(tmp_path / "metrics.csv"))
    assert [r["step"] for r in back] == ["1", "2", "3"] and list(back[0]) == list(ALL_COLUMNS)
    assert back[0][ALL_COLUMNS[-1]] == "" and back[2]["success_free"] == "0.5"


def test_t_interval_literal():
    mean, hw = t_interval(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and abs(hw - 4.30 * 1.0 / np.sqrt(3)) < 1e-9
    assert t_interval(np.array([5.0])) == (5.0, 0.0)


def test_band_is_min_max_for_two_seeds_and_t_interval_from_three():
    two = np.array([[0.0, 1.0], [0.5, 0.0]])
    mean, lo, hi = band(two)
    np.testing.assert_allclose(mean, [0.25, 0.5])
    np.testing.assert_allclose(lo, [0.0, 0.0])
    np.testing.assert_allclose(hi, [0.5, 1.0])
    three = np.array([[1.0], [2.0], [3.0]])
    mean, lo, hi = band(three)
    assert mean[0] == 2.0 and abs(hi[0] - 2.0 - 4.30 / np.sqrt(3)) < 1e-9 and abs(2.0 - lo[0] - 4.30 / np.sqrt(3)) < 1e-9


def test_plot_writes_png(tmp_path):
    for i in range(2):
        d = tmp_path / f"r{i}"
        d.mkdir()
        MetricsWriter(str(d), tensorboard=False).write(_chunk(4, 0, ev=True))
    out = plot_runs([str(tmp_path / "r0"), str(tmp_path / "r1")], str(tmp_path / "p.png"))
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_headline_panel_shows_each_group_deployed_policy():
    """The first panel draws a group's held-in evaluation with experience when it has one (CRL), else
    without (GRPO: its with-experience column is empty)."""
    crl = [[{"step": "5", "eval_heldin_with_exp": "0.5", "eval_heldin_without_exp": "0.25"}]]
    grpo = [[{"step": "5", "eval_heldin_with_exp": "", "eval_heldin_without_exp": "0.375"}]]
    assert deployed_column(crl) == "eval_heldin_with_exp"
    assert deployed_column(grpo) == "eval_heldin_without_exp"
