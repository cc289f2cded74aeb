"""The tiny sampler tests' model and prompts (tests/unit/test_sampling.py, test_decode_cache.py,
test_prepared_decode.py). Not a test module."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax.models import transformer as tr


def peaked_tiny(vocab: int, seed: int = 0, **overrides):
    """(graphdef, state) of `tiny_config(vocab, **overrides)` with large numpy-initialised weights (no eager init
    ops to compile): norms 4, matrices N(0, 0.08), so logits are peaked and greedy choices have clear margins."""
    gd, state = tr.split(nnx.eval_shape(lambda: tr.create(tr.tiny_config(vocab, **overrides), jax.random.key(0))))
    rng = np.random.default_rng(seed)
    pure = {k: (np.full(v.shape, 4.0, np.float32) if "norm" in k else
                (0.08 * rng.standard_normal(v.shape)).astype(np.float32))
            for k, v in nnx.to_pure_dict(state).items()}
    nnx.replace_by_pure_dict(state, {k: jnp.asarray(v) for k, v in pure.items()})
    return gd, state


PROMPTS = [[5, 9, 2, 7, 1], [3, 3], [11, 4, 8]]  # three rows of different lengths


def batch(prompts, P=None):
    """Right-padded prompts [B, P] int32 and their lengths [B] (P: the longest row unless given)."""
    P = P or max(len(p) for p in prompts)
    arr = np.zeros((len(prompts), P), np.int32)
    for i, p in enumerate(prompts):
        arr[i, : len(p)] = p
    return jnp.asarray(arr), jnp.asarray([len(p) for p in prompts], jnp.int32)
