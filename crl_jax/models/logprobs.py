"""Per-token log-probs of given targets from final hidden states, without a [N, V] logits buffer.

The learner needs log p(target_t | h_t) = logit[target_t] - logsumexp(logits) for every trained token;
with a big vocabulary (Qwen2.5: 152k) the float32 logits [B, T, V] — and the softmax the backward pass
builds from them — are the largest buffers of a training step. `chunked_logprobs` computes the same
numbers in tiles of `token_chunk` rows x `vocab_chunk` columns with a running (max, sum-exp) pair, and a
custom VJP recomputes each tile's logits in the backward pass, so neither pass holds more than one
[token_chunk, vocab_chunk] float32 tile of logits (plus the [H, V] float32 gradient accumulator of the
unembedding, which the ordinary backward needs as well).

Math per token row n (z = h_n @ w / temperature, float32 accumulation as in `Transformer.unembed`):
    lse_n = logsumexp_v z_v,   logp_n = z_{target_n} - lse_n,
    entropy_n = lse_n - sum_v softmax(z)_v z_v          (reported without gradient),
    d logp_n / d z = onehot(target_n) - softmax(z)      (the backward, tile by tile).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

_F32 = jnp.float32
_NEG = -jnp.inf


def _tile_starts(size: int, chunk: int) -> tuple[int, int]:
    """(effective chunk, number of chunks). The last chunk starts at size - chunk (it overlaps the one
    before; the overlapped columns are masked), so no array is padded or copied."""
    c = min(chunk, size)
    return c, -(-size // c)


def _vocab_tile(w, j, c: int, V: int):
    """Columns [start, start + c) of w [H, V] for vocab chunk j, and a [c] mask of the columns this
    chunk owns (the clamped last chunk re-reads columns the previous one already counted)."""
    start = jnp.minimum(j * c, V - c)
    cols = start + jnp.arange(c)
    return jax.lax.dynamic_slice_in_dim(w, start, c, axis=1), cols, cols >= j * c, start


def _logits(h, w_tile, temperature: float):
    z = jnp.einsum("nh,hv->nv", h, w_tile, preferred_element_type=_F32)
    return z if temperature == 1.0 else z / temperature


def _rows_forward(h, w, tgt, temperature: float, c: int, nv: int):
    """One token chunk: h [n, H], tgt [n] -> (lse [n], picked logit [n], sum p*z [n]) over all of V."""
    V = w.shape[1]
    n = h.shape[0]

    def body(carry, j):
        m, s, t, picked = carry
        w_t, cols, own, _ = _vocab_tile(w, j, c, V)
        z = jnp.where(own[None, :], _logits(h, w_t, temperature), _NEG)  # [n, c]
        m_new = jnp.maximum(m, z.max(-1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(z - m_new[:, None])
        s = s * scale + e.sum(-1)
        t = t * scale + (e * jnp.where(own[None, :], z, 0.0)).sum(-1)
        picked = picked + jnp.where((cols[None, :] == tgt[:, None]) & own[None, :], z, 0.0).sum(-1)
        return (m_new, s, t, picked), None

    init = (jnp.full((n,), _NEG, _F32), jnp.zeros((n,), _F32), jnp.zeros((n,), _F32), jnp.zeros((n,), _F32))
    (m, s, t, picked), _ = jax.lax.scan(body, init, jnp.arange(nv))
    lse = m + jnp.log(s)
    return lse, picked, t / s


def _split_rows(x, r: int, nt: int):
    """[N, ...] -> [nt, r, ...], zero-padded at the end (padding rows are dropped by the caller)."""
    pad = nt * r - x.shape[0]
    if pad:
        x = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)], axis=0)
    return x.reshape((nt, r) + x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunked(h, w, tgt, temperature, token_chunk, vocab_chunk):
    return _chunked_fwd(h, w, tgt, temperature, token_chunk, vocab_chunk)[0]


def _chunked_fwd(h, w, tgt, temperature, token_chunk, vocab_chunk):
    N, V = h.shape[0], w.shape[1]
    r, nt = _tile_starts(N, token_chunk)
    c, nv = _tile_starts(V, vocab_chunk)
    lse, picked, mean_z = jax.lax.map(lambda a: _rows_forward(a[0], w, a[1], temperature, c, nv),
                                      (_split_rows(h, r, nt), _split_rows(tgt, r, nt)))
    lse, picked, mean_z = (x.reshape(-1)[:N] for x in (lse, picked, mean_z))
    out = (picked - lse, lse - mean_z)
    return out, (h, w, tgt, lse)


def _chunked_bwd(temperature, token_chunk, vocab_chunk, res, cts):
    h, w, tgt, lse = res
    g = cts[0].astype(_F32)  # the entropy output carries no gradient (documented; stop_gradient outside)
    N, V = h.shape[0], w.shape[1]
    r, nt = _tile_starts(N, token_chunk)
    c, nv = _tile_starts(V, vocab_chunk)
    mm = jnp.promote_types(h.dtype, w.dtype)  # matmul input dtype of the backward

    def rows(dw, a):
        h_r, tgt_r, lse_r, g_r = a

        def cols(carry, j):
            dh, dw = carry
            w_t, cidx, own, start = _vocab_tile(w, j, c, V)
            z = _logits(h_r, w_t, temperature)
            p = jnp.exp(z - lse_r[:, None])
            dz = g_r[:, None] * ((cidx[None, :] == tgt_r[:, None]).astype(_F32) - p)
            dz = jnp.where(own[None, :], dz, 0.0)
            if temperature != 1.0:
                dz = dz / temperature
            # Low-precision inputs: the tile's cotangent goes into the matmuls in that precision (the usual
            # mixed-precision backward; float32 matmuls would run at a fraction of a GPU's bf16 rate), with
            # float32 accumulation. Float32 inputs stay float32 throughout.
            dz = dz.astype(mm)
            dh = dh + jnp.einsum("nv,hv->nh", dz, w_t.astype(mm), preferred_element_type=_F32)
            dw_t = jnp.einsum("nh,nv->hv", h_r.astype(mm), dz, preferred_element_type=_F32)
            dw = jax.lax.dynamic_update_slice_in_dim(
                dw, jax.lax.dynamic_slice_in_dim(dw, start, c, axis=1) + dw_t, start, axis=1)
            return (dh, dw), None

        (dh, dw), _ = jax.lax.scan(cols, (jnp.zeros(h_r.shape, _F32), dw), jnp.arange(nv))
        return dw, dh

    parts = tuple(_split_rows(x, r, nt) for x in (h, tgt, lse, g))
    dw, dh = jax.lax.scan(rows, jnp.zeros(w.shape, _F32), parts)
    dh = dh.reshape((nt * r,) + h.shape[1:])[:N]
    return dh.astype(h.dtype), dw.astype(w.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_logprobs(h, w, targets, *, temperature: float = 1.0, with_entropy: bool = False,
                     token_chunk: int = 2048, vocab_chunk: int = 8192):
    """Log-probs of `targets` under softmax(h @ w / temperature), tiled so no [..., V] buffer exists.

    h [..., H] hidden states (any float dtype), w [H, V] unembedding, targets [...] int in [0, V).
    Returns logp [...] float32 and entropy [...] float32 (no gradient) or None. Gradients flow to h and w;
    equal to `log_softmax(einsum(h, w) / temperature)[targets]` up to float32 summation order.
    """
    chex.assert_rank(w, 2)
    chex.assert_equal_shape_prefix([h, targets], targets.ndim)
    if h.ndim != targets.ndim + 1:
        raise ValueError(f"h must have one more axis than targets, got {h.shape} and {targets.shape}")
    lead = targets.shape
    hf = h.reshape((-1, h.shape[-1]))
    tf = targets.reshape(-1).astype(jnp.int32)
    if hf.shape[0] == 0:
        z = jnp.zeros(lead, _F32)
        return z, (z if with_entropy else None)
    logp, ent = _chunked(hf, w, tf, float(temperature), int(token_chunk), int(vocab_chunk))
    ent = jax.lax.stop_gradient(ent).reshape(lead) if with_entropy else None
    return logp.reshape(lead), ent


def full_logprobs(h, w, targets, *, temperature: float = 1.0, with_entropy: bool = False):
    """Reference: the same quantities from the full [..., V] float32 logits (what the learner did before)."""
    z = jnp.einsum("...h,hv->...v", h, w, preferred_element_type=_F32)
    if temperature != 1.0:
        z = z / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0] - lse
    ent = None
    if with_entropy:
        lp = z - lse[..., None]
        ent = jax.lax.stop_gradient(-(jnp.exp(lp) * lp).sum(-1))
    return logp, ent
