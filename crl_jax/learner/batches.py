"""Training batches of one step: split-GRPO actor batch from episodes, CISPO extractor batch from the buffer.

Actor ("current" history): every played turn is one row (its prompt and the chosen action token) with
the episode's advantage. With `seq_mean_token_mean` an episode's action tokens count as one sequence:
the row weight is the episode weight divided by its number of turns, so each episode weighs the same
whatever its length (and the split-GRPO weights make each subgroup weigh 1/2 of its group). With
`token_mean` every played turn weighs the same. Rows carry their episode's index, so `loss.ratio=sequence`
shares one ratio per episode (`loss_fns.actor_turn_loss`).

PPO epochs: with `loss.epochs` x `loss.minibatches` > 1 the rows are shuffled once per epoch and cut into
minibatches, stacked along a leading [epochs * minibatches] axis (one optimizer step each, in order;
`train_state.apply_updates`). Every step sees the stored behaviour log-probs, so the ratio and clip act.
The same stacking carries the prior-preserving auxiliary rows (fresh synthetic rows for every step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax import losses
from crl_jax.learner import pretrain
from crl_jax.learner.loss_fns import TurnBatch
from crl_jax.learner.train_state import ExtractorBatch
from crl_jax.text.packing import pack_segments


def episode_advantages(rt, reward, guided, split):
    """reward, guided [G, K], split (traced bool) -> (advantages [G, K], weights [G, K]).

    split: per-subgroup advantages and 1/2 subgroup weights (paper Eq. 5); else one normalisation over the
    whole group (the cross-group ablation) with equal weights.
    """
    lc = rt.cfg.loss
    adv_s = losses.subgroup_advantages(reward, guided, normalize=lc.normalize)
    w_s = losses.split_group_weights(guided)
    adv_c = losses.group_advantages(reward, normalize=lc.normalize)
    w_c = jnp.full(reward.shape, 1.0 / reward.shape[1], jnp.float32)
    return jnp.where(split, adv_s, adv_c), jnp.where(split, w_s, w_c)


def actor_batch(rt, ep, guided, split, key=None):
    """Episodes [N = G*K] with T turns -> (TurnBatch, metrics).

    All N*T turn rows, or (`loss.turn_rows` = R > 0) R rows drawn uniformly without replacement among the
    played turns, which keeps the update's cost fixed whatever N*T is (the weighted mean over the drawn
    rows estimates the full one).
    """
    G, K = guided.shape
    N, T, P = ep.prompts.shape
    adv, w = episode_advantages(rt, ep.reward.reshape(G, K), guided, split)
    adv, w = adv.reshape(N), w.reshape(N)
    if rt.cfg.loss.aggregation == "seq_mean_token_mean":
        w = w / jnp.maximum(ep.turns, 1).astype(jnp.float32)
    rows = N * T
    batch = TurnBatch(prompts=ep.prompts.reshape(rows, P), prompt_len=ep.prompt_len.reshape(rows),
                      action_token=ep.action_tokens.reshape(rows), behavior_logp=ep.logp.reshape(rows),
                      advantages=jnp.repeat(adv, T), weight=jnp.repeat(w, T) * ep.active.reshape(rows),
                      episode=jnp.repeat(jnp.arange(N, dtype=jnp.int32), T))
    lc = rt.cfg.loss
    R = lc.turn_rows
    k_rows, k_perm, k_aux = jax.random.split(key, 3) if key is not None else (None, None, None)
    if 0 < R < rows:
        score = jnp.where(ep.active.reshape(rows), jax.random.uniform(k_rows, (rows,)), -1.0)
        _, idx = jax.lax.top_k(score, R)
        batch = jax.tree_util.tree_map(lambda x: x[idx], batch)
    steps = lc.epochs * lc.minibatches
    if steps > 1:
        batch = stack_minibatches(batch, k_perm, lc.epochs, lc.minibatches)
    prior = pretrain.aux_actor_rows(rt, k_aux, steps)
    batch = batch.replace(prior=prior)
    return batch, {"adv_abs_mean": jnp.abs(adv).mean()}


def stack_minibatches(batch, key, epochs: int, minibatches: int):
    """Rows [B] -> [epochs * minibatches, B / minibatches]: one shuffle per epoch, then consecutive cuts.
    Rows beyond a multiple of `minibatches` are dropped from that epoch (the shuffle moves them around)."""
    B = jax.tree_util.tree_leaves(batch)[0].shape[0]
    m = B // minibatches
    perms = jnp.stack([jax.random.permutation(k, B)[: m * minibatches] for k in jax.random.split(key, epochs)])
    idx = perms.reshape(epochs * minibatches, m)
    return jax.tree_util.tree_map(lambda x: x[idx], batch)


def extractor_batch(rt, buffer, step, ready, key=None, epochs: int = 1):
    """Pop the oldest rewarded samples (`rt.buffer_ops.pop_batch`, when `ready`) -> (buffer, ExtractorBatch);
    `epochs` > 1 stacks the batch that many times (leading axis) for as many optimizer steps; `key` draws the
    auxiliary rows."""
    popped, b = rt.buffer_ops.pop_batch(buffer, step)
    buffer = jax.tree_util.tree_map(lambda n, o: jnp.where(ready, n, o), popped, buffer)
    tokens, total = jax.vmap(lambda p, pl, r, rl: pack_segments([(p, pl), (r, rl)]))(
        b["prompt"], b["prompt_len"], b["response"], b["response_len"])
    T = tokens.shape[1]
    t = jnp.arange(T)[None, :]
    pl = b["prompt_len"][:, None]
    mask = (t >= pl) & (t < total[:, None]) & b["valid"][:, None]
    src = jnp.clip(t - pl, 0, b["behavior_logp"].shape[1] - 1)
    blogp = jnp.where(mask, jnp.take_along_axis(b["behavior_logp"], src, axis=1), 0.0)
    # with extraction.outcome_last a prompt's last token is its episode's outcome: the groups of "outcome_mean"
    last = jnp.take_along_axis(b["prompt"], jnp.maximum(b["prompt_len"] - 1, 0)[:, None], axis=1)[:, 0]
    adv = losses.extractor_advantages(b["reward"], b["valid"], b["weight"], rt.cfg.extraction.baseline, last)
    eb = ExtractorBatch(tokens=tokens, loss_mask=mask, behavior_logp=blogp, advantages=adv,
                        ready=jnp.asarray(ready, bool), response_width=b["response"].shape[1])
    E = epochs
    prior = pretrain.aux_extractor_rows(rt, key, E)
    if E > 1:  # the same samples every epoch (off-policy ratios against the stored log-probs)
        eb = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (E,) + x.shape), eb)
    return buffer, eb.replace(prior=prior)
