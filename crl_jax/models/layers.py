"""The transformer's stateless pieces: rotary position embeddings (HF's rope variants: default, linear, llama3,
yarn), RMSNorm, the SwiGLU product and `dense`, the projections' matmul. Used by `crl_jax.models.transformer`
(which re-exports them).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def rope_inv_freq(cfg) -> tuple[np.ndarray, float]:
    """Inverse frequencies [D/2] and the attention scaling factor of a `TransformerConfig`, following HF's rope
    variants."""
    d = cfg.dim_head
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    sc = cfg.rope_scaling_dict
    attn_factor = 1.0
    if not sc:
        return inv.astype(np.float32), attn_factor
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        factor = float(sc["factor"])
        lo, hi = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        scaled = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wl >= high_wl) & (wl <= low_wl)
        inv = np.where(is_medium, smoothed, scaled)
    elif kind == "yarn":
        factor = float(sc["factor"])
        old = float(sc.get("original_max_position_embeddings", cfg.max_position_embeddings))
        beta_fast, beta_slow = float(sc.get("beta_fast", 32)), float(sc.get("beta_slow", 1))

        def corr_dim(rot):
            return (d * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(cfg.rope_theta))

        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap = 1 - ramp
        inv = (inv / factor) * (1 - extrap) + inv * extrap
        mscale = sc.get("attention_factor")
        attn_factor = float(mscale) if mscale is not None else (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    else:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3, yarn)")
    return inv.astype(np.float32), attn_factor


def apply_rope(x, positions, inv_freq, attn_factor=1.0):
    """x [B, T, N, D], positions [B, T] -> rotated x (HF "rotate_half" layout)."""
    ang = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos = jnp.cos(ang) * attn_factor
    sin = jnp.sin(ang) * attn_factor
    cos = jnp.concatenate([cos, cos], -1)[:, :, None, :]
    sin = jnp.concatenate([sin, sin], -1)[:, :, None, :]
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos + rot * sin).astype(x.dtype)


def dense(x, w, w_axes: str = "kf", preferred_element_type=None):
    """x [..., K] times w [K, *F] (w_axes "kf"; "fk": w stored [F, K]) over x's last axis -> [..., *F], as ONE
    matmul over x's flattened leading axes. Why not `einsum("btk,kf->btf")`: for the weight's gradient, which
    contracts B and T, XLA:CPU then transposes the [B, T, F] cotangent in a loop fusion that also computes every
    elementwise op it absorbs (the SiLU's backward), at ~13 ns per element: the 3-D transpose is not vectorised.
    From the 2-D product it takes the transposed operand as it is. The tiny actor's MLP gradient over 320 x 19
    rows: 20.7 -> 5.7 ms, the same bits. w's own axes stay apart (the
    packed gate / up [K, 2, I]): merged into [K, 2I] they cost a tensor-sharded I its sharding on a mesh, so only
    the caller merges them, where no tensor axis exists (`TransformerConfig.merge_gate_up`)."""
    f = "abcdefgh"[: w.ndim - 1]
    ws = f"k{f}" if w_axes == "kf" else f"{f}k"
    y = jnp.einsum(f"nk,{ws}->n{f}", x.reshape(-1, x.shape[-1]), w, preferred_element_type=preferred_element_type)
    return y.reshape(x.shape[:-1] + y.shape[1:])


def rms_norm(x, w, eps):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


@jax.custom_vjp
def swiglu(gu):
    """silu(g) * u of the MLP's packed gate / up product gu [..., 2, I] (g = gu[..., 0, :], u = gu[..., 1, :]: the
    memory layout of [g | u] concatenated), with a hand-written backward pass that returns the packed cotangent.

    Forward as `jax.nn.silu(g) * u`. Backward, with s = sigmoid(g), in float32 and cast to gu's dtype:
        dgu = [dy * u s (1 + g (1 - s)), dy * g s]
    one elementwise pass that reads dy and gu and writes dgu, which one matmul each then turns into dx and the
    packed weights' gradient. Autodiff of silu(g) * u on separate g and u makes XLA write its derivative chain in
    two passes (7 [tokens, I] tensors read or written per layer where this needs 5; `gpu_aot.py`'s count at the
    Qwen2.5-0.5B training shape).
    """
    return jax.nn.silu(gu[..., 0, :]) * gu[..., 1, :]


def _swiglu_fwd(gu):
    return swiglu(gu), gu


def _swiglu_bwd(gu, dy):
    # one elementwise expression over [..., 2, I], each half computed from g and u repeated twice and selected by
    # position: XLA computes a stack or a broadcast select of two results in two passes (and then copies them)
    twice = lambda x: jnp.concatenate([x, x], axis=-2)  # noqa: E731
    x = gu.astype(jnp.float32)
    g, u, dyf = twice(x[..., :1, :]), twice(x[..., 1:, :]), twice(dy.astype(jnp.float32)[..., None, :])
    s = jax.nn.sigmoid(g)
    first = jax.lax.broadcasted_iota(jnp.int32, gu.shape, gu.ndim - 2) == 0
    return (jnp.where(first, dyf * u * s * (1.0 + g * (1.0 - s)), dyf * g * s).astype(gu.dtype),)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)
