"""The experience bank's state: the `ExperienceBank` pytree, an empty one (`init`) and key normalisation.

Shapes: N = capacity, L = entry length in tokens, D = key dimension. The transitions live in
`crl_jax.bank.transitions` and retrieval in `crl_jax.bank.retrieve`; both import this module, so neither
imports the other; the package `crl_jax.bank` exports all three.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    """x / ||x|| along `axis` in float32; a zero vector stays zero (no NaN)."""
    x = jnp.asarray(x, jnp.float32)
    norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    return x / jnp.maximum(norm, 1e-12)


@struct.dataclass
class ExperienceBank:
    """Fixed-capacity experience store. All per-entry arrays have leading dimension N (capacity)."""

    tokens: jax.Array  # [N, L] int32 entry token ids (padding beyond `lengths` is unspecified, zeros)
    lengths: jax.Array  # [N] int32
    keys: jax.Array  # [N, D] float32, unit-norm retrieval keys
    task: jax.Array  # [N] int32 task family id
    valid: jax.Array  # [N] bool
    created_step: jax.Array  # [N] int32 step of the `add` that created the entry
    updated_step: jax.Array  # [N] int32 step of the last write (add or update)
    times_retrieved: jax.Array  # [N] int32 number of queries that received the entry
    last_retrieved_step: jax.Array  # [N] int32, -1 = never retrieved
    source: jax.Array  # [N] int32 extractor sample id that last wrote the entry, -1 = none
    insert_order: jax.Array  # [N] int32 value of `next_order` when added (FIFO order)
    next_order: jax.Array  # [] int32 monotone insertion counter
    total_credit_sum: jax.Array  # [N] float32 lifetime sum of the +-1 outcomes the entry guided (`bank.credit`)
    total_credit_count: jax.Array  # [N] int32 lifetime number of outcomes

    @property
    def capacity(self) -> int:
        return self.valid.shape[-1]

    @property
    def entry_len(self) -> int:
        return self.tokens.shape[-1]

    @property
    def key_dim(self) -> int:
        return self.keys.shape[-1]


def init(capacity: int, entry_len: int, key_dim: int) -> ExperienceBank:
    """An empty bank with `capacity` slots of `entry_len` tokens and `key_dim`-dimensional keys."""
    if capacity < 1 or entry_len < 1 or key_dim < 1:
        raise ValueError(f"bank capacity, entry_len and key_dim must be >= 1, got {capacity}, {entry_len}, {key_dim}")
    n = capacity
    zi = jnp.zeros((n,), jnp.int32)
    return ExperienceBank(
        tokens=jnp.zeros((n, entry_len), jnp.int32),
        lengths=zi,
        keys=jnp.zeros((n, key_dim), jnp.float32),
        task=zi,
        valid=jnp.zeros((n,), bool),
        created_step=zi,
        updated_step=zi,
        times_retrieved=zi,
        last_retrieved_step=jnp.full((n,), -1, jnp.int32),
        source=jnp.full((n,), -1, jnp.int32),
        insert_order=zi,
        next_order=jnp.zeros((), jnp.int32),
        total_credit_sum=jnp.zeros((n,), jnp.float32),
        total_credit_count=zi,
    )
