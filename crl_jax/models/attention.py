"""Decode-time attention over the live part of a KV cache.

A sampler's cache has capacity S = P + N slots, but at decode step i only P + i + 1 of them hold keys.
`attend_live` reads the cache block by block and stops after the last written block, so the cost of a
step grows with the tokens written, not with the capacity. (`jax.nn.dot_product_attention` with
`implementation="xla"` still computes and masks the whole [T, S] score matrix, i.e. costs the capacity.) On a
GPU the sampler reads the cache as one block instead (`sampling.decode_plan`): there the block loop's
data-dependent trip count costs a host round trip per iteration (H200: 2.2x slower than one block).

`dense_attention` is the uncached (training / scoring) attention over a [B, T, S] mask, in one of four
implementations (`TransformerConfig.attn_impl`): "einsum" (explicit float32 scores and softmax, every backend),
"xla" and "cudnn" (`jax.nn.dot_product_attention`; "cudnn" is its fused flash-attention kernel, CUDA GPUs and
bf16 / fp16 only, which never writes the [B, H, T, S] score matrix to memory), "blocked" (the plain causal
forward in query / key blocks with its own backward pass, `blocked_attention.py`: no [T, T] buffers kept, no tiles
above the diagonal; other forms run einsum); "auto" (the default) picks cudnn on a GPU and blocked on a CPU from
`BLOCKED_MIN_LEN` tokens where they apply (`attention_impl`; the plain causal forward only) and einsum elsewhere.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from crl_jax.models.blocked_attention import causal_blocked_attention

ATTN_IMPLS = ("auto", "einsum", "xla", "cudnn", "blocked")
# "auto" runs "blocked" on a CPU from this many tokens. SmolLM2-135M shape, 2-core CPU, B 2, float32, a whole
# update: T 1,280 0.43x einsum's time, T 384 0.89x, T 256 (one block) 0.94x; the tiny models' T < 100 equal within
# noise, so they keep einsum.
BLOCKED_MIN_LEN = 256


def attention_impl(impl: str, dtype, head_dim: int, backend: str | None = None,
                   compute_capability: str | None = None, seq_len: int | None = None) -> str:
    """The implementation `dense_attention` runs for `impl`. "auto": "cudnn" on a CUDA GPU of compute capability
    >= 8.0 for bf16 / fp16 inputs with a head dim <= 128 that is a multiple of 8 (H200, Qwen2.5-0.5B shape, bf16,
    B 8 x T 2048: a training step 3.7x faster than "einsum", logits within 7e-3 relative);
    "blocked" on a CPU for a sequence of at least `BLOCKED_MIN_LEN` (`seq_len`;
    None: not known, einsum); else "einsum" (TPU runs are unchanged by "auto")."""
    if impl != "auto":
        return impl
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return "blocked" if seq_len is not None and seq_len >= BLOCKED_MIN_LEN else "einsum"
    if backend != "gpu" or jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return "einsum"
    if head_dim > 128 or head_dim % 8:
        return "einsum"
    if compute_capability is None:
        compute_capability = str(getattr(jax.devices()[0], "compute_capability", ""))
    try:
        major = int(compute_capability.split(".")[0])
    except ValueError:  # not a CUDA device (e.g. ROCm reports its gfx name)
        return "einsum"
    return "cudnn" if major >= 8 else "einsum"


def dense_attention(q, k, v, mask, num_kv_heads: int, impl: str = "auto", causal: bool = False):
    """q [B, T, Nq, D], k / v [B, S, Hkv, D], mask [B, T, S] (True = attend) or None -> [B, T, Nq*D].

    `causal`: the caller promises that `mask` already forbids every key after its query (T == S, query t at
    slot t), so "xla" / "cudnn" may also pass `is_causal` (cuDNN then skips the tiles above the diagonal: about
    half the attention work); the result is the same either way. `mask=None` (with `causal` only): the plain
    causal mask and no padding. "xla" / "cudnn" then get no mask at all, only `is_causal`: cuDNN's causal
    kernel without the [B, 1, T, S] bias a dense mask becomes, and no pass that zeroes key-less query rows
    (there are none).

    Scaled by 1/sqrt(D). A query row with no valid key (a padded query) gets 0 in every implementation (a
    plain softmax would spread it uniformly over the masked keys). "einsum" computes the scores and the softmax
    in float32; "xla" / "cudnn" call `jax.nn.dot_product_attention` with that implementation (grouped-query
    heads native, the mask folded into an additive bias; their score precision is the backend's).
    """
    chex.assert_rank([q, k, v], [4, 4, 4])
    B, T, Nq, D = q.shape
    if mask is None and not causal:
        raise ValueError("dense_attention: mask=None means the plain causal mask, so it needs causal=True")
    if mask is not None:
        chex.assert_rank(mask, 3)
    # "auto" takes cuDNN / blocked for the plain causal forward only (training and scoring: the path gpu_checks.py
    # verified on an H200); the query-subset and prefixed forms of `Transformer.hidden_at` stay on einsum.
    impl = attention_impl(impl, q.dtype, D, seq_len=T) if (causal or impl != "auto") else "einsum"
    if impl == "blocked" and mask is None:
        return causal_blocked_attention(q, k, v, num_kv_heads)
    if impl in ("einsum", "blocked"):  # blocked takes no mask: a padded or prefixed forward runs einsum
        if mask is None:
            mask = jnp.broadcast_to(jnp.arange(k.shape[1])[None, :] <= jnp.arange(T)[:, None], (B, T, k.shape[1]))
        G = Nq // num_kv_heads
        qg = q.reshape(B, T, num_kv_heads, G, D)
        s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) / math.sqrt(D)
        s = jnp.where(mask[:, None, None, :, :], s, jnp.finfo(jnp.float32).min)
        p = jax.nn.softmax(s, axis=-1)
        p = jnp.where(mask.any(-1)[:, None, None, :, None], p, 0.0)
        o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v)
        return o.reshape(B, T, Nq * D)
    if impl not in ATTN_IMPLS:
        raise ValueError(f"attention implementation {impl!r}: choose one of {ATTN_IMPLS}")
    if impl == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(f"attn_impl='cudnn' needs a CUDA GPU (the default backend is {jax.default_backend()!r}); "
                         "use 'einsum' or 'xla'")
    if causal and T != k.shape[1]:
        raise ValueError(f"causal attention needs as many queries as keys, got {T} and {k.shape[1]}")
    o = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype),
                                     mask=None if mask is None else mask[:, None],
                                     scale=1.0 / math.sqrt(D), is_causal=causal, implementation=impl)
    if mask is not None:  # a padded query row has no valid key
        o = jnp.where(mask.any(-1)[:, :, None, None], o, 0)
    o = o.astype(v.dtype)
    return o.reshape(B, T, Nq * D)


def attend_live(q, kc, vc, layer, valid, cache_index, num_kv_heads: int, block: int = 128):
    """Attention of queries q [B, T, Nq, D] at slots cache_index .. cache_index+T-1 over layer `layer` of the
    cache kc / vc [L, B, S, Hkv, D] (layer None: kc / vc are that layer's own [B, S, Hkv, D]), key slots
    `valid` [B, S] and causal (slot <= the query's) -> [B, T, Nq*D].

    Only the ceil((cache_index + T) / block) blocks that hold written slots are read (a `fori_loop` with a
    traced trip count; with block >= S one static block and no loop); the softmax is accumulated across
    blocks (running max, sum and weighted values in float32). Equal to `Transformer._attend` over the whole
    cache up to float32 summation order; a query with no valid key gets 0, as there. The last block is
    clamped to end at slot S (the slots it shares with the block before are masked), so S need not be a
    multiple of `block`.
    """
    chex.assert_rank([q, valid], [4, 2])
    chex.assert_equal_shape([kc, vc])
    if kc.ndim != (4 if layer is None else 5):
        raise ValueError(f"attend_live: a cache of rank {kc.ndim} with layer={layer!r} (expected [L, B, S, Hkv, D] "
                         "with a layer index, or one layer's [B, S, Hkv, D] with layer None)")
    B, T, Nq, D = q.shape
    S = kc.shape[-3]
    G = Nq // num_kv_heads
    c = min(int(block), S)
    qg = q.reshape(B, T, num_kv_heads, G, D)
    q_slot = cache_index + jnp.arange(T)
    n_blocks = (cache_index + T + c - 1) // c
    scale = 1.0 / math.sqrt(D)

    def body(j, carry):
        m, l, acc = carry
        start = jnp.minimum(j * c, S - c)
        if layer is None:
            kb = jax.lax.dynamic_slice_in_dim(kc, start, c, axis=1)
            vb = jax.lax.dynamic_slice_in_dim(vc, start, c, axis=1)
        else:
            kb = jax.lax.dynamic_slice(kc, (layer, 0, start, 0, 0), (1, B, c, num_kv_heads, D))[0]
            vb = jax.lax.dynamic_slice(vc, (layer, 0, start, 0, 0), (1, B, c, num_kv_heads, D))[0]
        slot = start + jnp.arange(c)
        own = (slot >= j * c)[None, None, :]
        mask = jax.lax.dynamic_slice_in_dim(valid, start, c, axis=1)[:, None, :] & own & (
            slot[None, None, :] <= q_slot[None, :, None])  # [B, T, c]
        s = jnp.einsum("btkgd,bskd->bkgts", qg, kb, preferred_element_type=jnp.float32) * scale
        s = jnp.where(mask[:, None, None], s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_ref = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # no valid key yet: keep everything at 0
        p = jnp.exp(s - m_ref[..., None])
        rescale = jnp.exp(m - m_ref)
        pv = jnp.einsum("bkgts,bskd->bkgtd", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
        return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + pv

    stat = (B, num_kv_heads, G, T)
    init = (jnp.full(stat, -jnp.inf, jnp.float32), jnp.zeros(stat, jnp.float32),
            jnp.zeros(stat + (D,), jnp.float32))
    if -(-S // c) == 1:  # one block covers the cache: no loop (a GPU runs a data-dependent loop with a
        _, l, acc = body(0, init)  # host round trip per iteration; block >= capacity avoids it)
    else:
        _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
    o = (acc / jnp.where(l > 0, l, 1.0)[..., None]).astype(vc.dtype)  # [B, Kv, G, T, D]
    return jnp.moveaxis(o, 3, 1).reshape(B, T, Nq * D)
