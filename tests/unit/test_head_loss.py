"""The head's loss with its gradient taken in the forward pass (crl_jax.models.head_loss): literal values and
gradients, equality with the general path (`chunked_logprobs` under the same loss) for a non-linear per-token
loss, padding and invalid tokens, bf16, no gradient into aux, three vocabulary matmuls instead of four in the
compiled program, the per-token decomposition of the PPO numerator (`losses.ppo_token_terms`), and groups of rows
(`group`: a sequence-level ratio, `losses.ppo_sequence_terms`, with whole sequences per chunk)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import losses
from crl_jax.models import head_loss as HL
from crl_jax.models import logprobs as LP


def _run(f, jit):
    return jax.jit(f) if jit else f


@pytest.mark.parametrize("jit", [False, True])
def test_literal_value_and_gradient(jit):
    # logits row 0 = [1, 0, -1] (target 0, weight 2), row 1 = [0, 2, 2] (target 2, weight -1); token_chunk 1.
    h = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    w = jnp.array([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
    tgt = jnp.array([0, 2])
    c = jnp.array([2.0, -1.0])
    f = _run(lambda h, w: HL.fused_token_loss(h, w, tgt, jnp.ones(2, bool), lambda lp, a: a * lp, c,
                                              token_chunk=1), jit)
    total, logp, ent = f(h, w)
    e = np.e
    lp = np.array([1 - np.log(e + 1 + 1 / e), 2 - np.log(1 + 2 * e**2)])
    np.testing.assert_allclose(logp, lp, rtol=1e-6)
    np.testing.assert_allclose(total, 2 * lp[0] - lp[1], atol=1e-6)
    z = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 2.0]])
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(-1), rtol=1e-6)
    # d total / d z = c * (onehot - p); dh = dz w^T, dw = h^T dz; times the cotangent 3
    dz = np.array([2.0, -1.0])[:, None] * (np.eye(3)[[0, 2]] - p)
    gh, gw = _run(jax.grad(lambda h, w: 3.0 * f(h, w)[0], (0, 1)), jit)(h, w)
    np.testing.assert_allclose(gh, 3 * dz @ np.asarray(w).T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, 3 * np.asarray(h).T @ dz, rtol=1e-5, atol=1e-6)


def _ppo_like(lp, a):
    log_r = lp - a["b"]
    return a["c"] * losses.ppo_clip_token_loss(log_r, a["adv"], 0.2) + 0.1 * losses.k3_kl(lp, a["b"] + 0.3, lp < 0)


@pytest.mark.parametrize("jit,token_chunk,temperature", [(False, 4, 1.0), (True, 5, 0.7), (True, 64, 1.0)])
def test_equals_the_general_path_under_a_nonlinear_loss(jit, token_chunk, temperature):
    k = jax.random.split(jax.random.key(0), 6)
    N = 21  # not a multiple of 4 or 5: padding rows
    h = 0.3 * jax.random.normal(k[0], (N, 16))  # logits of order 1: ratios near 1, both clip sides
    w = jax.random.normal(k[1], (16, 50))
    t = jax.random.randint(k[2], (N,), 0, 50)
    valid = jax.random.uniform(k[3], (N,)) > 0.3
    aux = dict(b=-np.log(50.0) + 0.3 * jax.random.normal(k[4], (N,)), adv=jax.random.normal(k[5], (N,)),
               c=jnp.linspace(0.5, 2, N))

    def general(h, w):
        lp, _ = LP.chunked_logprobs(h, w, t, temperature=temperature, token_chunk=token_chunk, vocab_chunk=16)
        return jnp.where(valid, _ppo_like(lp, aux), 0.0).sum()

    def fused(h, w):
        return HL.fused_token_loss(h, w, t, valid, _ppo_like, aux, temperature=temperature,
                                   token_chunk=token_chunk)[0]

    np.testing.assert_allclose(_run(fused, jit)(h, w), general(h, w), rtol=1e-5)
    for a, b in zip(_run(jax.grad(fused, (0, 1)), jit)(h, w), jax.grad(general, (0, 1))(h, w)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # invalid tokens: no value and no gradient, though token_fn is not 0 there
    gh = jax.grad(lambda h: HL.fused_token_loss(h, w, t, valid, lambda lp, a: lp + 1.0, {})[0])(h)
    assert not np.asarray(gh)[~np.asarray(valid)].any() and np.asarray(gh)[np.asarray(valid)].any()
    # no gradient into aux; the log-probs returned for metrics carry none either
    g_aux = jax.grad(lambda a: HL.fused_token_loss(h, w, t, valid, _ppo_like, a)[0])(aux)
    assert not any(np.asarray(x).any() for x in jax.tree.leaves(g_aux))
    assert not np.asarray(jax.grad(lambda h: HL.fused_token_loss(h, w, t, valid, _ppo_like, aux)[1].sum())(h)).any()


def test_bfloat16_inputs_keep_their_dtype_in_the_gradient():
    k = jax.random.split(jax.random.key(1), 3)
    h = jax.random.normal(k[0], (9, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(k[1], (8, 40)).astype(jnp.bfloat16)
    t = jax.random.randint(k[2], (9,), 0, 40)
    ones = jnp.ones(9, bool)
    gh, gw = jax.jit(jax.grad(lambda h, w: HL.fused_token_loss(h, w, t, ones, lambda lp, a: -lp, {},
                                                                 token_chunk=4)[0], (0, 1)))(h, w)
    rh, rw = jax.jit(jax.grad(lambda h, w: -LP.full_logprobs(h, w, t)[0].sum(), (0, 1)))(h, w)
    assert gh.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(gh, np.float32), np.asarray(rh, np.float32), atol=3e-2)
    np.testing.assert_allclose(np.asarray(gw, np.float32), np.asarray(rw, np.float32), atol=3e-2)


def test_empty_and_bad_shapes():
    h, w = jnp.zeros((0, 4)), jnp.zeros((4, 7))
    total, lp, _ = HL.fused_token_loss(h, w, jnp.zeros(0, jnp.int32), jnp.zeros(0, bool), lambda lp, a: lp, {})
    assert float(total) == 0 and lp.shape == (0,)
    with pytest.raises(AssertionError):
        HL.fused_token_loss(jnp.zeros((3, 4)), w, jnp.zeros(2, jnp.int32), jnp.ones(2, bool), lambda lp, a: lp, {})
    with pytest.raises(AssertionError):  # aux must be per token
        HL.fused_token_loss(jnp.zeros((3, 4)), w, jnp.zeros(3, jnp.int32), jnp.ones(3, bool), lambda lp, a: lp,
                            jnp.ones(2))


def _vocab_dots(f, *args, V):
    """Number of dot_general ops in the lowered program that have the vocabulary size in an operand's shape."""
    text = jax.jit(f).lower(*args).as_text()
    return sum(1 for line in text.splitlines() if "dot_general" in line and re.search(rf"\b{V}\b|x{V}x|x{V}>", line))


def test_three_vocabulary_matmuls_instead_of_four():
    N, H, V = 32, 8, 97
    h, w = jnp.ones((N, H)), jnp.ones((H, V))
    t, ones = jnp.zeros(N, jnp.int32), jnp.ones(N, bool)
    fused = jax.grad(lambda h, w: HL.fused_token_loss(h, w, t, ones, lambda lp, a: -lp, {})[0], (0, 1))
    general = jax.grad(lambda h, w: -LP.chunked_logprobs(h, w, t, vocab_chunk=V)[0].sum(), (0, 1))
    assert _vocab_dots(fused, h, w, V=V) == 3
    assert _vocab_dots(general, h, w, V=V) == 4


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_ppo_token_terms_sum_to_the_numerator(aggregation):
    k = jax.random.split(jax.random.key(2), 4)
    B, T = 4, 6
    mask = jnp.asarray(np.random.default_rng(0).random((B, T)) > 0.4).at[3].set(False)  # row 3: nothing trained
    logp = -jax.random.uniform(k[0], (B, T), minval=0.5, maxval=4.0)
    beh = logp + 0.3 * jax.random.normal(k[1], (B, T))
    adv = jax.random.normal(k[2], (B,))
    wt = jnp.array([1.0, 0.5, 2.0, 1.0])
    ref = logp - 0.2
    num, den, _ = losses.ppo_clip_loss_parts(logp, beh, adv, mask, aggregation=aggregation, sample_weight=wt,
                                             ref_logp=ref, kl_coef=0.05)
    coef = losses.row_coefficients(mask, wt, aggregation)
    bc = lambda x: jnp.broadcast_to(x[:, None], (B, T))  # noqa: E731
    terms = losses.ppo_token_terms(logp, beh, bc(adv), bc(coef), ref_logp=ref, kl_coef=0.05)
    np.testing.assert_allclose(jnp.where(mask, terms, 0.0).sum(), num, rtol=1e-6)
    n = np.asarray(mask).sum(1)
    want = np.asarray(wt) if aggregation == "token_mean" else np.where(n > 0, np.asarray(wt) / np.maximum(n, 1), 0)
    np.testing.assert_allclose(coef, want, rtol=1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        losses.row_coefficients(mask, wt, "mean")


def _gspo_like(lp, a, valid):
    """A sequence-level loss on [c, L] blocks: every term depends on all of its row's valid log-probs."""
    return losses.ppo_sequence_terms(lp, a["b"], a["adv"], a["c"], valid, clip_eps=0.2, ref_logp=a["b"] + 0.3,
                                     kl_coef=0.1)


@pytest.mark.parametrize("jit,token_chunk,temperature", [(False, 3, 1.0), (True, 8, 0.7), (True, 14, 1.0),
                                                         (False, 1024, 1.0)])
def test_groups_equal_the_general_path_under_a_sequence_level_loss(jit, token_chunk, temperature):
    # 7 rows of L = 4 slots; chunks of 1 (token_chunk 3 < L), 2, 3 (14 // 4, the last chunk padded) and all 7 rows
    B, L, V = 7, 4, 50
    k = jax.random.split(jax.random.key(3), 6)
    h = 0.3 * jax.random.normal(k[0], (B * L, 16))
    w = jax.random.normal(k[1], (16, V))
    t = jax.random.randint(k[2], (B * L,), 0, V)
    valid = (jax.random.uniform(k[3], (B * L,)) > 0.3).at[8:12].set(False)  # row 2: nothing trained
    row = lambda x: jnp.repeat(x, L)  # noqa: E731
    aux = dict(b=-np.log(V) + 0.3 * jax.random.normal(k[4], (B * L,)), adv=row(jax.random.normal(k[5], (B,))),
               c=row(jnp.linspace(0.5, 2, B)))

    def general(h, w):
        lp, _ = LP.chunked_logprobs(h, w, t, temperature=temperature, token_chunk=5, vocab_chunk=16)
        blocks = lambda x: x.reshape(B, L)  # noqa: E731
        return _gspo_like(blocks(lp), jax.tree.map(blocks, aux), blocks(valid)).sum()

    def fused(h, w):
        return HL.fused_token_loss(h, w, t, valid, _gspo_like, aux, temperature=temperature,
                                   token_chunk=token_chunk, group=L)[0]

    np.testing.assert_allclose(_run(fused, jit)(h, w), general(h, w), rtol=1e-5)
    for a, b in zip(_run(jax.grad(fused, (0, 1)), jit)(h, w), jax.grad(general, (0, 1))(h, w)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the same loss through per-token chunks that split rows is wrong: the grouping is what makes it exact
    split = lambda h, w: HL.fused_token_loss(h, w, t, valid, lambda lp, a: _gspo_like(  # noqa: E731
        lp[:, None], jax.tree.map(lambda x: x[:, None], a), jnp.ones((lp.shape[0], 1), bool))[:, 0], aux,
        token_chunk=token_chunk)[0]
    assert not np.allclose(jax.grad(split)(h, w), jax.grad(general)(h, w), atol=1e-4)


def test_group_must_divide_the_rows():
    h, w = jnp.zeros((6, 4)), jnp.zeros((4, 7))
    args = (jnp.zeros(6, jnp.int32), jnp.ones(6, bool), lambda lp, a, v: lp, {})
    for g in (0, 4):
        with pytest.raises(ValueError, match="group"):
            HL.fused_token_loss(h, w, *args, group=g)
    assert HL.fused_token_loss(h, w, *args, group=3)[1].shape == (6,)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_ppo_sequence_terms_sum_to_the_numerator(aggregation):
    k = jax.random.split(jax.random.key(4), 3)
    B, T = 4, 6
    mask = jnp.asarray(np.random.default_rng(1).random((B, T)) > 0.4).at[3].set(False)
    logp = -jax.random.uniform(k[0], (B, T), minval=0.5, maxval=4.0)
    beh = logp + 0.3 * jax.random.normal(k[1], (B, T))
    adv = jax.random.normal(k[2], (B,))
    wt = jnp.array([1.0, 0.5, 2.0, 1.0])
    ref = logp - 0.2
    bc = lambda x: jnp.broadcast_to(x[:, None], (B, T))  # noqa: E731

    def pair(lp):
        num, _, _ = losses.ppo_clip_loss_parts(lp, beh, adv, mask, ratio="sequence", aggregation=aggregation,
                                               sample_weight=wt, ref_logp=ref, kl_coef=0.05)
        coef = losses.row_coefficients(mask, wt, aggregation)
        terms = losses.ppo_sequence_terms(lp, beh, bc(adv), bc(coef), mask, ref_logp=ref, kl_coef=0.05)
        return num, terms.sum()

    num, total = pair(logp)
    np.testing.assert_allclose(total, num, rtol=1e-6)
    g_num, g_sum = (jax.grad(lambda lp, i=i: pair(lp)[i])(logp) for i in (0, 1))
    np.testing.assert_allclose(g_sum, g_num, rtol=1e-5, atol=1e-7)
    # one row's terms move with another token of the same row (the shared ratio), not with another row's
    terms = lambda lp: losses.ppo_sequence_terms(lp, beh, bc(adv), bc(jnp.ones(B)), mask)  # noqa: E731
    jac = jax.jacobian(lambda lp: terms(lp)[0])(logp)  # [T, B, T]
    assert np.asarray(jac[:, 0][:, np.asarray(mask[0])]).any() and not np.asarray(jac[:, 1:]).any()
