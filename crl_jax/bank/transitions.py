"""The experience bank's transitions: pure functions from a bank to a bank (`crl_jax.bank` exports them).

Shapes: N = capacity, L = entry length in tokens, D = key dimension, Q = queries, M = rows of a batch.

Every function here is pure, jit-able and vmap-able (over a leading batch of banks); batch operations are
applied in index order with `lax.scan`, so the result never depends on scheduling.

Semantics (METHOD.md §2 steps 5-9, §3):

- Slots. `add` writes the first free slot (lowest index) if any; otherwise it evicts one valid entry by the
  eviction policy: "fifo" (oldest `insert_order`, the paper's default), "lru" (smallest last use, where
  last use = max(last_retrieved_step, updated_step); ties to the oldest insert), or "random" (uniform over
  all slots, needs `rng`). `insert_order` is set by `add` only: `update` rewrites an entry in place and
  keeps its place in the FIFO queue, its usage counts and its lifetime credit.
- Keys are stored unit-norm (normalised on write, a zero vector stays zero).
- Retrieval: `crl_jax.bank.retrieve`. The state pytree and `init`: `crl_jax.bank.state`.
- Credit: `credit` adds one step's per-entry sums and counts of +-1 outcomes (computed once, by
  `crl_jax.losses.credit`, from the episodes and the entries that guided them) to the entry's lifetime totals,
  which evaluation's tie-break (`retrieve_best(credit_bonus=)`) and inspection read. `add` clears the
  totals of the slot it overwrites.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from crl_jax.bank.state import ExperienceBank, normalize

_EVICTIONS = ("fifo", "lru", "random")
_INT_MAX = jnp.iinfo(jnp.int32).max


def _select(pred: jax.Array, new, old):
    """Tree-wise `where(pred, new, old)` for a scalar predicate."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def _eviction_slot(bank: ExperienceBank, eviction: str, rng) -> jax.Array:
    """Slot to overwrite when the bank is full."""
    if eviction == "fifo":
        return jnp.argmin(jnp.where(bank.valid, bank.insert_order, _INT_MAX)).astype(jnp.int32)
    if eviction == "lru":
        last_use = jnp.maximum(bank.last_retrieved_step, bank.updated_step)
        last_use = jnp.where(bank.valid, last_use, _INT_MAX)
        oldest_use = last_use == jnp.min(last_use)
        return jnp.argmin(jnp.where(oldest_use, bank.insert_order, _INT_MAX)).astype(jnp.int32)
    if eviction == "random":
        if rng is None:
            raise ValueError("eviction='random' needs an explicit `rng` key")
        return jax.random.randint(rng, (), 0, bank.capacity, dtype=jnp.int32)
    raise ValueError(f"eviction must be one of {_EVICTIONS}, got {eviction!r}")


def add(bank: ExperienceBank, tokens, length, key, task, step, source, *, eviction: str = "fifo",
        rng: jax.Array | None = None) -> tuple[ExperienceBank, jax.Array]:
    """Insert one entry: tokens [L], length [], key [D], task [], step [], source [] -> (bank, slot []).

    First free slot if any, else evict by `eviction` (see module doc). The new entry starts with zero usage,
    no credit, `last_retrieved_step` = -1.
    """
    chex.assert_rank([tokens, key], 1)
    chex.assert_shape(tokens, (bank.entry_len,))
    chex.assert_shape(key, (bank.key_dim,))
    has_free = ~jnp.all(bank.valid)
    free = jnp.argmin(bank.valid).astype(jnp.int32)  # first False
    slot = jnp.where(has_free, free, _eviction_slot(bank, eviction, rng))
    i32 = lambda v: jnp.asarray(v, jnp.int32)
    bank = bank.replace(
        tokens=bank.tokens.at[slot].set(i32(tokens)),
        lengths=bank.lengths.at[slot].set(i32(length)),
        keys=bank.keys.at[slot].set(normalize(key)),
        task=bank.task.at[slot].set(i32(task)),
        valid=bank.valid.at[slot].set(True),
        created_step=bank.created_step.at[slot].set(i32(step)),
        updated_step=bank.updated_step.at[slot].set(i32(step)),
        times_retrieved=bank.times_retrieved.at[slot].set(0),
        last_retrieved_step=bank.last_retrieved_step.at[slot].set(-1),
        source=bank.source.at[slot].set(i32(source)),
        insert_order=bank.insert_order.at[slot].set(bank.next_order),
        next_order=bank.next_order + 1,
        total_credit_sum=bank.total_credit_sum.at[slot].set(0.0),
        total_credit_count=bank.total_credit_count.at[slot].set(0),
    )
    return bank, slot


def add_many(bank: ExperienceBank, tokens, lengths, keys, task, step, source, mask, *, eviction: str = "fifo",
             rng: jax.Array | None = None) -> tuple[ExperienceBank, jax.Array]:
    """Insert rows in index order: tokens [M,L], lengths [M], keys [M,D], task [M], source [M], mask [M].

    Row i behaves exactly like `add` after rows 0..i-1. Masked-out rows change nothing and get slot -1.
    With eviction="random", row i uses `fold_in(rng, i)`.
    """
    chex.assert_rank([tokens, keys], 2)
    chex.assert_rank([lengths, task, source, mask], 1)
    m = tokens.shape[0]
    if eviction == "random" and rng is None:
        raise ValueError("eviction='random' needs an explicit `rng` key")
    rngs = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(m)) if rng is not None else None

    def body(b, row):
        tok, ln, k, t, src, msk, r = row
        nb, slot = add(b, tok, ln, k, t, step, src, eviction=eviction, rng=r)
        return _select(msk, nb, b), jnp.where(msk, slot, -1)

    xs = (tokens, lengths, keys, task, source, jnp.asarray(mask, bool), rngs)
    return jax.lax.scan(body, bank, xs)


def can_update(bank: ExperienceBank, slot, expect_order=None) -> jax.Array:
    """`update` would write `slot` (any shape of slots): in range, valid, and (given `expect_order`) still
    holding the entry of that insertion counter."""
    in_range = (slot >= 0) & (slot < bank.capacity)
    safe = jnp.clip(slot, 0, bank.capacity - 1)
    ok = in_range & bank.valid[safe]
    if expect_order is not None:
        ok = ok & (bank.insert_order[safe] == expect_order)
    return ok


def update(bank: ExperienceBank, slot, tokens, length, step, source, *, key=None,
           expect_order=None) -> ExperienceBank:
    """Rewrite entry `slot` in place: tokens [L], length, updated_step = step, source; key [D] if given.

    A no-op when `slot` is out of range or not valid, or (when `expect_order` is given) when the slot no
    longer holds the entry with that `insert_order` (it was evicted and reused since it was retrieved).
    Usage counts, FIFO position and lifetime credit are kept.
    """
    chex.assert_shape(tokens, (bank.entry_len,))
    ok = can_update(bank, slot, expect_order)
    safe = jnp.clip(slot, 0, bank.capacity - 1)
    new = bank.replace(
        tokens=bank.tokens.at[safe].set(jnp.asarray(tokens, jnp.int32)),
        lengths=bank.lengths.at[safe].set(jnp.asarray(length, jnp.int32)),
        updated_step=bank.updated_step.at[safe].set(jnp.asarray(step, jnp.int32)),
        source=bank.source.at[safe].set(jnp.asarray(source, jnp.int32)),
    )
    if key is not None:
        chex.assert_shape(key, (bank.key_dim,))
        new = new.replace(keys=new.keys.at[safe].set(normalize(key)))
    return _select(ok, new, bank)


def update_many(bank: ExperienceBank, slots, tokens, lengths, step, source, mask, *, keys=None,
                expect_order=None) -> ExperienceBank:
    """`update` for rows slots [M], tokens [M,L], lengths [M], source [M], mask [M] in index order.

    Optional keys [M,D] and expect_order [M]. Masked-out rows do nothing.
    """
    chex.assert_rank([slots, lengths, source, mask], 1)
    chex.assert_rank(tokens, 2)
    m = slots.shape[0]
    keys_x = keys if keys is not None else jnp.zeros((m, 0), jnp.float32)
    order_x = expect_order if expect_order is not None else jnp.zeros((m,), jnp.int32)

    def body(b, row):
        s, tok, ln, src, msk, k, o = row
        nb = update(b, s, tok, ln, step, src, key=k if keys is not None else None,
                    expect_order=o if expect_order is not None else None)
        return _select(msk, nb, b), None

    xs = (slots, tokens, lengths, source, jnp.asarray(mask, bool), keys_x, order_x)
    return jax.lax.scan(body, bank, xs)[0]


def apply_merge(bank: ExperienceBank, source_slots, merged_tokens, merged_lengths, merged_mask, task, step,
                source, *, eviction: str = "fifo", rng=None) -> tuple[ExperienceBank, jax.Array]:
    """Replace entries by merged ones: source_slots [S] (-1 padded), merged_tokens [M,L], merged_lengths [M],
    merged_mask [M], scalar task / step / source -> (bank, new_slots [M]).

    The valid source slots are invalidated first (duplicates count once), then the masked-in merged rows are
    added in index order (reusing the freed slots), each with key = normalised mean of the valid sources'
    keys (their common key, bit for bit, when they all have exactly the same one), task `task` and source
    `source` (the merge generation). With no valid source slot there is nothing to merge: the bank is
    unchanged and new_slots are all -1.
    """
    chex.assert_rank(source_slots, 1)
    chex.assert_rank(merged_tokens, 2)
    n = bank.capacity
    picked = jnp.zeros((n,), bool).at[jnp.where(source_slots >= 0, source_slots, n)].set(True, mode="drop")
    picked = picked & bank.valid
    any_src = jnp.any(picked)
    mean_key = jnp.sum(jnp.where(picked[:, None], bank.keys, 0.0), axis=0) / jnp.maximum(jnp.sum(picked), 1)
    merged_key = normalize(mean_key)
    m = merged_tokens.shape[0]
    invalidated = bank.replace(valid=bank.valid & ~picked)
    mask = jnp.asarray(merged_mask, bool) & any_src
    new_bank, slots = add_many(
        invalidated, merged_tokens, merged_lengths, jnp.broadcast_to(merged_key, (m, bank.key_dim)),
        jnp.full((m,), task, jnp.int32), step, jnp.full((m,), source, jnp.int32), mask, eviction=eviction, rng=rng)
    # sources that share one key (one level's entries) pass it on bit for bit: the normalised mean, and even
    # a renormalised unit key (`add`), can be a few ulps off, and retrieval's shared tie ranks compare exactly
    first_key = bank.keys[jnp.argmax(picked)]
    same_key = jnp.all(jnp.where(picked[:, None], bank.keys == first_key[None, :], True))
    new_bank = new_bank.replace(keys=new_bank.keys.at[jnp.where(same_key & (slots >= 0), slots, n)].set(
        first_key, mode="drop"))
    return _select(any_src, new_bank, bank), slots


def credit(bank: ExperienceBank, entry_sum, entry_count) -> ExperienceBank:
    """Record one step's credit: entry_sum [N] (sum of the +-1 outcomes of the episodes each entry guided)
    and entry_count [N] (their number), e.g. `rewards.outcome_rewards(...).sum / .count`, are added to the
    lifetime totals of the valid entries (invalid slots add nothing)."""
    chex.assert_shape([entry_sum, entry_count], (bank.capacity,))
    ok = bank.valid
    return bank.replace(
        total_credit_sum=bank.total_credit_sum + jnp.where(ok, jnp.asarray(entry_sum, jnp.float32), 0.0),
        total_credit_count=bank.total_credit_count + jnp.where(ok, jnp.asarray(entry_count, jnp.int32), 0),
    )


def prune(bank: ExperienceBank, reward, credited, threshold):
    """Pruning (our extension beside Add / Update / Return / Merge, METHOD.md §6): remove every valid
    entry that received credit this step (`credited` [N] bool) with `reward` [N] below `threshold`
    -> (bank, number removed []). Nothing else of the bank changes."""
    drop = bank.valid & jnp.asarray(credited, bool) & (jnp.asarray(reward, jnp.float32) < threshold)
    return bank.replace(valid=bank.valid & ~drop), jnp.sum(drop).astype(jnp.int32)


def size(bank: ExperienceBank) -> jax.Array:
    """Number of valid entries []."""
    return jnp.sum(bank.valid.astype(jnp.int32), axis=-1)


def family_counts(bank: ExperienceBank, num_tasks: int) -> jax.Array:
    """Valid entries per task family [num_tasks] (families outside [0, num_tasks) are not counted)."""
    return jnp.zeros((num_tasks,), jnp.int32).at[bank.task].add(bank.valid.astype(jnp.int32), mode="drop")
