"""Experience bank: literal-value unit tests, diversity re-ranking, jit / vmap / retrace guards."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as B
from crl_jax.losses.credit import outcome_rewards

L, D = 3, 2


def _tok(v):
    return jnp.full((L,), v, jnp.int32)


_add = jax.jit(B.add, static_argnames=("eviction",))
_add_many = jax.jit(B.add_many, static_argnames=("eviction",))
_retrieve_jit = jax.jit(B.retrieve, static_argnames=("top_k", "candidates"))


def _filled(keys, tasks=None, capacity=None, step=0):
    """Bank with one entry per key (token value = index + 1, source = 100 + index), added in order."""
    n = len(keys)
    bank = B.init(capacity or n, L, len(keys[0]))
    toks = jnp.repeat(jnp.arange(1, n + 1, dtype=jnp.int32)[:, None], L, axis=1)
    tasks = jnp.zeros(n, jnp.int32) if tasks is None else jnp.asarray(tasks, jnp.int32)
    return _add_many(bank, toks, jnp.full((n,), L), jnp.asarray(keys, jnp.float32), tasks, step,
                     100 + jnp.arange(n), jnp.ones(n, bool))[0]


def _retrieve(bank, q, task, **kw):
    q = jnp.asarray(q, jnp.float32).reshape(-1, bank.key_dim)
    task = jnp.broadcast_to(jnp.asarray(task, jnp.int32), (q.shape[0],))
    return _retrieve_jit(bank, q, task, kw.pop("rng", jax.random.key(0)), kw.pop("step", 10), **kw)


PLAIN = dict(diversity_lambda=0.0, recent_steps=0, demote_p=0.0)


def test_init_shapes_and_empty():
    b = B.init(5, 4, 3)
    assert b.tokens.shape == (5, 4) and b.keys.shape == (5, 3) and b.tokens.dtype == jnp.int32
    assert int(B.size(b)) == 0 and not bool(b.valid.any())
    assert (np.asarray(b.last_retrieved_step) == -1).all() and (np.asarray(b.source) == -1).all()
    with pytest.raises(ValueError):
        B.init(0, 4, 3)


def test_add_first_free_then_fifo_eviction():
    b = _filled([[1, 0], [0, 2], [3, 4]])
    np.testing.assert_allclose(b.keys, [[1, 0], [0, 1], [0.6, 0.8]], atol=1e-7)  # stored unit-norm
    assert list(np.asarray(b.insert_order)) == [0, 1, 2] and int(b.next_order) == 3
    b = b.replace(valid=b.valid.at[1].set(False))
    b, slot = _add(b, _tok(9), 2, jnp.array([1.0, 0.0]), 1, 5, 7)
    assert int(slot) == 1 and int(b.insert_order[1]) == 3 and int(b.lengths[1]) == 2
    b, slot = _add(b, _tok(8), 2, jnp.array([1.0, 0.0]), 1, 6, 8)  # full: oldest insert is slot 0
    assert int(slot) == 0 and int(b.source[0]) == 8 and int(b.created_step[0]) == 6
    b, slot = _add(b, _tok(8), 2, jnp.array([1.0, 0.0]), 1, 6, 8)
    assert int(slot) == 2  # next oldest (order 2); slot 1 has order 3


def test_add_lru_and_random_eviction():
    b = _filled([[1, 0], [0, 1], [1, 1]])
    b = b.replace(last_retrieved_step=jnp.array([5, -1, 3]), updated_step=jnp.array([0, 4, 0]))
    _, slot = _add(b, _tok(0), 1, jnp.array([1.0, 0.0]), 0, 9, 0, eviction="lru")
    assert int(slot) == 2  # last use = max(retrieved, updated) = [5, 4, 3]
    b2 = b.replace(last_retrieved_step=jnp.array([3, 3, 3]), updated_step=jnp.zeros(3, jnp.int32), insert_order=jnp.array([4, 2, 7]))
    _, slot = _add(b2, _tok(0), 1, jnp.array([1.0, 0.0]), 0, 9, 0, eviction="lru")
    assert int(slot) == 1  # tie on last use -> oldest insert
    with pytest.raises(ValueError):
        _add(b, _tok(0), 1, jnp.array([1.0, 0.0]), 0, 9, 0, eviction="random")
    slots = {int(_add(b, _tok(0), 1, jnp.array([1.0, 0.0]), 0, 9, 0, eviction="random",
                       rng=jax.random.key(s))[1]) for s in range(30)}
    assert slots == {0, 1, 2}


def test_add_many_matches_sequential_and_masks():
    base = _filled([[1, 0]], capacity=3)
    toks = jnp.arange(12, dtype=jnp.int32).reshape(4, L)
    keys = jnp.array([[0, 1], [1, 1], [2, 1], [1, 3]], jnp.float32)
    mask = jnp.array([True, False, True, True])
    got, slots = B.add_many(base, toks, jnp.array([1, 2, 3, 1]), keys, jnp.array([0, 1, 2, 3]), 4,
                            jnp.array([10, 11, 12, 13]), mask)
    assert list(np.asarray(slots)) == [1, -1, 2, 0]
    want = base
    for i in (0, 2, 3):
        want, _ = _add(want, toks[i], [1, 2, 3, 1][i], keys[i], i, 4, 10 + i)
    chex.assert_trees_all_close(got, want)


def test_update_semantics():
    b = _filled([[1, 0], [0, 1]])
    b = b.replace(times_retrieved=jnp.array([3, 0]))
    u = B.update(b, 0, _tok(7), 1, 4, 55)
    assert list(np.asarray(u.tokens[0])) == [7, 7, 7] and int(u.lengths[0]) == 1
    assert int(u.updated_step[0]) == 4 and int(u.source[0]) == 55 and int(u.created_step[0]) == 0
    assert int(u.times_retrieved[0]) == 3 and int(u.insert_order[0]) == 0
    np.testing.assert_allclose(u.keys, b.keys)
    u = B.update(b, 1, _tok(7), 1, 4, 55, key=jnp.array([3.0, 4.0]))
    np.testing.assert_allclose(u.keys[1], [0.6, 0.8], atol=1e-7)
    for bad in (-1, 2):
        chex.assert_trees_all_close(B.update(b, bad, _tok(7), 1, 4, 55), b)
    chex.assert_trees_all_close(B.update(b.replace(valid=b.valid.at[0].set(False)), 0, _tok(7), 1, 4, 55),
                                b.replace(valid=b.valid.at[0].set(False)))
    chex.assert_trees_all_close(B.update(b, 0, _tok(7), 1, 4, 55, expect_order=1), b)  # slot reused
    many = B.update_many(b, jnp.array([1, 0, 1]), jnp.stack([_tok(5), _tok(6), _tok(7)]), jnp.array([1, 2, 3]),
                         4, jnp.array([1, 2, 3]), jnp.array([True, True, False]))
    assert list(np.asarray(many.tokens[:, 0])) == [6, 5] and list(np.asarray(many.source)) == [2, 1]


def test_retrieve_plain_cosine_topk_literal():
    b = _filled([[1, 0], [0, 1], [1, 1], [-1, 0], [1, 0.2]], tasks=[0, 0, 0, 0, 1])
    nb, slots, found = _retrieve(b, [[2.0, 0.1], [-0.1, -1.0]], [0, 0], top_k=3, **PLAIN)
    assert slots.tolist() == [[0, 2, 1], [3, 0, 2]]  # slot 4 is another family
    assert found.all()
    assert nb.times_retrieved.tolist() == [2, 1, 2, 1, 0]
    assert nb.last_retrieved_step.tolist() == [10, 10, 10, 10, -1]
    # Fewer eligible than top_k: found False, slot -1; a masked query gets nothing and counts nothing.
    nb, slots, found = _retrieve(b, [[1, 0], [1, 0]], [1, 1], top_k=2, query_mask=jnp.array([True, False]),
                                 **PLAIN)
    assert slots.tolist() == [[4, -1], [-1, -1]] and found.tolist() == [[True, False], [False, False]]
    assert nb.times_retrieved.tolist() == [0, 0, 0, 0, 1]
    with pytest.raises(ValueError):
        _retrieve(b, [[1, 0]], 0, top_k=6)


def test_retrieve_candidates_limit():
    # 0.4 log(201) = 2.12 > 2: with 3 candidates the fresh 3rd-ranked entry wins; with 2 it is not a candidate.
    b = _filled([[1, 0], [1, 0.1], [1, 0.2]]).replace(times_retrieved=jnp.array([200, 200, 0]))
    kw = dict(diversity_lambda=0.4, recent_steps=0, demote_p=0.0)
    assert _retrieve(b, [[1, 0]], 0, candidates=3, **kw)[1].tolist() == [[2]]
    assert _retrieve(b, [[1, 0]], 0, candidates=2, **kw)[1].tolist() == [[0]]  # equal usage: rank decides


def test_shared_ties_rotate_through_more_tied_entries_than_candidates():
    """24 entries of one key, 16 candidates: the cut to 16 orders the ties by usage (then the draw), not by
    slot, so every entry is retrieved (before: slots 16-23 never)."""
    key = jnp.asarray([0.6, 0.8])
    b = B.add_many(B.init(32, 2, 2), jnp.ones((24, 2), jnp.int32), jnp.full((24,), 2), jnp.broadcast_to(key, (24, 2)),
                   jnp.zeros((24,), jnp.int32), 0, jnp.arange(24), jnp.ones((24,), bool))[0]
    ret = jax.jit(lambda b, r, s: B.retrieve(b, jnp.broadcast_to(key, (4, 2)), jnp.zeros((4,), jnp.int32), r, s,
                                             candidates=16, shared_ties=True))
    for step in range(12):  # 48 retrievals
        b, slots, found = ret(b, jax.random.key(step), step)
        assert found.all()
    uses = np.asarray(b.times_retrieved)[:24]
    assert uses.sum() == 48 and uses.min() >= 1, uses
    # without an rng the ties are ordered by usage, then slot: the 4 least used, lowest slots first
    b2 = b.replace(times_retrieved=jnp.arange(32, dtype=jnp.int32)[::-1])  # slot 23 the least used of the 24
    _, slots, _ = B.retrieve(b2, key[None], jnp.zeros((1,), jnp.int32), None, 100, candidates=16, top_k=4,
                             shared_ties=True, recent_steps=0, demote_p=0.0)
    assert slots.tolist() == [[23, 22, 21, 20]]


def test_heavily_retrieved_loses_to_fresh():
    b = _filled([[1, 0.01], [1, 0.02]]).replace(times_retrieved=jnp.array([20, 0]),
                                              last_retrieved_step=jnp.array([2, -1]))
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=10)  # defaults: lambda 0.4, recent 1 step, demote 0.5
    assert slots.tolist() == [[1]]  # s0 = -0.4 log 21 = -1.218 < s1 = -1
    b11 = b.replace(times_retrieved=jnp.array([11, 0]))
    _, slots, _ = _retrieve(b11, [[1, 0]], 0, step=10)
    assert slots.tolist() == [[0]]  # s0 = -0.4 log 12 = -0.994 > s1 = -1: rank still wins


def test_recent_penalty_and_never_is_not_recent():
    b = _filled([[1, 0.0], [1, 0.05]]).replace(last_retrieved_step=jnp.array([9, -1]))
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=10, diversity_lambda=0.0, recent_steps=1, demote_p=0.0)
    assert slots.tolist() == [[0]]  # s0 = -1 (recent), s1 = -1 (rank): tie -> lower rank
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=10, diversity_lambda=0.0, recent_steps=1, demote_p=1.0)
    assert slots.tolist() == [[1]]  # retrieved in the previous step (the default, recent_steps=1): demoted
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=11, diversity_lambda=0.0, recent_steps=1, demote_p=1.0)
    assert slots.tolist() == [[0]]  # retrieved 2 steps ago: 11 - 9 <= 1 is false, not recent
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=11, diversity_lambda=0.0, recent_steps=2, demote_p=1.0)
    assert slots.tolist() == [[1]]  # ... but within the last 2 steps
    # recent_steps=0: nothing is recent; an entry retrieved at this same step is not recent either.
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=10, diversity_lambda=0.0, recent_steps=0, demote_p=1.0)
    assert slots.tolist() == [[0]]
    _, slots, _ = _retrieve(b, [[1, 0]], 0, step=9, diversity_lambda=0.0, recent_steps=1, demote_p=1.0)
    assert slots.tolist() == [[0]]
    b2 = b.replace(last_retrieved_step=jnp.array([-1, -1]))
    _, slots, _ = _retrieve(b2, [[1, 0]], 0, step=0, diversity_lambda=0.0, recent_steps=5, demote_p=1.0)
    assert slots.tolist() == [[0]]  # -1 never counts as recent, even when step - (-1) <= recent_steps


def test_make_retriever_binds_the_hyperparameters_once():
    b = _filled([[1, 0.0], [1, 0.05], [0, 1]]).replace(last_retrieved_step=jnp.array([9, -1, -1]),
                                                      total_credit_sum=jnp.array([0.0, 1.0, 0.0]),
                                                      total_credit_count=jnp.array([0, 1, 0]))
    q, task, mask = jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.zeros(2, jnp.int32), jnp.array([True, False])
    kw = dict(candidates=2, diversity_lambda=0.0, recent_steps=1, demote_p=1.0, min_similarity=0.5)
    r = B.make_retriever(**kw, used_bonus=1e-6, credit_bonus=1e-4)
    got = jax.jit(r.retrieve)(b, q, task, jax.random.key(0), 10, query_mask=mask)
    want = B.retrieve(b, q, task, jax.random.key(0), 10, query_mask=mask, **kw)
    chex.assert_trees_all_equal(got, want)
    assert got[1].tolist() == [[1], [-1]]  # slot 0 was retrieved in the previous step: demoted (p = 1)
    chex.assert_trees_all_equal(r.best(b, q, task),
                                B.retrieve_best(b, q, task, min_similarity=0.5, used_bonus=1e-6, credit_bonus=1e-4))
    # cosine 1 vs 0.9988: the credit bonus (1e-4) does not outweigh it; the floor 0.5 keeps slot 2 for query 2
    assert [x.tolist() for x in r.best(b, q, task)] == [[0, 2], [True, True]]


def test_make_bank_ops_binds_the_hyperparameters_once():
    kw = dict(candidates=2, diversity_lambda=0.0, recent_steps=1, demote_p=1.0, min_similarity=0.5)
    ops = B.make_bank_ops(capacity=3, entry_len=L, key_dim=D, eviction="lru", prune_below=0.5, **kw)
    chex.assert_trees_all_equal(ops.init(), B.init(3, L, D))
    b = _filled([[1, 0.0], [1, 0.05], [0, 1]]).replace(last_retrieved_step=jnp.array([9, -1, 4]))
    # a full bank: lru evicts the least recently used entry (last use = max(retrieved, updated) = [9, 0, 4])
    got = jax.jit(ops.add)(b, _tok(7), 2, jnp.array([0.0, 1.0]), 0, 11, 42)
    chex.assert_trees_all_equal(got, B.add(b, _tok(7), 2, jnp.array([0.0, 1.0]), 0, 11, 42, eviction="lru"))
    assert int(got[1]) == 1
    rows = (jnp.stack([_tok(7), _tok(8)]), jnp.array([2, 2]), jnp.eye(2), jnp.zeros(2, jnp.int32), 11,
            jnp.array([42, 43]), jnp.array([True, True]))
    chex.assert_trees_all_equal(ops.add_many(b, *rows), B.add_many(b, *rows, eviction="lru"))
    reward, credited = jnp.array([0.25, 0.5, -1.0]), jnp.array([True, True, False])
    pruned, n = ops.prune(b, reward, credited)
    chex.assert_trees_all_equal((pruned, n), B.prune(b, reward, credited, 0.5))
    assert pruned.valid.tolist() == [False, True, True] and int(n) == 1  # 0.5 is not below 0.5; slot 2 uncredited
    q, task = jnp.array([[1.0, 0.0]]), jnp.zeros(1, jnp.int32)
    chex.assert_trees_all_equal(ops.retrieve(b, q, task, jax.random.key(0), 10),
                                B.retrieve(b, q, task, jax.random.key(0), 10, **kw))
    chex.assert_trees_all_equal(ops.best(b, q, task), B.retrieve_best(b, q, task, min_similarity=0.5))
    assert int(ops.size(pruned)) == 2
    with pytest.raises(ValueError):
        B.make_bank_ops(capacity=3, entry_len=L, key_dim=D, eviction="newest")


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_demotion_frequency_binomial(p):
    b = _filled([[1, 0.0], [1, 0.3], [0, 1]]).replace(last_retrieved_step=jnp.array([9, 9, -1]))
    q = 4000
    rate = []
    for seed in range(2):
        _, slots, _ = _retrieve(b, jnp.tile(jnp.array([[1.0, 0.0]]), (q, 1)), 0, step=10, rng=jax.random.key(seed),
                                diversity_lambda=0.0, recent_steps=1, demote_p=p)
        s = np.asarray(slots[:, 0])
        assert set(s.tolist()) <= {0, 1}
        rate.append((s == 1).mean())
    sigma = math.sqrt(p * (1 - p) / q)
    for r in rate:
        assert abs(r - p) < 5 * sigma
    assert rate[0] != rate[1]  # different keys, different draws


def test_identical_queries_share_one_snapshot():
    b = _filled([[1, 0.0], [1, 0.1]])
    nb, slots, _ = _retrieve(b, jnp.tile(jnp.array([[1.0, 0.0]]), (6, 1)), 0, step=3)
    assert slots[:, 0].tolist() == [0] * 6  # no query saw another's count increment or recency
    assert nb.times_retrieved.tolist() == [6, 0] and nb.last_retrieved_step.tolist() == [3, -1]
    b = b.replace(last_retrieved_step=jnp.array([2, -1]))
    _, slots, _ = _retrieve(b, jnp.tile(jnp.array([[1.0, 0.0]]), (6, 1)), 0, step=3, diversity_lambda=0.0,
                            recent_steps=1, demote_p=1.0)
    assert slots[:, 0].tolist() == [1] * 6


def test_apply_merge():
    b = _filled([[1, 0], [0, 1], [1, 1], [0, -1]], tasks=[0, 0, 0, 1])
    b = b.replace(valid=b.valid.at[2].set(False))
    toks = jnp.stack([_tok(40), _tok(41), _tok(42)])
    nb, slots = B.apply_merge(b, jnp.array([1, 0, 2, 1, -1]), toks, jnp.array([2, 3, 1]),
                              jnp.array([True, False, True]), 0, 7, 77)
    # sources 0 and 1 invalidated (2 was already invalid and does not contribute to the key)
    assert slots.tolist() == [0, -1, 1]
    assert nb.valid.tolist() == [True, True, False, True]
    np.testing.assert_allclose(nb.keys[0], [math.sqrt(0.5)] * 2, atol=1e-6)
    np.testing.assert_allclose(nb.keys[1], [math.sqrt(0.5)] * 2, atol=1e-6)
    assert nb.source.tolist()[:2] == [77, 77] and nb.created_step.tolist()[:2] == [7, 7]
    assert nb.tokens[:2, 0].tolist() == [40, 42] and nb.insert_order.tolist()[:2] == [4, 5]
    # no valid source: nothing happens
    nb, slots = B.apply_merge(b, jnp.array([2, -1]), toks, jnp.array([2, 3, 1]), jnp.ones(3, bool), 0, 7, 77)
    assert slots.tolist() == [-1, -1, -1]
    chex.assert_trees_all_close(nb, b)


def test_credit_adds_to_the_lifetime_totals_of_valid_entries():
    b = _filled([[1, 0], [0, 1], [1, 1]]).replace(valid=jnp.array([True, True, False]))
    b = B.credit(b, jnp.array([1.0, 2.0, 5.0]), jnp.array([3, 2, 5]))  # slot 2 is not valid: ignored
    b = B.credit(b, jnp.array([-1.0, 0.0, 1.0]), jnp.array([1, 0, 1]))
    assert b.total_credit_sum.tolist() == [0.0, 2.0, 0.0] and b.total_credit_count.tolist() == [4, 2, 0]
    nb, slot = B.add(b.replace(valid=jnp.array([True, False, True])), jnp.zeros((L,), jnp.int32), 1,
                     jnp.ones((D,)), 0, 3, 9)
    assert int(slot) == 1 and int(nb.total_credit_count[1]) == 0  # a new entry starts without credit


def test_size_and_family_counts():
    b = _filled([[1, 0]] * 4, tasks=[0, 2, 2, 5]).replace(valid=jnp.array([True, True, True, False]))
    assert int(B.size(b)) == 3
    assert B.family_counts(b, 4).tolist() == [1, 0, 2, 0]


def _script(bank, rng):
    """add_many -> retrieve -> credit -> merge: the loop's order of operations."""
    r1, r2 = jax.random.split(rng)
    keys = jax.random.normal(r1, (3, D))
    bank, _ = B.add_many(bank, jnp.ones((3, L), jnp.int32), jnp.array([1, 2, 3]), keys, jnp.array([0, 0, 1]),
                         4, jnp.array([1, 2, 3]), jnp.array([True, True, True]))
    bank, slots, found = B.retrieve(bank, keys, jnp.array([0, 0, 1]), r2, 4, top_k=1)
    per = outcome_rewards(jnp.array([1.0, 0.0, 1.0]), jnp.where(found[:, 0], slots[:, 0], -1), bank.capacity)
    bank = B.credit(bank, per.sum, per.count)
    mean = per.mean
    bank, _ = B.apply_merge(bank, slots[:, 0], jnp.ones((1, L), jnp.int32), jnp.array([2]), jnp.array([True]), 0,
                            4, 9)
    return bank, mean


def test_jit_equals_eager_vmap_and_retrace_guard():
    bank = _filled([[1, 0], [0, 1]], capacity=4)
    chex.clear_trace_counter()
    script = jax.jit(chex.assert_max_traces(_script, n=1))
    chex.assert_trees_all_close(_script(bank, jax.random.key(3)), script(bank, jax.random.key(3)))
    banks = jax.tree.map(lambda x: jnp.stack([x, x, x]), bank)
    rngs = jax.random.split(jax.random.key(5), 3)
    vb, vmean = jax.jit(jax.vmap(_script))(banks, rngs)
    for i in range(3):  # new values, same shapes: no retrace of `script`
        chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: x[i], (vb, vmean)), script(bank, rngs[i]))
