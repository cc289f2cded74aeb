"""Loss callbacks of the tiny loop, whose policies are *constrained* distributions.

The actor samples its action from the softmax over the action tokens only, and the extractor samples
its first response token from the operation tokens and the rest from actions, operations and EOS. The
behaviour log-probs stored at sampling time are those of these masked distributions, so the training
log-probs must be computed under the same masks (a full-vocabulary log-softmax would make every ratio
tiny). Both callbacks follow `train_state`'s contract `fn(graphdef, params, batch) -> (num, (den, metrics))`.

The actor batch has one row per played turn and one trained token per row, so the actor loss runs the
transformer over the prompt and unembeds only the last prompt position (`rollout.last_logits`, the very
function the rollout sampled from: at the first update the ratio is exactly 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from crl_jax import losses
from crl_jax.models import transformer as tr
from crl_jax.rollout import last_logits


@struct.dataclass
class TurnBatch:
    prompts: jax.Array  # [B, P] int32 per-turn prompt (right-padded)
    prompt_len: jax.Array  # [B] int32
    action_token: jax.Array  # [B] int32 token chosen at that turn
    behavior_logp: jax.Array  # [B] float32 log-prob under the constrained sampling distribution
    advantages: jax.Array  # [B] float32 episode advantage
    weight: jax.Array  # [B] float32 row weight (0: turn not played, or actor frozen)


def masked_log_softmax(logits, allowed):
    x = jnp.where(allowed, logits.astype(jnp.float32), -1e30)  # finite: no 0 * inf in entropies/grads
    return jax.nn.log_softmax(x, axis=-1)


def actor_turn_loss(allowed, *, clip_eps=0.2, entropy_metric=True):
    """PPO-clip on single-token turns; `allowed` [V] bool: the action tokens."""

    def fn(graphdef, params, b: TurnBatch):
        lp_all = masked_log_softmax(last_logits(graphdef, params, b.prompts, b.prompt_len), allowed)
        logp = jnp.take_along_axis(lp_all, b.action_token[:, None], axis=1)  # [B, 1]
        mask = (b.weight > 0)[:, None]
        ent = None
        if entropy_metric:
            p = jnp.exp(lp_all)
            ent = jax.lax.stop_gradient(-jnp.sum(jnp.where(allowed, p * lp_all, 0.0), -1))[:, None]
        num, den, metrics = losses.ppo_clip_loss_parts(
            logp, b.behavior_logp[:, None], b.advantages, mask, clip_eps=clip_eps, ratio="token",
            aggregation="seq_mean_token_mean", sample_weight=b.weight, entropy_t=ent)
        return num, (den, metrics)

    return fn


def extractor_constrained_loss(first_allowed, rest_allowed, *, eps_low=0.1, eps_high=0.1):
    """CISPO on responses whose first token is drawn from `first_allowed` [V], later ones from `rest_allowed`."""

    def fn(graphdef, params, b):
        mask = b.loss_mask.astype(bool) & (jnp.arange(b.tokens.shape[1]) >= 1)[None, :]
        logits = tr.merge(graphdef, params)(b.tokens)[:, :-1]  # predicts positions 1..T-1
        start = jnp.argmax(mask, axis=1)  # first response position of each row
        t = jnp.arange(1, b.tokens.shape[1])[None, :]
        first = (t == start[:, None])[..., None]
        allowed = jnp.where(first, first_allowed[None, None, :], rest_allowed[None, None, :])
        lp_all = masked_log_softmax(logits, allowed)
        picked = jnp.take_along_axis(lp_all, b.tokens[:, 1:, None], axis=-1)[..., 0]
        logp = jnp.concatenate([jnp.zeros((b.tokens.shape[0], 1)), picked], axis=1)
        logp = jnp.where(mask, logp, 0.0)
        num, den, metrics = losses.cispo_loss_parts(logp, b.behavior_logp, b.advantages, mask, eps_low=eps_low,
                                                    eps_high=eps_high)
        return num, (den, metrics)

    return fn
