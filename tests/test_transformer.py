"""Transformer core: cached decoding equals the full forward; padding-aware positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.models import transformer as tr


@pytest.mark.parametrize("bias,qk", [(False, False), (True, False), (False, True)])
def test_cached_equals_full(bias, qk):
    cfg = tr.tiny_config(300, attention_bias=bias, qk_norm=qk)
    m = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, 300)
    full = m(toks)
    cache = tr.init_cache(cfg, 2, 16)
    lo, cache = m(toks[:, :4], positions=jnp.broadcast_to(jnp.arange(4), (2, 4)), cache=cache, cache_index=0)
    outs = [lo]
    for t in range(4, 7):
        lo, cache = m(toks[:, t:t + 1], positions=jnp.full((2, 1), t), cache=cache, cache_index=t)
        outs.append(lo)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=1e-5)


def test_left_padding_matches_unpadded():
    cfg = tr.tiny_config(300)
    m = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (1, 5), 0, 300)
    ref = m(toks)
    pad = 3
    padded = jnp.concatenate([jnp.zeros((1, pad), jnp.int32), toks], 1)
    pos = jnp.maximum(jnp.arange(8) - pad, 0)[None]
    mask = (jnp.arange(8) >= pad)[None]
    out = m(padded, positions=pos, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(out[:, pad:]), np.asarray(ref), atol=1e-5)


def test_bad_config_names_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        tr.tiny_config(10, num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize("layers,bias,qk,remat", [(2, False, False, False), (1, True, True, False),
                                                   (3, False, True, True)])
def test_last_hidden_equals_the_full_forward_at_the_last_position(layers, bias, qk, remat):
    """`last_hidden` (last layer computed for one query row) == the full forward's hidden state at
    lengths-1, for right-padded rows of every length, and its gradient too."""
    cfg = tr.tiny_config(50, hidden_size=32, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         attention_bias=bias, qk_norm=qk, remat=remat)
    model = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (5, 17), 0, 50)
    lens = jnp.array([17, 1, 5, 9, 12])
    mask = jnp.arange(17)[None] < lens[:, None]
    ref = model(toks, attention_mask=mask, return_hidden=True)[jnp.arange(5), lens - 1]
    np.testing.assert_allclose(np.asarray(model.last_hidden(toks, lens)), np.asarray(ref), atol=2e-6)
    graphdef, params = tr.split(model)

    def loss(p, fast):
        m = tr.merge(graphdef, p)
        h = m.last_hidden(toks, lens) if fast else m(toks, attention_mask=mask, return_hidden=True)[jnp.arange(5),
                                                                                                      lens - 1]
        return jnp.sum(jnp.sin(h))

    g_fast, g_ref = jax.grad(loss)(params, True), jax.grad(loss)(params, False)
    for a, b in zip(jax.tree_util.tree_leaves(g_fast), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)
