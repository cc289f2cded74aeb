"""`crl-jax bank replay`'s split of the bank by when each entry was last written (`write_spans`), on literal
entries."""

import numpy as np

from crl_jax.infra.bank_report import write_spans


def test_entries_are_split_by_the_quarter_of_their_last_write():
    # a run of 8 iterations: spans 1-2, 3-4, 5-6, 7-8 hold 0-based write steps {0, 1}, {2, 3}, {4, 5}, {6, 7}
    updated = np.array([0, 1, 1, 3, 6, 7, 7, 5])
    valid = np.array([True, True, True, True, True, True, False, False])
    ok = np.array([0.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0])
    fact = np.array([False, True, True, False, True, True, True, True])
    rows = write_spans(updated, valid, ok, fact, steps=8)
    assert [r[:3] for r in rows] == [(1, 2, 3), (3, 4, 1), (5, 6, 0), (7, 8, 2)]  # invalid slots left out
    np.testing.assert_allclose([r[3] for r in rows], [0.5, 1.0, np.nan, 1.0])
    np.testing.assert_allclose([r[4] for r in rows], [2 / 3, 0.0, np.nan, 1.0])
    # spans of unequal length: whole iterations (edges i * steps // parts) that cover the run
    assert [r[:2] for r in write_spans(updated, valid, ok, fact, steps=10)] == [(1, 2), (3, 5), (6, 7), (8, 10)]
