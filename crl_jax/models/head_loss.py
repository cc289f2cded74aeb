"""A token-separable loss of the vocabulary head's log-probs, its gradient computed in the forward pass.

The learner's policy losses (PPO-clip with ratio "token", CISPO, the MFU benchmark's cross-entropy) are sums
over tokens of a function of that token's log-prob alone: num = sum_n f_n(logp_n). For such a loss the
gradient needs no second look at the logits. `fused_token_loss` takes the per-token function, and for one
chunk of `token_chunk` rows at a time it

    z = h_r @ w / T                          [r, V] float32, the chunk's logits over the whole vocabulary
    lse, logp = logsumexp(z), z[target] - lse
    value = sum f(logp),  g = f'(logp)       (jax.vjp of the chunk's f)
    dz = g * (onehot(target) - softmax(z)) / T
    dh_r = dz @ w^T,   dw += h_r^T @ dz

so the head costs three matmul passes over the vocabulary (z, dh, dw). `chunked_logprobs` (the general path,
for any loss of the log-probs) costs four: its forward computes z for the log-probs, and its backward, which
only then learns each token's gradient, computes z again before dh and dw. The custom VJP returns the stored
dh, dw times the incoming cotangent of the sum. Memory: one chunk's [r, V] logits and their cotangent instead
of a [r, vocab_chunk] tile, plus the [H, V] float32 gradient accumulator both paths have.

f must be elementwise over tokens (the vjp of a chunk's sum is only each token's own derivative if no token's
term depends on another token), or, with `group=L`, over groups of L consecutive rows: a sequence-level ratio
(GSPO) makes each of a sequence's terms depend on all of its log-probs, so the rows come as whole sequences of L
slots, every chunk holds whole sequences (max(1, token_chunk // L) of them), and f sees them as [c, L]. The
vjp of a chunk's sum is then exact again, since no term depends on a row of another chunk. The returned
log-probs and entropies are for metrics and carry no gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from crl_jax.models.logprobs import _logits, _split_rows, _tile_starts

_F32 = jnp.float32


def _combine(a, b):
    (ma, sa, ta), (mb, sb, tb) = a, b
    m = jnp.maximum(ma, mb)
    fa = jnp.where(ma == -jnp.inf, 0.0, jnp.exp(ma - m))
    fb = jnp.where(mb == -jnp.inf, 0.0, jnp.exp(mb - m))
    return m, sa * fa + sb * fb, ta * fa + tb * fb


def _softmax_stats(z):
    """Per row (max m, sum exp(z - m), sum exp(z - m) z) in one variadic reduction (an online softmax: each element
    starts as (z, 1, z); `_combine` rescales two partial states to their common max), so z is read once for all
    three, not once for the max and again for the sums: 10 GB less traffic per Qwen-shape step by `gpu_aot.py`'s
    count, for one more exponential per logit (CPU time unchanged)."""
    return jax.lax.reduce((z, jnp.ones_like(z), z), (jnp.float32(-jnp.inf), jnp.float32(0), jnp.float32(0)),
                          _combine, (1,))


def _grouped(token_fn, group: int):
    """fn(lp [r], aux_r, valid [r]) -> [r]: token_fn(lp, aux_r) for group 1, else token_fn on [r / group, group]
    blocks of all three (a group's terms need to know which of its rows count)."""
    if group == 1:
        return lambda lp, aux, valid: token_fn(lp, aux)

    def fn(lp, aux, valid):
        blocks = lambda x: x.reshape((-1, group) + x.shape[1:])  # noqa: E731
        return token_fn(blocks(lp), jax.tree.map(blocks, aux), blocks(valid)).reshape(lp.shape)

    return fn


def _chunk(h_r, tgt_r, valid_r, aux_r, w, token_fn, temperature: float):
    """One chunk of rows -> (sum of f, logp [r], entropy [r], dh [r, H] float32, dw [H, V] float32)."""
    mm = jnp.promote_types(h_r.dtype, w.dtype)
    z = _logits(h_r, w, temperature)  # [r, V] float32
    m, s, t = _softmax_stats(z)
    lse = m + jnp.log(s)
    ent = lse - t / s
    logp = jnp.take_along_axis(z, tgt_r[:, None], axis=-1)[:, 0] - lse
    vals, vjp = jax.vjp(lambda lp: jnp.where(valid_r, token_fn(lp, aux_r, valid_r), 0.0), logp)
    (g,) = vjp(jnp.ones_like(vals))
    p = jnp.exp(z - lse[:, None])
    onehot = (jnp.arange(z.shape[1])[None, :] == tgt_r[:, None]).astype(_F32)
    dz = (g[:, None] * (onehot - p)) if temperature == 1.0 else (g[:, None] * (onehot - p)) / temperature
    # the chunk's cotangent goes into the matmuls in the inputs' precision (bf16 on a GPU), float32 accumulation,
    # as `chunked_logprobs`' backward does
    dz = dz.astype(mm)
    dh = jnp.einsum("nv,hv->nh", dz, w.astype(mm), preferred_element_type=_F32)
    dw = jnp.einsum("nh,nv->hv", h_r.astype(mm), dz, preferred_element_type=_F32)
    return vals.sum(), logp, ent, dh, dw


def _fwd_all(h, w, tgt, valid, aux, token_fn, temperature, token_chunk, group):
    N = h.shape[0]
    if group == 1:
        r, nt = _tile_starts(N, token_chunk)
    else:  # whole groups per chunk: max(1, token_chunk // group) of them, never more than there are
        r = min(max(1, token_chunk // group), N // group) * group
        nt = -(-N // r)
    token_fn = _grouped(token_fn, group)

    def body(acc, part):
        total, dw = acc
        h_r, tgt_r, valid_r, aux_r = part
        v, lp, ent, dh, dw_r = _chunk(h_r, tgt_r, valid_r, aux_r, w, token_fn, temperature)
        return (total + v, dw + dw_r), (lp, ent, dh)

    split = functools.partial(_split_rows, r=r, nt=nt)  # padding rows are invalid: their f and g are 0
    parts = (split(h), split(tgt), split(valid), jax.tree.map(split, aux))
    (total, dw), (lp, ent, dh) = jax.lax.scan(body, (jnp.zeros((), _F32), jnp.zeros(w.shape, _F32)), parts)
    flat = lambda x: x.reshape((nt * r,) + x.shape[2:])[:N]  # noqa: E731
    return total, flat(lp), flat(ent), flat(dh), dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(h, w, tgt, valid, aux, token_fn, temperature, token_chunk, group):
    total, lp, ent, _, _ = _fwd_all(h, w, tgt, valid, aux, token_fn, temperature, token_chunk, group)
    return total, lp, ent


def _fused_fwd(h, w, tgt, valid, aux, token_fn, temperature, token_chunk, group):
    total, lp, ent, dh, dw = _fwd_all(h, w, tgt, valid, aux, token_fn, temperature, token_chunk, group)
    # zero-size arrays carry the input dtypes (residuals must be arrays)
    return (total, lp, ent), (dh, dw, jnp.zeros((0,), h.dtype), jnp.zeros((0,), w.dtype), aux)


def _fused_bwd(token_fn, temperature, token_chunk, group, res, cts):
    dh, dw, h_like, w_like, aux = res
    c = cts[0].astype(_F32)  # the log-prob and entropy outputs carry no gradient (stop_gradient outside)
    return ((dh * c).astype(h_like.dtype), (dw * c).astype(w_like.dtype), None, None,
            jax.tree.map(jnp.zeros_like, aux))


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_token_loss(h, w, targets, valid, token_fn: Callable, aux, *, temperature: float = 1.0,
                     token_chunk: int = 1024, group: int = 1):
    """sum over valid tokens of token_fn(logp, aux), with logp = log_softmax(h @ w / temperature)[targets].

    h [N, H] hidden states, w [H, V] unembedding, targets [N] int, valid [N] bool (invalid tokens add 0 and get
    no gradient), aux a pytree of [N] arrays handed to token_fn chunk by chunk (no gradient flows into them).
    token_fn(logp [r], aux_r) -> [r] float32 per-token terms; it must be elementwise over tokens. With `group` L > 1
    the rows are N / L groups of L consecutive rows (a sequence's slots), and token_fn(logp [c, L], aux_r [c, L],
    valid [c, L]) -> [c, L] must be elementwise over groups (a term may depend on every row of its own group);
    each chunk holds whole groups: max(1, token_chunk // L) of them.
    Returns (total [] float32 with gradients to h and w, logp [N] float32, entropy [N] float32); the last two
    carry no gradient. Three matmul passes over the vocabulary instead of `chunked_logprobs`' four.
    """
    chex.assert_rank([h, w, targets, valid], [2, 2, 1, 1])
    chex.assert_equal_shape_prefix([h, targets, valid], 1)
    for leaf in jax.tree.leaves(aux):
        chex.assert_shape(leaf, targets.shape)
    group = int(group)
    if group < 1 or h.shape[0] % group:
        raise ValueError(f"group must be a positive divisor of the {h.shape[0]} rows, got {group}")
    if h.shape[0] == 0:
        z = jnp.zeros((0,), _F32)
        return jnp.zeros((), _F32), z, z
    total, lp, ent = _fused(h, w, targets.astype(jnp.int32), valid.astype(bool), aux, token_fn, float(temperature),
                            int(token_chunk), group)
    return total, jax.lax.stop_gradient(lp), jax.lax.stop_gradient(ent)
