"""Extractor sample buffer: slots and ids, overflow accounting, credit routing, pop order, repeat weights."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.extractor import buffer as XB

P, R = 2, 3
_add = jax.jit(XB.add_many)
_credit = jax.jit(XB.credit)
_pop = jax.jit(XB.pop_batch, static_argnames=("batch",))


def _rows(vals, mask=None):
    """Rows whose prompt / response tokens and log-probs all equal vals[i]."""
    v = jnp.asarray(vals, jnp.int32)
    m = v.shape[0]
    return (jnp.repeat(v[:, None], P, 1), jnp.full((m,), P), jnp.repeat(v[:, None], R, 1), jnp.full((m,), R),
            -jnp.repeat(v[:, None], R, 1).astype(jnp.float32) / 10,
            jnp.ones(m, bool) if mask is None else jnp.asarray(mask))


def _add_rows(buf, vals, step, mask=None):
    p, pl, r, rl, lp, m = _rows(vals, mask)
    return _add(buf, p, pl, r, rl, lp, step, m)


def _credit_ids(buf, ids, rewards, counts=None):
    e = len(ids)
    counts = jnp.ones(e, jnp.int32) if counts is None else jnp.asarray(counts, jnp.int32)
    return _credit(buf, jnp.asarray(ids, jnp.int32), jnp.asarray(rewards, jnp.float32), counts, jnp.ones(e, bool))


def test_add_ids_slots_and_overflow():
    buf = XB.init(3, P, R)
    buf, ids = _add_rows(buf, [10, 11, 12, 13], step=0, mask=[True, False, True, True])
    assert ids.tolist() == [0, -1, 1, 2] and int(buf.next_id) == 3
    assert buf.sample_id.tolist() == [0, 1, 2] and buf.prompt[:, 0].tolist() == [10, 12, 13]
    # Full: the oldest id is evicted. Sample 0 was never trained -> overflow.
    buf, ids = _add_rows(buf, [20], step=1)
    assert ids.tolist() == [3] and buf.sample_id.tolist() == [3, 1, 2] and int(buf.overflow_count) == 1
    # Sample 1 trained (no pending reward): evicting it is not an overflow.
    buf = _credit_ids(buf, [1], [1.0])
    buf, _ = _pop(buf, 1, 2)
    buf, _ = _add_rows(buf, [21], step=3)
    assert buf.sample_id.tolist() == [3, 4, 2] and int(buf.overflow_count) == 1
    # Sample 2 has pending reward: evicting it is an overflow (reward lost).
    buf = _credit_ids(buf, [2], [1.0])
    buf, _ = _add_rows(buf, [22], step=4)
    assert buf.sample_id.tolist() == [3, 4, 5] and int(buf.overflow_count) == 2
    assert int(buf.created_step[2]) == 4 and int(buf.times_trained[1]) == 0  # slot 1 is the new sample 4


def test_credit_routes_by_id_and_ignores_evicted():
    buf = XB.init(2, P, R)
    buf, _ = _add_rows(buf, [1, 2, 3], step=0)  # id 0 evicted
    buf = _credit(buf, jnp.array([0, 1, 2, 1, -1, 7]), jnp.array([1.0, 0.5, -1.0, 1.0, 9.0, 9.0]),
                  jnp.array([1, 1, 2, 1, 1, 1]), jnp.array([True, True, True, True, True, False]))
    assert buf.sample_id.tolist() == [2, 1]
    assert buf.reward_sum.tolist() == [-1.0, 1.5] and buf.reward_count.tolist() == [2, 2]
    assert buf.total_uses.tolist() == [2, 2]
    assert int(buf.dropped) == 1  # id 0 (evicted); id -1 and the masked row are not counted
    assert bool(XB.ready(buf, 2)) and not bool(XB.ready(buf, 3))


def test_pop_order_padding_and_marking():
    buf = XB.init(5, P, R)
    buf, _ = _add_rows(buf, [10, 11, 12, 13, 14], step=0)
    buf = _credit_ids(buf, [3, 1, 4, 1], [1.0, -1.0, 0.5, 0.0])
    buf, out = _pop(buf, 4, 6)
    assert out["sample_id"].tolist() == [1, 3, 4, -1]  # oldest pending first, padded
    assert out["valid"].tolist() == [True, True, True, False]
    np.testing.assert_allclose(out["reward"], [-0.5, 1.0, 0.5, 0.0])
    assert out["prompt"][:, 0].tolist() == [11, 13, 14, 0] and out["response_len"].tolist() == [R, R, R, 0]
    np.testing.assert_allclose(out["behavior_logp"][:, 0], [-1.1, -1.3, -1.4, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out["weight"], [1.0, 1.0, 1.0, 0.0])
    assert buf.times_trained.tolist() == [0, 1, 0, 1, 1]
    assert buf.last_trained_step.tolist() == [-1, 6, -1, 6, 6]
    assert buf.reward_count.tolist() == [0, 0, 0, 0, 0] and buf.reward_sum.tolist() == [0.0] * 5
    assert bool(buf.valid.all())  # samples stay in the buffer after training
    assert not bool(XB.ready(buf, 1))


def test_repeat_weights_literal():
    w = XB.repeat_weights(jnp.array([0, 1, 3, 2, 2, 0]), jnp.array([-1, 3, 1, 5, 4, -1]), 5, cooldown=1, power=0.5)
    np.testing.assert_allclose(w, [1.0, 2 ** -0.5, 0.5, 0.0, 0.0, 1.0], rtol=1e-6)  # trained at step 4 or 5: 0
    w = XB.repeat_weights(jnp.array([1, 1, 1]), jnp.array([3, 1, -1]), 4, cooldown=2, power=1.0)
    np.testing.assert_allclose(w, [0.0, 0.5, 0.5], rtol=1e-6)  # step - last = 1 <= 2: cooling; 3 > 2: not


def test_retrained_sample_weights_through_pops():
    buf = XB.init(3, P, R)
    buf, _ = _add_rows(buf, [1], step=0)
    weights = []
    for step in (2, 2, 3, 5):
        buf = _credit_ids(buf, [0], [1.0])
        buf, out = _pop(buf, 1, step)
        weights.append(float(out["weight"][0]))
    # times_trained 0 -> w 1; same step again -> cooldown 0; the next step (trained at the previous one) -> 0; two
    # steps later (1+3)^-0.5
    np.testing.assert_allclose(weights, [1.0, 0.0, 0.0, 0.5], rtol=1e-6)
    assert int(buf.times_trained[0]) == 4


def test_jit_eager_vmap_and_retrace_guard():
    def script(buf, rewards, step):
        p, pl, r, rl, lp, m = _rows([1, 2, 3, 4])
        buf, ids = XB.add_many(buf, p, pl, r, rl, lp, step, m)
        buf = XB.credit(buf, ids, rewards, jnp.ones(4, jnp.int32), jnp.ones(4, bool))
        return XB.pop_batch(buf, 2, step)

    buf = XB.init(3, P, R)
    rewards = jnp.array([1.0, -1.0, 0.5, 0.25])
    chex.clear_trace_counter()
    jitted = jax.jit(chex.assert_max_traces(script, n=1))
    eager = script(buf, rewards, 0)
    chex.assert_trees_all_close(eager, jitted(buf, rewards, 0))
    assert eager[1]["sample_id"].tolist() == [1, 2]
    bufs = jax.tree.map(lambda x: jnp.stack([x, x]), buf)
    vout = jax.jit(jax.vmap(script, in_axes=(0, 0, None)))(bufs, jnp.stack([rewards, -rewards]), 1)
    for step in (1, 2):  # new values, same shapes: no retrace
        out = jitted(buf, -rewards, step)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[1], vout), jitted(buf, -rewards, 1))
    assert int(out[1]["sample_id"][0]) == 1


def test_bad_batch_raises():
    with pytest.raises(ValueError):
        XB.pop_batch(XB.init(2, P, R), 3, 0)


def test_make_buffer_ops_binds_the_hyperparameters_once():
    ops = XB.make_buffer_ops(capacity=4, prompt_len=P, response_len=R, batch=2, cooldown=2, power=1.0)
    buf = ops.init()
    chex.assert_trees_all_equal(buf, XB.init(4, P, R))
    buf, ids = ops.add_many(buf, *_rows([5, 6, 7])[:5], 0, jnp.ones(3, bool))
    buf = ops.credit(buf, ids, jnp.array([1.0, -1.0, 0.5]), jnp.ones(3, jnp.int32), jnp.array([True, False, True]))
    assert bool(ops.ready(buf)) and not bool(XB.ready(buf, 3))  # batch 2 bound: two samples pending
    weights = []
    for step in (3, 4, 7):  # then sample 2 alone, credited again: inside the cooldown of 2, then after it
        got = jax.jit(ops.pop_batch)(buf, step)
        chex.assert_trees_all_equal(got, XB.pop_batch(buf, 2, step, cooldown=2, power=1.0))
        weights.append(got[1]["weight"].tolist())
        buf = ops.credit(got[0], ids, jnp.full(3, 0.25), jnp.ones(3, jnp.int32), jnp.array([False, False, True]))
        assert not bool(ops.ready(buf))
    assert got[1]["sample_id"].tolist() == [2, -1]
    np.testing.assert_allclose(weights, [[1.0, 1.0], [0.0, 0.0], [1 / 3, 0.0]], rtol=1e-6)  # (1 + 2)^-1
    with pytest.raises(ValueError):
        XB.make_buffer_ops(capacity=2, prompt_len=P, response_len=R, batch=3)


def test_store_returns_literal():
    """RETURN decisions (extraction.return_samples): at most `num` of the candidates, in episode order,
    each stored with the response length given (the op token alone) and credited once with its value."""
    from crl_jax.extractor.distill import store_returns

    buf = XB.init(8, 3, 4)
    N = 5
    prompts = jnp.arange(N * 2, dtype=jnp.int32).reshape(N, 2)  # narrower than the buffer: padded
    plen = jnp.full((N,), 2, jnp.int32)
    resp = jnp.arange(N * 3, dtype=jnp.int32).reshape(N, 3) + 100
    logp = -jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 3) / 10
    is_ret = jnp.array([True, False, True, True, False])
    ok = jnp.array([True, True, True, False, True])  # episode 3's group has no free member
    value = jnp.array([0.5, 9.0, -0.25, 9.0, 9.0])
    key = jax.random.key(0)
    # enough room: both candidates (0 and 2), ids in episode order
    out, chosen = jax.jit(lambda b: store_returns(b, is_ret, prompts, plen, resp, jnp.ones((N,), jnp.int32),
                                                  logp, value, ok, 4, key, 3))(buf)
    np.testing.assert_array_equal(chosen, [True, False, True, False, False])
    assert out.sample_id[:3].tolist() == [0, 1, -1]
    np.testing.assert_array_equal(out.response[0], [100, 101, 102, 0])
    np.testing.assert_array_equal(out.response[1], [106, 107, 108, 0])
    np.testing.assert_array_equal(out.prompt[1], [4, 5, 0])
    assert out.response_len[:2].tolist() == [1, 1]
    np.testing.assert_allclose(out.behavior_logp[1, :3], [-0.6, -0.7, -0.8], rtol=1e-6)
    np.testing.assert_allclose(out.reward_sum[:2], [0.5, -0.25])
    assert out.reward_count[:2].tolist() == [1, 1] and int(out.created_step[0]) == 3
    assert int(XB.pending(out)) == 2
    # a cap of 1 keeps exactly one of the two candidates
    one, chosen1 = store_returns(buf, is_ret, prompts, plen, resp, jnp.ones((N,), jnp.int32), logp, value, ok, 1,
                                 key, 3)
    assert int(chosen1.sum()) == 1 and bool((chosen1 <= (is_ret & ok)).all())
    assert int(XB.pending(one)) == 1
    # 0: nothing stored, the buffer unchanged
    none, chosen0 = store_returns(buf, is_ret, prompts, plen, resp, jnp.ones((N,), jnp.int32), logp, value, ok, 0,
                                  key, 3)
    assert not bool(chosen0.any())
    chex.assert_trees_all_equal(none, buf)
