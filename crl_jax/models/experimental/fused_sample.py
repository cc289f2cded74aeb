"""The sampler's fused batch-1 path: when it applies (`wanted`), the draw of a token as one Pallas
kernel, and the decode loop made of nothing but kernels.

Why. With the layers in Pallas kernels (`fused_decode`), XLA's sampling was most of what remained of a batch-1
step on an H200: 13 of its 22 XLA kernels (log-softmax's max, sum and log, the exponentials, the cumulative sum's
passes, the compare and count; `experiments/bench/gpu_aot.py --what decode`), and the embedding lookup, RoPE
angles, the cache's valid mask and the output writes most of the rest. Here:

- the vocabulary head's programs (`fused_decode._head_kernel`) also write each tile's statistics: m = the max of
  its logits / T and s = the sum of exp(logits / T - m), one tile per `VOCAB_COLS` tokens;
- `_sample_kernel` (one program) combines them: M = max m, Z = sum exp(m - M) s, and draws by inverse CDF, as
  `token_draw.categorical_inverse_cdf` does, with the same uniform: the tile where the cumulative tile mass
  first passes u Z, then the token in that tile where the cumulative mass passes the rest. Greedy (T = 0):
  the first tile holding the maximum, then its first maximum (`argmax`'s tie rule). The log-prob is
  logits[tok] / T - M - log Z, `log_softmax`'s value. The token and log-prob go straight into the loop's
  output rows (in place), and the token on to the first layer's kernel, which reads its embedding row itself;
- the uniforms of every step are drawn before the loop, each from `fold_in(key, step)` as the XLA loop does, so
  the two paths draw the same token from the same key (up to float32 rounding at a boundary, ~1e-7).

The draw also checks the token against the stop tokens, for the loop's condition. A step is then the layers'
kernels, the last layer's partial sum, the head's, the draw, and the loop's counter. `decode_loop` runs it when
the sampling is plain (temperature only: no top-k / top-p, no allowed-token mask, no first-token mixing);
otherwise `sampling.continue_tokens` keeps XLA's sampling between `fused_decode.decode_step`s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from crl_jax.models.experimental import fused_decode as fd

f32, i32 = jnp.float32, jnp.int32


KERNELS = ("xla", "pallas", "pallas_interpret")  # `SamplerConfig.decode_kernel`


def wanted(kernel: str, cfg, batch: int) -> bool:
    """Whether a sampler with `decode_kernel` = kernel runs its decode steps in the kernels: batch 1 only
    (larger batches keep XLA's path); a model the kernels cannot take is an error, as is "pallas" off a
    CUDA GPU or on a jax without Pallas' Triton backend."""
    if kernel == "xla" or batch != 1:
        return False
    why = fd.unsupported(cfg, batch)
    if why:
        raise ValueError(f"decode_kernel={kernel!r}: {why}; use decode_kernel='xla'")
    if kernel == "pallas":
        fd.triton_compiler_params()  # a clear error where this jax has no Triton backend
        if jax.default_backend() != "gpu":
            raise ValueError(f"decode_kernel='pallas' compiles Triton kernels for a CUDA GPU (the default backend "
                             f"is {jax.default_backend()!r}); use 'pallas_interpret' (slow) or 'xla'")
    return True


def plain(cfg, allowed_tokens) -> bool:
    """Whether `SamplerConfig` cfg samples with nothing but a temperature (what `_sample_kernel` draws from)."""
    return cfg.top_k == 0 and cfg.top_p >= 1.0 and cfg.first_mix == 0 and allowed_tokens is None


def tile_stats(logits, temperature: float):
    """logits [V] -> the head kernel's tile statistics (m, s) [`fd.stat_tiles`(V)[1]], computed by XLA (for the
    prefill's logits, which XLA's head computes, and as the tests' reference)."""
    V = logits.shape[0]
    n, padded, _ = fd.stat_tiles(V)
    x = logits.astype(f32)
    x = x if temperature in (0.0, 1.0) else x / temperature
    x = x.reshape(n, fd.VOCAB_COLS)
    m = jnp.max(x, axis=1)
    s = jnp.sum(jnp.exp(x - m[:, None]), axis=1)
    return (jnp.pad(m, (0, padded - n), constant_values=-jnp.inf), jnp.pad(s, (0, padded - n)))


def _sample_kernel(step_ref, u_ref, logits_ref, m_ref, s_ref, t_in, lp_in, tok_ref, t_ref, lp_ref, done_ref, *,
                   chunk, temperature, stops):
    del t_in, lp_in  # aliased to t_ref / lp_ref: only slot `step` is written
    i = step_ref[0]
    cv = fd.VOCAB_COLS
    n = m_ref.shape[0] // chunk
    lane, col = jnp.arange(chunk, dtype=i32), jnp.arange(cv, dtype=i32)
    ms = [m_ref[pl.ds(c * chunk, chunk)] for c in range(n)]  # a few chunks (3 at V 49,152, 10 at 151,936)
    M = functools.reduce(jnp.maximum, [jnp.max(m) for m in ms])
    w = [jnp.exp(m - M) * s_ref[pl.ds(c * chunk, chunk)] for c, m in enumerate(ms)]  # each tile's mass / e^M
    Z = functools.reduce(jnp.add, [jnp.sum(x) for x in w])
    if temperature == 0.0:  # greedy: the first tile holding the max, then its first max
        t = functools.reduce(jnp.minimum, [jnp.min(jnp.where(m == M, c * chunk + lane, n * chunk))
                                           for c, m in enumerate(ms)])
        xs = logits_ref[pl.ds(t * cv, cv)]
        k = jnp.min(jnp.where(xs == M, col, cv))
    else:
        r = u_ref[i] * Z
        acc, count, before, last = jnp.float32(0.0), jnp.int32(0), jnp.float32(0.0), jnp.int32(-1)
        for c, wc in enumerate(w):  # tiles whose cumulative mass is <= r, and their mass
            below = acc + jnp.cumsum(wc) <= r
            count = count + jnp.sum(below.astype(i32))
            before = before + jnp.sum(jnp.where(below, wc, 0.0))
            last = jnp.maximum(last, jnp.max(jnp.where(wc > 0, c * chunk + lane, -1)))
            acc = acc + jnp.sum(wc)
        t = jnp.minimum(count, last)  # past the last tile of positive mass only by rounding
        xs = logits_ref[pl.ds(t * cv, cv)]
        xs = xs if temperature == 1.0 else xs / temperature
        q = jnp.exp(xs - M)
        last_k = jnp.max(jnp.where(q > 0, col, -1))
        k = jnp.minimum(jnp.sum((jnp.cumsum(q) <= r - before).astype(i32)), last_k)
        k = jnp.where(count > last, last_k, k)
    lp = jnp.sum(jnp.where(col == k, xs, 0.0)) - M - jnp.log(Z)
    tok = t * cv + k
    tok_ref[0] = tok
    t_ref[0, i] = tok
    lp_ref[0, i] = lp
    hit = jnp.bool_(False)
    for stop in stops:  # the stop check here, not in one more XLA kernel
        hit = hit | (tok == stop)
    done_ref[0] = hit.astype(i32)


def sample(step, u, logits, m, s, out_t, out_lp, *, temperature: float, stops=(), interpret: bool = False):
    """Draw step `step` [1] int32's token from logits [V] and their tile statistics m, s (`fused_decode.forward`
    or `tile_stats`) with uniform u[step] (u [N] float32; unused when greedy), and write it and its log-prob
    into column `step` of out_t [1, N] int32 / out_lp [1, N] float32 (in place) -> (tok [1], out_t, out_lp,
    done [1] int32: 1 if the token is one of `stops`)."""
    kern = functools.partial(_sample_kernel, chunk=fd.stat_tiles(logits.shape[0])[2], temperature=float(temperature),
                             stops=tuple(int(t) for t in stops))
    outs = (jax.ShapeDtypeStruct((1,), i32), jax.ShapeDtypeStruct(out_t.shape, i32),
            jax.ShapeDtypeStruct(out_lp.shape, f32), jax.ShapeDtypeStruct((1,), i32))
    return fd._call(kern, outs, (1,), interpret, aliases={5: 1, 6: 2}, name="decode_sample")(
        step, u, logits, m, s, out_t, out_lp)


def decode_loop(model, layers, logits, cache, slot, position, key, cfg, dead, *, interpret: bool = False):
    """`sampling.continue_tokens`' decode loop at batch 1 with plain sampling (`plain`), every step in kernels.

    logits [1, V]: the prefill's last logits; cache: the per-layer cache after the prefill; slot / position:
    the first reply token's cache slot and position (scalars); dead [1] bool: the row generates nothing.
    -> (steps taken, cache, out_t [1, N], out_lp [1, N]): as XLA's loop, which masks nothing at batch 1 (its
    one row stops the loop when it is done).
    """
    N, T = cfg.max_new_tokens, float(cfg.temperature)
    start = jnp.stack([jnp.asarray(slot, i32), jnp.asarray(position, i32)])
    u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i), (1,), f32))(jnp.arange(N))[:, 0]

    def cond(c):
        return (c[0] < N) & (c[-1][0] == 0)

    def body(c):
        i, logits, m, s, ks, vs, valid, out_t, out_lp, done = c
        step = jnp.reshape(i, (1,))
        tok, out_t, out_lp, hit = sample(step, u, logits, m, s, out_t, out_lp, temperature=T, stops=cfg.stop_tokens,
                                         interpret=interpret)
        # Without stop tokens `done` stays the loop-invariant `dead`, so XLA knows the trip count (a GPU then runs
        # the loop without reading its condition back to the host at every step).
        done = hit if cfg.stop_tokens else done
        logits, m, s, ks, vs, valid = fd.forward(model, layers, tok, step, start, ks, vs, valid, temperature=T,
                                                 interpret=interpret)
        return i + 1, logits, m, s, ks, vs, valid, out_t, out_lp, done

    m, s = tile_stats(logits[0], T)
    init = (jnp.int32(0), logits[0], m, s, cache["k"], cache["v"], cache["valid"][0].astype(i32),
            jnp.full((1, N), cfg.pad_id, i32), jnp.zeros((1, N), f32), dead.astype(i32))
    steps, _, _, _, ks, vs, valid, out_t, out_lp, _ = jax.lax.while_loop(cond, body, init)
    return steps, dict(cache, k=ks, v=vs, valid=valid[None] != 0), out_t, out_lp
