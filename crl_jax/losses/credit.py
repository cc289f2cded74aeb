"""Extractor credit: per-entry rewards from the outcomes of the episodes that retrieved each entry.

METHOD.md step 6 and the "Extractor reward" row of §3. Inputs are per-trajectory arrays; `entry_ids`
are ints in [0, N) naming the bank entry a trajectory retrieved, -1 for none (free rollouts, guided
rollouts that found nothing). Every variant returns `EntryRewards(sum, count, mean)`, each [N] with a
static N, so the credit step is one fixed-shape program: `mean[e] = sum[e] / count[e]` (0 when count is
0) is the entry's reward, given to the extractor generation that last wrote entry e; entries with
count 0 received no evidence this step and should produce no extractor sample.

Variants (`entry_rewards(variant, ...)`):
- "outcome" (the paper; an LLM extractor's default): score_i = +1 if outcome_i > 0 else -1; reward = mean score.
- "relative_to_free" (the tiny extractor's default): score_i = success_i - mean_{free j in i's group} success_j
  (success in {0, 1}); the entry is credited with the lift over the group's no-experience control. A trajectory
  whose group has no free member gives no evidence and is not counted.

RETURN decisions (our extension, `extraction.return_samples`): the paper never rewards a `<RETURN>`, so
only writes are trained and a run whose extractor stops writing has no sample left to learn from (the
RETURN collapse). `return_values` gives a RETURN the reward an entry would earn if
the guided rollouts did exactly as well as the group's free ones (the value of playing without an entry),
on the same scale as the variant's entry rewards, so CISPO's batch baseline compares writing with not
writing.

The reference code's optional critic verdict (an actor judging whether the entry helped) is not a variant
here: nothing produces verdicts (METHOD.md §3).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

_F32 = jnp.float32


class EntryRewards(NamedTuple):
    sum: jax.Array  # [N] float32 sum of trajectory scores per entry
    count: jax.Array  # [N] int32 number of scored trajectories per entry
    mean: jax.Array  # [N] float32 sum / count (0 where count == 0)


def outcome_scores(outcomes: jax.Array) -> jax.Array:
    """±1 per trajectory: +1 if outcome > 0 (success, for 0/1 and -1/+1 rewards alike), else -1."""
    return jnp.where(outcomes.astype(_F32) > 0, 1.0, -1.0)


def aggregate_by_entry(scores: jax.Array, entry_ids: jax.Array, num_entries: int,
                       counted: jax.Array | None = None) -> EntryRewards:
    """Per-entry (sum, count, mean) of `scores` over trajectories with entry_ids in [0, N) (and counted).

    scores, entry_ids, counted: same shape (any rank, flattened) -> EntryRewards of [num_entries].
    Ids outside [0, N) (e.g. -1) are ignored.
    """
    chex.assert_equal_shape([scores, entry_ids])
    ids = entry_ids.reshape(-1).astype(jnp.int32)
    use = (ids >= 0) & (ids < num_entries)
    if counted is not None:
        chex.assert_equal_shape([scores, counted])
        use = use & counted.reshape(-1).astype(bool)
    safe_ids = jnp.where(use, ids, 0)
    s = jnp.where(use, scores.reshape(-1).astype(_F32), 0.0)
    total = jax.ops.segment_sum(s, safe_ids, num_segments=num_entries)
    count = jax.ops.segment_sum(use.astype(jnp.int32), safe_ids, num_segments=num_entries)
    mean = jnp.where(count > 0, total / jnp.maximum(count, 1).astype(_F32), 0.0)
    return EntryRewards(total, count, mean)


def outcome_rewards(outcomes: jax.Array, entry_ids: jax.Array, num_entries: int) -> EntryRewards:
    """Default credit: reward_e = mean over trajectories i with entry_ids_i == e of (±1 outcome score_i)."""
    return aggregate_by_entry(outcome_scores(outcomes), entry_ids, num_entries)


def relative_to_free_rewards(outcomes: jax.Array, guided: jax.Array, entry_ids: jax.Array,
                             num_entries: int) -> EntryRewards:
    """reward_e = mean over guided i using e of (success_i - mean_{free j, same group} success_j).

    outcomes, guided (bool), entry_ids: [G, K] (one row per group). success = outcome > 0.
    Free members (guided False) are never credited even if an id is given.
    """
    chex.assert_rank([outcomes, guided, entry_ids], 2)
    chex.assert_equal_shape([outcomes, guided, entry_ids])
    g = guided.astype(bool)
    succ = (outcomes.astype(_F32) > 0).astype(_F32)
    n_free = (~g).sum(-1, keepdims=True).astype(_F32)
    free_mean = jnp.where(~g, succ, 0.0).sum(-1, keepdims=True) / jnp.maximum(n_free, 1.0)
    return aggregate_by_entry(succ - free_mean, entry_ids, num_entries, counted=g & (n_free > 0))


def return_values(variant: str, outcomes: jax.Array, guided: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The reward of a `<RETURN>` decision per episode: (value [G, K] float32, ok [G, K] bool).

    outcomes, guided (bool): [G, K] (one row per group). A RETURN writes nothing, so the guided rollouts
    that would have used its entry play without one, as the free members do:
    - "outcome": value = mean over the group's free members j of (±1 score_j), the entry-reward scale;
    - "relative_to_free": value = 0 (an entry no better than playing free earns 0 there).
    ok: the group has free members (a group without them gives no counterfactual: nothing to train on).
    Every member of a group gets its group's value (a RETURN on a guided episode alike).
    """
    chex.assert_rank([outcomes, guided], 2)
    chex.assert_equal_shape([outcomes, guided])
    g = guided.astype(bool)
    n_free = (~g).sum(-1, keepdims=True)
    ok = jnp.broadcast_to(n_free > 0, g.shape)
    if variant == "outcome":
        free_sum = jnp.where(~g, outcome_scores(outcomes), 0.0).sum(-1, keepdims=True)
        value = free_sum / jnp.maximum(n_free, 1).astype(_F32)
    elif variant == "relative_to_free":
        value = jnp.zeros((g.shape[0], 1), _F32)
    else:
        raise ValueError(f"unknown extractor reward variant {variant!r}; choose one of {VARIANTS}")
    return jnp.where(ok, jnp.broadcast_to(value, g.shape), 0.0).astype(_F32), ok


VARIANTS = ("outcome", "relative_to_free")  # = the values of `extraction.reward`


def entry_rewards(variant: str, outcomes: jax.Array, entry_ids: jax.Array, num_entries: int, *,
                  guided: jax.Array | None = None) -> EntryRewards:
    """Dispatch on the configured variant (see the module docstring); shapes as the chosen function."""
    if variant == "outcome":
        return outcome_rewards(outcomes, entry_ids, num_entries)
    if variant == "relative_to_free":
        if guided is None:
            raise ValueError("extractor reward 'relative_to_free' needs the guided [G, K] mask")
        return relative_to_free_rewards(outcomes, guided, entry_ids, num_entries)
    raise ValueError(f"unknown extractor reward variant {variant!r}; choose one of {VARIANTS}")
