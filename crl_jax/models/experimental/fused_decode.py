"""A batch-1 decode step as three Pallas (Triton) kernels per layer (the batch-1 GPU target).

Why. XLA runs a batch-1 decode step of the SmolLM2-135M shape as ~560 kernels (~19 per layer) on an H200: each
vector x matrix product becomes a multiply and a reduce kernel. At
1.5-5 us per kernel the step takes 1.06 ms; reading the weights once takes 56 us. Here a layer is three kernels,
each reading its weights once:

1. `_qkv_kernel` (one program per q / k / v head): the residual stream (the previous layer's output, see
   below; in the first layer the token's embedding row), RMSNorm, this head's columns of the fused q/k/v
   projection (+ bias, + per-head q/k RMSNorm), RoPE (angles from the position); q goes to a small buffer, k and
   v straight into this layer's KV-cache buffer at the current slot (in place: the cache buffers are aliased to
   the outputs; the first layer also marks the slot valid).
2. `_attn_kernel` (one program per query head): attention over the live slots (online softmax over blocks of
   cache slots, as `attention.attend_live`), then that head's rows of the output projection: a partial [H]
   of the attention output, one row per head.
3. `_mlp_kernel` (one program per `MLP_COLS` intermediate columns): the residual plus the sum of the attention
   partials, RMSNorm, this program's gate / up columns, SiLU, and those rows of the down projection: again a
   partial [H] per program.

Partials instead of a reduction kernel: the next kernel adds them up in a fixed order while it reads its input
(so the result is deterministic, unlike atomics), and RMSNorm is folded into each matvec (the sum of squares is
accumulated in the same pass, the product scaled by 1/rms at the end), so no kernel needs a grid-wide barrier.
A model with more than `MAX_PARTS` MLP programs gets its MLP partials summed by `_sum_kernel` instead (one more
kernel per layer, against every program of the next kernel reading all of them).
`_head_kernel` does the final norm and the vocabulary head (one program per `VOCAB_COLS` tokens) on the last
layer's output (summed by `_sum_kernel`), and each tile's softmax statistics, from which `fused_sample` draws
the token in one more kernel. The slot and position come from the loop's counter plus loop-invariant bases, so
a step (`forward`) is 3L + 3 kernels and the loop's counter (94 at SmolLM2's 30 layers, against XLA's ~533;
experiments/bench/gpu_aot.py). The loops over the hidden size run in groups of `UNROLL` unrolled chunks:
each chunk's loads are independent of the others, so a program has a group's loads in flight at once. What each
kernel compiles to (registers, spills) can be seen without a GPU: experiments/bench/triton_ptx.py.

Numerics follow `Transformer._cached_layer` (float32 accumulation, the model dtype's roundings after each
projection, float32 softmax), except that a projection's normalised input is not rounded to the model dtype.
Tested equal (float32, interpret mode) to the XLA step, and lowered for CUDA, on a CPU (test_fused_decode.py);
GPU parity and speed: gpu_checks.py, decode_cache.py (gpu.sh). One device: the kernels take whole arrays (a
model sharded over a mesh keeps `decode_kernel="xla"`). Triton needs power-of-two tensor shapes, so every model
dimension is walked in chunks: hidden size a multiple of `CH`, head dim a power of two, intermediate size a
multiple of `MLP_COLS`, vocabulary a multiple of `VOCAB_COLS` (`unsupported` says which one fails).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


CH = 64  # hidden-size chunk of every matvec
MLP_COLS = 32  # intermediate columns per program of the MLP kernel (48 programs at SmolLM2's 1,536)
VOCAB_COLS = 128  # vocabulary rows per program of the head kernel
SLOTS = 64  # cache slots per attention block
MAX_PARTS = 64  # more MLP partials than this (Qwen2.5-0.5B: 152) are summed before the next layer: each
#                of the next kernel's programs would otherwise read them all (at Qwen's shape 0.9 MB, 8x its weights)
NUM_WARPS = 4
NUM_STAGES = 2  # Triton's software pipelining depth of a rolled loop
DEBUG = False  # print each kernel's jaxpr and Triton module when it is lowered (experiments/bench/triton_ptx.py)
UNROLL = 3  # chunks per step of the loops over the hidden size: k = a `fori_loop` over groups of k unrolled
#             chunks (1: rolled, one chunk ahead in flight with Triton's pipelining), 0 = all unrolled (every load
#             in flight at once; at SmolLM2 shape the MLP kernel then spills 168 bytes at 255 registers, against
#             72 registers and no spill with 3: experiments/bench/triton_ptx.py)
f32 = jnp.float32


def triton_compiler_params():
    """Pallas' Triton `CompilerParams`, imported when a kernel is built for a GPU, not with this module: jax 0.11
    deprecates that backend for removal, and a jax without it must still import the sampler. Else a ValueError."""
    try:
        from jax.experimental.pallas.triton import CompilerParams
    except ImportError as e:
        raise ValueError(f"decode_kernel='pallas' builds its kernels with Pallas' Triton backend, which jax "
                         f"{jax.__version__} does not have ({e}); use decode_kernel='xla'") from None
    return CompilerParams


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


def _call(kernel, out_shape, grid, interpret: bool, aliases=None, name=None):
    kw = dict(out_shape=out_shape, grid=grid, input_output_aliases=aliases or {}, name=name, debug=DEBUG)
    if interpret:
        kw["interpret"] = True
    else:
        kw["compiler_params"] = triton_compiler_params()(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
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


def _residual_chunk(base_ref, parts_ref, n_parts: int, c, dtype, token=None):
    """Chunk c (CH values, float32) of the residual stream: base + the sum of the n_parts rows of the previous
    kernel's partials, added in a fixed order and rounded as `h + (...).astype(h.dtype)` is. `token`: base_ref is
    the embedding table and the residual is that token's row (the first layer: no lookup kernel before it)."""
    x = (base_ref[pl.ds(c * CH, CH)] if token is None else base_ref[token, pl.ds(c * CH, CH)]).astype(f32)
    if parts_ref is None:
        return x
    total, row = jnp.zeros((CH,), f32), 0
    for bit in reversed(range(n_parts.bit_length())):  # rows in power-of-two blocks (48 = 32 + 16): Triton's
        if n_parts >> bit & 1:  # loads are powers of two, and no row is read that was not written
            total = total + jnp.sum(parts_ref[pl.ds(row, 1 << bit), pl.ds(c * CH, CH)], axis=0)
            row += 1 << bit
    return _round(x + _round(total, dtype), dtype)


def _normed_pair(base_ref, parts_ref, n_parts: int, wn_ref, w_ref, col_a, col_b, width: int, H: int, eps: float,
                 x_out_ref, writer, dtype, token=None):
    """RMSNorm(x) @ w[:, col_a : col_a + width] and @ w[:, col_b : col_b + width] (float32), for the residual x
    = base + partials (`_residual_chunk`), which the program where `writer` holds also writes to x_out_ref. The
    norm is folded in: the sum of squares is accumulated in the same pass, the products scaled at the end."""
    def body(c, carry):
        ss, a, b = carry
        xc = _residual_chunk(base_ref, parts_ref, n_parts, c, dtype, token)

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


def _sum_kernel(base_ref, parts_ref, x_ref, *, n_parts, dtype):
    """The residual base + the n_parts rows of partials (`_residual_chunk`), CH columns per program: one kernel
    where XLA made two (the sum, then the add and roundings)."""
    c = pl.program_id(0)
    x_ref[pl.ds(c * CH, CH)] = _residual_chunk(base_ref, parts_ref, n_parts, c, dtype).astype(x_ref.dtype)


def _qkv_kernel(*refs, H, D, Nq, Nkv, n_parts, eps, bias, qk_norm, first, attn_factor, dtype):
    """`first`: the first layer, whose residual is the embedding row of the token (tok_ref) and whose program 0
    also marks the step's cache slot valid (valid_ref, int32 [S], in place) for every layer's attention."""
    it = iter(refs)
    step_ref, start_ref, inv_ref = next(it), next(it), next(it)
    tok_ref = next(it) if first else None
    base_ref = next(it)
    parts_ref = next(it) if n_parts else None
    wn_ref, w_ref = next(it), next(it)
    b_ref = next(it) if bias else None
    qn_ref, kn_ref = (next(it), next(it)) if qk_norm else (None, None)
    for _ in range(3 if first else 2):  # the cache buffers (and valid) as inputs: aliased to the outputs below
        next(it)
    x_ref, q_ref, kc_ref, vc_ref = next(it), next(it), next(it), next(it)
    j = pl.program_id(0)
    h2 = D // 2
    idx, pos = start_ref[0] + step_ref[0], start_ref[1] + step_ref[0]  # this step's cache slot and position

    a1, a2 = _normed_pair(base_ref, parts_ref, n_parts, wn_ref, w_ref, j * D, j * D + h2, h2, H, eps, x_ref, j == 0,
                          dtype, tok_ref[0] if first else None)
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
    ang = pos.astype(f32) * inv_ref[pl.ds(0, h2)]  # RoPE angles, as `Transformer._cached_layer` computes them
    cos, sin = jnp.cos(ang) * attn_factor, jnp.sin(ang) * attn_factor
    r1, r2 = y1 * cos - y2 * sin, y2 * cos + y1 * sin  # HF's rotate_half layout
    if first:
        valid_ref = next(it)

        @pl.when(j == 0)
        def _():
            valid_ref[idx] = jnp.int32(1)

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


def _attn_kernel(step_ref, start_ref, valid_ref, q_ref, kc_ref, vc_ref, wo_ref, parts_ref, *, H, D, G, S, c, dtype):
    n = pl.program_id(0)
    kvh = n // G
    idx = start_ref[0] + step_ref[0]
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


def _head_kernel(x_ref, wn_ref, w_ref, out_ref, m_ref, s_ref, *, H, eps, tied, n_tiles, temperature):
    """x [H]: the last layer's output, already summed (`_sum_kernel`: 384 programs each adding up the MLP's
    partials would read them 384 times). Program v: the logits of tokens v * VOCAB_COLS ..., and the statistics
    of its tile that `fused_sample` draws from: m = max(logits / T), s = sum(exp(logits / T - m)) (T =
    `temperature`, 1 when greedy). Programs past the vocabulary's tiles (the statistics are padded to whole
    chunks) write an empty tile (m = -inf, s = 0)."""
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

    @pl.when(v < n_tiles)
    def _():
        ss, acc = _chunks(H // CH, body, (jnp.float32(0.0), jnp.zeros((cv,), f32)))
        logits = acc * jax.lax.rsqrt(ss / H + eps)
        out_ref[pl.ds(v * cv, cv)] = logits
        xs = logits if temperature in (0.0, 1.0) else logits / temperature  # as `token_draw.filter_logits`
        m = jnp.max(xs)
        m_ref[v] = m
        s_ref[v] = jnp.sum(jnp.exp(xs - m))

    if m_ref.shape[0] > n_tiles:
        @pl.when(v >= n_tiles)
        def _():  # an empty tile
            m_ref[pl.ds(v, 1)] = jnp.full((1,), -jnp.inf, f32)
            s_ref[pl.ds(v, 1)] = jnp.zeros((1,), f32)


def stat_tiles(vocab_size: int) -> tuple[int, int, int]:
    """(tiles, padded length, chunk) of the head's tile statistics: one tile per VOCAB_COLS tokens, padded to a
    multiple of the chunk `fused_sample`'s kernel reads them in (128, or the least power of two >= the tiles)."""
    n = vocab_size // VOCAB_COLS
    ch = min(128, 1 << max(n - 1, 0).bit_length())
    return n, -(-n // ch) * ch, ch


def decode_step(model, layers, tok, position, cache: dict, cache_index, *, interpret: bool = False):
    """One batch-1 decode step: token tok [1] at `position` [1] written to slot `cache_index` of a per-layer
    cache (`transformer.split_cache`), with `layers` = `model.layer_list(fused=True)` -> (logits [1, V] float32,
    cache). The same contract as `model(tok[:, None], positions=position[:, None], cache=cache,
    cache_index=cache_index, layers=layers)` followed by `model.unembed`. `interpret`: run the kernels in
    Pallas' interpreter (any backend; for tests), else compile them for a CUDA GPU with Triton. A decode loop
    calls `forward`, which keeps the step's bookkeeping in the kernels."""
    if not isinstance(cache["k"], (list, tuple)) or len(layers) != model.cfg.num_layers or "wqkv" not in layers[0]:
        raise ValueError("fused decode step: needs a per-layer cache (split_cache) and layer_list(fused=True)")
    start = jnp.stack([jnp.asarray(cache_index, jnp.int32), position[0].astype(jnp.int32)])
    logits, _, _, ks, vs, valid = forward(model, layers, tok.astype(jnp.int32), jnp.zeros((1,), jnp.int32), start,
                                          cache["k"], cache["v"], cache["valid"][0].astype(jnp.int32),
                                          interpret=interpret)
    return logits[None], dict(cache, k=ks, v=vs, valid=valid[None] != 0)


def forward(model, layers, tok, step, start, ks, vs, valid, *, temperature: float = 1.0, interpret: bool = False):
    """The kernels of one batch-1 step, with no XLA operation between them: token tok [1] (int32) at cache slot
    start[0] + step[0] and position start[1] + step[0] (step [1], start [2] int32: a loop passes its counter and
    loop-invariant bases, so no kernel computes the slot). ks / vs: the per-layer cache buffers; valid: int32
    [S], the step's slot set to 1 in place. -> (logits [V] float32, the head's tile statistics m, s
    [`stat_tiles`(V)[1]] at `temperature`, ks, vs, valid)."""
    cfg = model.cfg
    H, D, I, V = cfg.hidden_size, cfg.dim_head, cfg.intermediate_size, cfg.vocab_size
    Nq, Nkv, L = cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
    S = valid.shape[0]
    why = unsupported(cfg, tok.shape[0])
    if why:
        raise ValueError(f"fused decode step: {why}")
    dtype = jnp.dtype(model.embed[...].dtype)
    eps = float(cfg.rms_norm_eps)
    inv_freq, attn_factor = model._rope()
    c = min(SLOTS, 1 << (S.bit_length() - 1))  # attention block: a power of two <= S
    n_mlp = I // MLP_COLS
    shape = lambda *s, dt=f32: jax.ShapeDtypeStruct(s, dt)  # noqa: E731

    x, parts, n_parts = model.embed[...], None, 0  # the first layer reads the token's row itself
    ks, vs = list(ks), list(vs)
    for i, lp in enumerate(layers):
        bias, first = cfg.attention_bias, i == 0
        ins = [step, start, inv_freq] + ([tok] if first else []) + [x] + ([parts] if n_parts else [])
        ins += [lp["attn_norm"], lp["wqkv"]] + ([lp["bqkv"]] if bias else [])
        if cfg.qk_norm:
            ins += [lp["q_norm"], lp["k_norm"]]
        ins += [ks[i], vs[i]] + ([valid] if first else [])
        kern = functools.partial(_qkv_kernel, H=H, D=D, Nq=Nq, Nkv=Nkv, n_parts=n_parts, eps=eps, bias=bias,
                                 qk_norm=cfg.qk_norm, first=first, attn_factor=float(attn_factor), dtype=dtype)
        outs = (shape(H, dt=dtype), shape(Nq * D, dt=dtype), jax.ShapeDtypeStruct(ks[i].shape, ks[i].dtype),
                jax.ShapeDtypeStruct(vs[i].shape, vs[i].dtype)) + ((shape(S, dt=jnp.int32),) if first else ())
        n_in = len(ins)
        aliases = {n_in - 3: 2, n_in - 2: 3, n_in - 1: 4} if first else {n_in - 2: 2, n_in - 1: 3}
        res = _call(kern, outs, (Nq + 2 * Nkv,), interpret, aliases=aliases, name="decode_qkv")(*ins)
        x, q, ks[i], vs[i] = res[:4]
        if first:
            valid = res[4]
        kern = functools.partial(_attn_kernel, H=H, D=D, G=Nq // Nkv, S=S, c=c, dtype=dtype)
        attn = _call(kern, shape(Nq, H), (Nq,), interpret, name="decode_attn")(
            step, start, valid, q, ks[i], vs[i], lp["wo"])
        kern = functools.partial(_mlp_kernel, H=H, I=I, n_parts=Nq, eps=eps, dtype=dtype)
        x, parts = _call(kern, (shape(H, dt=dtype), shape(n_mlp, H)), (n_mlp,), interpret,
                         name="decode_mlp")(x, attn, lp["mlp_norm"], lp["w_gate_up"], lp["w_down"])
        n_parts = n_mlp
        if n_mlp > MAX_PARTS or i == L - 1:  # summed once by one kernel (see MAX_PARTS; the head's input)
            kern = functools.partial(_sum_kernel, n_parts=n_mlp, dtype=dtype)
            x = _call(kern, shape(H, dt=dtype), (H // CH,), interpret, name="decode_sum")(x, parts)
            parts, n_parts = None, 0
    tied = cfg.tie_embeddings
    n_tiles, padded, _ = stat_tiles(V)
    kern = functools.partial(_head_kernel, H=H, eps=eps, tied=tied, n_tiles=n_tiles, temperature=float(temperature))
    w = model.embed[...] if tied else model.lm_head[...]
    logits, m, s = _call(kern, (shape(V), shape(padded), shape(padded)), (padded,), interpret, name="decode_head")(
        x, model.final_norm[...], w)
    return logits, m, s, ks, vs, valid
