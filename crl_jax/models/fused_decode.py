"""A batch-1 decode step as three Pallas (Triton) kernels per layer (issue #16, the batch-1 target).

Why. XLA runs a batch-1 decode step of the SmolLM2-135M shape as ~560 kernels (~19 per layer) on an H200, and
rewrites each vector x matrix product into a multiply kernel and a reduce kernel with the product written to
memory between them (experiments/bench/RESULTS.md, session 16). At 1.5-5 us per kernel the step takes 1.06 ms,
while reading the weights once takes 56 us. This module does one layer in three kernels, each reading its
weights once:

1. `_qkv_kernel` (one program per q / k / v head): the residual stream (the previous layer's output, see
   below), RMSNorm, this head's columns of the fused q/k/v projection (+ bias, + per-head q/k RMSNorm), RoPE;
   q goes to a small buffer, k and v straight into this layer's KV-cache buffer at the current slot (in place:
   the cache buffers are aliased to the outputs).
2. `_attn_kernel` (one program per query head): attention over the live slots (online softmax over blocks of
   cache slots, as `attention.attend_live`), then that head's rows of the output projection: a partial [H]
   of the attention output, one row per head.
3. `_mlp_kernel` (one program per `MLP_COLS` intermediate columns): the residual plus the sum of the attention
   partials, RMSNorm, this program's gate / up columns, SiLU, and those rows of the down projection: again a
   partial [H] per program.

Partials instead of a reduction kernel: the next kernel adds them up in a fixed order while it reads its input
(so the result is deterministic, unlike atomics), and RMSNorm is folded into each matvec (the sum of squares is
accumulated in the same pass, the product scaled by 1/rms at the end), so no kernel needs a grid-wide barrier.
A model with more than `MAX_PARTS` MLP programs gets its MLP partials summed by XLA instead (one more kernel per
layer, against every program of the next kernel reading all of them).
`_head_kernel` does the final norm and the vocabulary head (one program per `VOCAB_COLS` tokens) on the last
layer's output, summed by XLA. With that sum, the embedding lookup and the sampling in XLA, a step is about
3L + 10 kernels instead of ~19L. The loops over the hidden size run in groups of `UNROLL` unrolled chunks:
each chunk's loads are independent of the others, so a program has a group's loads in flight at once. What each
kernel compiles to (registers, spills) can be seen without a GPU: experiments/bench/triton_ptx.py.

Numerics follow `Transformer._cached_layer` (float32 accumulation, the model dtype's roundings after each
projection, float32 softmax), except that the normalised input of a projection is not rounded to the model
dtype before the product. Tested equal (float32, interpret mode) to the XLA step, and lowered for CUDA, on a
CPU (tests/unit/test_fused_decode.py); GPU parity and speed: experiments/bench/gpu_checks.py and
decode_cache.py's `pallas` variant (gpu.sh).

One device: the kernels take whole arrays (a model sharded over a mesh keeps `decode_kernel="xla"`).

Triton needs power-of-two tensor shapes, so every model dimension is walked in chunks: hidden size a multiple
of `CH`, head dim a power of two, intermediate size a multiple of `MLP_COLS`, vocabulary a multiple of
`VOCAB_COLS` (`unsupported` says which one fails).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


CH = 64  # hidden-size chunk of every matvec
MLP_COLS = 32  # intermediate columns per program of the MLP kernel (48 programs at SmolLM2's 1,536)
VOCAB_COLS = 128  # vocabulary rows per program of the head kernel
SLOTS = 64  # cache slots per attention block
MAX_PARTS = 64  # more MLP partials than this (Qwen2.5-0.5B: 152) are summed by XLA before the next layer: each
#                of the next kernel's programs would otherwise read them all (at Qwen's shape 0.9 MB, 8x its weights)
NUM_WARPS = 4
NUM_STAGES = 2  # Triton's software pipelining depth of a rolled loop
DEBUG = False  # print each kernel's jaxpr and Triton module when it is lowered (experiments/bench/triton_ptx.py)
UNROLL = 3  # chunks per step of the loops over the hidden size: k = a `fori_loop` over groups of k unrolled
#             chunks (1: rolled, one chunk ahead in flight with Triton's pipelining), 0 = all unrolled (every load
#             in flight at once; at SmolLM2 shape the MLP kernel then spills 168 bytes at 255 registers, against
#             72 registers and no spill with 3: experiments/bench/triton_ptx.py)
f32 = jnp.float32


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def unsupported(cfg, batch: int) -> str | None:
    """Why the fused step cannot run this model / batch (None: it can)."""
    D = cfg.dim_head
    checks = [(batch == 1, f"batch {batch} (the kernels are for batch 1)"),
              (cfg.hidden_size % CH == 0, f"hidden_size {cfg.hidden_size} is not a multiple of {CH}"),
              (_pow2(D) and D >= 16, f"head dim {D} is not a power of two >= 16"),
              (cfg.intermediate_size % MLP_COLS == 0,
               f"intermediate_size {cfg.intermediate_size} is not a multiple of {MLP_COLS}"),
              (cfg.vocab_size % VOCAB_COLS == 0, f"vocab_size {cfg.vocab_size} is not a multiple of {VOCAB_COLS}")]
    bad = [why for ok, why in checks if not ok]
    return "; ".join(bad) or None


KERNELS = ("xla", "pallas", "pallas_interpret")  # `SamplerConfig.decode_kernel`


def wanted(kernel: str, cfg, batch: int) -> bool:
    """Whether a sampler with `decode_kernel` = kernel runs its decode steps through `decode_step`: batch 1 only
    (larger batches keep XLA's path); a model the kernels cannot take is an error, as is "pallas" off a
    CUDA GPU."""
    if kernel == "xla" or batch != 1:
        return False
    why = unsupported(cfg, batch)
    if why:
        raise ValueError(f"decode_kernel={kernel!r}: {why}; use decode_kernel='xla'")
    if kernel == "pallas" and jax.default_backend() != "gpu":
        raise ValueError(f"decode_kernel='pallas' compiles Triton kernels for a CUDA GPU (the default backend is "
                         f"{jax.default_backend()!r}); use 'pallas_interpret' (slow) or 'xla'")
    return True


def _call(kernel, out_shape, grid, interpret: bool, aliases=None, name=None):
    kw = dict(out_shape=out_shape, grid=grid, input_output_aliases=aliases or {}, name=name, debug=DEBUG)
    if interpret:
        kw["interpret"] = True
    else:
        kw["compiler_params"] = plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return pl.pallas_call(kernel, **kw)


def _round(x, dtype):
    """x rounded to the model dtype, kept in float32 (where XLA's path stores an intermediate in that dtype)."""
    return x.astype(dtype).astype(f32)


def _chunks(n: int, body, carry):
    """carry = body(c, carry) for c in 0 .. n-1, as a `fori_loop` over groups of `UNROLL` chunks (the group
    unrolled; the chunks left over after the last whole group unrolled after the loop), or all unrolled."""
    k = UNROLL if 0 < UNROLL < n else n

    def group(g, carry):
        for i in range(k):
            carry = body(g * k + i, carry)
        return carry

    if n // k > 1:
        carry = jax.lax.fori_loop(0, n // k, group, carry)
    elif n // k == 1:
        carry = group(0, carry)
    for c in range(n // k * k, n):
        carry = body(c, carry)
    return carry


def _residual_chunk(base_ref, parts_ref, n_parts: int, c, dtype):
    """Chunk c (CH values, float32) of the residual stream: base + the sum of the n_parts rows of the previous
    kernel's partials, added in a fixed order and rounded as `h + (...).astype(h.dtype)` is."""
    x = base_ref[pl.ds(c * CH, CH)].astype(f32)
    if parts_ref is None:
        return x
    total, row = jnp.zeros((CH,), f32), 0
    for bit in reversed(range(n_parts.bit_length())):  # rows in power-of-two blocks (48 = 32 + 16): Triton's
        if n_parts >> bit & 1:  # loads are powers of two, and no row is read that was not written
            total = total + jnp.sum(parts_ref[pl.ds(row, 1 << bit), pl.ds(c * CH, CH)], axis=0)
            row += 1 << bit
    return _round(x + _round(total, dtype), dtype)


def _normed_pair(base_ref, parts_ref, n_parts: int, wn_ref, w_ref, col_a, col_b, width: int, H: int, eps: float,
                 x_out_ref, writer, dtype):
    """RMSNorm(x) @ w[:, col_a : col_a + width] and @ w[:, col_b : col_b + width] (float32), for the residual x
    = base + partials (`_residual_chunk`), which the program where `writer` holds also writes to x_out_ref. The
    norm is folded in: the sum of squares is accumulated in the same pass, the products scaled at the end."""
    def body(c, carry):
        ss, a, b = carry
        xc = _residual_chunk(base_ref, parts_ref, n_parts, c, dtype)

        @pl.when(writer)
        def _():
            x_out_ref[pl.ds(c * CH, CH)] = xc.astype(x_out_ref.dtype)

        xw = (xc * wn_ref[pl.ds(c * CH, CH)].astype(f32))[:, None]
        a = a + jnp.sum(xw * w_ref[pl.ds(c * CH, CH), pl.ds(col_a, width)].astype(f32), axis=0)
        b = b + jnp.sum(xw * w_ref[pl.ds(c * CH, CH), pl.ds(col_b, width)].astype(f32), axis=0)
        return ss + jnp.sum(xc * xc), a, b

    zero = jnp.zeros((width,), f32)
    ss, a, b = _chunks(H // CH, body, (jnp.float32(0.0), zero, zero))
    inv = jax.lax.rsqrt(ss / H + eps)
    return a * inv, b * inv


def _summed(base, parts, n_parts: int, dtype):
    """base + the first n_parts rows of parts, rounded as `_residual_chunk` rounds (in XLA)."""
    return _round(base.astype(f32) + _round(parts[:n_parts].sum(0), dtype), dtype).astype(dtype)


def _qkv_kernel(*refs, H, D, Nq, Nkv, n_parts, eps, bias, qk_norm, dtype):
    it = iter(refs)
    idx_ref, cs_ref, base_ref = next(it), next(it), next(it)
    parts_ref = next(it) if n_parts else None
    wn_ref, w_ref = next(it), next(it)
    b_ref = next(it) if bias else None
    qn_ref, kn_ref = (next(it), next(it)) if qk_norm else (None, None)
    next(it), next(it)  # the cache buffers as inputs: aliased to kc_ref / vc_ref
    x_ref, q_ref, kc_ref, vc_ref = next(it), next(it), next(it), next(it)
    j = pl.program_id(0)
    h2 = D // 2

    a1, a2 = _normed_pair(base_ref, parts_ref, n_parts, wn_ref, w_ref, j * D, j * D + h2, h2, H, eps, x_ref, j == 0,
                          dtype)
    y1, y2 = _round(a1, dtype), _round(a2, dtype)
    if bias:
        y1 = _round(y1 + b_ref[pl.ds(j * D, h2)].astype(f32), dtype)
        y2 = _round(y2 + b_ref[pl.ds(j * D + h2, h2)].astype(f32), dtype)
    is_q, is_k = j < Nq, (j >= Nq) & (j < Nq + Nkv)
    if qk_norm:  # per-head RMSNorm of q and k (Qwen3), before RoPE
        invh = jax.lax.rsqrt((jnp.sum(y1 * y1) + jnp.sum(y2 * y2)) / D + eps)
        n1 = jnp.where(is_q, qn_ref[pl.ds(0, h2)].astype(f32), kn_ref[pl.ds(0, h2)].astype(f32))
        n2 = jnp.where(is_q, qn_ref[pl.ds(h2, h2)].astype(f32), kn_ref[pl.ds(h2, h2)].astype(f32))
        y1 = jnp.where(is_q | is_k, _round(y1 * invh * n1, dtype), y1)
        y2 = jnp.where(is_q | is_k, _round(y2 * invh * n2, dtype), y2)
    cos, sin = cs_ref[0, pl.ds(0, h2)], cs_ref[1, pl.ds(0, h2)]
    r1, r2 = y1 * cos - y2 * sin, y2 * cos + y1 * sin  # HF's rotate_half layout
    idx = idx_ref[0]

    @pl.when(is_q)
    def _():
        q_ref[pl.ds(j * D, h2)] = r1.astype(q_ref.dtype)
        q_ref[pl.ds(j * D + h2, h2)] = r2.astype(q_ref.dtype)

    @pl.when(is_k)
    def _():
        kc_ref[0, idx, j - Nq, pl.ds(0, h2)] = r1.astype(kc_ref.dtype)
        kc_ref[0, idx, j - Nq, pl.ds(h2, h2)] = r2.astype(kc_ref.dtype)

    @pl.when(j >= Nq + Nkv)
    def _():
        vc_ref[0, idx, j - Nq - Nkv, pl.ds(0, h2)] = y1.astype(vc_ref.dtype)
        vc_ref[0, idx, j - Nq - Nkv, pl.ds(h2, h2)] = y2.astype(vc_ref.dtype)


def _attn_kernel(idx_ref, valid_ref, q_ref, kc_ref, vc_ref, wo_ref, parts_ref, *, H, D, G, S, c, dtype):
    n = pl.program_id(0)
    kvh = n // G
    idx = idx_ref[0]
    q = q_ref[pl.ds(n * D, D)].astype(f32)
    scale = 1.0 / math.sqrt(D)

    def block(b, carry):  # slots [start, start + c); the last block is clamped to end at S (overlap masked)
        m, l, acc = carry
        start = jnp.minimum(b * c, S - c)
        slot = start + jnp.arange(c)
        k = kc_ref[0, pl.ds(start, c), kvh, :].astype(f32)  # [c, D]
        s = jnp.sum(k * q[None, :], axis=1) * scale
        ok = (valid_ref[pl.ds(start, c)] != 0) & (slot >= b * c) & (slot <= idx)
        s = jnp.where(ok, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s))
        m_ref = jnp.where(m_new > -jnp.inf, m_new, 0.0)  # no valid key yet: keep everything at 0
        p = jnp.exp(s - m_ref)
        rescale = jnp.exp(m - m_ref)
        v = vc_ref[0, pl.ds(start, c), kvh, :].astype(f32)
        pv = jnp.sum(_round(p, dtype)[:, None] * v, axis=0)
        return m_new, l * rescale + jnp.sum(p), acc * rescale + pv

    init = (jnp.float32(-jnp.inf), jnp.float32(0.0), jnp.zeros((D,), f32))
    _, l, acc = jax.lax.fori_loop(0, (idx + c) // c, block, init)  # the blocks holding slots 0 .. idx
    o = _round(acc / jnp.where(l > 0, l, 1.0), dtype)

    def project(c, carry):  # this head's rows of the output projection, CH columns at a time
        w = wo_ref[pl.ds(n * D, D), pl.ds(c * CH, CH)].astype(f32)
        parts_ref[n, pl.ds(c * CH, CH)] = jnp.sum(o[:, None] * w, axis=0)
        return carry

    _chunks(H // CH, project, 0)


def _mlp_kernel(base_ref, parts_ref, wn_ref, wgu_ref, wd_ref, h_ref, out_ref, *, H, I, n_parts, eps, dtype):
    p = pl.program_id(0)
    ci = MLP_COLS

    g, u = _normed_pair(base_ref, parts_ref, n_parts, wn_ref, wgu_ref, p * ci, I + p * ci, ci, H, eps, h_ref, p == 0,
                        dtype)
    g, u = _round(g, dtype), _round(u, dtype)
    act = _round(_round(g / (1.0 + jnp.exp(-g)), dtype) * u, dtype)  # silu(g) * u

    def project(c, carry):
        w = wd_ref[pl.ds(p * ci, ci), pl.ds(c * CH, CH)].astype(f32)
        out_ref[p, pl.ds(c * CH, CH)] = jnp.sum(act[:, None] * w, axis=0)
        return carry

    _chunks(H // CH, project, 0)


def _head_kernel(x_ref, wn_ref, w_ref, out_ref, *, H, eps, tied):
    """x [H]: the last layer's output, already summed (by XLA: 384 programs each adding up the MLP's partials
    would read them 384 times)."""
    v = pl.program_id(0)
    cv = VOCAB_COLS

    def body(c, carry):
        ss, acc = carry
        xc = x_ref[pl.ds(c * CH, CH)].astype(f32)
        xw = xc * wn_ref[pl.ds(c * CH, CH)].astype(f32)
        if tied:  # the embedding [V, H] as stored
            acc = acc + jnp.sum(w_ref[pl.ds(v * cv, cv), pl.ds(c * CH, CH)].astype(f32) * xw[None, :], axis=1)
        else:  # lm_head [H, V]
            acc = acc + jnp.sum(xw[:, None] * w_ref[pl.ds(c * CH, CH), pl.ds(v * cv, cv)].astype(f32), axis=0)
        return ss + jnp.sum(xc * xc), acc

    ss, acc = _chunks(H // CH, body, (jnp.float32(0.0), jnp.zeros((cv,), f32)))
    out_ref[pl.ds(v * cv, cv)] = acc * jax.lax.rsqrt(ss / H + eps)


def decode_step(model, layers, tok, position, cache: dict, cache_index, *, interpret: bool = False):
    """One batch-1 decode step: token tok [1] at `position` [1] written to slot `cache_index` of a per-layer
    cache (`transformer.split_cache`), with `layers` = `model.layer_list(fused=True)` -> (logits [1, V] float32,
    cache). The same contract as `model(tok[:, None], positions=position[:, None], cache=cache,
    cache_index=cache_index, layers=layers)` followed by `model.unembed`. `interpret`: run the kernels in
    Pallas' interpreter (any backend; for tests), else compile them for a CUDA GPU with Triton."""
    cfg = model.cfg
    H, D, I, V = cfg.hidden_size, cfg.dim_head, cfg.intermediate_size, cfg.vocab_size
    Nq, Nkv, L = cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
    S = cache["valid"].shape[1]
    why = unsupported(cfg, tok.shape[0])
    if why:
        raise ValueError(f"fused decode step: {why}")
    if not isinstance(cache["k"], (list, tuple)) or len(layers) != L or "wqkv" not in layers[0]:
        raise ValueError("fused decode step: needs a per-layer cache (split_cache) and layer_list(fused=True)")
    dtype = jnp.dtype(model.embed[...].dtype)
    eps = float(cfg.rms_norm_eps)
    inv_freq, attn_factor = model._rope()
    ang = position[0].astype(f32) * inv_freq
    cs = jnp.stack([jnp.cos(ang) * attn_factor, jnp.sin(ang) * attn_factor])  # [2, D/2]
    idx = jnp.reshape(jnp.asarray(cache_index, jnp.int32), (1,))
    valid = jax.lax.dynamic_update_slice(cache["valid"], jnp.ones((1, 1), bool), (0, cache_index))
    valid_i = valid[0].astype(jnp.int32)
    c = min(SLOTS, 1 << (S.bit_length() - 1))  # attention block: a power of two <= S
    n_mlp = I // MLP_COLS
    shape = lambda *s, dt=f32: jax.ShapeDtypeStruct(s, dt)  # noqa: E731

    x, parts, n_parts = model.embed_tokens(tok)[0], None, 0
    ks, vs = list(cache["k"]), list(cache["v"])
    for i, lp in enumerate(layers):
        bias = cfg.attention_bias
        ins = [idx, cs, x] + ([parts] if n_parts else []) + [lp["attn_norm"], lp["wqkv"]]
        if bias:
            ins.append(lp["bqkv"])
        if cfg.qk_norm:
            ins += [lp["q_norm"], lp["k_norm"]]
        ins += [ks[i], vs[i]]
        kern = functools.partial(_qkv_kernel, H=H, D=D, Nq=Nq, Nkv=Nkv, n_parts=n_parts, eps=eps, bias=bias,
                                 qk_norm=cfg.qk_norm, dtype=dtype)
        outs = (shape(H, dt=dtype), shape(Nq * D, dt=dtype), jax.ShapeDtypeStruct(ks[i].shape, ks[i].dtype),
                jax.ShapeDtypeStruct(vs[i].shape, vs[i].dtype))
        x, q, ks[i], vs[i] = _call(kern, outs, (Nq + 2 * Nkv,), interpret,
                                   aliases={len(ins) - 2: 2, len(ins) - 1: 3}, name="decode_qkv")(*ins)
        kern = functools.partial(_attn_kernel, H=H, D=D, G=Nq // Nkv, S=S, c=c, dtype=dtype)
        attn = _call(kern, shape(Nq, H), (Nq,), interpret, name="decode_attn")(
            idx, valid_i, q, ks[i], vs[i], lp["wo"])
        kern = functools.partial(_mlp_kernel, H=H, I=I, n_parts=Nq, eps=eps, dtype=dtype)
        x, parts = _call(kern, (shape(H, dt=dtype), shape(n_mlp, H)), (n_mlp,), interpret,
                         name="decode_mlp")(x, attn, lp["mlp_norm"], lp["w_gate_up"], lp["w_down"])
        n_parts = n_mlp
        if n_mlp > MAX_PARTS or i == L - 1:  # summed once by one XLA fusion (see MAX_PARTS; the head's input)
            x, parts, n_parts = _summed(x, parts, n_mlp, dtype), None, 0
    tied = cfg.tie_embeddings
    kern = functools.partial(_head_kernel, H=H, eps=eps, tied=tied)
    w = model.embed[...] if tied else model.lm_head[...]
    logits = _call(kern, shape(V), (V // VOCAB_COLS,), interpret, name="decode_head")(x, model.final_norm[...], w)
    return logits[None], dict(cache, k=ks, v=vs, valid=valid)

