"""The blocked causal attention (`models/blocked_attention.py`): the einsum attention's values and gradients, its
block rule, what it keeps for the backward pass, and where "auto" runs it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.models import attention
from crl_jax.models import transformer as tr
from crl_jax.models.blocked_attention import block_size, causal_blocked_attention


def _qkvw(B, T, Nq, K, D, seed=0, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(ks[i], (B, T, n, D), dtype) for i, n in enumerate((Nq, K, K)))
    return q, k, v, jax.random.normal(ks[3], (B, T, Nq * D))


def _loss(fn, K, w):
    return lambda q, k, v: jnp.sum(jnp.tanh(fn(q, k, v).astype(jnp.float32)) * w)


@pytest.mark.parametrize("B,T,Nq,K,D,block,jit", [(2, 37, 6, 2, 16, 8, True), (1, 64, 4, 4, 8, 16, True),
                                                  (1, 64, 4, 4, 8, 16, False), (2, 5, 3, 1, 4, 256, True),
                                                  (2, 5, 3, 1, 4, 256, False), (1, 40, 9, 3, 64, 7, True)])
def test_equals_the_einsum_attention_in_values_and_gradients(B, T, Nq, K, D, block, jit):
    """Grouped-query heads, one block or many, the last one shorter: the output and the gradients of q, k and v
    are einsum's (`dense_attention(mask=None, causal=True)`) up to float32 summation order (eagerly too: only two
    shapes, since eager dispatch of the unrolled blocks is slow)."""
    q, k, v, w = _qkvw(B, T, Nq, K, D, seed=T)
    ref = lambda q, k, v: attention.dense_attention(q, k, v, None, K, "einsum", causal=True)  # noqa: E731
    ours = lambda q, k, v: causal_blocked_attention(q, k, v, K, block=block)  # noqa: E731
    wrap = jax.jit if jit else (lambda f: f)
    np.testing.assert_allclose(np.asarray(wrap(ours)(q, k, v)), np.asarray(ref(q, k, v)), atol=2e-6)
    got = wrap(jax.grad(_loss(ours, K, w), (0, 1, 2)))(q, k, v)
    want = jax.grad(_loss(ref, K, w), (0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-6 * float(jnp.abs(r).max()))


def test_bfloat16_inputs_keep_their_dtype_and_come_close_to_einsum():
    q, k, v, w = _qkvw(1, 48, 4, 2, 16, dtype=jnp.bfloat16)
    o = causal_blocked_attention(q, k, v, 2, block=16)
    assert o.dtype == jnp.bfloat16
    ref = attention.dense_attention(q, k, v, None, 2, "einsum", causal=True)
    np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(ref, np.float32), atol=3e-2)
    gq, gk, gv = jax.grad(_loss(lambda *a: causal_blocked_attention(*a, 2, block=16), 2, w), (0, 1, 2))(q, k, v)
    assert (gq.dtype, gk.dtype, gv.dtype) == (jnp.bfloat16,) * 3


def test_block_size_splits_the_sequence_into_equal_blocks_up_to_a_count():
    assert block_size(1280) == 256  # 5 blocks
    assert block_size(300) == 150  # 2 equal blocks, not 256 + 44
    assert block_size(256) == 256 and block_size(37) == 37  # one block
    assert block_size(8192) == 512  # at most 16 blocks
    assert block_size(37, block=8) == 8  # 5 blocks: 8 x 4 + 5


def test_the_backward_pass_keeps_no_score_sized_buffer():
    """What `jax.vjp` keeps for the backward pass (the residual arrays of its pullback): einsum keeps [B, Hq, T, T]
    float32 probabilities (per layer, in a model); the blocked attention keeps q, k, v, the output and the log-sum-
    exps, nothing with T x T entries."""
    B, T, Nq, K, D = 1, 96, 4, 2, 8
    q, k, v, _ = _qkvw(B, T, Nq, K, D)
    largest = {}
    for name, fn in (("einsum", lambda q, k, v: attention.dense_attention(q, k, v, None, K, "einsum", causal=True)),
                     ("blocked", lambda q, k, v: causal_blocked_attention(q, k, v, K, block=32))):
        _, pullback = jax.vjp(fn, q, k, v)
        largest[name] = max(x.size for x in jax.tree.leaves(pullback) if hasattr(x, "size"))
    assert largest["einsum"] >= B * Nq * T * T
    assert largest["blocked"] == B * T * Nq * D, largest  # q or the output


def test_shapes_it_cannot_take_are_a_clear_error():
    q, k, v, _ = _qkvw(1, 8, 4, 2, 8)
    with pytest.raises(ValueError, match="as many keys as queries"):
        causal_blocked_attention(q, k[:, :5], v[:, :5], 2)
    with pytest.raises(ValueError, match="kv heads"):
        causal_blocked_attention(q, k, v, 3)


def test_auto_runs_it_on_the_cpu_from_blocked_min_len_for_the_plain_causal_forward_only(monkeypatch):
    """A tiny model at T = BLOCKED_MIN_LEN: "auto" on the CPU gives einsum's logits and gradients through the blocked
    attention (a spy counts its calls); a padded forward (a mask) and a shorter one stay on einsum."""
    pick = attention.attention_impl
    n = attention.BLOCKED_MIN_LEN
    assert pick("auto", jnp.float32, 64, backend="cpu", seq_len=n) == "blocked"
    assert pick("auto", jnp.float32, 64, backend="cpu", seq_len=n - 1) == "einsum"
    assert pick("auto", jnp.float32, 64, backend="cpu") == "einsum"  # length unknown
    assert pick("auto", jnp.bfloat16, 64, backend="tpu", seq_len=4096) == "einsum"
    assert pick("auto", jnp.bfloat16, 64, backend="gpu", seq_len=4096, compute_capability="9.0") == "cudnn"
    calls = []
    real = attention.causal_blocked_attention
    monkeypatch.setattr(attention, "causal_blocked_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cfg = tr.tiny_config(97, hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=2)
    toks = jax.random.randint(jax.random.key(1), (2, n), 0, 97)
    out = {}
    for impl in ("einsum", "auto"):
        gd, params = tr.split(tr.create(cfg.replace(attn_impl=impl), jax.random.key(0)))
        loss = lambda p, mask=None: jnp.sum(tr.merge(gd, p)(toks, attention_mask=mask) ** 2) * 1e-4  # noqa: B023,E731
        out[impl] = jax.value_and_grad(loss)(params)
        if jax.default_backend() == "cpu":
            assert len(calls) == (1 if impl == "auto" else 0), calls  # the layer scan traces its body once
    np.testing.assert_allclose(float(out["auto"][0]), float(out["einsum"][0]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(out["auto"][1]), jax.tree.leaves(out["einsum"][1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
    calls.clear()
    tr.merge(gd, params)(toks, attention_mask=jnp.ones((2, n), bool))  # padded form: einsum
    tr.merge(gd, params)(toks[:, : n - 1])  # shorter than BLOCKED_MIN_LEN: einsum
    assert calls == []
