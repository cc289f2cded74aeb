"""Train states for the actor and the extractor, and the single jit-compiled co-update (docs/ARCHITECTURE.md, "Principles").

`TrainState` is a pure pytree: the NNX graph definition and the optax transformation are static
(aux data), params / optimizer state / counters are leaves, so states jit, shard and checkpoint as
values. `make_co_update(...)` returns ONE compiled program that computes both models' losses,
gradients and AdamW steps:

- the extractor half runs under `lax.cond(extractor_batch.ready, ...)`, so a not-ready buffer costs no
  forward/backward and leaves the extractor state bit-identical, with no recompilation;
- a non-finite loss or gradient keeps that model's params and optimizer state, does not advance its
  `step`, and adds 1 to its `nonfinite_count`; a batch with no valid token is skipped likewise
  (without counting);
- `microbatches=M` splits the batch rows into M chunks and accumulates gradients under `lax.scan`.
  Loss callbacks return (numerator, (denominator, metrics)) with loss = numerator / denominator and a
  denominator that does not depend on params, so accumulation is exact: sum the numerators' gradients
  and divide by the summed denominators. Metrics are averaged over micro-batches.

The loss callbacks (`LossFn`: `fn(graphdef, params, batch) -> (num, (den, metrics))`) of both training
paths are built by the factories of `crl_jax.learner.loss_fns`; a loop with its own batch format passes its own.

Split GRPO: set `ActorBatch.weight = losses.split_group_weights(guided).reshape(-1)` (1 / (number of
non-empty subgroups x subgroup size)) and the actor loss is the mean over groups of the mean of the
guided and free subgroups' losses (paper Eq. 5, weight 1/2 each); with equal-size subgroups this equals
weight = 1 everywhere. Padding rows get weight 0.

LoRA (`crl_jax.models.lora.LoRAParams` as `params`, the LLM path's `lora.train`): gradients, the optimizer
state and the non-finite guard cover the adapters only (`lora.trainable`); the loss callback sees the
effective tree base + scale * A @ B; the frozen base is carried through unchanged (bit-identical). When the
actor and the extractor are one checkpoint, one of them holds the base (`params.base`) and the other None:
`make_co_update` hands the held base to the other (`shared_base`).

Mixed precision (`crl_jax.learner.precision`): with float32 `master` weights beside bfloat16 `params`, the
forward and backward run on `params`, the optimizer state and the update are the masters' (float32), and
`params` is the updated masters rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from crl_jax import losses
from crl_jax.learner import precision
from crl_jax.models import lora
from crl_jax.models.head_loss import fused_token_loss
from crl_jax.models.logprobs import chunked_logprobs

_F32 = jnp.float32


@struct.dataclass
class TrainState:
    graphdef: Any = struct.field(pytree_node=False)  # nnx.GraphDef of the model
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    params: Any = None  # nnx.State of nnx.Param, or a lora.LoRAParams (adapters trained over a frozen base)
    opt_state: Any = None  # over lora.trainable(params)
    step: jax.Array = None  # int32 scalar: number of applied updates
    nonfinite_count: jax.Array = None  # int32 scalar: updates skipped for a non-finite loss/grad
    master: Any = None  # float32 master copy of lora.trainable(params) (mixed precision), or None


def make_optimizer(lr: float = 1e-6, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Global-norm gradient clipping (skipped when grad_clip is None or <= 0), then AdamW, constant LR."""
    adamw = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    if grad_clip is None or grad_clip <= 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(grad_clip), adamw)


def create_train_state(model, tx: optax.GradientTransformation, master_dtype=None) -> TrainState:
    """Split an NNX model (all of its state must be nnx.Param), or take a `(graphdef, params)` pair (params
    may be a `lora.LoRAParams`), and initialise the optimizer state over the trainable part (over its
    `master_dtype` masters when the weights are stored in another dtype: `precision.make_master`)."""
    graphdef, params = model if isinstance(model, tuple) else nnx.split(model, nnx.Param)
    master = precision.make_master(lora.trainable(params), master_dtype)
    return TrainState(graphdef=graphdef, tx=tx, params=params,
                      opt_state=tx.init(lora.trainable(params) if master is None else master),
                      step=jnp.zeros((), jnp.int32), nonfinite_count=jnp.zeros((), jnp.int32), master=master)


# The loss-callback contract: fn(graphdef, params, batch) -> (num, (den, metrics)), loss = num / den with
# den independent of params. The callbacks of both training paths are in `crl_jax.learner.loss_fns`.
LossFn = Callable[[Any, Any, Any], tuple]


# ----------------------------------------------------------------------------------------------
# Batches and log-probs


@struct.dataclass
class ActorBatch:
    tokens: jax.Array  # [B, T] int32, prompt + response, right-padded
    loss_mask: jax.Array  # [B, T] bool, True on trained (response) tokens; column 0 is ignored
    behavior_logp: jax.Array  # [B, T] float32 log-prob of each token under the sampling policy
    advantages: jax.Array  # [B] float32
    weight: jax.Array  # [B] float32 sample weight (split_group_weights; 0 for padding rows)
    ref_logp: jax.Array | None = None  # [B, T] reference-policy log-probs (only for kl_coef > 0)
    # static: no row has more trained tokens than this (the LLM path: turns x max_action_tokens), so the loss's
    # vocabulary head scores only those positions (`compact_token_logprobs`); None: every position
    trained_width: int | None = struct.field(pytree_node=False, default=None)


@struct.dataclass
class ExtractorBatch:
    tokens: jax.Array  # [N, T] int32, extractor prompt + generation, right-padded
    loss_mask: jax.Array  # [N, T] bool, True on generated tokens
    behavior_logp: jax.Array  # [N, T] float32, stored at generation time
    advantages: jax.Array  # [N] float32, already multiplied by the repeat weights
    ready: jax.Array  # bool scalar: buffer full, take the extractor step
    prior: Any = None  # optional synthetic rows of a prior-preserving auxiliary loss (tiny path)
    # static: every response is at most this long, so the losses score only that window after each row's first
    # trained position (tiny path: `loss_fns.extractor_constrained_loss`; LLM path: the vocabulary head of
    # `extractor_cispo_loss`, `compact_token_logprobs`); None: every position
    response_width: int | None = struct.field(pytree_node=False, default=None)


def response_mask(prompt_len: jax.Array, length: jax.Array, seq_len: int) -> jax.Array:
    """[B, T] bool: prompt_len[b] <= t < length[b] (single-turn prompt/response layout)."""
    t = jnp.arange(seq_len)[None, :]
    return (t >= prompt_len[:, None]) & (t < length[:, None])


def token_logprobs(graphdef, params, tokens: jax.Array, mask: jax.Array, *, with_entropy: bool = False,
                   temperature: float = 1.0):
    """Per-token log-probs from one full forward pass of the model.

    logp[b, t] = log_softmax(logits[b, t - 1] / temperature)[tokens[b, t]] where mask[b, t] and t >= 1, else 0;
    entropy[b, t] (if asked; no gradient) is the entropy of that same distribution. temperature > 0: the one the
    tokens were sampled at (`loss_fns` maps a greedy 0 to 1, the sampler's greedy log-probs).
    tokens, mask [B, T] -> logp [B, T] float32, entropy [B, T] float32 or None.

    A model with `unembed_matrix` (the transformer) is scored from its final hidden states with
    `chunked_logprobs`: no [B, T, V] float32 logits in the forward or the backward pass.
    """
    chex.assert_rank([tokens, mask], 2)
    chex.assert_equal_shape([tokens, mask])
    model = nnx.merge(graphdef, params)
    if hasattr(model, "unembed_matrix"):
        h, _, pick, back = _predicting_rows(model(tokens, return_hidden=True), mask, None)  # h [B, T-1, H]
        lp, ent = chunked_logprobs(h, model.unembed_matrix(), pick(tokens).astype(jnp.int32), with_entropy=with_entropy,
                                   temperature=temperature)
    else:  # any other module returning logits
        logits, _, pick, back = _predicting_rows(model(tokens).astype(_F32) / temperature, mask, None)
        tgt = pick(tokens).astype(jnp.int32)
        lp = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)
        ent = jax.lax.stop_gradient(losses.token_entropy(logits)) if with_entropy else None
    return back(lp), (back(ent) if with_entropy else None)


def _predicting_rows(x: jax.Array, mask: jax.Array, max_trained: int | None):
    """The rows of x [B, T, ...] (hidden states or logits) that predict the trained tokens (mask, t >= 1): every
    position's predecessor x[:, :-1] (max_trained None, or no shorter than T - 1), or each row's trained positions'
    predecessors gathered into `max_trained` slots (a row's trained positions past its first `max_trained` are
    dropped). -> (rows [B, K, ...], slot_valid [B, K], pick: [B, T] array -> its values at the predicted positions
    [B, K], back: [B, K] -> [B, T] with 0 off the trained positions)."""
    B, T = mask.shape
    if max_trained is None or max_trained >= T - 1:
        trained = mask.astype(bool) & (jnp.arange(T) >= 1)
        return (x[:, :-1], trained[:, 1:], lambda a: a[:, 1:],
                lambda a: jnp.where(trained, jnp.pad(a, ((0, 0), (1, 0))), 0.0))
    K = int(max_trained)
    t = jnp.arange(T)
    valid = mask.astype(bool) & (t >= 1)[None, :]
    rank = jnp.cumsum(valid, axis=1) - 1  # [B, T]: each trained position's slot
    keep = valid & (rank < K)
    rows = jnp.arange(B)[:, None]
    pos = jnp.zeros((B, K), jnp.int32).at[rows, jnp.where(keep, rank, K)].set(  # unused slots stay 0
        jnp.broadcast_to(t, (B, T)).astype(jnp.int32), mode="drop")
    at = jnp.maximum(pos, 1)
    slot_valid = jnp.arange(K)[None, :] < jnp.minimum(valid.sum(1), K)[:, None]
    slot = jnp.clip(rank, 0, K - 1)
    return (jnp.take_along_axis(x, (at - 1).reshape((B, K) + (1,) * (x.ndim - 2)), axis=1), slot_valid,
            lambda a: jnp.take_along_axis(a, at, axis=1),
            lambda a: jnp.where(keep, jnp.take_along_axis(a, slot, axis=1), 0.0))


def compact_token_logprobs(graphdef, params, tokens: jax.Array, mask: jax.Array, max_trained: int, *,
                           with_entropy: bool = False, temperature: float = 1.0):
    """`token_logprobs` when no row has more than `max_trained` trained positions: the forward pass is the same
    (`model(tokens, return_hidden=True)`, which keeps the backend's fused attention), but the vocabulary head runs
    for each row's trained positions only, gathered into `max_trained` slots, not for its prompt or observation
    tokens (the extractor's prompt before its response; the actor's conversation around its replies). Equal values
    and gradients; a row's trained positions past its first `max_trained` would get 0 (the callers' static bound
    covers every row: `ExtractorBatch.response_width`, `ActorBatch.trained_width`)."""
    chex.assert_rank([tokens, mask], 2)
    chex.assert_equal_shape([tokens, mask])
    model = nnx.merge(graphdef, params)
    hk, _, pick, back = _predicting_rows(model(tokens, return_hidden=True), mask, max_trained)
    lp, ent = chunked_logprobs(hk, model.unembed_matrix(), pick(tokens).astype(jnp.int32), with_entropy=with_entropy,
                               temperature=temperature)
    return back(lp), (back(ent) if with_entropy else None)


def token_loss(graphdef, params, tokens: jax.Array, mask: jax.Array, token_fn, aux, *, max_trained: int | None = None,
               rowwise: bool = False, head_chunk: int = 1024, temperature: float = 1.0):
    """sum over trained tokens (mask, t >= 1) of token_fn(logp, aux) for a transformer, the head's gradient taken in
    its forward pass (`head_loss.fused_token_loss`: three vocabulary matmul passes, not four). token_fn must be
    elementwise over tokens; aux: a pytree of [B, T] arrays aligned with tokens. `max_trained`: as
    `compact_token_logprobs` (the head over that many slots per row); None: every position. `rowwise`: a term may
    depend on every trained token of its row (a sequence-level ratio): token_fn(logp [c, K], aux [c, K],
    valid [c, K]) then sees whole rows' K slots, a head chunk holding whole rows. `head_chunk`: rows per head chunk
    (`fused_token_loss`'s token_chunk: its [r, V] float32 logits against how often the [H, V] gradient is added to).
    `temperature` > 0: logp under softmax(logits / temperature), the distribution the tokens were sampled from.
    Returns (total with gradients, logp [B, T], entropy [B, T]), the last two without gradient and 0 off the mask."""
    chex.assert_rank([tokens, mask], 2)
    chex.assert_equal_shape([tokens, mask])
    model = nnx.merge(graphdef, params)
    hk, slot_valid, pick, back = _predicting_rows(model(tokens, return_hidden=True), mask, max_trained)
    B, K = slot_valid.shape
    flat = lambda x: x.reshape((B * K,) + x.shape[2:])  # noqa: E731
    total, lp, ent = fused_token_loss(flat(hk), model.unembed_matrix(), flat(pick(tokens)), flat(slot_valid), token_fn,
                                      jax.tree.map(lambda a: flat(pick(a)), aux), group=K if rowwise else 1,
                                      token_chunk=head_chunk, temperature=temperature)
    return total, back(lp.reshape(B, K)), back(ent.reshape(B, K))


# ----------------------------------------------------------------------------------------------
# Updates


def _split_microbatches(batch, m: int):
    """Leaves with a leading batch axis [B, ...] -> [m, B/m, ...]; scalars are repeated m times."""

    def split(x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            return jnp.broadcast_to(x, (m,))
        if x.shape[0] % m:
            raise ValueError(f"batch size {x.shape[0]} is not divisible by microbatches={m}")
        return x.reshape(m, x.shape[0] // m, *x.shape[1:])

    return jax.tree_util.tree_map(split, batch)


def shared_base(params, other):
    """The frozen base `params` borrows from the other model (`other.base` when `params` is a LoRAParams
    without a base of its own), else None."""
    if lora.is_lora(params) and params.base is None and lora.is_lora(other):
        return other.base
    return None


def _grads(state: TrainState, batch, loss_fn: LossFn, microbatches: int, base=None):
    """(num, den, summed float32 grads of num w.r.t. the trainable params, metrics) over the whole batch."""
    model_params = lambda t: lora.effective(lora.with_trainable(state.params, t), base)  # noqa: E731
    vg = jax.value_and_grad(lambda t, b: loss_fn(state.graphdef, model_params(t), b), has_aux=True)
    trainable = lora.trainable(state.params)
    if microbatches == 1:
        (num, (den, metrics)), g = vg(trainable, batch)
        return num, den, jax.tree_util.tree_map(lambda x: x.astype(_F32), g), metrics

    def body(carry, mb):
        gsum, nsum, dsum = carry
        (num, (den, met)), g = vg(trainable, mb)
        gsum = jax.tree_util.tree_map(lambda a, b: a + b.astype(_F32), gsum, g)
        return (gsum, nsum + num, dsum + den), met

    zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, _F32), trainable)
    init = (zeros, jnp.zeros((), _F32), jnp.zeros((), _F32))
    (g, num, den), mets = jax.lax.scan(body, init, _split_microbatches(batch, microbatches))
    return num, den, g, jax.tree_util.tree_map(lambda x: x.mean(0), mets)


def _global_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(_F32))) for x in jax.tree_util.tree_leaves(tree)))


def _select(pred, new: TrainState, old: TrainState) -> TrainState:
    """`new` where `pred`, else `old`, leaf by leaf over the trained parts (a LoRA base passes through)."""
    pick = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)  # noqa: E731
    return old.replace(params=lora.with_trainable(old.params, pick(lora.trainable(new.params),
                                                                   lora.trainable(old.params))),
                       opt_state=pick(new.opt_state, old.opt_state), master=pick(new.master, old.master),
                       step=jnp.where(pred, new.step, old.step),
                       nonfinite_count=jnp.where(pred, new.nonfinite_count, old.nonfinite_count))


def apply_update(state: TrainState, batch, loss_fn: LossFn, microbatches: int = 1, base=None):
    """One guarded optimizer step of one model -> (new state, metrics). Pure; call under jit.
    `base`: the frozen base of a LoRAParams that holds none (`shared_base`)."""
    num, den, gsum, metrics = _grads(state, batch, loss_fn, microbatches, base)
    has_data = den > 0
    safe_den = jnp.where(has_data, den, 1.0)
    loss = num / safe_den
    trainable = lora.trainable(state.params)
    # The gradients in the dtype of the weights the optimizer updates: the float32 masters when there are any
    # (mixed precision), else the weights' own dtype.
    target = trainable if state.master is None else state.master
    grads = jax.tree_util.tree_map(lambda g, p: (g / safe_den).astype(p.dtype), gsum, target)
    # One pass over the gradients for both: a NaN or inf anywhere makes the norm non-finite (so does a norm whose
    # square overflows float32, which clipping could not scale either).
    grad_norm = _global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    do = finite & has_data
    updates, new_opt = state.tx.update(grads, state.opt_state, target)
    new_target = optax.apply_updates(target, updates)
    # with masters, the compute weights are the updated masters rounded to their dtype
    new_trainable = new_target if state.master is None else jax.tree_util.tree_map(
        lambda m, p: m.astype(p.dtype), new_target, trainable)

    def pick(new, old):
        return jax.tree_util.tree_map(lambda a, b: jnp.where(do, a, b), new, old)

    new_state = state.replace(
        params=lora.with_trainable(state.params, pick(new_trainable, trainable)),
        master=None if state.master is None else pick(new_target, state.master),
        opt_state=pick(new_opt, state.opt_state),
        step=state.step + do.astype(jnp.int32),
        nonfinite_count=state.nonfinite_count + (~finite).astype(jnp.int32))
    metrics = dict(metrics, loss=jnp.where(has_data, loss, 0.0), grad_norm=grad_norm,
                   updated=do.astype(_F32), nonfinite=(~finite).astype(_F32), denominator=den)
    return new_state, metrics


def apply_updates(state: TrainState, batches, loss_fn: LossFn, microbatches: int = 1, steps: int = 1,
                  target_kl: float = 0.0, base=None):
    """`steps` optimizer steps in order (`lax.scan`), step i on `batches[i]` (a leading [steps] axis on
    every leaf; steps=1: one step on an unstacked batch) -> (new state, metrics averaged over the steps).

    PPO epochs x minibatches: the caller stacks the shuffled minibatches of every epoch; every step sees
    the same behaviour log-probs, so from the second step on the importance ratio is real and the clip acts.

    `target_kl` > 0 (early stopping, as Stable-Baselines3's PPO): the loss's `approx_kl` of step i is
    measured at the parameters before step i; from the first step whose value exceeds `target_kl` on, the
    steps are skipped (state unchanged). The metric `steps_taken` counts the steps that were applied.
    `base`: see `apply_update`.
    """
    if steps == 1:
        return apply_update(state, batches, loss_fn, microbatches, base)
    if target_kl <= 0.0:
        state, mets = jax.lax.scan(lambda st, b: apply_update(st, b, loss_fn, microbatches, base), state, batches)
        return state, jax.tree_util.tree_map(lambda x: x.mean(0), mets)

    def step(carry, b):
        st, stopped = carry
        new, m = apply_update(st, b, loss_fn, microbatches, base)
        go = ~stopped & (m["approx_kl"] <= target_kl)
        st = _select(go, new, st)
        return (st, ~go), dict(m, taken=go.astype(_F32))

    (state, _), mets = jax.lax.scan(step, (state, jnp.asarray(False)), batches)
    taken = mets.pop("taken")
    return state, dict(jax.tree_util.tree_map(lambda x: x.mean(0), mets), steps_taken=taken.sum())


def _prefix(tag: str, metrics: dict) -> dict:
    return {f"{tag}/{k}": v for k, v in metrics.items()}


def make_co_update(actor_loss_fn: LossFn, extractor_loss_fn: LossFn, *,
                   microbatches: int = 1, extractor_microbatches: int | None = None,
                   actor_steps: int = 1, extractor_steps: int = 1, actor_target_kl: float = 0.0, donate: bool = True,
                   max_traces: int | None = None, compiler_options: dict | None = None):
    """The jit-compiled co-update (actor_state, extractor_state, actor_batch, extractor_batch) ->
    (actor_state, extractor_state, metrics); both states are donated.

    The two loss callbacks come from `crl_jax.learner.loss_fns` (LLM path: `actor_ppo_loss(cfg)`,
    `extractor_cispo_loss(cfg)`; tiny path: `actor_turn_loss(...)`, `extractor_constrained_loss(...)`).
    `max_traces` wraps the program in `chex.assert_max_traces` (a retrace guard for tests);
    `compiler_options` go to `jax.jit` (e.g. {"xla_backend_optimization_level": 0} for fast CPU compiles).
    `actor_steps` / `extractor_steps` > 1: the batch carries a leading [steps] axis and each model takes
    that many optimizer steps in order (`apply_updates`: PPO epochs x minibatches, extractor epochs);
    `actor_target_kl` > 0 stops the actor's steps early (`apply_updates` `target_kl`).
    The states' static parts (graphdef, tx) are part of the compiled signature: build the optimizer
    once and reuse it for every state (including restored ones) to avoid recompiling.
    """
    ext_mb = microbatches if extractor_microbatches is None else extractor_microbatches

    def co_update_fn(actor_state, extractor_state, actor_batch, extractor_batch):
        a_base = shared_base(actor_state.params, extractor_state.params)  # one frozen base for both (LoRA)
        e_base = shared_base(extractor_state.params, actor_state.params)
        actor_state, a_met = apply_updates(actor_state, actor_batch, actor_loss_fn, microbatches, actor_steps,
                                           actor_target_kl, a_base)

        def run(st):
            return apply_updates(st, extractor_batch, extractor_loss_fn, ext_mb, extractor_steps, base=e_base)

        def skip(st):
            shapes = jax.eval_shape(run, st)[1]
            return st, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        ready = jnp.asarray(extractor_batch.ready, bool).reshape(-1)[0]
        extractor_state, e_met = jax.lax.cond(ready, run, skip, extractor_state)
        e_met = dict(e_met, ready=ready.astype(_F32))
        return actor_state, extractor_state, {**_prefix("actor", a_met), **_prefix("extractor", e_met)}

    fn = chex.assert_max_traces(co_update_fn, n=max_traces) if max_traces else co_update_fn
    return jax.jit(fn, donate_argnums=(0, 1) if donate else (), compiler_options=compiler_options)

