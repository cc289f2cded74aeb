"""The review's four loss-math cases, on literal values (jitted and not where cheap):

- `loss_fns.episode_mean` / `actor_turn_loss(ratio="sequence")` do not depend on how episodes are numbered (the
  batch holds global ids, and a loss call may see fewer rows than the largest id);
- the LLM losses score tokens at the temperature they were sampled at: a batch just sampled by `sampling.generate`
  has ratio 1 and nothing clipped, fused head or not, at 0.7 and at 0 (greedy);
- `repeat_weights`: a sample trained at the previous step is in cooldown (delta = 1);
- an exactly constant (sub)group has exactly 0 advantage, also for rewards that float32 cannot hold exactly.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import losses as L
from crl_jax import sampling
from crl_jax.config import load
from crl_jax.learner import loss_fns
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tfm

CFG = tfm.tiny_config(64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)


@functools.lru_cache(maxsize=1)
def _state():
    return ts.create_train_state(tfm.create(CFG, jax.random.key(0)), ts.make_optimizer(1e-2))


# ----------------------------------------------------------------------------------------------
# 1. Episode ids


class EpisodeMeanTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_global_ids_literal(self):
        x = jnp.array([0.1, 0.3, -0.2, 0.4, 0.5, 0.7])
        f = self.variant(loss_fns.episode_mean)
        # 6 rows of episodes 0, 6 and 7 (global ids >= the number of rows): means (.1+.3)/2, (-.2+.4)/2, (.5+.7)/2
        np.testing.assert_allclose(f(x, jnp.array([0, 0, 6, 6, 7, 7]), jnp.ones(6)), [.2, .2, .1, .1, .6, .6],
                                   rtol=1e-6)
        # unsorted, negative and huge ids; a weight-0 row counts in no mean but gets its episode's
        ep = jnp.array([7, -3, 7, 1000, -3, 1000])
        w = jnp.array([1.0, 1.0, 0.0, 0.5, 1.0, 0.5])
        np.testing.assert_allclose(f(x, ep, w), [.1, .4, .1, .55, .4, .55], rtol=1e-6)

    def test_sequence_ratio_loss_and_grad_do_not_depend_on_the_numbering(self):
        st = _state()
        rng = np.random.default_rng(0)
        B, P = 6, 5
        allowed = jnp.zeros(64, bool).at[jnp.arange(10, 14)].set(True)
        fn = loss_fns.actor_turn_loss(allowed, ratio="sequence", entropy_metric=False)
        base = dict(prompts=jnp.asarray(rng.integers(0, 64, (B, P)), jnp.int32), prompt_len=jnp.full((B,), P),
                    action_token=jnp.asarray(rng.integers(10, 14, (B,)), jnp.int32),
                    behavior_logp=jnp.asarray(np.log(0.25) + rng.uniform(-0.3, 0.3, B), jnp.float32),
                    advantages=jnp.array([1.0, 1.0, -1.0, -1.0, 0.5, 0.5]))

        vg = jax.jit(jax.value_and_grad(lambda p, b: fn(st.graphdef, p, b), has_aux=True))

        def run(episode, weight):
            b = loss_fns.TurnBatch(**base, weight=jnp.asarray(weight), episode=jnp.asarray(episode, jnp.int32))
            return vg(st.params, b)

        for weight in ([0.5] * 6, [0.0, 0.0, 0.5, 0.5, 0.5, 0.5]):  # the second: only episodes 6 and 7 train
            (num_g, (den_g, m_g)), g_g = run([0, 0, 6, 6, 7, 7], weight)
            (num_l, (den_l, m_l)), g_l = run([0, 0, 1, 1, 2, 2], weight)
            np.testing.assert_allclose(num_g / den_g, num_l / den_l, rtol=1e-6)
            np.testing.assert_allclose(m_g["ratio_mean"], m_l["ratio_mean"], rtol=1e-6)
            chex.assert_trees_all_close(g_g, g_l, rtol=1e-5, atol=1e-7)
            assert float(jnp.abs(m_g["ratio_mean"] - 1.0)) > 1e-3  # real ratios, not frozen at 1
            assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_g)) > 1e-3


# ----------------------------------------------------------------------------------------------
# 2. Sampling temperature of the LLM losses


def _sampled_batches(temperature, trained_width):
    """An ActorBatch and an ExtractorBatch of replies just sampled by `sampling.generate` from the same params,
    with the sampler's log-probs as behaviour log-probs."""
    st = _state()
    B, P, N = 4, 5, 6
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 64, (B, P)), jnp.int32)
    toks, lp, ln = sampling.generate(tfm.merge(st.graphdef, st.params), prompt, jnp.full((B,), P), jax.random.key(1),
                                     max_new_tokens=N, temperature=temperature)
    tokens = jnp.concatenate([prompt, toks], 1)
    mask = ts.response_mask(jnp.full((B,), P), P + ln, P + N)
    blogp = jnp.where(mask, jnp.concatenate([jnp.zeros((B, P)), lp], 1), 0.0)
    adv = jnp.array([1.0, -1.0, 1.0, -1.0])
    return (ts.ActorBatch(tokens, mask, blogp, adv, jnp.ones(B), trained_width=trained_width),
            ts.ExtractorBatch(tokens, mask, blogp, adv, jnp.array(True), response_width=trained_width))


# trained_width: every position (None) / the compact head over the 6 replies' slots
@pytest.mark.parametrize("temperature, trained_width, fused", [(0.7, None, True), (0.7, 6, False), (0.7, 6, True),
                                                               (0.0, None, True)])
def test_llm_losses_score_at_the_sampling_temperature(temperature, trained_width, fused):
    st = _state()
    ab, eb = _sampled_batches(temperature, trained_width)
    actor = loss_fns.actor_ppo_loss(loss_fns.PPOLossConfig(fused_head=fused, temperature=temperature))
    extractor = loss_fns.extractor_cispo_loss(loss_fns.CISPOLossConfig(fused_head=fused, temperature=temperature))
    for fn, batch in ((actor, ab), (extractor, eb)):
        _, (den, m) = jax.jit(fn, static_argnums=0)(st.graphdef, st.params, batch)
        assert float(den) > 0
        np.testing.assert_allclose(m["ratio_mean"], 1.0, atol=1e-5)
        np.testing.assert_allclose(m["approx_kl"], 0.0, atol=1e-5)
        assert float(m["clip_frac"]) == 0.0
    if temperature == 0.7:  # scored at 1 instead (the old behaviour), the same batch is off
        _, (_, m) = loss_fns.actor_ppo_loss(loss_fns.PPOLossConfig(fused_head=fused))(st.graphdef, st.params, ab)
        assert abs(float(m["ratio_mean"]) - 1.0) > 1e-3


@pytest.mark.parametrize("ratio", ["token", "sequence"])
def test_fused_and_unfused_heads_agree_at_a_temperature(ratio):
    """Loss and gradient of the fused head (its backward divides by the temperature) equal the tiled path's, with
    behaviour log-probs off the current ones (ratios != 1; per token, some clipped)."""
    st = _state()
    ab, _ = _sampled_batches(0.7, 6)
    noise = jnp.asarray(np.random.default_rng(1).uniform(-0.4, 0.4, ab.loss_mask.shape), jnp.float32)
    ab = ab.replace(behavior_logp=jnp.where(ab.loss_mask, ab.behavior_logp + noise, 0.0))
    out = []
    for fused in (True, False):
        fn = loss_fns.actor_ppo_loss(loss_fns.PPOLossConfig(fused_head=fused, ratio=ratio, temperature=0.7,
                                                            head_chunk=4))
        (num, (den, m)), g = jax.value_and_grad(lambda p: fn(st.graphdef, p, ab), has_aux=True)(st.params)
        out.append((num / den, g))
    assert float(m["clip_frac"]) > 0 or ratio == "sequence"  # the per-token ratios do clip
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
    chex.assert_trees_all_close(out[0][1], out[1][1], rtol=1e-4, atol=1e-6)


def test_llm_loss_configs_take_the_sampling_temperatures():
    from crl_jax.backends.llm import runtime as llm_runtime

    ppo, cispo = llm_runtime.loss_configs(load(None, ["actor.temperature=0.7", "extraction.temperature=0.5"]))
    assert (ppo.temperature, cispo.temperature) == (0.7, 0.5)
    ppo, cispo = llm_runtime.loss_configs(load(None, []))
    assert (ppo.temperature, cispo.temperature) == (1.0, 1.0)


# ----------------------------------------------------------------------------------------------
# 3. Repeat-weight cooldown


class CooldownTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_trained_at_the_previous_step_weighs_zero(self):
        f = self.variant(functools.partial(L.repeat_weights, cooldown=1, power=0.5))
        # one pop per step: trained at step 4, popped again at 5 (0), at 6 (2^-0.5); never trained: 1
        np.testing.assert_allclose(f(jnp.array([1, 1, 0]), jnp.array([4, 4, -1]), 5), [0.0, 0.0, 1.0])
        np.testing.assert_allclose(f(jnp.array([1]), jnp.array([4]), 6), [2 ** -0.5], rtol=1e-6)
        g = self.variant(functools.partial(L.repeat_weights, cooldown=0, power=1.0))
        np.testing.assert_allclose(g(jnp.array([1, 1]), jnp.array([5, 4]), 5), [0.0, 0.5], rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# 4. Constant groups


class ConstantGroupTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_review_values_literal(self):
        # 0.11 and 7.3 three times: the float32 mean missed them by an ulp, and / (std + eps) made that 0.007 and -0.32
        r = jnp.array([[v] * 3 for v in (0.11, 0.66666667, 3.3, 7.3, 12.7)], jnp.float32)
        for mode in ("mean_std", "mean"):
            np.testing.assert_array_equal(self.variant(functools.partial(L.group_advantages, normalize=mode))(r), 0.0)
            sub = self.variant(functools.partial(L.subgroup_advantages, normalize=mode))
            np.testing.assert_array_equal(sub(r, jnp.ones(r.shape, bool)), 0.0)
            np.testing.assert_array_equal(sub(r, jnp.array([[True, False, True]] * 5)), 0.0)
        # a constant guided subgroup gives exactly 0, the free one beside it is normalised as before
        a = self.variant(L.subgroup_advantages)(jnp.array([[0.1, 0.1, 0.1, 1.0, 0.0, 1.0]]),
                                                jnp.array([[1, 1, 1, 0, 0, 0]], bool))
        np.testing.assert_array_equal(a[0, :3], 0.0)
        np.testing.assert_allclose(a[0, 3:], [2 ** -0.5, -(2 ** 0.5), 2 ** -0.5], rtol=1e-5)
        # not constant: still normalised (3 values, one apart by 0.01: +-1/sqrt(2)-ish, not 0)
        a = self.variant(L.group_advantages)(jnp.array([[0.11, 0.11, 0.12]]))
        np.testing.assert_allclose(a, [[-(2 ** -0.5), -(2 ** -0.5), 2 ** 0.5]], rtol=1e-3)

    def test_every_constant_group_of_2_to_16_in_0_1(self):
        @jax.jit
        def all_modes(r):  # group and split (two constant subgroups) advantages, both normalisations
            guided = jnp.broadcast_to(jnp.arange(r.shape[1]) < r.shape[1] // 2, r.shape)
            return [f(r, normalize=mode) for mode in ("mean_std", "mean")
                    for f in (L.group_advantages, functools.partial(L.subgroup_advantages, guided=guided))]

        v = jnp.asarray(np.linspace(0.01, 1.0, 100), jnp.float32)
        for k in range(2, 17):
            for a in all_modes(jnp.broadcast_to(v[:, None], (100, k))):
                np.testing.assert_array_equal(a, 0.0, err_msg=f"K={k}")
