"""Causal attention in blocks of queries and keys, with its own backward pass (the CPU learner).

The "einsum" attention (`attention.dense_attention`) differentiated by autodiff keeps every layer's [B, Hq, T, T]
float32 probabilities for the backward pass (stacked over the layer scan: 3.5 GB at SmolLM2-135M's shape, B 2 x
T 1,280), computes the tiles above the causal diagonal only to mask them, and XLA:CPU copies its scores into the
layout of the next matmul, which in the backward reads the probabilities transposed (about 0.8 GB/s: 7.2 s of the
forward and 4.3 s of the backward in a 35 s actor update). Here:

- the forward runs one query block at a time against the keys up to that block's end (the tiles above the diagonal
  are never computed) and keeps only q, k, v, the output and each query's log-sum-exp;
- the backward recomputes the probabilities block by block. dK and dV come from one pass over key blocks that
  computes the scores already transposed ([keys, queries], so that the matmuls contracting over queries read them
  in place), and dQ from one pass over query blocks in the forward's layout. No matmul reads a score-sized
  operand transposed; the price is the scores' matmul done three times instead of twice (with the causal half
  skipped, fewer flops than the dense path's in all).

Pure jnp with static blocks (a Python loop of at most `max_blocks` blocks per pass, each its own static shape),
so it runs on every backend; `dense_attention` picks it on the CPU for the plain causal forward
(`attention.attention_impl`, from `BLOCKED_MIN_LEN` tokens). Scores and softmax in float32, as "einsum".
"""

from __future__ import annotations

import math
from functools import partial

import chex
import jax
import jax.numpy as jnp


def block_size(T: int, block: int = 256, max_blocks: int = 16) -> int:
    """Rows per block for a sequence of T: T split into ceil(T / block) blocks (at most `max_blocks`: each is
    unrolled into the program) of equal size, the last one possibly shorter by less than one row per block."""
    n = max(1, min(-(-int(T) // int(block)), int(max_blocks)))
    return -(-int(T) // n)


def _spans(T: int, c: int):
    """[(start, end)] of the blocks of c rows covering 0..T-1 (the last one may be shorter)."""
    return [(s, min(s + c, T)) for s in range(0, T, c)]


def _causal(q0: int, q1: int, k0: int, k1: int, transposed: bool = False) -> jax.Array:
    """bool [q1-q0, k1-k0] (or its transpose): key slot <= query slot. From iotas, which XLA computes in the fusion
    that reads it rather than folding it into a constant of the program."""
    shape = (k1 - k0, q1 - q0) if transposed else (q1 - q0, k1 - k0)
    qd, kd = (1, 0) if transposed else (0, 1)
    iota = lambda d: jax.lax.broadcasted_iota(jnp.int32, shape, d)  # noqa: E731
    return iota(kd) + k0 <= iota(qd) + q0


def _query_block_scores(qh, kh, q0: int, q1: int):
    """Scaled float32 scores [B, K, G, q1-q0, q1] of queries q0..q1-1 against keys 0..q1-1, -inf above the diagonal
    (the query itself is always visible)."""
    s = jnp.einsum("bkgtd,bksd->bkgts", qh[:, :, :, q0:q1], kh[:, :, :q1], preferred_element_type=jnp.float32)
    return jnp.where(_causal(q0, q1, 0, q1), s * (1.0 / math.sqrt(qh.shape[-1])), -jnp.inf)


def _forward(qh, kh, vh, c: int):
    """qh [B, K, G, T, D], kh / vh [B, K, T, D] -> (out [B, K, G, T, D] in v's dtype, lse [B, K, G, T] float32)."""
    outs, lses = [], []
    for q0, q1 in _spans(qh.shape[3], c):
        s = _query_block_scores(qh, kh, q0, q1)
        m = s.max(-1, keepdims=True)
        p = jnp.exp(s - m)
        den = p.sum(-1, keepdims=True)
        o = jnp.einsum("bkgts,bksd->bkgtd", p.astype(vh.dtype), vh[:, :, :q1], preferred_element_type=jnp.float32)
        outs.append((o / den).astype(vh.dtype))
        lses.append((m + jnp.log(den))[..., 0])
    return jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attend(qh, kh, vh, c: int):
    return _forward(qh, kh, vh, c)[0]


def _attend_fwd(qh, kh, vh, c):
    out, lse = _forward(qh, kh, vh, c)
    return out, (qh, kh, vh, out, lse)


def _attend_bwd(c, res, d_out):
    qh, kh, vh, out, lse = res
    T = qh.shape[3]
    scale = 1.0 / math.sqrt(qh.shape[-1])
    f32 = jnp.float32
    do = d_out.astype(f32)
    delta = jnp.sum(do * out.astype(f32), axis=-1)  # [B, K, G, T]: rowsum(dO * O)
    dq, dk, dv = [], [], []
    # dK, dV: a key block [k0, k1) against the queries from k0 on (the earlier ones cannot see it), the scores
    # computed as [keys, queries] so the contractions over queries read them in place.
    for k0, k1 in _spans(T, c):
        qt, dot_ = qh[:, :, :, k0:], do[:, :, :, k0:]
        st = jnp.einsum("bksd,bkgtd->bksgt", kh[:, :, k0:k1], qt, preferred_element_type=f32) * scale
        visible = _causal(k0, T, k0, k1, transposed=True)[:, None, :]  # [keys, 1, queries]
        pt = jnp.where(visible, jnp.exp(st - lse[:, :, None, :, k0:]), 0.0)
        dv.append(jnp.einsum("bksgt,bkgtd->bksd", pt, dot_, preferred_element_type=f32))
        dpt = jnp.einsum("bksd,bkgtd->bksgt", vh[:, :, k0:k1], dot_.astype(vh.dtype), preferred_element_type=f32)
        dst = pt * (dpt - delta[:, :, None, :, k0:])
        dk.append(jnp.einsum("bksgt,bkgtd->bksd", dst, qt, preferred_element_type=f32) * scale)
    # dQ: a query block against the keys up to its end, in the forward's layout.
    for q0, q1 in _spans(T, c):
        p = jnp.exp(_query_block_scores(qh, kh, q0, q1) - lse[..., q0:q1, None])  # 0 above the diagonal
        dp = jnp.einsum("bkgtd,bksd->bkgts", do[:, :, :, q0:q1].astype(vh.dtype), vh[:, :, :q1],
                        preferred_element_type=f32)
        ds = p * (dp - delta[..., q0:q1, None])
        dq.append(jnp.einsum("bkgts,bksd->bkgtd", ds, kh[:, :, :q1], preferred_element_type=f32) * scale)
    dq = jnp.concatenate(dq, axis=3).astype(qh.dtype)
    dk = jnp.concatenate(dk, axis=2).astype(kh.dtype)
    dv = jnp.concatenate(dv, axis=2).astype(vh.dtype)
    return dq, dk, dv


_attend.defvjp(_attend_fwd, _attend_bwd)


def causal_blocked_attention(q, k, v, num_kv_heads: int, block: int = 256, max_blocks: int = 16):
    """q [B, T, Nq, D], k / v [B, T, Hkv, D] -> [B, T, Nq*D]: softmax(q k^T / sqrt(D)) v under the plain causal
    mask (query t sees keys 0..t; no padding mask: right padding is harmless, as in `dense_attention(mask=None)`),
    query head kv * G + g reading kv head kv (G = Nq / Hkv). Blocks of `block_size(T, block, max_blocks)` rows."""
    chex.assert_rank([q, k, v], [4, 4, 4])
    chex.assert_equal_shape([k, v])
    B, T, Nq, D = q.shape
    if k.shape[1] != T or k.shape[2] != num_kv_heads or Nq % num_kv_heads:
        raise ValueError(f"causal_blocked_attention: q {q.shape} against k / v {k.shape} with {num_kv_heads} kv heads "
                         "(needs as many keys as queries and Nq a multiple of the kv heads)")
    G = Nq // num_kv_heads
    # Head-major layouts: every matmul below then reads its operands as stored (these transposes are [T, D]-sized).
    qh = jnp.transpose(q.reshape(B, T, num_kv_heads, G, D), (0, 2, 3, 1, 4))
    kh, vh = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
    o = _attend(qh, kh, vh, block_size(T, block, max_blocks))  # in v's dtype
    return jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(B, T, Nq * D)
