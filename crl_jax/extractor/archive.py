"""The `archive` method's bank writes: every successful training episode's moves become an entry, with no
extractor call (a control for CRL: what a bank of raw successful plans gives the actor without any learned
distillation).

The entry is the episode's action tokens (the plan the tiny default's entries hold), keyed by the
episode's retrieval query like an extractor's ADD, and written through the same `apply_operations` (same
eviction, same order); failed episodes write nothing. Credit, pruning and retrieval are the loop's, as for
`crl`. The entries have no extractor sample behind them (source -1), so nothing is ever trained on them.
"""

from __future__ import annotations

import jax.numpy as jnp

from crl_jax.extractor.distill import ADD, DistillOut, apply_operations


def archive_entries(action_tokens, turns, entry_len: int):
    """Entries [N, entry_len] and lengths [N] from episodes' action tokens [N, T] and turns [N]: the first
    min(turns, entry_len) moves, zeros after them."""
    T = action_tokens.shape[1]
    tok = action_tokens[:, :entry_len] if T >= entry_len else jnp.pad(action_tokens, ((0, 0), (0, entry_len - T)))
    length = jnp.minimum(turns, entry_len).astype(jnp.int32)
    return jnp.where(jnp.arange(entry_len)[None] < length[:, None], tok, 0).astype(jnp.int32), length


def archive(rt, bank, buffer, key, step, *, episodes, keys, slots) -> DistillOut:
    """Add every successful episode of `episodes` (`success`, `action_tokens`, `turns` [N]) to `bank` in episode
    order, keyed by `keys` [N, D] -> a `DistillOut` (its ADDs; the buffer unchanged)."""
    entry, entry_len = archive_entries(episodes.action_tokens, episodes.turns, rt.cfg.bank.entry_len)
    writes = episodes.success.astype(bool) & (entry_len > 0)
    n = writes.shape[0]
    bank = apply_operations(rt.bank_ops, bank, writes, jnp.full((n,), ADD, jnp.int32), entry, entry_len, keys,
                            slots, jnp.full((n,), -1, jnp.int32), key, step)
    n_add = jnp.sum(writes).astype(jnp.int32)
    z = jnp.int32(0)
    return DistillOut(bank, buffer, n_add, z, jnp.int32(n) - n_add, z, z, adds=writes.astype(jnp.int32),
                      updates=jnp.zeros((n,), jnp.int32))
