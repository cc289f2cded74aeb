"""Literal hand-computed values of the small loss functions of crl_jax.losses (rlax style, jitted and not):
per-token terms, aggregations and diagnostics, each on its own."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from crl_jax import losses as L

LN = math.log
NEG_INF = -np.inf


def _v(self, fn, **kw):
    """self.variant over a function with its static keyword arguments bound."""
    return self.variant(functools.partial(fn, **kw))


class PerTokenTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_log_ratio_literal(self):
        logp = jnp.array([[-1.0, -2.0, NEG_INF], [-0.5, -0.5, -0.5]])
        beh = jnp.array([[-1.5, -1.0, 0.0], [-0.5, NEG_INF, -1.0]])
        mask = jnp.array([[1, 1, 0], [1, 0, 1]], bool)
        log_r = self.variant(L.log_ratio)(logp, beh, mask)
        np.testing.assert_allclose(log_r, [[0.5, -1.0, 0.0], [0.0, 0.0, 0.5]])  # 0 off the mask, no inf
        self.assertEqual(log_r.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_log_ratio_literal(self):
        f = self.variant(L.sequence_log_ratio)
        np.testing.assert_allclose(f(jnp.array([0.5, -1.0, 0.0]), jnp.array([1, 1, 0], bool)), [-0.25] * 3)
        np.testing.assert_array_equal(f(jnp.zeros(3), jnp.zeros(3, bool)), [0.0, 0.0, 0.0])  # empty: 0
        # Batched by vmap: one mean per row.
        rows = self.variant(jax.vmap(L.sequence_log_ratio))(
            jnp.array([[0.5, -1.0, 0.0], [0.3, 0.0, 0.0]]), jnp.array([[1, 1, 0], [1, 0, 0]], bool))
        np.testing.assert_allclose(rows, [[-0.25] * 3, [0.3] * 3], rtol=1e-6)

    def test_sequence_log_ratio_is_unbatched(self):
        with self.assertRaises(AssertionError):
            L.sequence_log_ratio(jnp.zeros((2, 3)), jnp.ones((2, 3), bool))

    @chex.variants(with_jit=True, without_jit=True)
    def test_ppo_clip_token_loss_literal(self):
        # -min(r A, clip(r, .8, 1.2) A) for r = 1, 1.5, 0.5 with A = 1 and r = 1.5, 0.5, 1.1 with A < 0.
        log_r = jnp.log(jnp.array([1.0, 1.5, 0.5, 1.5, 0.5, 1.1]))
        adv = jnp.array([1.0, 1.0, 1.0, -1.0, -1.0, -2.0])
        loss = _v(self, L.ppo_clip_token_loss, clip_eps=0.2)(log_r, adv)
        np.testing.assert_allclose(loss, [-1.0, -1.2, -0.5, 1.5, 0.8, 2.2], rtol=1e-6)
        # One advantage per sequence broadcast over its tokens: [B, T] with [B, 1].
        loss = _v(self, L.ppo_clip_token_loss, clip_eps=0.2)(log_r.reshape(2, 3), jnp.array([[1.0], [-1.0]]))
        np.testing.assert_allclose(loss, [[-1.0, -1.2, -0.5], [1.5, 0.8, 1.1]], rtol=1e-6)

    def test_ppo_clip_token_loss_gradient(self):
        # d l / d log r = -r A where the unclipped term is the min, 0 where the clip binds.
        log_r = jnp.log(jnp.array([1.0, 1.5, 0.5, 1.5, 0.5]))
        adv = jnp.array([1.0, 1.0, 1.0, -1.0, -1.0])
        g = jax.jit(jax.grad(lambda x: L.ppo_clip_token_loss(x, adv).sum()))(log_r)
        np.testing.assert_allclose(g, [-1.0, 0.0, -0.5, 1.5, 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ppo_clipped_literal(self):
        log_r = jnp.log(jnp.array([1.0, 1.5, 0.5, 1.5, 0.5, 1.5]))
        adv = jnp.array([1.0, 1.0, 1.0, -1.0, -1.0, 0.0])
        clipped = _v(self, L.ppo_clipped, clip_eps=0.2)(log_r, adv)
        np.testing.assert_array_equal(clipped, [False, True, False, False, True, False])

    @chex.variants(with_jit=True, without_jit=True)
    def test_cispo_token_loss_literal(self):
        # w = clip(r, .9, 1.1) = [1.05, 1.1, 0.9, -]; l = -w A logp on the mask.
        logp = jnp.array([-1.0, -2.0, -0.5, NEG_INF])
        log_r = jnp.log(jnp.array([1.05, 1.5, 0.5, 2.0]))
        adv = jnp.array([1.0, 1.0, -2.0, 1.0])
        mask = jnp.array([1, 1, 1, 0], bool)
        loss = _v(self, L.cispo_token_loss, eps_low=0.1, eps_high=0.1)(logp, log_r, adv, mask)
        np.testing.assert_allclose(loss, [1.05, 2.2, -0.9, 0.0], rtol=1e-6)

    def test_cispo_token_loss_gradient_is_minus_w_a(self):
        logp = jnp.array([-1.0, -2.0, -0.5, NEG_INF])
        log_r = jnp.log(jnp.array([1.05, 1.5, 0.5, 2.0]))
        adv = jnp.array([1.0, 1.0, -2.0, 1.0])
        mask = jnp.array([1, 1, 1, 0], bool)
        # The weight is a stop-gradient: no gradient reaches log_r, and -inf off the mask stays finite.
        g_lp, g_lr = jax.jit(jax.grad(lambda lp, lr: L.cispo_token_loss(lp, lr, adv, mask).sum(),
                                      argnums=(0, 1)))(logp, log_r)
        np.testing.assert_allclose(g_lp, [-1.05, -1.1, 1.8, 0.0], rtol=1e-6)
        np.testing.assert_array_equal(g_lr, 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_cispo_clipped_literal(self):
        log_r = jnp.log(jnp.array([1.05, 1.5, 0.5, 2.0]))
        np.testing.assert_array_equal(_v(self, L.cispo_clipped, eps_low=0.1, eps_high=0.2)(log_r),
                                      [False, True, True, True])
        np.testing.assert_array_equal(_v(self, L.cispo_clipped, eps_low=0.6, eps_high=0.6)(log_r),
                                      [False, False, False, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_entropy_literal(self):
        # p = [.75, .25]: H = -(.75 ln .75 + .25 ln .25); uniform over 4: ln 4.
        logits = jnp.array([[LN(3.0), 0.0, -1e30, -1e30], [0.0, 0.0, 0.0, 0.0]])
        np.testing.assert_allclose(self.variant(L.token_entropy)(logits), [0.5623351, LN(4.0)], rtol=1e-6)


class AggregationTest(chex.TestCase):
    LOSS = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # 0 off the mask
    MASK = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
    W = jnp.array([1.0, 0.5, 7.0])  # the empty row's weight must not count

    @chex.variants(with_jit=True, without_jit=True)
    def test_seq_mean_token_mean_literal(self):
        # sequence means [2, 4, -]: unweighted (2 + 4) / 2; weighted (1*2 + 0.5*4) / (1 + 0.5).
        num, den = self.variant(L.seq_mean_token_mean)(self.LOSS, self.MASK)
        np.testing.assert_allclose([num, den], [6.0, 2.0])
        num, den = self.variant(L.seq_mean_token_mean)(self.LOSS, self.MASK, self.W)
        np.testing.assert_allclose([num, den], [4.0, 1.5])

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_mean_literal(self):
        # unweighted 10 / 4 tokens; weighted (1*6 + 0.5*4) / (1*3 + 0.5*1).
        num, den = self.variant(L.token_mean)(self.LOSS, self.MASK)
        np.testing.assert_allclose([num, den], [10.0, 4.0])
        num, den = self.variant(L.token_mean)(self.LOSS, self.MASK, self.W)
        np.testing.assert_allclose([num, den], [8.0, 3.5])

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_batch_is_zero_over_zero(self):
        for agg in (L.seq_mean_token_mean, L.token_mean):
            num, den = self.variant(agg)(jnp.zeros((2, 3)), jnp.zeros((2, 3), bool), jnp.ones(2))
            np.testing.assert_array_equal([num, den], [0.0, 0.0])

    def test_bad_weight_shape_raises(self):
        for agg in (L.seq_mean_token_mean, L.token_mean):
            with self.assertRaises(AssertionError):
                agg(self.LOSS, self.MASK, jnp.ones(2))


class DiagnosticsTest(chex.TestCase):
    LOG_R = jnp.log(jnp.array([2.0, 0.5, 1.0, 9.0]))
    MASK = jnp.array([1, 1, 1, 0], bool)

    @chex.variants(with_jit=True, without_jit=True)
    def test_masked_mean_literal(self):
        f = self.variant(L.masked_mean)
        np.testing.assert_allclose(f(jnp.array([1.0, 2.0, 3.0, 4.0]), jnp.array([1, 0, 1, 0], bool)), 2.0)
        self.assertEqual(float(f(jnp.ones(3), jnp.zeros(3, bool))), 0.0)  # empty mask: 0, not NaN

    @chex.variants(with_jit=True, without_jit=True)
    def test_clip_fraction_literal(self):
        clipped = jnp.array([1, 0, 1, 1], bool)
        np.testing.assert_allclose(self.variant(L.clip_fraction)(clipped, self.MASK), 2 / 3, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ratio_mean_literal(self):
        np.testing.assert_allclose(self.variant(L.ratio_mean)(self.LOG_R, self.MASK), 3.5 / 3, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_approx_kl_literal(self):
        # (r - 1) - ln r: r = 2 -> 1 - ln 2, r = 0.5 -> ln 2 - 0.5, r = 1 -> 0; mean over 3 = 0.5 / 3.
        kl = self.variant(L.approx_kl)(self.LOG_R, self.MASK)
        np.testing.assert_allclose(kl, 0.5 / 3, rtol=1e-5)
        np.testing.assert_allclose(self.variant(L.approx_kl)(self.LOG_R[:1], self.MASK[:1]), 1 - LN(2.0),
                                   rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mean_entropy_literal(self):
        ent = jnp.array([0.5, 1.0, 1.5])
        np.testing.assert_allclose(self.variant(L.mean_entropy)(ent, jnp.array([1, 1, 0], bool)), 0.75)

    def test_diagnostics_carry_no_gradient(self):
        g = jax.jit(jax.grad(lambda x: L.ratio_mean(x, self.MASK) + L.approx_kl(x, self.MASK)
                             + L.mean_entropy(x, self.MASK)))(self.LOG_R)
        np.testing.assert_array_equal(g, 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_policy_diagnostics_literal(self):
        clipped = jnp.array([1, 0, 0, 1], bool)
        m = self.variant(L.policy_diagnostics)(self.LOG_R, clipped, self.MASK)
        self.assertEqual(set(m), {"clip_frac", "ratio_mean", "approx_kl"})
        np.testing.assert_allclose([m["clip_frac"], m["ratio_mean"], m["approx_kl"]], [1 / 3, 3.5 / 3, 0.5 / 3],
                                   rtol=1e-5)
        ent = jnp.array([0.5, 1.0, 1.5, 9.0])
        m = _v(self, L.policy_diagnostics, entropy_t=ent)(self.LOG_R, clipped, self.MASK)
        np.testing.assert_allclose(m["entropy"], 1.0)
        m = _v(self, L.policy_diagnostics, logits=jnp.zeros((4, 4)))(self.LOG_R, clipped, self.MASK)
        np.testing.assert_allclose(m["entropy"], LN(4.0), rtol=1e-6)


if __name__ == "__main__":  # pragma: no cover
    parameterized.absltest.main()
