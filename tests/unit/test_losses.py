"""Literal hand-computed values, gradients and equivalences for crl_jax.losses (jitted and not)."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from crl_jax import losses as L

LN = math.log

# The shared PPO / CISPO example (B=3, T=3). Token ratios r = exp(logp - behavior_logp):
#   row 0: r = [1.05, 1.5, 0.5], all valid, A = +1
#   row 1: r = [0.5, 1.5, -],    last token masked, A = -2
#   row 2: no valid token,       A = 5 (must contribute nothing)
LOGP = np.array([[-1.0, -2.0, -0.5], [-1.0, -3.0, -7.0], [-1.0, -1.0, -1.0]], np.float32)
LOG_R = np.array([[LN(1.05), LN(1.5), LN(0.5)], [LN(0.5), LN(1.5), 0.3], [0.1, 0.2, 0.3]], np.float32)
BEHAVIOR = LOGP - LOG_R
ADV = np.array([1.0, -2.0, 5.0], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)


def _v(self, fn, **kw):
    """self.variant over a function with its static keyword arguments bound."""
    return self.variant(functools.partial(fn, **kw))


class AdvantageTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_group_advantages_literal(self):
        r = jnp.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1]], jnp.float32)
        a = self.variant(L.group_advantages)(r)
        np.testing.assert_allclose(a, [[1, -1, 1, -1], [0, 0, 0, 0], [-0.5773503] * 3 + [1.7320508]], atol=1e-5)
        a = _v(self, L.group_advantages, normalize="mean")(r)
        np.testing.assert_allclose(a, [[0.5, -0.5, 0.5, -0.5], [0] * 4, [-0.25] * 3 + [0.75]], atol=1e-6)
        self.assertEqual(a.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_subgroup_advantages_literal(self):
        # group 0: guided [1, 0] -> [1, -1]; free [1, 1] constant -> 0.
        # group 1: guided [0] single member -> 0; free [1, 1, 0]: mean 2/3, std sqrt(2/9).
        r = jnp.array([[1, 0, 1, 1], [0, 1, 1, 0]], jnp.float32)
        g = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool)
        a = self.variant(L.subgroup_advantages)(r, g)
        np.testing.assert_allclose(a, [[1, -1, 0, 0], [0, 0.7071068, 0.7071068, -1.4142136]], atol=1e-5)
        a = _v(self, L.subgroup_advantages, normalize="mean")(r, g)
        np.testing.assert_allclose(a, [[0.5, -0.5, 0, 0], [0, 1 / 3, 1 / 3, -2 / 3]], atol=1e-6)
        self.assertTrue(np.isfinite(a).all())

    @chex.variants(with_jit=True, without_jit=True)
    def test_subgroup_all_guided_equals_group(self):
        r = (np.random.default_rng(0).random((5, 8)) < 0.4).astype(np.float32)
        for guided in (jnp.ones((5, 8), bool), jnp.zeros((5, 8), bool)):
            for norm in ("mean_std", "mean"):
                np.testing.assert_allclose(_v(self, L.subgroup_advantages, normalize=norm)(r, guided),
                                           L.group_advantages(r, normalize=norm), atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_split_group_weights_literal(self):
        g = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
        w = self.variant(L.split_group_weights)(g)
        np.testing.assert_allclose(w, [[0.25] * 4, [0.5, 1 / 6, 1 / 6, 1 / 6], [0.25] * 4], atol=1e-7)

    def test_bad_normalize_raises(self):
        with self.assertRaisesRegex(ValueError, "normalize"):
            L.group_advantages(jnp.zeros((1, 2)), normalize="std")


class PPOTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_token_ratio_literal(self):
        # per-token terms -min(rA, clip(r, .8, 1.2)A): row 0 [-1.05, -1.2, -0.5], row 1 [1.6, 3.0].
        loss, m = self.variant(L.ppo_clip_loss)(LOGP, BEHAVIOR, ADV, MASK)
        np.testing.assert_allclose(loss, (-2.75 / 3 + 2.3) / 2, rtol=1e-5)  # 0.6916667
        np.testing.assert_allclose(m["clip_frac"], 2 / 5, rtol=1e-6)  # r=1.5,A>0 and r=.5,A<0
        np.testing.assert_allclose(m["ratio_mean"], 5.05 / 5, rtol=1e-5)
        np.testing.assert_allclose(m["approx_kl"], 0.1153148, rtol=1e-4)
        loss = _v(self, L.ppo_clip_loss, aggregation="token_mean")(LOGP, BEHAVIOR, ADV, MASK)[0]
        np.testing.assert_allclose(loss, (-2.75 + 4.6) / 5, rtol=1e-5)  # 0.37

    @chex.variants(with_jit=True, without_jit=True)
    def test_sample_weights_literal(self):
        w = jnp.array([1.0, 3.0, 1.0])
        loss = _v(self, L.ppo_clip_loss, sample_weight=w)(LOGP, BEHAVIOR, ADV, MASK)[0]
        np.testing.assert_allclose(loss, (-2.75 / 3 + 3 * 2.3) / 4, rtol=1e-5)
        loss = _v(self, L.ppo_clip_loss, sample_weight=w, aggregation="token_mean")(LOGP, BEHAVIOR, ADV, MASK)[0]
        np.testing.assert_allclose(loss, (-2.75 + 3 * 4.6) / 9, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_ratio_literal(self):
        # row 0: r = (1.05 * 1.5 * 0.5)^(1/3) = 0.9234574 (inside the clip); row 1: r = sqrt(0.75).
        loss, m = _v(self, L.ppo_clip_loss, ratio="sequence")(LOGP, BEHAVIOR, ADV, MASK)
        np.testing.assert_allclose(loss, (-0.9234574 + 2 * 0.8660254) / 2, rtol=1e-5)
        np.testing.assert_allclose(m["clip_frac"], 0.0)
        loss = _v(self, L.ppo_clip_loss, ratio="sequence", aggregation="token_mean")(LOGP, BEHAVIOR, ADV, MASK)[0]
        np.testing.assert_allclose(loss, (-3 * 0.9234574 + 2 * 2 * 0.8660254) / 5, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_entropy_and_k3_metrics(self):
        logits = jnp.zeros((3, 3, 4))  # uniform over 4 tokens: entropy ln 4
        ref = jnp.asarray(LOGP) + LN(2.0)  # k3 = 2 - ln 2 - 1 on every valid token
        loss0 = L.ppo_clip_loss(LOGP, BEHAVIOR, ADV, MASK)[0]
        loss, m = _v(self, L.ppo_clip_loss, logits=logits, ref_logp=ref, kl_coef=0.5)(LOGP, BEHAVIOR, ADV, MASK)
        np.testing.assert_allclose(m["entropy"], LN(4.0), rtol=1e-6)
        np.testing.assert_allclose(m["kl_ref"], 0.3068528, rtol=1e-5)
        np.testing.assert_allclose(loss, loss0 + 0.5 * 0.3068528, rtol=1e-5)
        np.testing.assert_allclose(self.variant(L.k3_kl)(LOGP, ref, MASK),
                                   np.where(MASK, 0.3068528, 0.0), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_mask_is_zero_not_nan(self):
        z = jnp.zeros((2, 3), bool)
        for fn in (L.ppo_clip_loss, functools.partial(L.ppo_clip_loss, ratio="sequence",
                                                      aggregation="token_mean"), L.cispo_loss):
            def loss_and_grad(lp, fn=fn):
                (loss, m), g = jax.value_and_grad(lambda x: fn(x, BEHAVIOR[:2], ADV[:2], z), has_aux=True)(lp)
                return loss, m, g

            loss, m, g = self.variant(loss_and_grad)(jnp.asarray(LOGP[:2]))
            self.assertEqual(float(loss), 0.0)
            self.assertTrue(all(np.isfinite(v) for v in jax.tree_util.tree_leaves(m)))
            np.testing.assert_array_equal(g, 0.0)

    def test_masked_inf_logp_does_not_leak(self):
        lp = LOGP.copy()
        lp[1, 2] = lp[2] = -np.inf
        for fn in (L.ppo_clip_loss, L.cispo_loss):
            loss_grad = jax.jit(jax.value_and_grad(lambda x, fn=fn: fn(x, BEHAVIOR, ADV, MASK)[0]))
            loss, g = loss_grad(lp)
            np.testing.assert_allclose(loss, loss_grad(jnp.asarray(LOGP))[0])
            self.assertTrue(np.isfinite(g).all())

    def test_gradient_literal_and_clip_zero(self):
        # d/dlogp of -r*A / n_b / n_seq on unclipped tokens; exactly 0 on the two clipped tokens.
        g = jax.jit(jax.grad(lambda lp: L.ppo_clip_loss(lp, BEHAVIOR, ADV, MASK)[0]))(jnp.asarray(LOGP))
        np.testing.assert_allclose(g, [[-1.05 / 6, 0.0, -0.5 / 6], [0.0, 0.75, 0.0], [0, 0, 0]], atol=1e-6)
        self.assertEqual(float(g[0, 1]), 0.0)  # r = 1.5 > 1.2 with A > 0
        self.assertEqual(float(g[1, 0]), 0.0)  # r = 0.5 < 0.8 with A < 0

    def test_finite_differences(self):
        # Random ratios kept away from the clip boundaries (the loss is not differentiable there).
        rng = np.random.default_rng(1)
        lp = -rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
        log_r = rng.choice(np.array([-0.5, -0.1, 0.05, 0.1, 0.5], np.float32), (3, 5))
        adv = rng.normal(size=3).astype(np.float32)
        mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0] * 5], bool)
        h = 1e-2
        idxs = ((0, 0), (0, 3), (1, 2), (2, 1))
        bumps = np.zeros((len(idxs), 3, 5), np.float32)  # one-hot perturbations [4, 3, 5]
        for n, i in enumerate(idxs):
            bumps[(n, *i)] = h

        @functools.partial(jax.jit, static_argnums=0)
        def grad_and_fd(f, x):
            fd = (jax.vmap(f)(x + bumps) - jax.vmap(f)(x - bumps)) / (2 * h)
            g = jax.grad(f)(x)
            return jnp.stack([g[i] for i in idxs]), fd

        for r in ("token", "sequence"):
            for a in ("seq_mean_token_mean", "token_mean"):
                def f(x, r=r, a=a):
                    return L.ppo_clip_loss(x, lp - log_r, adv, mask, ratio=r, aggregation=a)[0]

                g, fd = grad_and_fd(f, lp)
                np.testing.assert_allclose(g, fd, atol=1e-4)
        # CISPO's weight is a stop-gradient of the ratio, so its gradient is the finite difference
        # with the ratio held fixed: shift logp and behavior_logp together.
        g = jax.grad(lambda x: L.cispo_loss(x, lp - log_r, adv, mask)[0])(lp)
        _, fd = grad_and_fd(lambda x: L.cispo_loss(x, x - log_r, adv, mask)[0], lp)
        np.testing.assert_allclose(jnp.stack([g[i] for i in idxs]), fd, atol=1e-4)

    def test_sequence_equals_token_when_log_ratios_equal(self):
        lp = -np.random.default_rng(2).uniform(0.5, 2.0, (4, 6)).astype(np.float32)
        adv = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
        mask = np.arange(6)[None, :] < np.array([6, 3, 1, 0])[:, None]
        for agg in ("seq_mean_token_mean", "token_mean"):
            tok = jax.jit(functools.partial(L.ppo_clip_loss, aggregation=agg))
            seq = jax.jit(functools.partial(L.ppo_clip_loss, aggregation=agg, ratio="sequence"))
            for delta in (0.1, -0.4, 0.3):  # inside and outside the clip range
                t, s = tok(lp, lp - delta, adv, mask), seq(lp, lp - delta, adv, mask)
                np.testing.assert_allclose(t[0], s[0], rtol=1e-6)
                np.testing.assert_allclose(t[1]["clip_frac"], s[1]["clip_frac"])

    def test_split_loss_equals_mean_of_subgroup_losses(self):
        rng = np.random.default_rng(3)
        lp = -rng.uniform(0.5, 2.0, (8, 5)).astype(np.float32)
        beh = lp - rng.uniform(-0.3, 0.3, (8, 5)).astype(np.float32)
        adv = rng.normal(size=8).astype(np.float32)
        mask = np.arange(5)[None, :] < np.array([5, 4, 3, 2, 5, 1, 2, 3])[:, None]
        loss = jax.jit(lambda m, w: L.ppo_clip_loss(lp, beh, adv, m, sample_weight=w)[0])
        ones = jnp.ones(8)

        def sub(rows):  # a subgroup's own loss: the other rows get no valid token
            keep = np.zeros(8, bool)
            keep[list(rows)] = True
            return loss(mask & keep[:, None], ones)

        # Two groups of 4, equal-size subgroups: unit weights already give the 1/2-1/2 average.
        guided = jnp.array([[1, 1, 0, 0], [0, 1, 0, 1]], bool)
        g_rows, f_rows = np.flatnonzero(guided.reshape(-1)), np.flatnonzero(~guided.reshape(-1))
        expect = 0.5 * (sub(g_rows) + sub(f_rows))
        np.testing.assert_allclose(loss(mask, ones), expect, rtol=1e-5)
        np.testing.assert_allclose(loss(mask, L.split_group_weights(guided).reshape(-1)), expect, rtol=1e-5)
        # Unequal subgroups (1 guided + 3 free, 3 guided + 1 free): weights give the mean of the 4
        # (group, subgroup) losses.
        guided = jnp.array([[1, 0, 0, 0], [1, 1, 1, 0]], bool)
        parts = [sub(r) for r in ([0], [1, 2, 3], [4, 5, 6], [7])]
        np.testing.assert_allclose(loss(mask, L.split_group_weights(guided).reshape(-1)), np.mean(parts),
                                   rtol=1e-5)


class CISPOTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_literal(self):
        # w = clip(r, .9, 1.1): row 0 [1.05, 1.1, 0.9] (A=1), row 1 [0.9, 1.1] (A=-2); N = 5 tokens.
        # loss = -(1.05*-1 + 1.1*-2 + 0.9*-0.5 + (0.9*-2*-1 + 1.1*-2*-3)) / 5 = (3.7 - 8.4) / 5
        loss, m = self.variant(L.cispo_loss)(LOGP, BEHAVIOR, ADV, MASK)
        np.testing.assert_allclose(loss, -0.94, rtol=1e-5)
        np.testing.assert_allclose(m["clip_frac"], 4 / 5)
        np.testing.assert_allclose(m["ratio_mean"], 5.05 / 5, rtol=1e-5)
        loss = _v(self, L.cispo_loss, eps_low=0.6, eps_high=0.6)(LOGP, BEHAVIOR, ADV, MASK)[0]
        np.testing.assert_allclose(loss, -(-1.05 - 3.0 - 0.25 + 1.0 + 9.0) / 5, rtol=1e-5)

    def test_gradient_is_minus_w_a_over_n(self):
        g = jax.jit(jax.grad(lambda lp: L.cispo_loss(lp, BEHAVIOR, ADV, MASK)[0]))(jnp.asarray(LOGP))
        w = np.array([[1.05, 1.1, 0.9], [0.9, 1.1, 0.0], [0, 0, 0]])
        np.testing.assert_allclose(g, -w * ADV[:, None] / 5 * MASK, atol=1e-6)
        np.testing.assert_allclose(g[0], [-0.21, -0.22, -0.18], atol=1e-6)


class ExtractorWeightingTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_repeat_weights_literal(self):
        # step - last <= cooldown is in cooldown: with the default 1, trained at the previous step (4) or this one (5)
        times = jnp.array([0, 1, 3, 2, 0, 1])
        last = jnp.array([-1, 4, 2, 5, 5, 3])
        w = self.variant(L.repeat_weights)(times, last, 5)
        np.testing.assert_allclose(w, [1.0, 0.0, 0.5, 0.0, 0.0, 0.7071068], rtol=1e-6)
        w = _v(self, L.repeat_weights, cooldown=2, power=1.0)(times, last, 5)
        np.testing.assert_allclose(w, [1.0, 0.0, 0.25, 0.0, 0.0, 0.0], rtol=1e-6)
        w = _v(self, L.repeat_weights, cooldown=0)(times, last, 5)  # 0: only a sample trained at this very step
        np.testing.assert_allclose(w, [1.0, 0.7071068, 0.5, 0.0, 0.0, 0.7071068], rtol=1e-6)
        # Never-trained samples are never in cooldown, however long the cooldown.
        w = _v(self, L.repeat_weights, cooldown=5)(jnp.zeros(2, jnp.int32), jnp.array([-1, -1]), 0)
        np.testing.assert_allclose(w, [1.0, 1.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_extractor_advantages_literal(self):
        r = jnp.array([1.0, -1.0, 0.5, 3.0])
        valid = jnp.array([1, 1, 1, 0], bool)
        a = self.variant(L.extractor_advantages)(r, valid, jnp.array([1.0, 0.5, 2.0, 1.0]))
        np.testing.assert_allclose(a, [5 / 6, -7 / 12, 2 / 3, 0.0], rtol=1e-6)
        a = self.variant(L.extractor_advantages)(r, jnp.zeros(4, bool), jnp.ones(4))
        np.testing.assert_array_equal(a, 0.0)
        # no baseline: A = r * w (rewards already relative to not writing)
        a = self.variant(functools.partial(L.extractor_advantages, baseline="none"))(r, valid,
                                                                                     jnp.array([1.0, 0.5, 2.0, 1.0]))
        np.testing.assert_allclose(a, [1.0, -0.5, 1.0, 0.0], rtol=1e-6)
        # a mean per group: samples 0 and 2 (group 5) share (1 + 0.5) / 2, sample 1 (group 7) is alone; the invalid
        # sample 3 of group 5 is left out of its group's mean
        a = self.variant(functools.partial(L.extractor_advantages, baseline="outcome_mean"))(
            r, valid, jnp.array([1.0, 0.5, 2.0, 1.0]), groups=jnp.array([5, 7, 5, 5]))
        np.testing.assert_allclose(a, [0.25, 0.0, -0.5, 0.0], rtol=1e-6)
        with pytest.raises(ValueError, match="baseline"):
            L.extractor_advantages(r, valid, jnp.ones(4), baseline="group")
        with pytest.raises(ValueError, match="groups"):
            L.extractor_advantages(r, valid, jnp.ones(4), baseline="outcome_mean")


if __name__ == "__main__":  # pragma: no cover
    parameterized.absltest.main()
