"""Small helpers shared by the host adapters (no imports of the games' packages)."""

from __future__ import annotations

import jax
import numpy as np

# The 8 compass moves, in the order of the JAX envs' `crl_jax.envs.base.DIR_NAMES` (a test checks it).
DIR_NAMES = ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
# Same text as the JAX envs' message for an invalid model output.
INVALID_MESSAGE = "That is not a valid action."


def seed_to_int(key_or_seed) -> int:
    """A non-negative int from an int seed, a typed JAX key (`jax.random.key`) or a raw uint32 key."""
    if isinstance(key_or_seed, (int, np.integer)):
        return int(key_or_seed) & ((1 << 63) - 1)
    data = key_or_seed
    if jax.dtypes.issubdtype(getattr(key_or_seed, "dtype", None), jax.dtypes.prng_key):
        data = jax.random.key_data(key_or_seed)
    words = np.asarray(data, np.uint64).reshape(-1)
    out = 0
    for w in words:
        out = ((out << 32) | int(w)) & ((1 << 63) - 1)
    return out
