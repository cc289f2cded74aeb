"""Vocabulary-tiled log-probs (crl_jax.models.logprobs): literal values, gradients and entropy equal to the
full-logits computation, the learner's token_logprobs through it, and no [N, V] buffer in the compiled
program (memory_analysis)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.learner import train_state as ts
from crl_jax.models import logprobs as LP
from crl_jax.models import transformer as tfm


def _run(f, jit):
    return jax.jit(f) if jit else f


@pytest.mark.parametrize("jit", [False, True])
def test_literal_values_and_entropy(jit):
    # logits row 0 = [1, 0, -1], row 1 = [0, 2, 2]; vocab_chunk 2 over V = 3 makes the last tile overlap
    # column 1 (it must not be counted twice), token_chunk 1 runs one row per tile.
    h = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    w = jnp.array([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
    tgt = jnp.array([0, 2])
    f = _run(lambda h, w, t: LP.chunked_logprobs(h, w, t, with_entropy=True, token_chunk=1, vocab_chunk=2), jit)
    logp, ent = f(h, w, tgt)
    e = np.e
    want = [1 - np.log(e + 1 + 1 / e), 2 - np.log(1 + 2 * e**2)]
    np.testing.assert_allclose(logp, want, rtol=1e-6)
    z = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 2.0]])
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(-1), rtol=1e-6)
    # temperature 2 halves the logits
    lp2, _ = _run(lambda h, w, t: LP.chunked_logprobs(h, w, t, temperature=2.0, vocab_chunk=2), jit)(h, w, tgt)
    np.testing.assert_allclose(lp2, [0.5 - np.log(e**0.5 + 1 + e**-0.5), 1 - np.log(1 + 2 * e)], rtol=1e-6)


@pytest.mark.parametrize("jit,token_chunk,vocab_chunk,temperature",
                         [(False, 5, 7, 0.7), (True, 4, 16, 1.0), (True, 5, 7, 0.7), (True, 64, 64, 1.0)])
def test_values_and_gradients_equal_the_full_logits(jit, token_chunk, vocab_chunk, temperature):
    k = jax.random.split(jax.random.key(0), 4)
    h = jax.random.normal(k[0], (3, 7, 16))  # 21 rows: not a multiple of token_chunk 4 or 5 (padding)
    w = jax.random.normal(k[1], (16, 50))  # 50 columns: not a multiple of 16 or 7 (overlapping last tile)
    t = jax.random.randint(k[2], (3, 7), 0, 50)
    g = jax.random.normal(k[3], (3, 7))
    kw = dict(temperature=temperature)
    ck = dict(kw, token_chunk=token_chunk, vocab_chunk=vocab_chunk)
    a = _run(lambda h, w: LP.chunked_logprobs(h, w, t, with_entropy=True, **ck), jit)(h, w)
    b = LP.full_logprobs(h, w, t, with_entropy=True, **kw)
    np.testing.assert_allclose(a[0], b[0], atol=2e-5)
    np.testing.assert_allclose(a[1], b[1], atol=2e-5)
    ga = _run(jax.grad(lambda h, w: (LP.chunked_logprobs(h, w, t, **ck)[0] * g).sum(), (0, 1)), jit)(h, w)
    gb = jax.grad(lambda h, w: (LP.full_logprobs(h, w, t, **kw)[0] * g).sum(), (0, 1))(h, w)
    for x, y in zip(ga, gb):
        np.testing.assert_allclose(x, y, atol=2e-5)
    # the entropy output carries no gradient (stop_gradient, as the learner's metric)
    ge = jax.grad(lambda h: LP.chunked_logprobs(h, w, t, with_entropy=True, **ck)[1].sum())(h)
    assert not np.asarray(ge).any()


def test_bfloat16_inputs_keep_their_dtype_in_the_gradient():
    k = jax.random.split(jax.random.key(1), 3)
    h = jax.random.normal(k[0], (9, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(k[1], (8, 40)).astype(jnp.bfloat16)
    t = jax.random.randint(k[2], (9,), 0, 40)
    a = jax.jit(lambda h, w: LP.chunked_logprobs(h, w, t, token_chunk=4, vocab_chunk=16)[0])(h, w)
    np.testing.assert_allclose(a, LP.full_logprobs(h, w, t)[0], atol=1e-4)
    gh, gw = jax.jit(jax.grad(lambda h, w: LP.chunked_logprobs(h, w, t, token_chunk=4, vocab_chunk=16)[0].sum(),
                              (0, 1)))(h, w)
    rh, rw = jax.jit(jax.grad(lambda h, w: LP.full_logprobs(h, w, t)[0].sum(), (0, 1)))(h, w)
    assert gh.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(gh, np.float32), np.asarray(rh, np.float32), atol=3e-2)
    np.testing.assert_allclose(np.asarray(gw, np.float32), np.asarray(rw, np.float32), atol=3e-2)


def _old_token_logprobs(gd, params, tokens, mask):
    """The learner's full-logits version before the tiled one."""
    logits = tfm.apply(gd, params, tokens)[:, :-1].astype(jnp.float32)
    lp = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, -1)
    valid = mask[:, 1:] & True
    return jnp.where(valid, lp, 0.0)


def test_token_logprobs_gradient_equals_the_full_logits_version(tie=True):
    cfg = tfm.tiny_config(96, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                          tie_embeddings=tie)
    gd, params = tfm.split(tfm.create(cfg, jax.random.key(0)))
    tokens = jax.random.randint(jax.random.key(1), (3, 9), 0, 96)
    mask = jnp.arange(9)[None, :] < jnp.array([[9], [5], [7]])
    g = jax.random.normal(jax.random.key(2), (3, 8))

    def new(p):
        return (ts.token_logprobs(gd, p, tokens, mask)[0][:, 1:] * g).sum()

    def old(p):
        return (_old_token_logprobs(gd, p, tokens, mask) * g).sum()

    np.testing.assert_allclose(jax.jit(new)(params), jax.jit(old)(params), rtol=1e-5)
    ga, gb = jax.jit(jax.grad(new))(params), jax.jit(jax.grad(old))(params)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_compiled_temporary_memory_has_no_full_logits_buffer():
    """value_and_grad of the head at N = 2 x 256 rows, V = 8192: the full version needs several [N, V]
    float32 buffers (16 MiB each), the tiled one a few [256, 1024] tiles."""
    B, T, H, V = 2, 256, 64, 8192
    args = (jax.ShapeDtypeStruct((B, T, H), jnp.float32), jax.ShapeDtypeStruct((H, V), jnp.float32),
            jax.ShapeDtypeStruct((B, T), jnp.int32))

    def temp(f):
        m = jax.jit(jax.value_and_grad(lambda h, w, t: f(h, w, t)[0].sum(), (0, 1))).lower(*args).compile()
        return m.memory_analysis().temp_size_in_bytes

    full = temp(LP.full_logprobs)
    tiled = temp(functools.partial(LP.chunked_logprobs, token_chunk=256, vocab_chunk=1024))
    one_buffer = B * T * V * 4
    assert full >= one_buffer, (full, one_buffer)
    assert tiled <= full / 8, (tiled, full)
