"""Thompson retrieval on literal bank statistics (jitted and not, same key -> same draw) and the extractor
loss's op-token weight on hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as B
from crl_jax import losses as L
from crl_jax.bank.retrieve import beta_counts, thompson_draws


def test_beta_counts_literal():
    wins, losses = beta_counts(jnp.array([2.0, -1.0, 0.0, 3.0]), jnp.array([4, 3, 0, 3]))
    assert wins.tolist() == [3.0, 1.0, 0.0, 3.0]
    assert losses.tolist() == [1.0, 2.0, 0.0, 0.0]


def test_thompson_draws_mean_and_key():
    s, c = jnp.array([2.0, -1.0, 0.0]), jnp.array([4, 3, 0])
    np.testing.assert_allclose(thompson_draws(s, c, None, 2), [[4 / 6, 2 / 5, 0.5]] * 2, rtol=1e-6)
    k = jax.random.key(3)
    a = thompson_draws(s, c, k, 5)
    b = jax.jit(thompson_draws, static_argnums=3)(s, c, k, 5)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # jitted == eager, same key -> same draws
    assert a.shape == (5, 3) and bool(((a > 0) & (a < 1)).all())
    assert not np.array_equal(np.asarray(a), np.asarray(thompson_draws(s, c, jax.random.key(4), 5)))


def _tied_bank(credit_sum, credit_count, keys=None):
    """One entry per credit value; all share one key (one level) unless `keys` are given."""
    n = len(credit_sum)
    keys = jnp.broadcast_to(jnp.asarray([0.6, 0.8]), (n, 2)) if keys is None else jnp.asarray(keys, jnp.float32)
    b = B.add_many(B.init(n, 2, 2), jnp.ones((n, 2), jnp.int32), jnp.full((n,), 2), keys, jnp.zeros((n,), jnp.int32),
                   0, jnp.arange(n), jnp.ones((n,), bool))[0]
    return b.replace(total_credit_sum=jnp.asarray(credit_sum, jnp.float32),
                     total_credit_count=jnp.asarray(credit_count, jnp.int32))


def _ret(bank, q, rng, select="thompson", **kw):
    q = jnp.asarray(q, jnp.float32)
    return B.retrieve(bank, q, jnp.zeros(q.shape[:1], jnp.int32), rng, 7, shared_ties=True, select=select, **kw)


@pytest.mark.parametrize("jit", [False, True])
def test_thompson_exploits_validated_and_explores_untried(jit):
    # slot 0: 20 wins; slot 1: 20 losses; slot 2: never credited (Beta(1, 1)); 400 queries of the one level
    bank = _tied_bank([20.0, -20.0, 0.0], [20, 20, 0])
    q = jnp.broadcast_to(jnp.asarray([0.6, 0.8]), (400, 2))
    f = jax.jit(_ret, static_argnames=("select",)) if jit else _ret
    nb, slots, found = f(bank, q, jax.random.key(0))
    counts = np.bincount(np.asarray(slots[:, 0]), minlength=3)
    # P(slot 2) = P(U > Beta(21, 1)) = 1/22: ~18 of 400; the 20-loss entry never beats both
    assert found.all() and counts[1] == 0 and 300 < counts[0] < 395 and 5 <= counts[2] <= 40, counts
    assert np.asarray(nb.times_retrieved).tolist() == counts.tolist()  # the usage bookkeeping is unchanged
    again = f(bank, q, jax.random.key(0))[1]
    np.testing.assert_array_equal(np.asarray(slots), np.asarray(again))  # same key, same draw
    # no rng: the posterior means (21/22, 1/22, 1/2) decide, every query the validated entry
    assert _ret(bank, q[:3], None)[1][:, 0].tolist() == [0, 0, 0]


def test_thompson_orders_within_a_similarity_rank_only():
    # the credited entry has the lower similarity: rank wins over any draw
    bank = _tied_bank([20.0, -20.0], [20, 20], keys=[[0.6, 0.8], [1.0, 0.0]])
    _, slots, _ = _ret(bank, jnp.broadcast_to(jnp.asarray([1.0, 0.0]), (50, 2)), jax.random.key(1))
    assert (slots[:, 0] == 1).all()


def test_thompson_ignores_usage_and_recency():
    # the diversity rule would avoid the heavily, recently used entry; Thompson keeps the validated one
    bank = _tied_bank([30.0, 0.0], [30, 0]).replace(times_retrieved=jnp.array([500, 0]),
                                                     last_retrieved_step=jnp.array([6, -1]))
    q = jnp.asarray([[0.6, 0.8]])
    assert _ret(bank, q, None)[1].tolist() == [[0]]
    assert _ret(bank, q, None, select="diversity", demote_p=0.0)[1].tolist() == [[1]]
    with pytest.raises(ValueError, match="select"):
        _ret(bank, q, None, select="ucb")


def test_cispo_token_weight_literal():
    # ratio 1 (logp = behaviour): d loss / d logp_bt = -w_bt A_b / (valid tokens); num = -sum w A logp
    logp = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]])
    mask = jnp.array([[True, True, True], [True, True, False]])
    adv = jnp.array([1.0, -2.0])
    tw = L.op_token_weights(jnp.broadcast_to(jnp.arange(3), (2, 3)), 4.0)
    assert tw.tolist() == [[4.0, 1.0, 1.0], [4.0, 1.0, 1.0]]
    num, den, _ = L.cispo_loss_parts(logp, logp, adv, mask, token_weight=tw)
    # row 0: -(1)(4(-1) + (-2) + (-3)) = 9; row 1: -(-2)(4(-0.5) + (-1.5)) = -7
    assert float(den) == 5.0 and float(num) == pytest.approx(2.0)
    num1, _, _ = L.cispo_loss_parts(logp, logp, adv, mask)
    assert float(num1) == pytest.approx(6.0 - 4.0)  # unweighted: row 0 6, row 1 -4
    g = jax.grad(lambda lp: L.cispo_loss_parts(lp, logp, adv, mask, token_weight=tw)[0])(logp)
    np.testing.assert_allclose(np.asarray(g), [[-4.0, -1.0, -1.0], [8.0, 2.0, 0.0]])


@pytest.mark.parametrize("outcome_last", [False, True])
def test_distill_prompt_outcome_last_literal(outcome_last):
    from crl_jax.extractor.ops import build_distill_prompt
    A = jnp.asarray
    p, n = jax.jit(lambda: build_distill_prompt(A([100]), (A([7, 0]), 1), A([10, 11, 12, 0]), 4, (A([50]), 1),
                                                A([60, 0]), 1, 12, trajectory_prefix=A([90]), retrieved_prefix=A([91]),
                                                suffix=A([99]), moves_last=True, outcome_last=outcome_last))()
    # moves_last: header, goal, retrieved, moves, outcome, label; outcome_last swaps the last two, so every move
    # keeps its distance from the answer
    tail = [99, 50] if outcome_last else [50, 99]
    assert np.asarray(p).tolist() == [100, 7, 91, 60, 90, 10, 11, 12, 0] + tail + [0] and int(n) == 11
