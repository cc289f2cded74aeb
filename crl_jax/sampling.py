"""Batched autoregressive sampling with a KV cache, constrained decoding and per-token log-probs.

Four entry points:
- `sample_tokens(graphdef, params, prompt[B,P], prompt_len[B], key, cfg, allowed_tokens=None)`: pure and
  traceable (no Python side effects, no nested jit), so the training loop can call it inside its own
  compiled iteration. `cfg` is a hashable `SamplerConfig` and must be static under an outer jit.
- `continue_tokens(graphdef, params, cache, at, start, prompt, prompt_len, key, cfg)`: the same after context
  already in a KV cache (an encoded prefix, or a multi-turn rollout's previous turns); returns the cache too.
- `generate(model_or_(graphdef, params), prompt[B,P], prompt_len[B], key, *, max_new_tokens, ...)`: the
  jit-compiled convenience wrapper; one compiled program per (shapes, static options). `prepare(model)` makes
  the decode weights once for many calls on the same weights (pass it as `model`).
- `sequence_logprobs(graphdef, params, tokens[B,T], prompt_len[B], total_len[B])`: per-token log-probs of
  a given response under the model (what the policy loss recomputes); equals `generate`'s log-probs at
  temperature 1 with no filtering.

Layout. Prompts are RIGHT-padded in the API (row b holds its tokens at 0..len_b-1). Internally each row is
rolled right by pad_b = P - len_b, so every prompt ends at slot P-1 and all rows decode in lock-step with
one scalar cache index (the transformer's cache contract). Row b's token in slot s has position s - pad_b;
the padded slots are masked out as keys. The cache holds P + N slots; it is carried through the decode
loop and written in place, and each step attends only over the `attn_block`-slot blocks written so far (on
a GPU, by default, one block: see `decode_plan`). Models with at most `unroll_layers` layers run their layers
as straight-line code over weights sliced once before the loop (a layer scan inside the loop would copy every
layer's weights at every step), with the q/k/v and gate/up projections fused into one matmul each (fewer,
larger ops: a batch-1 step is mostly per-op cost), and over one KV buffer per layer (`transformer.split_cache`;
reading a layer out of the stacked cache is a copy per layer and step), stacked again after the loop. With
`decode_kernel="pallas"` a batch-1 decode step is three Pallas kernels per layer (`models.experimental.fused_decode`), and
with plain sampling the draw is one more (`models.experimental.fused_sample`).

Sampling order and the draw: `token_draw` (`sample_logits`, re-exported here).

Stopping: a row is done after it emits a stop token (the stop token is kept and counted in `lengths`);
later slots hold `pad_id` with log-prob 0. The decode loop (`lax.while_loop`) exits early once every row
is done; the result is identical to running all N steps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax import token_draw
from crl_jax.models.experimental import fused_decode as fd
from crl_jax.models.experimental import fused_sample as fs
from crl_jax.models import transformer as tr
from crl_jax.models.logprobs import chunked_logprobs
from crl_jax.token_draw import sample_logits

# The one-step functions keep their old paths here too.
filter_logits, mix_uniform = token_draw.filter_logits, token_draw.mix_uniform
categorical_inverse_cdf, inverse_cdf_index = token_draw.categorical_inverse_cdf, token_draw.inverse_cdf_index


@dataclass(frozen=True)
class SamplerConfig:
    """Static sampling options (hashable: a jit static argument; a new value compiles a new program)."""

    max_new_tokens: int  # N: generated slots per row
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    stop_tokens: tuple = ()  # token ids that end a row (kept in the output)
    pad_id: int = 0  # written after a row stops
    attn_block: int = 0  # cache slots per attention block: decode reads only the blocks written so far;
    #                      0 = by backend (`decode_plan`): 128 on CPU / TPU, the whole cache (no block loop) on GPU
    unroll_layers: int = -1  # models with at most this many layers decode with straight-line layers over weights
    #                         sliced once before the loop (`Transformer.layer_list`); deeper ones keep the layer
    #                         scan (compile time flat in depth), which slices every layer's weights at every step;
    #                         -1 = by backend (`decode_plan`): 8 on CPU / TPU, every layer on GPU
    first_mix: float = 0.0  # exploration of the FIRST token: sample it from (1 - m) * p + m * uniform(allowed);
    #                         its log-prob is the mixture's (the behaviour policy). 0 = off
    decode_kernel: str = "xla"  # batch-1 decode steps: "xla" | "pallas" (three Pallas / Triton kernels per layer,
    #                             CUDA GPUs: models.experimental.fused_decode) | "pallas_interpret" (the same kernels in Pallas'
    #                             interpreter, any backend: tests); batches > 1 and the prefill always run "xla"

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.attn_block < 0:
            raise ValueError(f"attn_block must be >= 1 (or 0: by backend), got {self.attn_block}")
        if self.unroll_layers < -1:
            raise ValueError(f"unroll_layers must be >= 0 (or -1: by backend), got {self.unroll_layers}")
        if not 0.0 <= self.first_mix < 1.0:
            raise ValueError(f"first_mix must be in [0, 1), got {self.first_mix}")
        if self.decode_kernel not in fs.KERNELS:
            raise ValueError(f"decode_kernel must be one of {fs.KERNELS}, got {self.decode_kernel!r}")
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))


# ----------------------------------------------------------------------------------------------
# One sampling step on logits


def decode_plan(cfg: SamplerConfig, capacity: int, num_layers: int, backend: str | None = None) -> tuple[int, bool]:
    """(attention block in slots, straight-line layers?) for a decode over a `capacity`-slot cache.

    Explicit `cfg` values win. By backend (0 / -1): a GPU runs the live-block loop of `attend_live` (its trip
    count is data-dependent) with a host round trip per iteration, and a layer scan slices every layer's weights
    at every step, so there one block covers the whole cache and every layer is unrolled (H200, SmolLM2-135M
    shape, bf16, P 128 + N 128: 2.6x faster at batch 1 and at batch 256 than 128-slot blocks with the layer
    scan). CPUs and TPUs loop on the device: 128-slot blocks (cost grows with the tokens
    written) and unrolled layers up to 8 deep. The GPU choice was measured at a 256-slot capacity only: with a
    cache of thousands of slots and few of them written (a long LLM conversation's first turns), reading the whole
    cache each step may cost more than the round trips; set `attn_block` there after measuring.
    """
    gpu = (backend or jax.default_backend()) == "gpu"
    block = cfg.attn_block or (max(int(capacity), 1) if gpu else 128)
    unroll = cfg.unroll_layers if cfg.unroll_layers >= 0 else (num_layers if gpu else 8)
    return block, num_layers <= unroll


# ----------------------------------------------------------------------------------------------
# Prefill + decode


def _allowed_at(allowed, step, B):
    """The [B, V] mask for decode step `step` from a [V], [B, V] or [B, N, V] mask (or None)."""
    if allowed is None:
        return None
    if allowed.ndim == 1:
        return jnp.broadcast_to(allowed[None], (B, allowed.shape[0]))
    if allowed.ndim == 2:
        return allowed
    return jax.lax.dynamic_index_in_dim(allowed, step, axis=1, keepdims=False)


def left_align(prompt, prompt_len, pad_id=0):
    """Right-padded prompt [B, P] -> (tokens, positions, valid) [B, P], each row ending at slot P-1."""
    B, P = prompt.shape
    pad = P - prompt_len  # [B]
    slot = jnp.arange(P)[None, :]
    src = (slot - pad[:, None]) % P
    valid = slot >= pad[:, None]
    tokens = jnp.where(valid, jnp.take_along_axis(prompt, src, axis=1), pad_id)
    positions = jnp.maximum(slot - pad[:, None], 0).astype(jnp.int32)
    return tokens.astype(jnp.int32), positions, valid


def sample_tokens(graphdef, params, prompt, prompt_len, key, cfg: SamplerConfig, allowed_tokens=None, live=None,
                  layers=None):
    """Pure prefill + decode. prompt [B, P] int (right-padded), prompt_len [B] (1 <= len <= P; a row of
    length 0 has nothing to condition on and yields meaningless tokens). `continue_tokens` does the same after
    context already in a cache (e.g. `init_cache(prefix=encode_prefix(head))`, or the last turn's cache).

    allowed_tokens: None or bool [V], [B, V] (same mask every step) or [B, N, V] (per step).
    live: None or bool [B]: rows that are False generate nothing (pad tokens, log-prob 0, length 0) and do not
    keep the decode loop running, which stops once every live row has stopped (e.g. the finished episodes of a
    lock-step multi-turn rollout).
    layers: None, or `decode_layers(graphdef, params)` computed beforehand (see `continue_tokens`).
    Returns tokens [B, N] int32, logprobs [B, N] float32, lengths [B] int32 (N = cfg.max_new_tokens).
    """
    chex.assert_rank([prompt, prompt_len], [2, 1])
    B, P = prompt.shape
    cache = tr.init_cache(tr.merge(graphdef, params).cfg, B, P + cfg.max_new_tokens)
    out_t, out_lp, lengths, _ = continue_tokens(graphdef, params, cache, 0, jnp.zeros((B,), jnp.int32), prompt,
                                                prompt_len, key, cfg, allowed_tokens, live, layers)
    return out_t, out_lp, lengths


def continue_tokens(graphdef, params, cache, at, start, prompt, prompt_len, key, cfg: SamplerConfig,
                    allowed_tokens=None, live=None, layers=None):
    """`sample_tokens` on a cache that already holds each row's context: the prompt [B, P] (right-padded,
    prompt_len [B]) is prefilled into slots at .. at+P-1 (left-aligned) and the reply decoded into slots
    at+P .. at+P+N-1, attending over every valid slot before them. `at`: a slot (int or traced scalar);
    `start` [B]: each row's position of its first prompt token (the number of tokens of context). `live`: as in
    `sample_tokens`.

    A multi-turn rollout carries the returned cache to the next turn, so every token of an episode is encoded
    once (`rollout.share_prefix` in the LLM loop). Returns (tokens [B, N], logprobs [B, N], lengths [B], cache);
    the cache's `valid` then marks exactly the prompt's tokens and each row's `lengths` reply tokens.
    The cache must have at + P + N slots (checked when `at` is a Python int; a traced `at` past the end would
    make XLA clamp the writes).
    layers: None (straight-line decoding slices and fuses the layer weights in this program), or
    `decode_layers(graphdef, params)` computed beforehand, which straight-line decoding then reads instead: weights
    in buffers that outlive the call (`prepare`) make a repeated batch-1 call faster.
    They must be those of `params`; the layer scan of a deeper model ignores them.
    """
    chex.assert_rank([prompt, prompt_len, start], [2, 1, 1])
    B, P = prompt.shape
    N = cfg.max_new_tokens
    S = cache["valid"].shape[1]
    if isinstance(at, int) and at + P + N > S:
        raise ValueError(f"continue_tokens: slots {at} .. {at + P + N - 1} (prompt {P} + reply {N}) do not fit a "
                         f"cache of {S} slots")
    model = tr.merge(graphdef, params)
    if allowed_tokens is not None:
        if allowed_tokens.ndim not in (1, 2, 3):
            raise ValueError(f"allowed_tokens must be [V], [B, V] or [B, N, V], got {allowed_tokens.shape}")
        allowed_tokens = allowed_tokens.astype(bool)
    prompt_len = prompt_len.astype(jnp.int32)
    start = start.astype(jnp.int32)
    toks, pos, valid = left_align(prompt.astype(jnp.int32), prompt_len, cfg.pad_id)
    pos = pos + start[:, None]
    block, straight = decode_plan(cfg, S, model.cfg.num_layers)
    fused = fs.wanted(cfg.decode_kernel, model.cfg, B)
    straight = straight or fused  # the kernels take the per-layer weights and cache buffers
    if not straight:
        layers = None
    elif layers is None:
        # Sliced (and fused) once, here; the barrier keeps XLA from sinking the slices back into the decode loop,
        # where each would be a copy per step.
        layers = jax.lax.optimization_barrier(model.layer_list(fused=True))
    elif len(layers) != model.cfg.num_layers:
        raise ValueError(f"layers: {len(layers)} prepared layers for a model of {model.cfg.num_layers}")
    if straight:
        cache = tr.split_cache(cache)  # one KV buffer per layer: no per-step slice of the stacked cache
    # Unembed only the last slot: [B, P, V] prefill logits would dominate memory for big vocabularies.
    h, cache = model(toks, positions=pos, attention_mask=valid, cache=cache, cache_index=at, return_hidden=True,
                     attn_block=block, layers=layers)
    logits = model.unembed(h[:, -1:])[:, 0]
    stops = jnp.asarray(cfg.stop_tokens, jnp.int32)

    def cond(c):
        i, done = c[0], c[4]
        return (i < N) & ~jnp.all(done)

    def body(c):
        i, logits, cache, key, done, out_t, out_lp = c
        sk = jax.random.fold_in(key, i)
        mix = jnp.where(i == 0, jnp.float32(cfg.first_mix), 0.0) if cfg.first_mix > 0 else None
        tok, lp = sample_logits(logits, sk, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                allowed=_allowed_at(allowed_tokens, i, B), mix=mix)
        tok = jnp.where(done, cfg.pad_id, tok)
        lp = jnp.where(done, 0.0, lp)
        out_t = jax.lax.dynamic_update_index_in_dim(out_t, tok, i, axis=1)
        out_lp = jax.lax.dynamic_update_index_in_dim(out_lp, lp, i, axis=1)
        if cfg.stop_tokens:
            done = done | jnp.any(tok[:, None] == stops[None, :], axis=-1)
        # Feed the token at slot at + P + i; its position continues each row's own count.
        new_pos = (start + prompt_len + i)[:, None]
        if fused:
            logits, cache = fd.decode_step(model, layers, tok, new_pos[:, 0], cache, at + P + i,
                                           interpret=cfg.decode_kernel == "pallas_interpret")
            return i + 1, logits, cache, key, done, out_t, out_lp
        h, cache = model(tok[:, None], positions=new_pos, attention_mask=jnp.ones((B, 1), bool), cache=cache,
                         cache_index=at + P + i, return_hidden=True, attn_block=block, layers=layers)
        return i + 1, model.unembed(h)[:, 0], cache, key, done, out_t, out_lp

    dead = jnp.zeros((B,), bool) if live is None else ~live.astype(bool)
    if fused and fs.plain(cfg, allowed_tokens):  # the draw in a kernel too (models.experimental.fused_sample)
        steps, cache, out_t, out_lp = fs.decode_loop(model, layers, logits, cache, at + P, start[0] + prompt_len[0],
                                                     key, cfg, dead, interpret=cfg.decode_kernel == "pallas_interpret")
    else:
        init = (jnp.int32(0), logits, cache, key, dead,
                jnp.full((B, N), cfg.pad_id, jnp.int32), jnp.zeros((B, N), jnp.float32))
        steps, _, cache, _, _, out_t, out_lp = jax.lax.while_loop(cond, body, init)
    if straight:
        cache = tr.stack_cache(cache)
    # A row's length: steps taken before it finished (its stop token included).
    if cfg.stop_tokens:
        is_stop = jnp.any(out_t[..., None] == stops, axis=-1)
        first = jnp.argmax(is_stop, axis=1)
        lengths = jnp.where(is_stop.any(1), first + 1, steps)
    else:
        lengths = jnp.full((B,), steps)
    lengths = jnp.where(dead, 0, lengths).astype(jnp.int32)
    # Every generated token was fed (its keys and values are in the cache); the padding fed after a row's stop
    # token, and slots a loop that ended early never wrote, are not context.
    reply_valid = jnp.arange(N)[None, :] < lengths[:, None]
    cache = dict(cache, valid=jax.lax.dynamic_update_slice(cache["valid"], reply_valid, (0, at + P)))
    return out_t, out_lp, lengths, cache


def decode_layers(graphdef, params) -> list[dict]:
    """The layer weights as straight-line decoding reads them: one dict per layer, q/k/v and gate/up fused
    (`Transformer.layer_list(fused=True)`). Pure; a copy of every layer's weights."""
    return tr.merge(graphdef, params).layer_list(fused=True)


class Prepared(NamedTuple):
    """A model's weights ready for repeated `generate` calls (`prepare`): a snapshot of `params`."""

    graphdef: Any
    params: Any
    layers: list | None  # decode_layers(graphdef, params) in buffers of their own; None where decoding scans layers


def prepare(model) -> Prepared:
    """`model` (a Transformer, its (graphdef, params) split, or a `Prepared`) with its decode weights computed
    once, for many `generate` calls on the same weights, as a sampler object holds its model. Without it each call
    slices and fuses the layer weights in its own program: on the 2-core CPU a batch-1 call of the Tunix benchmark's
    model (32 + 32 tokens) takes about 0.82x the time with it. Costs a
    second copy of the layer weights, and only for a model that the backend decodes with straight-line layers
    (`decode_plan`; a deeper one keeps None, and its layer scan reads the stacked weights). Prepare again after the
    weights change: the snapshot does not follow them."""
    if isinstance(model, Prepared):
        return model
    graphdef, params, _ = _split_model(model)
    straight = decode_plan(SamplerConfig(max_new_tokens=1), 1, tr.merge(graphdef, params).cfg.num_layers)[1]
    return Prepared(graphdef, params, _decode_layers_jit(graphdef, params) if straight else None)


_decode_layers_jit = jax.jit(decode_layers, static_argnums=0)


def _split_model(model):
    """(graphdef, params, prepared layers or None) of a Transformer, a (graphdef, params) pair or a `Prepared`."""
    if isinstance(model, Prepared):
        return model
    graphdef, params = tr.split(model) if isinstance(model, nnx.Module) else model
    return graphdef, params, None


@functools.partial(jax.jit, static_argnums=(0, 5))
def _generate_jit(graphdef, params, prompt, prompt_len, key, cfg, allowed_tokens, layers):
    return sample_tokens(graphdef, params, prompt, prompt_len, key, cfg, allowed_tokens, layers=layers)


def generate(model, prompt_tokens, prompt_lengths, key, *, max_new_tokens, temperature=1.0, top_p=1.0,
             top_k=0, stop_tokens=(), allowed_tokens=None, pad_id=0,
             unroll_layers=SamplerConfig.unroll_layers, decode_kernel=SamplerConfig.decode_kernel):
    """Sample N = max_new_tokens tokens after each prompt. See the module docstring.

    model: a Transformer, its (graphdef, params) split, or `prepare(model)` (faster for repeated calls on the same
    weights). prompt_tokens [B, P] int right-padded, prompt_lengths [B] int, key: a typed PRNG key. Returns
    tokens [B, N] int32, logprobs [B, N] float32, lengths [B] int32 (generated tokens including the stop token).
    """
    graphdef, params, layers = _split_model(model)
    cfg = SamplerConfig(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_p=float(top_p),
                        top_k=int(top_k), stop_tokens=tuple(stop_tokens), pad_id=int(pad_id),
                        unroll_layers=int(unroll_layers), decode_kernel=str(decode_kernel))
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    if allowed_tokens is not None:
        allowed_tokens = jnp.asarray(allowed_tokens, bool)
    return _generate_jit(graphdef, params, prompt_tokens, prompt_lengths, key, cfg, allowed_tokens, layers)


# ----------------------------------------------------------------------------------------------
# Scoring a given sequence


def sequence_logprobs(graphdef, params, tokens, prompt_len, total_len, *, temperature=1.0):
    """log p(tokens[b, t] | tokens[b, <t]) [B, T] float32, 0 outside prompt_len[b] <= t < total_len[b].

    tokens [B, T] int (prompt then response, right-padded), prompt_len / total_len [B] int. Pure and
    traceable; matches `generate`'s log-probs at the same temperature with no top-k / top-p / mask.
    """
    chex.assert_rank([tokens, prompt_len, total_len], [2, 1, 1])
    B, T = tokens.shape
    tokens = tokens.astype(jnp.int32)
    t = jnp.arange(T)[None, :]
    valid = t < total_len[:, None]
    model = tr.merge(graphdef, params)
    # Right padding: under the causal mask no valid query sees a padded key, so no key mask (the fused kernels'
    # plain causal form); the padded positions' log-probs are dropped below.
    h = model(tokens, return_hidden=True)  # positions 0..T-1
    # h[:, t-1] predicts tokens[:, t]; scored in vocabulary tiles (no [B, T, V] logits buffer).
    lp, _ = chunked_logprobs(h[:, :-1], model.unembed_matrix(), tokens[:, 1:], temperature=temperature)
    lp = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), lp], axis=1)
    keep = (t >= prompt_len[:, None]) & valid & (t >= 1)
    return jnp.where(keep, lp, 0.0)
