"""Policy losses (METHOD.md §3: PPO-clip for the actor, CISPO for the extractor), as rlax builds them:
per-token terms, aggregations to (numerator, denominator) and diagnostics as separate small functions, each
with its equation; `ppo_clip_loss` and `cispo_loss` compose them. Shapes: `B` sequences of `T` tokens.
Re-exported by `crl_jax.losses`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from crl_jax.losses.advantages import _F32, _safe_div


# ----------------------------------------------------------------------------------------------
# Per-token terms. Elementwise: any shape (one sequence [T] or a batch [B, T]), float32 out.


def log_ratio(logp: jax.Array, behavior_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token log importance ratio, 0 off the mask.

    log r_t = logp_t - behavior_logp_t  where mask_t,  else 0
    (0 rather than whatever padding holds, so no inf / NaN can leak into a sum). Equal shapes.
    """
    chex.assert_equal_shape([logp, behavior_logp, mask])
    return jnp.where(mask, logp.astype(_F32) - behavior_logp.astype(_F32), 0.0)


def sequence_log_ratio(log_r: jax.Array, mask: jax.Array) -> jax.Array:
    """One log-ratio per sequence (GSPO-style), shared by all of its tokens. Unbatched: vmap over rows.

    log r_t <- sum_s log r_s / n  for every t,  n = sum_s mask_s  (0 when n = 0)
    log_r [T] (0 off the mask, as `log_ratio` gives), mask [T] -> [T] float32.
    """
    chex.assert_rank([log_r, mask], 1)
    chex.assert_equal_shape([log_r, mask])
    n = mask.astype(_F32).sum()
    return jnp.broadcast_to(_safe_div(log_r.sum(), n), log_r.shape)


def ppo_clip_token_loss(log_r: jax.Array, advantages: jax.Array, clip_eps: float = 0.2) -> jax.Array:
    """Per-token PPO clipped-surrogate loss (minus the objective).

    r_t = exp(log r_t),   l_t = -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)
    log_r [...]; advantages broadcastable to it ([B, 1] for one advantage per sequence) -> log_r's shape.
    """
    chex.assert_is_broadcastable(advantages.shape, log_r.shape)
    r = jnp.exp(log_r)
    r_clip = jnp.clip(r, 1.0 - clip_eps, 1.0 + clip_eps)
    return -jnp.minimum(r * advantages, r_clip * advantages)


def cispo_token_loss(logp: jax.Array, log_r: jax.Array, advantages: jax.Array, mask: jax.Array,
                     eps_low: float = 0.1, eps_high: float = 0.1) -> jax.Array:
    """Per-token CISPO loss: REINFORCE weighted by the clipped ratio, the weight carrying no gradient.

    w_t = sg(clip(exp(log r_t), 1 - eps_low, 1 + eps_high)),   l_t = -w_t A_t logp_t  on the mask, 0 off it
    so d l_t / d logp_t = -w_t A_t: clipping bounds a token's weight and never removes its gradient.
    A where, not a product, masks: a -inf logp off the mask cannot turn into NaN.
    logp, log_r, mask [...]; advantages broadcastable to them -> [...] float32.
    """
    chex.assert_equal_shape([logp, log_r, mask])
    chex.assert_is_broadcastable(advantages.shape, log_r.shape)
    lp = logp.astype(_F32)
    w = jax.lax.stop_gradient(jnp.clip(jnp.exp(log_r), 1.0 - eps_low, 1.0 + eps_high))
    return jnp.where(mask, -w * advantages * lp, 0.0)


def ppo_clipped(log_r: jax.Array, advantages: jax.Array, clip_eps: float = 0.2) -> jax.Array:
    """Tokens whose gradient the PPO clip removes (bool):

    (r_t > 1 + eps and A_t > 0)  or  (r_t < 1 - eps and A_t < 0),   r_t = exp(log r_t).
    """
    chex.assert_is_broadcastable(advantages.shape, log_r.shape)
    r = jnp.exp(log_r)
    return ((r > 1.0 + clip_eps) & (advantages > 0)) | ((r < 1.0 - clip_eps) & (advantages < 0))


def cispo_clipped(log_r: jax.Array, eps_low: float = 0.1, eps_high: float = 0.1) -> jax.Array:
    """Tokens whose CISPO weight is clipped (bool): r_t < 1 - eps_low  or  r_t > 1 + eps_high."""
    r = jnp.exp(log_r)
    return (r < 1.0 - eps_low) | (r > 1.0 + eps_high)


def k3_kl(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(pi || pi_ref) on tokens sampled from pi (0 off the mask).

    k3_t = exp(d_t) - d_t - 1 with d_t = ref_logp_t - logp_t (>= 0, unbiased). Equal shapes -> float32.
    """
    chex.assert_equal_shape([logp, ref_logp, mask])
    d = ref_logp.astype(_F32) - logp.astype(_F32)
    return jnp.where(mask, jnp.exp(d) - d - 1.0, 0.0)


def token_entropy(logits: jax.Array) -> jax.Array:
    """H_t = -sum_v p_v log p_v with p = softmax(logits[..., v]). logits [..., V] -> [...] float32."""
    lp = jax.nn.log_softmax(logits.astype(_F32), axis=-1)
    return -(jnp.exp(lp) * lp).sum(-1)


# ----------------------------------------------------------------------------------------------
# Aggregations: per-token losses [B, T] -> (numerator, denominator), loss = numerator / denominator.
# The denominator does not depend on the policy, so micro-batches combine exactly by summing both
# (`train_state.make_co_update`).


def seq_mean_token_mean(loss_t: jax.Array, mask: jax.Array, weight: jax.Array | None = None):
    """Weighted mean over sequences of each sequence's mean over its valid tokens.

    num = sum_b w_b (sum_t l_bt / n_b),   den = sum_{b: n_b > 0} w_b,   n_b = sum_t mask_bt
    (a sequence with n_b = 0 adds nothing; w = 1 when weight is None).
    loss_t [B, T] (already 0 off the mask), mask [B, T], weight [B] -> (num, den) float32 scalars.
    """
    chex.assert_rank([loss_t, mask], 2)
    chex.assert_equal_shape([loss_t, mask])
    n = mask.astype(_F32).sum(-1)
    has = (n > 0).astype(_F32)
    seq = _safe_div(loss_t.sum(-1), n)
    if weight is None:
        return seq.sum(), has.sum()
    chex.assert_shape(weight, n.shape)
    w = weight.astype(_F32)
    return (w * seq).sum(), (w * has).sum()


def token_mean(loss_t: jax.Array, mask: jax.Array, weight: jax.Array | None = None):
    """Weighted mean over all valid tokens of the batch.

    num = sum_b w_b sum_t l_bt,   den = sum_b w_b n_b,   n_b = sum_t mask_bt
    (unweighted when weight is None: num = sum_bt l_bt, den = sum_bt mask_bt).
    loss_t [B, T] (already 0 off the mask), mask [B, T], weight [B] -> (num, den) float32 scalars.
    """
    chex.assert_rank([loss_t, mask], 2)
    chex.assert_equal_shape([loss_t, mask])
    m = mask.astype(_F32)
    if weight is None:
        return loss_t.sum(), m.sum()
    chex.assert_shape(weight, m.shape[:1])
    w = weight.astype(_F32)
    return (w[:, None] * loss_t).sum(), (w * m.sum(-1)).sum()


AGGREGATIONS = {"seq_mean_token_mean": seq_mean_token_mean, "token_mean": token_mean}


def row_coefficients(mask: jax.Array, weight: jax.Array | None, aggregation: str) -> jax.Array:
    """Per-sequence c_b with num = sum_b c_b sum_t l_bt for the aggregation's numerator (both are linear in l):

    seq_mean_token_mean: c_b = w_b / n_b (0 when n_b = 0);   token_mean: c_b = w_b;   w = 1 when weight is None.
    So a loss that is a sum of per-token terms c_b l_bt can be scored token by token
    (`train_state.token_loss`). mask [B, T], weight [B] -> [B] float32.
    """
    chex.assert_rank(mask, 2)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be 'seq_mean_token_mean' or 'token_mean', got {aggregation!r}")
    w = jnp.ones(mask.shape[:1], _F32) if weight is None else weight.astype(_F32)
    chex.assert_shape(w, mask.shape[:1])
    if aggregation == "token_mean":
        return w
    return _safe_div(w, mask.astype(_F32).sum(-1))


# ----------------------------------------------------------------------------------------------
# Diagnostics: means over the valid tokens, no gradient.


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """mean_{t: mask_t} x_t = sum_t m_t x_t / sum_t m_t  (0 for an empty mask). Equal shapes -> []."""
    chex.assert_equal_shape([x, mask])
    m = mask.astype(_F32)
    return _safe_div((x * m).sum(), m.sum())


def clip_fraction(clipped: jax.Array, mask: jax.Array) -> jax.Array:
    """Fraction of valid tokens that are clipped: sum_t m_t clipped_t / sum_t m_t."""
    return masked_mean(clipped.astype(_F32), mask)


def ratio_mean(log_r: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean importance ratio over valid tokens: mean_t exp(log r_t)."""
    return masked_mean(jnp.exp(jax.lax.stop_gradient(log_r)), mask)


def approx_kl(log_r: jax.Array, mask: jax.Array) -> jax.Array:
    """k3 estimate of KL(behaviour || policy) from behaviour samples: mean_t (r_t - 1) - log r_t (>= 0)."""
    log_r = jax.lax.stop_gradient(log_r)
    return masked_mean((jnp.exp(log_r) - 1.0) - log_r, mask)


def mean_entropy(entropy_t: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean per-token entropy over valid tokens: mean_t H_t."""
    return masked_mean(jax.lax.stop_gradient(entropy_t).astype(_F32), mask)


def policy_diagnostics(log_r, clipped, mask, *, logits=None, entropy_t=None) -> dict:
    """{clip_frac, ratio_mean, approx_kl, [entropy]} over valid tokens; the entropy from `entropy_t`
    [B, T], else from `logits` [B, T, V] (`token_entropy`), else left out."""
    metrics = {"clip_frac": clip_fraction(clipped, mask), "ratio_mean": ratio_mean(log_r, mask),
               "approx_kl": approx_kl(log_r, mask)}
    if entropy_t is None and logits is not None:
        entropy_t = token_entropy(logits)
    if entropy_t is not None:
        metrics["entropy"] = mean_entropy(entropy_t, mask)
    return metrics


# ----------------------------------------------------------------------------------------------
# Policy losses: the compositions (ratio -> per-token loss -> aggregation, + diagnostics)


def _check_token_args(logp, behavior_logp, advantages, mask):
    chex.assert_rank([logp, behavior_logp, advantages, mask], [2, 2, 1, 2])
    chex.assert_equal_shape([logp, behavior_logp, mask])
    chex.assert_equal_shape_prefix([logp, advantages], 1)


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
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be 'seq_mean_token_mean' or 'token_mean', got {aggregation!r}")
    m = mask.astype(_F32)
    w = jnp.ones(advantages.shape, _F32) if sample_weight is None else sample_weight.astype(_F32)
    chex.assert_equal_shape([w, advantages])
    a = advantages.astype(_F32)[:, None]
    log_r = log_ratio(logp, behavior_logp, mask)
    if ratio == "sequence":
        log_r = jax.vmap(sequence_log_ratio)(log_r, mask)
    per_tok = ppo_clip_token_loss(log_r, a, clip_eps)  # [B, T]
    if ref_logp is not None and kl_coef:
        per_tok = per_tok + kl_coef * k3_kl(logp, ref_logp, mask)
    num, den = AGGREGATIONS[aggregation](per_tok * m, mask, w)
    metrics = policy_diagnostics(log_r, ppo_clipped(log_r, a, clip_eps), mask, logits=logits,
                                 entropy_t=entropy_t)
    if ref_logp is not None:
        metrics["kl_ref"] = _safe_div(jax.lax.stop_gradient(k3_kl(logp, ref_logp, mask)).sum(), m.sum())
    return num, den, metrics


def ppo_token_terms(logp, behavior_logp, advantages, coef, *, clip_eps: float = 0.2, ref_logp=None,
                    kl_coef: float = 0.0):
    """Each valid token's share of `ppo_clip_loss_parts`' numerator with ratio="token", elementwise:

    c * (ppo_clip_token_loss(logp - behavior_logp, A) + kl_coef * k3(logp, ref_logp))
    with c the row's `row_coefficients` (summed over a batch's valid tokens, this is that numerator; tested).
    All arguments the same shape (broadcast per-row values to it) -> float32.
    """
    chex.assert_equal_shape([logp, behavior_logp, advantages, coef])
    lp = logp.astype(_F32)
    per_tok = ppo_clip_token_loss(lp - behavior_logp.astype(_F32), advantages.astype(_F32), clip_eps)
    if ref_logp is not None and kl_coef:
        per_tok = per_tok + kl_coef * k3_kl(lp, ref_logp, jnp.ones(lp.shape, bool))
    return coef.astype(_F32) * per_tok


def ppo_sequence_terms(logp, behavior_logp, advantages, coef, mask, *, clip_eps: float = 0.2, ref_logp=None,
                       kl_coef: float = 0.0):
    """Each valid token's share of `ppo_clip_loss_parts`' numerator with ratio="sequence":

    c_b * (ppo_clip_token_loss(sequence_log_ratio(log r_b, m_b), A_b) + kl_coef * k3(logp, ref_logp))  on the mask
    with c_b the row's `row_coefficients`. Not elementwise over tokens: each term depends on every valid log-prob
    of its row through the shared ratio, so a caller that splits the batch keeps rows whole.
    All arguments [B, T] (broadcast per-row values to it) -> [B, T] float32, 0 off the mask.
    """
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, behavior_logp, advantages, coef, mask])
    lp = logp.astype(_F32)
    log_r = jax.vmap(sequence_log_ratio)(log_ratio(lp, behavior_logp, mask), mask)
    per_tok = ppo_clip_token_loss(log_r, advantages.astype(_F32), clip_eps)
    if ref_logp is not None and kl_coef:
        per_tok = per_tok + kl_coef * k3_kl(lp, ref_logp, mask)
    return jnp.where(mask, coef.astype(_F32) * per_tok, 0.0)


def ppo_clip_loss(logp, behavior_logp, advantages, mask, *, clip_eps: float = 0.2, ratio: str = "token",
                  aggregation: str = "seq_mean_token_mean", sample_weight=None, logits=None,
                  entropy_t=None, ref_logp=None, kl_coef: float = 0.0):
    """PPO clipped-surrogate loss over response tokens.

    ratio="token":    r_bt = exp(logp_bt - behavior_logp_bt)                          (`log_ratio`)
    ratio="sequence": r_bt = exp(sum_t m_bt (logp_bt - behavior_logp_bt) / n_b) for every t of row b
                                                                                    (`sequence_log_ratio`)
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
                     logits=None, entropy_t=None, token_weight=None):
    """`cispo_loss` as (numerator, denominator = number of valid tokens, metrics). `token_weight` [B, T]
    (default 1) scales each token's term of the numerator, not the denominator (`op_token_weights`)."""
    _check_token_args(logp, behavior_logp, advantages, mask)
    log_r = log_ratio(logp, behavior_logp, mask)
    a = advantages.astype(_F32)[:, None]
    per_tok = cispo_token_loss(logp, log_r, a, mask, eps_low, eps_high)
    if token_weight is not None:
        chex.assert_equal_shape([token_weight, mask])
        per_tok = per_tok * token_weight.astype(_F32)
    num, den = token_mean(per_tok, mask)
    metrics = policy_diagnostics(log_r, cispo_clipped(log_r, eps_low, eps_high), mask, logits=logits,
                                 entropy_t=entropy_t)
    return num, den, metrics


def op_token_weights(offset, op_weight):
    """Per-token weights of an extractor response: `op_weight` on the operation token (response offset 0),
    1 on the entry tokens after it. With one op token among ~20 copied moves in a token mean, the decision
    to write gets ~1/20 of a sample's gradient; op_weight > 1 gives it more (our extension). offset [...] int
    -> [...] float32."""
    return jnp.where(offset == 0, jnp.asarray(op_weight, _F32), 1.0)


def cispo_loss(logp, behavior_logp, advantages, mask, *, eps_low: float = 0.1, eps_high: float = 0.1,
               logits=None, entropy_t=None):
    """CISPO loss (the extractor's; METHOD.md step 7).

    loss = -sum_{b,t} m_bt * sg(clip(r_bt, 1 - eps_low, 1 + eps_high)) * A_b * logp_bt / sum_{b,t} m_bt
    with r_bt = exp(logp_bt - behavior_logp_bt), so d loss / d logp_bt = -w_bt * A_b / N on valid
    tokens (w = the clipped ratio): every token keeps a gradient, clipping only bounds its weight.
    (`cispo_token_loss` then unweighted `token_mean`.)

    Shapes as `ppo_clip_loss`. Returns (loss, metrics: clip_frac, ratio_mean, approx_kl, [entropy]).
    """
    num, den, metrics = cispo_loss_parts(logp, behavior_logp, advantages, mask, eps_low=eps_low,
                                         eps_high=eps_high, logits=logits, entropy_t=entropy_t)
    return _safe_div(num, den), metrics
