"""Bank retrieval with diversity re-ranking (METHOD.md §2 step 9). Exported by `crl_jax.bank`.

Shapes: N = bank capacity, D = key dim, Q = queries, C = candidates, K = top_k.

`retrieve` / `retrieve_best` take their hyperparameters as keyword arguments; `make_retriever(...)` binds
them once (flashbax's `make_*_buffer`) into a `Retriever` whose functions take data only.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from crl_jax.bank.state import ExperienceBank, normalize


def retrieve(bank: ExperienceBank, query_keys, query_task, rng: jax.Array | None, step, *, top_k: int = 1,
             candidates: int = 16, diversity_lambda=0.4, recent_steps=1, demote_p=0.5, query_mask=None,
             min_similarity=None, shared_ties: bool = False, select: str = "diversity"):
    """Retrieve entries for a batch of queries -> (bank, slots [Q,K] int32, found [Q,K] bool).

    query_keys [Q,D] (normalised here), query_task [Q] int32, query_mask [Q] bool (default all True).

    For each query, against one snapshot of the bank (the input `bank`):
      1. eligible = valid entries with task == query_task (and cosine >= min_similarity when given: the
         similarity floor); a masked-out query has none.
      2. The C = min(candidates, N) eligible entries with the highest cosine similarity, ordered by
         similarity (ties: lower slot first); rank r = 0..C-1. With `shared_ties`, candidates of exactly
         equal similarity share a rank: r = the number of candidates with a strictly higher similarity
         (entries of one level share one key, so slot order would otherwise decide which of them is ever
         retrieved, and the usage term could not rotate through them); candidates whose score in step 3
         ties exactly are then ordered by a uniform draw per (query, slot) from `rng` (when given), so the
         guided queries of one group, which see one snapshot, spread over a level's equally used entries.
         With `shared_ties` the cut to C also orders exact similarity ties by step 3's other terms (usage,
         recency, the draw; then slot), so a level with more than C entries rotates through all of them.
      3. Rescore s = -r - diversity_lambda * log(1 + times_retrieved) - recent, where recent = 1 if
         the entry was retrieved in one of the `recent_steps` steps before this one
         (0 < step - last_retrieved_step <= recent_steps; -1 = never is never recent), else 0. Order candidates by s (ties: lower rank first).
      4. Demotion: if the best-by-s entry is recent and a second-best eligible entry exists, then with
         probability demote_p (uniform u_q from `rng`, one per query, demote iff u_q < demote_p) the first
         two positions are swapped. With top_k = 1 this returns the second-best instead.
      5. Keep the first K positions; `found` is False (slot -1) where fewer than K eligible entries exist.
    Afterwards times_retrieved grows by the number of (unmasked) queries that received each entry and
    last_retrieved_step becomes `step` for those entries. With diversity_lambda = 0, recent_steps = 0 and
    demote_p = 0 this is plain cosine top-K. `rng=None` disables demotion. `diversity_lambda`,
    `recent_steps` and `demote_p` may be traced scalars; `top_k`, `candidates` and `select` are static.

    `select="thompson"` (our extension) replaces steps 3-4 by Thompson sampling on each entry's lifetime
    credit: theta ~ Beta(1 + wins, 1 + losses) per (query, slot) from `rng` (`thompson_draws`), s = -r + theta.
    Within one similarity rank (with `shared_ties`: a level's entries, which share one key) the entry with the
    largest draw wins, so validated entries are exploited in proportion to their chance of being the best and
    untried ones (Beta(1, 1)) keep being explored; the cut to C orders ties by the draw too. No usage, recency
    or demotion terms. `rng=None`: theta = the posterior mean.
    """
    chex.assert_rank(query_keys, 2)
    chex.assert_rank(query_task, 1)
    n = bank.valid.shape[-1]
    q = query_keys.shape[0]
    c = min(int(candidates), n)
    k = int(top_k)
    if not 1 <= k <= c:
        raise ValueError(f"need 1 <= top_k <= min(candidates, capacity); got top_k={k}, candidates={candidates}, "
                         f"capacity={n}")
    qmask = jnp.ones((q,), bool) if query_mask is None else jnp.asarray(query_mask, bool)
    chex.assert_shape(qmask, (q,))
    step = jnp.asarray(step, jnp.int32)

    # Highest precision: TF32 / bf16 matmuls would reorder near-equal candidates across devices.
    sim = jnp.matmul(normalize(query_keys), bank.keys.T, precision=jax.lax.Precision.HIGHEST)  # [Q,N]
    eligible = bank.valid[None, :] & (bank.task[None, :] == jnp.asarray(query_task, jnp.int32)[:, None])
    eligible = eligible & qmask[:, None]
    if min_similarity is not None:
        eligible = eligible & (sim >= min_similarity)
    if select not in SELECTS:
        raise ValueError(f"select must be one of {SELECTS}, got {select!r}")
    thompson = select == "thompson"
    last_all = bank.last_retrieved_step
    recent_all = (last_all >= 0) & (last_all < step) & (step - last_all <= recent_steps)  # [N]
    # (step 3's terms besides the rank, lower is better; the random draw is one per (query, slot))
    rest_all = recent_all.astype(jnp.float32) + diversity_lambda * jnp.log1p(bank.times_retrieved.astype(jnp.float32))
    draw = None
    if thompson:
        # theta < 1 (the 0.999): a draw never outweighs one rank, so it orders entries within a rank only
        rest_all = jnp.zeros((n,), jnp.float32)
        draw = 0.999 * thompson_draws(bank.total_credit_sum, bank.total_credit_count, rng, q)
    elif shared_ties and rng is not None:
        # < 1e-3: below any rank (1) or recency (1) difference and, at the default lambda = 0.4, below any
        # usage difference (lambda * log((n + 2) / (n + 1)) >= 0.004 for n < 100), so it orders exact ties
        draw = 1e-3 * jax.random.uniform(jax.random.fold_in(rng, 1), (q, n))
    masked_sim = jnp.where(eligible, sim, -jnp.inf)
    if shared_ties:
        # The candidate cut orders exact similarity ties the way step 3 will (usage, recency, the draw; then
        # slot): with more than C entries of one key, slot order would otherwise decide which are candidates.
        tie_key = rest_all[None, :] - (draw if draw is not None else 0.0)
        neg, _, idx = jax.lax.sort((-masked_sim, jnp.broadcast_to(tie_key, (q, n)),
                                    jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (q, n))),
                                   dimension=1, is_stable=True, num_keys=2)
        cand_sim, cand_idx = -neg[:, :c], idx[:, :c]  # [Q,C]
    else:
        cand_sim, cand_idx = jax.lax.top_k(masked_sim, c)  # [Q,C]
    cand_ok = jnp.take_along_axis(eligible, cand_idx, axis=1)
    if shared_ties:
        rank = (cand_sim[:, None, :] > cand_sim[:, :, None]).sum(-1).astype(jnp.float32)  # [Q,C]
    else:
        rank = jnp.broadcast_to(jnp.arange(c, dtype=jnp.float32)[None, :], (q, c))

    recent = recent_all[cand_idx] & (not thompson)
    uses = bank.times_retrieved[cand_idx].astype(jnp.float32) * (not thompson)
    # rank + recent is an exact small integer, so candidates whose usage is equal tie exactly and the
    # lower rank (with shared ties: the lower candidate position, or the random draw below) wins,
    # independent of float rounding order.
    int_penalty = rank + recent.astype(jnp.float32)
    score = -int_penalty - diversity_lambda * jnp.log1p(uses)
    if draw is not None:
        score = score + jnp.take_along_axis(draw, cand_idx, axis=1)
    score = jnp.where(cand_ok, score, -jnp.inf)

    j = min(k + 1, c)  # one extra position so a demoted top-1 has a successor
    _, order = jax.lax.top_k(score, j)  # positions into the candidate list [Q,J]
    chosen = jnp.take_along_axis(cand_idx, order, axis=1)
    chosen_ok = jnp.take_along_axis(cand_ok, order, axis=1)
    chosen_recent = jnp.take_along_axis(recent, order, axis=1)
    if j > 1 and rng is not None and not thompson:
        u = jax.random.uniform(rng, (q,))
        demote = chosen_recent[:, 0] & chosen_ok[:, 0] & chosen_ok[:, 1] & (u < demote_p)
        first = jnp.where(demote, chosen[:, 1], chosen[:, 0])
        second = jnp.where(demote, chosen[:, 0], chosen[:, 1])
        chosen = chosen.at[:, 0].set(first).at[:, 1].set(second)
    found = chosen_ok[:, :k]
    slots = jnp.where(found, chosen[:, :k], -1).astype(jnp.int32)

    # Usage counts once for the whole batch (every query above saw the same snapshot).
    flat = jnp.where(found, slots, n).reshape(-1)
    count = jnp.zeros((n,), jnp.int32).at[flat].add(1, mode="drop")
    bank = bank.replace(
        times_retrieved=bank.times_retrieved + count,
        last_retrieved_step=jnp.where(count > 0, step, bank.last_retrieved_step),
    )
    return bank, slots, found


SELECTS = ("diversity", "thompson")  # = the values of `bank.select`


def beta_counts(credit_sum, credit_count):
    """(wins, losses) of entries from their lifetime +-1 outcome credit: sum = wins - losses, count = wins +
    losses, so wins = (count + sum) / 2 and losses = (count - sum) / 2 (clipped at 0 against float drift).
    credit_sum [N] float, credit_count [N] int -> ([N], [N]) float32."""
    c = credit_count.astype(jnp.float32)
    s = credit_sum.astype(jnp.float32)
    return jnp.maximum((c + s) / 2, 0.0), jnp.maximum((c - s) / 2, 0.0)


def thompson_draws(credit_sum, credit_count, rng, num_queries: int):
    """[Q, N] Thompson draws theta ~ Beta(1 + wins, 1 + losses) per (query, entry), from `rng` (fold-in 2);
    `rng=None`: the posterior means (1 + wins) / (2 + wins + losses). Same key, same draws."""
    wins, losses = beta_counts(credit_sum, credit_count)
    if rng is None:
        return jnp.broadcast_to((1.0 + wins) / (2.0 + wins + losses), (num_queries, wins.shape[0]))
    return jax.random.beta(jax.random.fold_in(rng, 2), 1.0 + wins, 1.0 + losses, (num_queries, wins.shape[0]))


def retrieve_best(bank: ExperienceBank, query_keys, query_task, *, min_similarity=None, used_bonus: float = 0.0,
                  query_mask=None, credit_bonus: float = 0.0):
    """Greedy top-1 for evaluation, the bank unchanged -> (slots [Q] int32 (-1: none), found [Q] bool).

    score = cosine + used_bonus * log(1 + times_retrieved) + credit_bonus * mean lifetime credit over the
    eligible entries (valid, same task, cosine >= min_similarity), where the mean lifetime credit is
    total_credit_sum / total_credit_count (0 for an entry never credited). Small bonuses (~1e-4) only break
    ties between entries of (nearly) equal similarity: toward the entry whose guided episodes succeeded
    (credit) and, among equals, the most used one.
    """
    chex.assert_rank(query_keys, 2)
    sim = jnp.matmul(normalize(query_keys), bank.keys.T, precision=jax.lax.Precision.HIGHEST)  # [Q,N]
    eligible = bank.valid[None, :] & (bank.task[None, :] == jnp.asarray(query_task, jnp.int32)[:, None])
    if query_mask is not None:
        eligible = eligible & jnp.asarray(query_mask, bool)[:, None]
    if min_similarity is not None:
        eligible = eligible & (sim >= min_similarity)
    cnt = bank.total_credit_count.astype(jnp.float32)
    mean_credit = jnp.where(cnt > 0, bank.total_credit_sum / jnp.maximum(cnt, 1.0), 0.0)
    bonus = used_bonus * jnp.log1p(bank.times_retrieved.astype(jnp.float32)) + credit_bonus * mean_credit
    score = sim + bonus[None, :]
    best = jnp.argmax(jnp.where(eligible, score, -jnp.inf), axis=1)
    found = jnp.any(eligible, axis=1)
    return jnp.where(found, best, -1).astype(jnp.int32), found


class Retriever(NamedTuple):
    """`retrieve` and `retrieve_best` with their hyperparameters bound (`make_retriever`):

    - `retrieve(bank, query_keys [Q,D], query_task [Q], rng, step, query_mask=None)`
      -> (bank, slots [Q,K], found [Q,K]) (training: diversity re-ranking, usage bookkeeping);
    - `best(bank, query_keys [Q,D], query_task [Q], query_mask=None)` -> (slots [Q], found [Q])
      (evaluation: greedy top-1, the bank unchanged)."""

    retrieve: Callable[..., tuple[ExperienceBank, jax.Array, jax.Array]]
    best: Callable[..., tuple[jax.Array, jax.Array]]


def make_retriever(*, top_k: int = 1, candidates: int = 16, diversity_lambda=0.4, recent_steps=1, demote_p=0.5,
                   min_similarity=None, shared_ties: bool = False, used_bonus: float = 0.0,
                   credit_bonus: float = 0.0, select: str = "diversity") -> Retriever:
    """A `Retriever`: `retrieve` with top_k, candidates, diversity_lambda, recent_steps, demote_p,
    min_similarity, shared_ties and select bound; `best` (`retrieve_best`) with min_similarity, used_bonus and
    credit_bonus bound (their meaning: those functions' docstrings)."""
    return Retriever(
        retrieve=functools.partial(retrieve, top_k=top_k, candidates=candidates, diversity_lambda=diversity_lambda,
                                   recent_steps=recent_steps, demote_p=demote_p, min_similarity=min_similarity,
                                   shared_ties=shared_ties, select=select),
        best=functools.partial(retrieve_best, min_similarity=min_similarity, used_bonus=used_bonus,
                               credit_bonus=credit_bonus))
