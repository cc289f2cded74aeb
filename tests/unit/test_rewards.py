"""Literal per-entry extractor rewards for every variant (jitted and not)."""

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.losses import credit as R


def _check(er, total, count, mean):
    np.testing.assert_allclose(er.sum, total, atol=1e-6)
    np.testing.assert_array_equal(er.count, count)
    np.testing.assert_allclose(er.mean, mean, atol=1e-6)
    assert er.mean.shape == (len(total),) and np.isfinite(er.mean).all()


class RewardsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_outcome_literal(self):
        # scores +-1: [1, -1, 1, 1, -1, -1]; trajectory 3 retrieved nothing (-1); entry 3 never used.
        outcomes = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
        ids = jnp.array([0, 0, 2, -1, 0, 1])
        er = self.variant(functools.partial(R.outcome_rewards, num_entries=4))(outcomes, ids)
        _check(er, [-1.0, -1.0, 1.0, 0.0], [3, 1, 1, 0], [-1 / 3, -1.0, 1.0, 0.0])
        # -1/+1 outcomes (ALFWorld style) score the same as 0/1.
        er = self.variant(functools.partial(R.outcome_rewards, num_entries=4))(2 * outcomes - 1, ids)
        _check(er, [-1.0, -1.0, 1.0, 0.0], [3, 1, 1, 0], [-1 / 3, -1.0, 1.0, 0.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_relative_to_free_literal(self):
        # group 0: free mean (1 + 0)/2 = .5 -> guided scores 1-.5 (entry 0), 0-.5 (entry 1); the free
        #          member carrying id 3 is never credited.
        # group 1: free mean 1/3 -> guided score 2/3 (entry 0).
        # group 2: all guided, no control -> not counted.
        outcomes = jnp.array([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], jnp.float32)
        guided = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
        ids = jnp.array([[0, 1, 3, -1], [0, -1, -1, -1], [1, 1, 2, 2]])
        er = self.variant(functools.partial(R.relative_to_free_rewards, num_entries=4))(outcomes, guided, ids)
        _check(er, [0.5 + 2 / 3, -0.5, 0.0, 0.0], [2, 1, 0, 0], [(0.5 + 2 / 3) / 2, -0.5, 0.0, 0.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_no_entries_used(self):
        er = self.variant(functools.partial(R.outcome_rewards, num_entries=3))(jnp.ones(4), -jnp.ones(4, jnp.int32))
        _check(er, [0.0] * 3, [0] * 3, [0.0] * 3)

    @chex.variants(with_jit=True, without_jit=True)
    def test_return_values_literal(self):
        # group 0: free members succeed / fail -> (+1 - 1)/2 = 0 for every member of the group;
        # group 1: free members 1, 1, 0 -> (1 + 1 - 1)/3; group 2: no free member -> not ok, value 0.
        outcomes = jnp.array([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 1, 1]], jnp.float32)
        guided = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
        v, ok = self.variant(functools.partial(R.return_values, "outcome"))(outcomes, guided)
        np.testing.assert_allclose(v, [[0.0] * 4, [1 / 3] * 4, [0.0] * 4], atol=1e-6)
        np.testing.assert_array_equal(ok, [[True] * 4, [True] * 4, [False] * 4])
        # -1/+1 outcomes score the same; relative_to_free: playing free is the zero of the scale
        v2, _ = self.variant(functools.partial(R.return_values, "outcome"))(2 * outcomes - 1, guided)
        np.testing.assert_allclose(v2, v, atol=1e-6)
        v3, ok3 = self.variant(functools.partial(R.return_values, "relative_to_free"))(outcomes, guided)
        np.testing.assert_allclose(v3, np.zeros((3, 4)))
        np.testing.assert_array_equal(ok3, ok)

    def test_return_value_is_the_entry_scale(self):
        # an entry whose guided rollouts did exactly as the free ones earns what a RETURN earns
        outcomes = jnp.array([[1, 0, 1, 0]], jnp.float32)
        guided = jnp.array([[1, 1, 0, 0]], bool)
        ids = jnp.array([[0, 0, -1, -1]])
        for variant in R.VARIANTS:
            er = R.entry_rewards(variant, outcomes, ids, 1, guided=guided)
            v, _ = R.return_values(variant, outcomes, guided)
            np.testing.assert_allclose(er.mean[0], v[0, 0], atol=1e-6)
        with pytest.raises(ValueError, match="unknown extractor reward"):
            R.return_values("bogus", outcomes, guided)

    def test_dispatch_and_errors(self):
        outcomes, ids = jnp.array([1.0, 0.0]), jnp.array([0, 0])
        _check(R.entry_rewards("outcome", outcomes, ids, 1), [0.0], [2], [0.0])
        _check(R.entry_rewards("relative_to_free", outcomes[None], ids[None], 1, guided=jnp.array([[True, False]])),
               [1.0], [1], [1.0])
        with pytest.raises(ValueError, match="guided"):
            R.entry_rewards("relative_to_free", outcomes, ids, 1)
        for gone in ("critic", "bogus"):  # the reference code's critic verdict is not a variant (nothing makes one)
            with pytest.raises(ValueError, match="unknown extractor reward"):
                R.entry_rewards(gone, outcomes, ids, 1)

    def test_variants_are_the_config_values(self):
        import typing

        from crl_jax.config import ExtractorConfig

        assert R.VARIANTS == typing.get_args(typing.get_type_hints(ExtractorConfig)["reward"])
