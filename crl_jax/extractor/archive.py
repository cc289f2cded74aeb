"""The `archive` method's bank writes: every successful training episode's moves become an entry, with no
extractor call (a control for CRL: what a bank of raw successful plans gives the actor without any learned
distillation). `oracle_archive` (with `extraction.forms`) writes each successful episode's FACT instead, its
end cell `<r{i}> <c{j}>` (`crl_jax.extractor.forms`): on a testbed whose hidden fact is the goal cell, the
entry the best extractor could write (an upper bound for CRL there).

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


def fact_entries(end_cell, entry_len: int):
    """Entries [N, entry_len] and lengths [N] (= 2) from episodes' end cells [N, 2] (`Episodes.end_cell`)."""
    n = end_cell.shape[0]
    return (jnp.pad(end_cell, ((0, 0), (0, entry_len - 2))).astype(jnp.int32),
            jnp.full((n,), 2, jnp.int32))


def archive(rt, bank, buffer, key, step, *, episodes, keys, slots, fact: bool = False) -> DistillOut:
    """Add every successful episode of `episodes` (`success`, `action_tokens`, `turns` [N]) to `bank` in episode
    order, keyed by `keys` [N, D] -> a `DistillOut` (its ADDs; the buffer unchanged). `fact`: the entries are
    the episodes' end cells (`episodes.end_cell` [N, 2], `oracle_archive`), counted as FACT writes."""
    if fact:
        entry, entry_len = fact_entries(episodes.end_cell, rt.cfg.bank.entry_len)
    else:
        entry, entry_len = archive_entries(episodes.action_tokens, episodes.turns, rt.cfg.bank.entry_len)
    writes = episodes.success.astype(bool) & (entry_len > 0)
    n = writes.shape[0]
    bank = apply_operations(rt.bank_ops, bank, writes, jnp.full((n,), ADD, jnp.int32), entry, entry_len, keys,
                            slots, jnp.full((n,), -1, jnp.int32), key, step)
    n_add = jnp.sum(writes).astype(jnp.int32)
    z = jnp.int32(0)
    facts = writes.astype(jnp.int32) if fact else None
    return DistillOut(bank, buffer, n_add, z, jnp.int32(n) - n_add, z, z, adds=writes.astype(jnp.int32),
                      updates=jnp.zeros((n,), jnp.int32), facts=facts)
