"""Advantages and policy losses for Complementary RL, as small pure functions (METHOD.md §2-3).

Every function is jit-able, does its math in float32 and returns `loss = -objective`. Shapes:
`G` groups of `K` rollouts, `B` sequences of `T` tokens, `N` extractor samples. Masks select the
tokens that are trained (response tokens); a row with no valid token contributes nothing and never
produces NaN.

Split GRPO (paper Eq. 5) with the 1/2 weighting of the guided and free subgroups is expressed with
per-sequence `sample_weight`s: `ppo_clip_loss` is a *weighted mean* over sequences (or tokens), so
`split_group_weights(guided)` (1 / (number of non-empty subgroups x subgroup size)) makes the loss the
mean, over groups and their subgroups, of each subgroup's mean loss; with equal-size subgroups every
weight is equal and plain weights (all ones) give exactly the same loss.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _safe_div(num, den):
    """num / den, and 0 where den == 0 (an empty mask or an empty subgroup never gives NaN)."""
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


# ----------------------------------------------------------------------------------------------
# Advantages


def _normalise(r, member, normalize: str, eps: float):
    """(r - mean_S) [/ (std_S + eps)] over the members S (bool, same shape) along the last axis."""
    m = member.astype(_F32)
    n = m.sum(-1, keepdims=True)
    mean = _safe_div((r * m).sum(-1, keepdims=True), n)
    centred = r - mean
    if normalize == "mean":
        return centred
    if normalize != "mean_std":
        raise ValueError(f"normalize must be 'mean_std' or 'mean', got {normalize!r}")
    std = jnp.sqrt(_safe_div((centred**2 * m).sum(-1, keepdims=True), n))  # population std
    return centred / (std + eps)


def group_advantages(rewards: jax.Array, *, normalize: str = "mean_std", eps: float = 1e-6) -> jax.Array:
    """Plain GRPO advantages over each whole group.

    A[g, k] = (r[g, k] - mean_k r[g]) / (std_k r[g] + eps)   ("mean_std", population std)
    A[g, k] =  r[g, k] - mean_k r[g]                          ("mean")

    rewards [G, K] -> [G, K] float32. A constant group (or a group of one) gives 0.
    """
    chex.assert_rank(rewards, 2)
    r = rewards.astype(_F32)
    return _normalise(r, jnp.ones(r.shape, bool), normalize, eps)


def subgroup_advantages(rewards: jax.Array, guided: jax.Array, *, normalize: str = "mean_std",
                        eps: float = 1e-6) -> jax.Array:
    """Split-GRPO advantages (paper Eq. 5): guided and free members of each group normalised apart.

    For S = {k : guided[g, k] == guided[g, j]} (the subgroup of member j):
    A[g, j] = (r[g, j] - mean_S r[g]) / (std_S r[g] + eps)   or   r[g, j] - mean_S r[g].

    rewards [G, K], guided [G, K] bool -> [G, K] float32. All-guided (or all-free) equals
    `group_advantages`; a single-member or constant subgroup gives 0.
    """
    chex.assert_rank([rewards, guided], 2)
    chex.assert_equal_shape([rewards, guided])
    r = rewards.astype(_F32)
    g = guided.astype(bool)
    a_guided = _normalise(r, g, normalize, eps)
    a_free = _normalise(r, ~g, normalize, eps)
    return jnp.where(g, a_guided, a_free)


def split_group_weights(guided: jax.Array) -> jax.Array:
    """Per-sequence weights that make the weighted PPO loss the mean of the subgroups' losses.

    w[g, k] = 1 / (n_subgroups(g) * |S(g, k)|), n_subgroups(g) in {1, 2} = number of non-empty
    subgroups of group g. Each group sums to 1 and each of its non-empty subgroups to 1/n_subgroups,
    i.e. the paper's 1/2 weighting. guided [G, K] bool -> [G, K] float32 (flatten to [B] for the batch).
    """
    chex.assert_rank(guided, 2)
    g = guided.astype(bool)
    n_g = g.sum(-1, keepdims=True).astype(_F32)
    n_f = (~g).sum(-1, keepdims=True).astype(_F32)
    n_sub = (n_g > 0).astype(_F32) + (n_f > 0).astype(_F32)
    size = jnp.where(g, n_g, n_f)
    return 1.0 / (n_sub * size)


# ----------------------------------------------------------------------------------------------
# Policy losses


def _check_token_args(logp, behavior_logp, advantages, mask):
    chex.assert_rank([logp, behavior_logp, advantages, mask], [2, 2, 1, 2])
    chex.assert_equal_shape([logp, behavior_logp, mask])
    chex.assert_equal_shape_prefix([logp, advantages], 1)


def token_entropy(logits: jax.Array) -> jax.Array:
    """H_t = -sum_v p_v log p_v with p = softmax(logits[..., v]). logits [..., V] -> [...] float32."""
    lp = jax.nn.log_softmax(logits.astype(_F32), axis=-1)
    return -(jnp.exp(lp) * lp).sum(-1)


def _token_metrics(log_r, clipped, m, n_tok, logits, entropy_t):
    """Diagnostics over valid tokens: clip fraction, mean ratio, approx KL E[(r - 1) - log r], entropy."""
    log_r = jax.lax.stop_gradient(log_r)
    r = jnp.exp(log_r)
    metrics = {
        "clip_frac": _safe_div((clipped.astype(_F32) * m).sum(), n_tok),
        "ratio_mean": _safe_div((r * m).sum(), n_tok),
        "approx_kl": _safe_div((((r - 1.0) - log_r) * m).sum(), n_tok),
    }
    if entropy_t is None and logits is not None:
        entropy_t = token_entropy(logits)
    if entropy_t is not None:
        metrics["entropy"] = _safe_div((jax.lax.stop_gradient(entropy_t).astype(_F32) * m).sum(), n_tok)
    return metrics


def k3_kl(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(pi || pi_ref) on tokens sampled from pi (0 off the mask).

    k3_t = exp(d_t) - d_t - 1 with d_t = ref_logp_t - logp_t (>= 0, unbiased). [B, T] -> [B, T].
    """
    chex.assert_equal_shape([logp, ref_logp, mask])
    d = ref_logp.astype(_F32) - logp.astype(_F32)
    return jnp.where(mask, jnp.exp(d) - d - 1.0, 0.0)


def ppo_clip_loss_parts(logp, behavior_logp, advantages, mask, *, clip_eps: float = 0.2,
                        ratio: str = "token", aggregation: str = "seq_mean_token_mean",
                        sample_weight=None, logits=None, entropy_t=None, ref_logp=None,
                        kl_coef: float = 0.0):
    """`ppo_clip_loss` as (numerator, denominator, metrics) with loss = numerator / denominator.

    The denominator does not depend on `logp`, so micro-batches are combined exactly by summing
    numerators and denominators (see `train_state.make_co_update`).
    """
    _check_token_args(logp, behavior_logp, advantages, mask)
    if ratio not in ("token", "sequence"):
        raise ValueError(f"ratio must be 'token' or 'sequence', got {ratio!r}")
    if aggregation not in ("seq_mean_token_mean", "token_mean"):
        raise ValueError(f"aggregation must be 'seq_mean_token_mean' or 'token_mean', got {aggregation!r}")
    m = mask.astype(_F32)
    w = jnp.ones(advantages.shape, _F32) if sample_weight is None else sample_weight.astype(_F32)
    chex.assert_equal_shape([w, advantages])
    a = advantages.astype(_F32)[:, None]
    # Masked-out tokens get log-ratio 0 so no inf/NaN from padding can leak into the sums.
    log_r = jnp.where(mask, logp.astype(_F32) - behavior_logp.astype(_F32), 0.0)
    n_b = m.sum(-1)  # [B] valid tokens per sequence
    if ratio == "sequence":
        log_r = jnp.broadcast_to(_safe_div(log_r.sum(-1), n_b)[:, None], log_r.shape)
    r = jnp.exp(log_r)
    r_clip = jnp.clip(r, 1.0 - clip_eps, 1.0 + clip_eps)
    per_tok = -jnp.minimum(r * a, r_clip * a)  # [B, T]
    if ref_logp is not None and kl_coef:
        per_tok = per_tok + kl_coef * k3_kl(logp, ref_logp, mask)
    per_tok = per_tok * m
    if aggregation == "seq_mean_token_mean":
        has = (n_b > 0).astype(_F32)
        num = (w * _safe_div(per_tok.sum(-1), n_b)).sum()
        den = (w * has).sum()
    else:
        num = (w[:, None] * per_tok).sum()
        den = (w * n_b).sum()
    # Tokens whose gradient the clip removes: r above 1+eps with A > 0, or below 1-eps with A < 0.
    clipped = ((r > 1.0 + clip_eps) & (a > 0)) | ((r < 1.0 - clip_eps) & (a < 0))
    metrics = _token_metrics(log_r, clipped, m, m.sum(), logits, entropy_t)
    if ref_logp is not None:
        metrics["kl_ref"] = _safe_div(jax.lax.stop_gradient(k3_kl(logp, ref_logp, mask)).sum(), m.sum())
    return num, den, metrics


def ppo_clip_loss(logp, behavior_logp, advantages, mask, *, clip_eps: float = 0.2, ratio: str = "token",
                  aggregation: str = "seq_mean_token_mean", sample_weight=None, logits=None,
                  entropy_t=None, ref_logp=None, kl_coef: float = 0.0):
    """PPO clipped-surrogate loss over response tokens.

    ratio="token":    r_bt = exp(logp_bt - behavior_logp_bt)
    ratio="sequence": r_bt = exp(sum_t m_bt (logp_bt - behavior_logp_bt) / n_b) for every t of row b
    l_bt = -min(r_bt * A_b, clip(r_bt, 1 - eps, 1 + eps) * A_b)  [+ kl_coef * k3_bt when ref_logp given]
    seq_mean_token_mean: loss = sum_b w_b * (sum_t m_bt l_bt / n_b) / sum_{b: n_b > 0} w_b
    token_mean:          loss = sum_b w_b sum_t m_bt l_bt / sum_b w_b n_b
    with n_b = sum_t m_bt and w = sample_weight (default 1; 0 drops a padding row).

    logp, behavior_logp, mask [B, T]; advantages, sample_weight [B]; logits [B, T, V] aligned so
    that logits[b, t] produced token t (or entropy_t [B, T]) adds the "entropy" metric.
    Returns (loss scalar float32, metrics: clip_frac, ratio_mean, approx_kl = mean((r - 1) - log r)
    over valid tokens, [entropy], [kl_ref]).
    """
    num, den, metrics = ppo_clip_loss_parts(
        logp, behavior_logp, advantages, mask, clip_eps=clip_eps, ratio=ratio, aggregation=aggregation,
        sample_weight=sample_weight, logits=logits, entropy_t=entropy_t, ref_logp=ref_logp, kl_coef=kl_coef)
    return _safe_div(num, den), metrics


def cispo_loss_parts(logp, behavior_logp, advantages, mask, *, eps_low: float = 0.1, eps_high: float = 0.1,
                     logits=None, entropy_t=None):
    """`cispo_loss` as (numerator, denominator = number of valid tokens, metrics)."""
    _check_token_args(logp, behavior_logp, advantages, mask)
    m = mask.astype(_F32)
    lp = logp.astype(_F32)
    log_r = jnp.where(mask, lp - behavior_logp.astype(_F32), 0.0)
    r = jnp.exp(log_r)
    w = jax.lax.stop_gradient(jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high))
    # where() rather than a product so a -inf logp off the mask cannot turn into NaN.
    num = jnp.where(mask, -w * advantages.astype(_F32)[:, None] * lp, 0.0).sum()
    den = m.sum()
    clipped = (r < 1.0 - eps_low) | (r > 1.0 + eps_high)
    return num, den, _token_metrics(log_r, clipped, m, den, logits, entropy_t)


def cispo_loss(logp, behavior_logp, advantages, mask, *, eps_low: float = 0.1, eps_high: float = 0.1,
               logits=None, entropy_t=None):
    """CISPO loss (the extractor's; METHOD.md step 7).

    loss = -sum_{b,t} m_bt * sg(clip(r_bt, 1 - eps_low, 1 + eps_high)) * A_b * logp_bt / sum_{b,t} m_bt
    with r_bt = exp(logp_bt - behavior_logp_bt), so d loss / d logp_bt = -w_bt * A_b / N on valid
    tokens (w = the clipped ratio): every token keeps a gradient, clipping only bounds its weight.

    Shapes as `ppo_clip_loss`. Returns (loss, metrics: clip_frac, ratio_mean, approx_kl, [entropy]).
    """
    num, den, metrics = cispo_loss_parts(logp, behavior_logp, advantages, mask, eps_low=eps_low,
                                         eps_high=eps_high, logits=logits, entropy_t=entropy_t)
    return _safe_div(num, den), metrics


# ----------------------------------------------------------------------------------------------
# Extractor sample weighting


def repeat_weights(times_trained: jax.Array, last_trained_step: jax.Array, step, *, cooldown: int = 1,
                   power: float = 0.5) -> jax.Array:
    """Down-weighting of extractor samples that were already trained on (METHOD.md step 7).

    w_i = 0                           if last_i >= 0 and step - last_i < cooldown
    w_i = (1 + times_trained_i)^-power otherwise
    A never-trained sample has last_trained_step = -1 and is never in cooldown.
    times_trained, last_trained_step [N] -> [N] float32.
    """
    chex.assert_rank([times_trained, last_trained_step], 1)
    chex.assert_equal_shape([times_trained, last_trained_step])
    last = last_trained_step.astype(jnp.int32)
    cool = (last >= 0) & (jnp.asarray(step, jnp.int32) - last < cooldown)
    return jnp.where(cool, 0.0, (1.0 + times_trained.astype(_F32)) ** (-power))


def extractor_advantages(rewards: jax.Array, valid: jax.Array, weights: jax.Array) -> jax.Array:
    """A_i = (r_i - mean_{j valid} r_j) * w_i, and 0 where not valid. [N], [N] bool, [N] -> [N] float32."""
    chex.assert_rank([rewards, valid, weights], 1)
    chex.assert_equal_shape([rewards, valid, weights])
    r = rewards.astype(_F32)
    v = valid.astype(bool)
    mean = _safe_div(jnp.where(v, r, 0.0).sum(), v.sum().astype(_F32))
    return jnp.where(v, (r - mean) * weights.astype(_F32), 0.0)


# The extractor reward variants live in `crl_jax.rewards`; re-exported here for one import site.
from crl_jax.rewards import (  # noqa: F401
    EntryRewards,
    critic_rewards,
    entry_rewards,
    outcome_rewards,
    relative_to_free_rewards,
)
