"""The entry forms in the compiled loop (`extraction.forms`): crl and oracle_archive share one program; the
oracle's bank holds the end cells of the successful episodes, crl's holds well-formed entries of either form."""

import jax
import jax.numpy as jnp
import numpy as np
from _micro import micro

from crl_jax import loop
from crl_jax.loop.runtime import build

FORMS = ["extraction.forms=true", "extraction.merge=false", "steps=2"]


def _run(cfg, steps=2):
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    return rt, *loop.compiled_chunk(rt, steps)(state, jnp.int32(steps))


def test_crl_and_oracle_archive_write_well_formed_entries_in_one_program():
    crl, oracle = micro(*FORMS), micro(*FORMS, "method=oracle_archive")
    assert build(crl) is build(oracle)
    rt, state, m = _run(oracle)
    rows, cols = np.asarray(rt.tiny.row_ids), np.asarray(rt.tiny.col_ids)
    valid = np.asarray(state.bank.valid)
    toks, lens = np.asarray(state.bank.tokens)[valid], np.asarray(state.bank.lengths)[valid]
    assert np.isin(toks[:, 0], rows).all() and np.isin(toks[:, 1], cols).all() and (lens == 2).all()
    n = crl.rollout.groups * crl.rollout.group_size
    np.testing.assert_array_equal(np.asarray(m["ops_add"]), np.round(np.asarray(m["success_all"]) * n))
    np.testing.assert_array_equal(np.asarray(m["forms_fact"]), np.asarray(m["ops_add"]))
    assert int(state.buffer.next_id) == 0  # no extractor sample
    rt, state, m = _run(crl)
    share = np.asarray(m["forms_fact_share"])
    assert np.all(np.isnan(share) | ((share >= 0) & (share <= 1)))
    assert np.asarray(m["forms_fact"]).sum() <= (np.asarray(m["ops_add"]) + np.asarray(m["ops_update"])).sum()
    valid = np.asarray(state.bank.valid)
    assert valid.any()
    acts = np.asarray(rt.tiny.action_ids)
    for e, n_ in zip(np.asarray(state.bank.tokens)[valid], np.asarray(state.bank.lengths)[valid]):
        fact = np.isin(e[0], rows)
        assert (fact and n_ == 2 and np.isin(e[1], cols)) or (not fact and np.isin(e[:n_], acts).all())
