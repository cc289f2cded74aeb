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
