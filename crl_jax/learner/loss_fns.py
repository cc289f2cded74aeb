"""The loss callbacks of both training paths: `fn(graphdef, params, batch) -> (num, (den, metrics))`.

Each factory below returns the callback `train_state.apply_update` / `make_co_update` differentiate,
with loss = num / den and a denominator that does not depend on params (exact micro-batch accumulation).
They compute the policy's log-probs of the trained tokens and hand them to the pure losses of
`crl_jax.losses` (`ppo_clip_loss_parts`, `cispo_loss_parts`). Two families, one per batch format:

Full-sequence (the LLM path; `ActorBatch` / `ExtractorBatch` of `train_state`): `actor_ppo_loss(cfg)`,
`extractor_cispo_loss(cfg)` score every response token under the model's full-vocabulary distribution at the
temperature it was sampled at (`PPOLossConfig.temperature`; `train_state.token_logprobs`; with the batch's static
bound on trained tokens, `ActorBatch.trained_width` / `ExtractorBatch.response_width`, the vocabulary head runs
over those tokens only, `compact_token_logprobs`).
Both losses are sums of per-token terms, so by default (`fused_head`) a transformer's head computes their gradient
in its forward pass (`train_state.token_loss`: three vocabulary matmuls, not four); with PPO's ratio "sequence" a
term depends on its whole row, and the head's chunks hold whole rows (`rowwise`).

Constrained-vocabulary (the tiny path; `TurnBatch`, and `ExtractorBatch`): `actor_turn_loss`,
`extractor_constrained_loss`. There the actor samples its action from the softmax over the action
tokens only, and the extractor samples its first response token from the operation tokens and the rest
from actions, operations and EOS. The behaviour log-probs stored at sampling time are those of these
masked distributions at the sampling temperature, so the training log-probs are computed under the same
masks and the same temperature (a full-vocabulary log-softmax would make every ratio tiny; another
temperature every ratio != 1). The actor batch has one row per played turn and one trained token per
row, so the actor loss runs the transformer over the prompt and unembeds only the last prompt position
(`rollout.last_logits`, the very function the rollout sampled from: at the first update the ratio is
exactly 1). The extractor's losses likewise unembed only the response window after each row's prompt
(`response_window_logits`; the batch or the rows carry its static `response_width`). `ratio="sequence"`
shares one ratio per episode (exp of the mean log-ratio over the episode's rows in the batch).

Prior-preserving auxiliary loss (METHOD.md §6, PPO-ptx style; constrained family): a batch may carry
`PriorRows`, synthetic rows of the prior's supervised task; the objective becomes
loss_RL + aux_coef * CE(prior rows). In the num / den contract that is num + aux_coef * CE * den (den
does not depend on params). `actor_prior_loss` / `extractor_prior_loss` are also the prior's own
pre-training losses (`pretrain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx, struct

from crl_jax import losses
from crl_jax.actor.rollout import last_logits
from crl_jax.learner.train_state import (ActorBatch, ExtractorBatch, LossFn, compact_token_logprobs, token_logprobs,
                                        token_loss)
from crl_jax.models import transformer as tr

# ----------------------------------------------------------------------------------------------
# Full-sequence family (LLM path)


@dataclass(frozen=True)
class PPOLossConfig:
    clip_eps: float = 0.2
    ratio: str = "token"  # "token" | "sequence"
    aggregation: str = "seq_mean_token_mean"  # | "token_mean"
    kl_coef: float = 0.0  # k3 KL to ActorBatch.ref_logp; off, as in the paper
    entropy_metric: bool = True
    # a transformer's vocabulary head takes the loss's gradient in its forward pass (`train_state.token_loss`:
    # three vocabulary matmul passes, not four); ratio "sequence" too, the head's chunks holding whole rows
    fused_head: bool = True
    head_chunk: int = 1024  # rows per chunk of the fused head (`train_state.token_loss`; `LossConfig.head_chunk`)
    # the temperature the replies were sampled at (`actor.temperature`): the log-probs are those of the softmax of
    # logits / temperature, as the stored behaviour log-probs are; 0 (greedy) scores at 1, as the sampler does
    temperature: float = 1.0


@dataclass(frozen=True)
class CISPOLossConfig:
    eps_low: float = 0.1
    eps_high: float = 0.1
    entropy_metric: bool = True
    fused_head: bool = True  # as PPOLossConfig.fused_head (CISPO is always a sum of per-token terms)
    head_chunk: int = 1024  # as PPOLossConfig.head_chunk
    temperature: float = 1.0  # as PPOLossConfig.temperature (`extraction.temperature`)


def _score_temperature(temperature: float) -> float:
    """The temperature the learner scores sampled tokens at: the sampling one, and 1 for greedy (0), whose stored
    log-probs are those of the untempered softmax (`token_draw.sample_logits`; `masked_log_softmax` alike)."""
    return 1.0 if temperature == 0.0 else float(temperature)


def _trained_mask(batch):
    """The batch's loss mask without column 0 (no prediction produces the first token)."""
    return batch.loss_mask.astype(bool) & (jnp.arange(batch.tokens.shape[1]) >= 1)[None, :]


def _logprobs(graphdef, params, tokens, mask, bound, with_entropy, temperature):
    """Log-probs (and entropies) of the trained tokens at `temperature`: the head over at most `bound` positions
    per row when the batch gives that static bound and it is shorter than the sequence (`compact_token_logprobs`),
    else over all."""
    kw = dict(with_entropy=with_entropy, temperature=temperature)
    if bound is not None and bound < tokens.shape[1] - 1:
        return compact_token_logprobs(graphdef, params, tokens, mask, bound, **kw)
    return token_logprobs(graphdef, params, tokens, mask, **kw)


def _has_head(graphdef, params) -> bool:
    return hasattr(nnx.merge(graphdef, params), "unembed_matrix")


def _row(x, like):
    return jnp.broadcast_to(x.astype(jnp.float32)[:, None], like.shape)


def actor_ppo_loss(cfg: PPOLossConfig = PPOLossConfig()) -> LossFn:
    """fn(graphdef, params, ActorBatch) -> (num, (den, metrics)) of `losses.ppo_clip_loss`. With the batch's static
    `trained_width` (the LLM backend sets it) the vocabulary head scores only the replies' tokens
    (`compact_token_logprobs`); None: every position. With `cfg.fused_head`, a transformer's numerator is summed
    token by token (`losses.ppo_token_terms`, or row by row with ratio "sequence": `losses.ppo_sequence_terms`;
    `train_state.token_loss`); the denominator and metrics come from `ppo_clip_loss_parts` on the same log-probs."""

    def token_fn(lp, x):
        return losses.ppo_token_terms(lp, x["behavior"], x["adv"], x["coef"], clip_eps=cfg.clip_eps,
                                      ref_logp=x.get("ref"), kl_coef=cfg.kl_coef)

    def row_fn(lp, x, valid):
        return losses.ppo_sequence_terms(lp, x["behavior"], x["adv"], x["coef"], valid, clip_eps=cfg.clip_eps,
                                         ref_logp=x.get("ref"), kl_coef=cfg.kl_coef)

    temp = _score_temperature(cfg.temperature)

    def fn(graphdef, params, batch: ActorBatch):
        mask = _trained_mask(batch)
        fused = cfg.fused_head and _has_head(graphdef, params)
        if fused:
            coef = losses.row_coefficients(mask, batch.weight, cfg.aggregation)
            aux = dict(behavior=batch.behavior_logp, adv=_row(batch.advantages, mask), coef=_row(coef, mask))
            if batch.ref_logp is not None and cfg.kl_coef:
                aux["ref"] = batch.ref_logp
            seq = cfg.ratio == "sequence"
            total, logp, ent = token_loss(graphdef, params, batch.tokens, mask, row_fn if seq else token_fn, aux,
                                          max_trained=batch.trained_width, rowwise=seq, head_chunk=cfg.head_chunk,
                                          temperature=temp)
        else:
            logp, ent = _logprobs(graphdef, params, batch.tokens, mask, batch.trained_width, cfg.entropy_metric, temp)
        num, den, metrics = losses.ppo_clip_loss_parts(
            logp, batch.behavior_logp, batch.advantages, mask, clip_eps=cfg.clip_eps, ratio=cfg.ratio,
            aggregation=cfg.aggregation, sample_weight=batch.weight, entropy_t=ent if cfg.entropy_metric else None,
            ref_logp=batch.ref_logp, kl_coef=cfg.kl_coef)
        return (total if fused else num), (den, metrics)

    return fn


def extractor_cispo_loss(cfg: CISPOLossConfig = CISPOLossConfig()) -> LossFn:
    """fn(graphdef, params, ExtractorBatch) -> (num, (den, metrics)) of `losses.cispo_loss`. With the batch's
    static `response_width` (set by `batches.extractor_batch`), the vocabulary head scores only the response
    tokens (`compact_token_logprobs`); None: every position (the reference path). With `cfg.fused_head`, a
    transformer's numerator is summed token by token (`train_state.token_loss`)."""

    def token_fn(lp, x):
        log_r = lp - x["behavior"]
        return losses.cispo_token_loss(lp, log_r, x["adv"], jnp.ones(lp.shape, bool), cfg.eps_low, cfg.eps_high)

    temp = _score_temperature(cfg.temperature)

    def fn(graphdef, params, batch: ExtractorBatch):
        mask = _trained_mask(batch)
        fused = cfg.fused_head and _has_head(graphdef, params)
        if fused:
            aux = dict(behavior=batch.behavior_logp, adv=_row(batch.advantages, mask))
            total, logp, ent = token_loss(graphdef, params, batch.tokens, mask, token_fn, aux,
                                          max_trained=batch.response_width, head_chunk=cfg.head_chunk,
                                          temperature=temp)
        else:
            logp, ent = _logprobs(graphdef, params, batch.tokens, mask, batch.response_width, cfg.entropy_metric, temp)
        num, den, metrics = losses.cispo_loss_parts(
            logp, batch.behavior_logp, batch.advantages, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            entropy_t=ent if cfg.entropy_metric else None)
        return (total if fused else num), (den, metrics)

    return fn


# ----------------------------------------------------------------------------------------------
# Constrained-vocabulary family (tiny path)


@struct.dataclass
class PriorRows:
    """Synthetic supervised rows. Actor: prompts [A, P], one target distribution over the vocabulary per
    row at the next position. Extractor: teacher-forced sequences [A, S]; `target` [A, V] is the soft
    target of the first response token (the operation), `hard` [A, S] marks later positions whose target
    is the token itself."""

    tokens: jax.Array  # [A, S] int32
    lengths: jax.Array  # [A] int32 prompt length (actor) / response start (extractor)
    target: jax.Array  # [A, V] float32 target distribution (rows summing to 0 are unused)
    hard: jax.Array = None  # [A, S] bool (extractor only)
    form_target: jax.Array = None  # [A, V] soft target of the form token (`extraction.forms`; extractor only)
    # extractor only, static: no response is longer (positions lengths .. lengths + response_width - 1), so the
    # loss scores that window only (`response_window_logits`); None: every position (the reference path)
    response_width: int | None = struct.field(pytree_node=False, default=None)


@struct.dataclass
class TurnBatch:
    prompts: jax.Array  # [B, P] int32 per-turn prompt (right-padded)
    prompt_len: jax.Array  # [B] int32
    action_token: jax.Array  # [B] int32 token chosen at that turn
    behavior_logp: jax.Array  # [B] float32 log-prob under the constrained sampling distribution
    advantages: jax.Array  # [B] float32 episode advantage
    weight: jax.Array  # [B] float32 row weight (0: turn not played, or actor frozen)
    episode: jax.Array = None  # [B] int32 episode of the row (ratio="sequence")
    prior: PriorRows | None = None  # auxiliary-loss rows


def masked_log_softmax(logits, allowed, temperature: float = 1.0):
    """log-softmax of logits / temperature over the allowed tokens (temperature 0 = greedy: scale 1)."""
    x = logits.astype(jnp.float32)
    if temperature not in (0.0, 1.0):
        x = x / temperature
    x = jnp.where(allowed, x, -1e30)  # finite: no 0 * inf in entropies/grads
    return jax.nn.log_softmax(x, axis=-1)


def soft_cross_entropy(logp_all, target, allowed):
    """Mean over rows with any target mass of -sum_v target_v log p_v -> [] (a target of total mass w
    weighs its row's cross-entropy by w)."""
    has = target.sum(-1) > 0
    ce = -jnp.sum(jnp.where(allowed, target * logp_all, 0.0), -1)
    return jnp.sum(jnp.where(has, ce, 0.0)) / jnp.maximum(has.sum(), 1)


def actor_prior_loss(graphdef, params, rows: PriorRows, allowed, temperature: float = 1.0):
    """Cross-entropy of the actor's constrained next-action distribution against the rows' targets."""
    lp = masked_log_softmax(last_logits(graphdef, params, rows.tokens, rows.lengths), allowed, temperature)
    return soft_cross_entropy(lp, rows.target, allowed)


def episode_mean(x, episode, weight):
    """Per-row mean of x over the rows of the same episode that have weight > 0 -> [B]. Only equality of the
    ids counts, not their values: the batch holds global episode ids (`batches.actor_batch`: [0, G*K)), and after
    row sampling or minibatching a call sees fewer rows than the largest id, so the ids are renumbered
    0..(distinct - 1) within the call (`jnp.unique` with the static size B) before the segment sums."""
    use = weight > 0
    n = x.shape[0]
    _, local = jnp.unique(episode, size=n, return_inverse=True)
    local = local.reshape(n)
    tot = jax.ops.segment_sum(jnp.where(use, x, 0.0), local, num_segments=n)
    cnt = jax.ops.segment_sum(use.astype(jnp.float32), local, num_segments=n)
    return (tot / jnp.maximum(cnt, 1.0))[local]


def actor_turn_loss(allowed, *, clip_eps=0.2, temperature=1.0, ratio="token", aux_coef=0.0,
                    entropy_metric=True):
    """PPO-clip on single-token turns; `allowed` [V] bool: the action tokens."""
    if ratio not in ("token", "sequence"):
        raise ValueError(f"ratio must be 'token' or 'sequence', got {ratio!r}")

    def fn(graphdef, params, b: TurnBatch):
        lp_all = masked_log_softmax(last_logits(graphdef, params, b.prompts, b.prompt_len), allowed, temperature)
        logp = jnp.take_along_axis(lp_all, b.action_token[:, None], axis=1)  # [B, 1]
        if ratio == "sequence":  # one ratio per episode, gradients through all of its rows
            log_r = logp[:, 0] - b.behavior_logp
            logp = (b.behavior_logp + episode_mean(log_r, b.episode, b.weight))[:, None]
        mask = (b.weight > 0)[:, None]
        ent = None
        if entropy_metric:
            p = jnp.exp(lp_all)
            ent = jax.lax.stop_gradient(-jnp.sum(jnp.where(allowed, p * lp_all, 0.0), -1))[:, None]
        num, den, metrics = losses.ppo_clip_loss_parts(
            logp, b.behavior_logp[:, None], b.advantages, mask, clip_eps=clip_eps, ratio="token",
            aggregation="seq_mean_token_mean", sample_weight=b.weight, entropy_t=ent)
        if b.prior is not None and aux_coef:
            aux = actor_prior_loss(graphdef, params, b.prior, allowed, temperature)
            num = num + aux_coef * aux * jax.lax.stop_gradient(den)
            metrics = dict(metrics, prior_loss=jax.lax.stop_gradient(aux))
        return num, (den, metrics)

    return fn


def response_allowed_at(first_allowed, early_allowed, rest_allowed, offset, min_entry: int, form_allowed=None):
    """[..., V] mask of response position `offset` (0 = the op token): ops first, then `min_entry`
    positions of entry tokens only (no EOS, no op: an entry an actor can use), then `rest_allowed`.
    `form_allowed` [V] (`extraction.forms`): the form token at offset 1, the entry one position later."""
    o = offset[..., None]
    if form_allowed is None:
        return jnp.where(o == 0, first_allowed, jnp.where(o <= min_entry, early_allowed, rest_allowed))
    return jnp.where(o == 0, first_allowed, jnp.where(o == 1, form_allowed,
                                                      jnp.where(o <= min_entry + 1, early_allowed, rest_allowed)))


def response_window_logits(graphdef, params, tokens, start, width: int):
    """(logits [B, W, V], positions [B, W], inside [B, W]): the logits of the tokens at positions
    start .. start + W - 1 of tokens [B, T] (start [B] >= 1), each predicted from the position before. Positions
    past T - 1 are clipped to T - 1 and `inside` is False there (mask them out of every sum).

    Equal to the full forward's logits gathered there (`Transformer.hidden_at`: the last layer and the
    unembedding run for the W rows only). The extractor's losses score a response of at most W tokens after a
    prompt of up to T - W: on the tiny default (48 + 21 tokens, 2 layers) this made the gradient of the
    auxiliary loss ~1.6x cheaper on the 2-core CPU."""
    T = tokens.shape[1]
    pos = start[:, None] + jnp.arange(width)[None, :]
    model = tr.merge(graphdef, params)
    logits = model.unembed(model.hidden_at(tokens, jnp.clip(pos - 1, 0, T - 1)))
    return logits, jnp.clip(pos, 0, T - 1), pos < T


def extractor_prior_loss(graphdef, params, rows: PriorRows, masks, min_entry: int, temperature: float = 1.0):
    """Teacher-forced cross-entropy of the extractor's constrained responses: the soft op target at the
    first response position, the row's own tokens at the `hard` positions. With `rows.response_width` only
    the response window is scored (equal values and gradients up to float order; the full path is the
    reference the tests compare it with)."""
    first, early, rest = masks[:3]
    form = masks[3] if len(masks) > 3 else None  # the entry forms' mask at offset 1 (`extraction.forms`)
    S = rows.tokens.shape[1]
    W = rows.response_width
    if W is not None and W < S - 1:
        logits, pos, inside = response_window_logits(graphdef, params, rows.tokens, rows.lengths, W)
        off = jnp.broadcast_to(jnp.arange(W)[None, :], pos.shape)  # response offset of each window position
        tok, hard = (jnp.take_along_axis(x, pos, axis=1) for x in (rows.tokens, rows.hard))
        hard = hard & inside
        allowed = response_allowed_at(first, early, rest, off[:1], min_entry, form)  # [1, W, V]: the same for every row
    else:
        logits = tr.merge(graphdef, params)(rows.tokens)[:, :-1]  # predicts positions 1..S-1
        off = jnp.arange(1, S)[None, :] - rows.lengths[:, None]
        allowed = response_allowed_at(first, early, rest, jnp.maximum(off, 0), min_entry, form)
        tok, hard = rows.tokens[:, 1:], rows.hard[:, 1:]
    lp = masked_log_softmax(logits, allowed, temperature)
    op_lp = jnp.take_along_axis(lp, jnp.argmax(off == 0, axis=1)[:, None, None], axis=1)[:, 0]
    op_ce = soft_cross_entropy(op_lp, rows.target, first)  # 0 when no row has an op target
    hard = hard & (off > 0)
    if rows.form_target is not None:  # the form token: a soft target (left to RL), not the row's own token
        form_lp = jnp.take_along_axis(lp, jnp.argmax(off == 1, axis=1)[:, None, None], axis=1)[:, 0]
        op_ce = op_ce + soft_cross_entropy(form_lp, rows.form_target, form)
        hard = hard & (off > 1)
    picked = jnp.take_along_axis(lp, tok[..., None], axis=-1)[..., 0]
    tok_ce = -jnp.sum(jnp.where(hard, picked, 0.0)) / jnp.maximum(hard.sum(), 1)
    return op_ce + tok_ce


def extractor_constrained_loss(first_allowed, rest_allowed, *, early_allowed=None, min_entry: int = 0,
                               eps_low=0.1, eps_high=0.1, temperature=1.0, aux_coef=0.0, op_weight: float = 1.0,
                               form_allowed=None, op_entropy: float = 0.0):
    """CISPO on responses whose first token is drawn from `first_allowed` [V], the next `min_entry` from
    `early_allowed` [V] and later ones from `rest_allowed` [V] (the sampler's masks). `op_weight` scales the
    op token's term (`losses.op_token_weights`; 1 = the paper's plain token mean). `form_allowed` [V]
    (`extraction.forms`): the form token after the op token, trained like every response token. `op_entropy`:
    the loss minus this times the op token's mean entropy over the batch's responses (0 = off)."""
    early_allowed = rest_allowed if early_allowed is None else early_allowed
    masks = (first_allowed, early_allowed, rest_allowed) + (() if form_allowed is None else (form_allowed,))

    def fn(graphdef, params, b: ExtractorBatch):
        mask = _trained_mask(b)
        T = b.tokens.shape[1]
        start = jnp.argmax(mask, axis=1)  # first response position of each row
        W = b.response_width
        blogp = b.behavior_logp
        if W is not None and W < T - 1:  # the response window only (equal to the full path up to float order)
            logits, pos, inside = response_window_logits(graphdef, params, b.tokens, start, W)
            allowed = response_allowed_at(first_allowed, early_allowed, rest_allowed, jnp.arange(W)[None],
                                          min_entry, form_allowed)
            tok, blogp, mask = (jnp.take_along_axis(x, pos, axis=1) for x in (b.tokens, blogp, mask))
            mask = mask & inside
            off = jnp.broadcast_to(jnp.arange(W)[None], mask.shape)
        else:  # every position but 0 (which no prediction produces; the mask is False there)
            logits = tr.merge(graphdef, params)(b.tokens)[:, :-1]  # predicts positions 1..T-1
            t = jnp.arange(1, T)[None, :]
            allowed = response_allowed_at(first_allowed, early_allowed, rest_allowed,
                                          jnp.maximum(t - start[:, None], 0), min_entry, form_allowed)
            tok, blogp, mask = b.tokens[:, 1:], blogp[:, 1:], mask[:, 1:]
            off = t - start[:, None]
        lp_all = masked_log_softmax(logits, allowed, temperature)
        logp = jnp.take_along_axis(lp_all, tok[..., None], axis=-1)[..., 0]
        logp = jnp.where(mask, logp, 0.0)
        tw = None if op_weight == 1.0 else losses.op_token_weights(off, op_weight)
        num, den, metrics = losses.cispo_loss_parts(logp, blogp, b.advantages, mask, eps_low=eps_low,
                                                    eps_high=eps_high, token_weight=tw)
        if op_entropy:  # a decided softmax no longer moves under the reward: keep the op from deciding too early
            h = losses.masked_mean(losses.token_entropy(lp_all), mask & (off == 0))
            num = num - op_entropy * h * jax.lax.stop_gradient(den)
        if b.prior is not None and aux_coef:
            aux = extractor_prior_loss(graphdef, params, b.prior, masks, min_entry, temperature)
            num = num + aux_coef * aux * jax.lax.stop_gradient(den)
            metrics = dict(metrics, prior_loss=jax.lax.stop_gradient(aux))
        return num, (den, metrics)

    return fn
