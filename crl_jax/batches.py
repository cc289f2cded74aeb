"""Training batches of one step: split-GRPO actor batch from episodes, CISPO extractor batch from the buffer.

Actor ("current" history): every played turn is one row (its prompt and the chosen action token) with
the episode's advantage. With `seq_mean_token_mean` an episode's action tokens count as one sequence:
the row weight is the episode weight divided by its number of turns, so each episode weighs the same
whatever its length (and the split-GRPO weights make each subgroup weigh 1/2 of its group). With
`token_mean` every played turn weighs the same. Each row trains one token, so the `sequence` ratio
option equals the token ratio in this layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax import buffer as buffer_lib
from crl_jax import losses
from crl_jax.packing import pack_segments
from crl_jax.constrained_losses import TurnBatch
from crl_jax.train_state import ExtractorBatch


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
                      advantages=jnp.repeat(adv, T), weight=jnp.repeat(w, T) * ep.active.reshape(rows))
    R = rt.cfg.loss.turn_rows
    if 0 < R < rows:
        score = jnp.where(ep.active.reshape(rows), jax.random.uniform(key, (rows,)), -1.0)
        _, idx = jax.lax.top_k(score, R)
        batch = jax.tree_util.tree_map(lambda x: x[idx], batch)
    return batch, {"adv_abs_mean": jnp.abs(adv).mean()}


def extractor_batch(rt, buffer, step, ready):
    """Pop the oldest rewarded samples (when `ready`) -> (buffer, ExtractorBatch)."""
    ec = rt.cfg.extraction
    popped, b = buffer_lib.pop_batch(buffer, ec.batch, step, cooldown=ec.cooldown, power=ec.power)
    buffer = jax.tree_util.tree_map(lambda n, o: jnp.where(ready, n, o), popped, buffer)
    tokens, total = jax.vmap(lambda p, pl, r, rl: pack_segments([(p, pl), (r, rl)]))(
        b["prompt"], b["prompt_len"], b["response"], b["response_len"])
    T = tokens.shape[1]
    t = jnp.arange(T)[None, :]
    pl = b["prompt_len"][:, None]
    mask = (t >= pl) & (t < total[:, None]) & b["valid"][:, None]
    src = jnp.clip(t - pl, 0, b["behavior_logp"].shape[1] - 1)
    blogp = jnp.where(mask, jnp.take_along_axis(b["behavior_logp"], src, axis=1), 0.0)
    adv = losses.extractor_advantages(b["reward"], b["valid"], b["weight"])
    return buffer, ExtractorBatch(tokens=tokens, loss_mask=mask, behavior_logp=blogp, advantages=adv,
                                  ready=jnp.asarray(ready, bool))
