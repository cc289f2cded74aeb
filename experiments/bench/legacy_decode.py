"""The cached forward and sampler as they were before the in-place KV cache, kept only as the benchmark's baseline.

Before: the layer scan took the cache's k / v stacks as scanned inputs and returned new stacks as
outputs (XLA writes a fresh [L, B, S, Hkv, D] buffer per model call, i.e. a copy of the whole cache per
decode step), and every decode step attended over all S = P + N slots of the cache, however few were
written. `legacy_sample_tokens` is `crl_jax.sampling.sample_tokens` with that forward; the test
tests/unit/test_decode_cache.py checks that the library's greedy tokens equal these.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from crl_jax import sampling as S
from crl_jax.models import transformer as tr
from crl_jax.models.attention import dense_attention


def _attend(cfg, q, k, v, mask):
    """The attention of that time: float32 scores and softmax over the whole [T, S] mask (today's "einsum")."""
    return dense_attention(q, k, v, mask, cfg.num_kv_heads, "einsum")


def _layer(model, h, lp, positions, inv_freq, attn_factor, mask, kc, vc, cache_index):
    cfg = model.cfg
    B, T, _ = h.shape
    D = cfg.dim_head
    x = tr.rms_norm(h, lp["attn_norm"], cfg.rms_norm_eps)
    q = jnp.einsum("bth,hf->btf", x, lp["wq"])
    k = jnp.einsum("bth,hf->btf", x, lp["wk"])
    v = jnp.einsum("bth,hf->btf", x, lp["wv"])
    if cfg.attention_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    q = q.reshape(B, T, cfg.num_heads, D)
    k = k.reshape(B, T, cfg.num_kv_heads, D)
    v = v.reshape(B, T, cfg.num_kv_heads, D)
    if cfg.qk_norm:
        q = tr.rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = tr.rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q = tr.apply_rope(q, positions, inv_freq, attn_factor)
    k = tr.apply_rope(k, positions, inv_freq, attn_factor)
    kc = jax.lax.dynamic_update_slice(kc, k.astype(kc.dtype), (0, cache_index, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v.astype(vc.dtype), (0, cache_index, 0, 0))
    h = h + jnp.einsum("btf,fh->bth", _attend(cfg, q, kc, vc, mask), lp["wo"]).astype(h.dtype)
    x = tr.rms_norm(h, lp["mlp_norm"], cfg.rms_norm_eps)
    g = jnp.einsum("bth,hi->bti", x, lp["w_gate"])
    u = jnp.einsum("bth,hi->bti", x, lp["w_up"])
    h = h + jnp.einsum("bti,ih->bth", jax.nn.silu(g) * u, lp["w_down"]).astype(h.dtype)
    return h, (kc, vc)


def legacy_cached_forward(model, tokens, *, positions, attention_mask, cache, cache_index):
    """The old `Transformer.__call__` cached path -> (final-norm hidden [B, T, H], new cache)."""
    cfg = model.cfg
    T = tokens.shape[1]
    inv_np, attn_factor = tr.rope_inv_freq(cfg)
    inv = jnp.asarray(inv_np)
    h = model.embed_tokens(tokens)
    S_ = cache["k"].shape[2]
    valid = jax.lax.dynamic_update_slice(cache["valid"], attention_mask.astype(bool), (0, cache_index))
    q_slot = cache_index + jnp.arange(T)
    mask = valid[:, None, :] & (jnp.arange(S_)[None, None, :] <= q_slot[None, :, None])

    def block(h, xs):
        lp, kc, vc = xs
        return _layer(model, h, lp, positions, inv, attn_factor, mask, kc, vc, cache_index)

    h, (ks, vs) = jax.lax.scan(block, h, (model.layer_params(), cache["k"], cache["v"]))
    return tr.rms_norm(h, model.final_norm[...], cfg.rms_norm_eps), {"k": ks, "v": vs, "valid": valid}


def legacy_sample_tokens(graphdef, params, prompt, prompt_len, key, cfg: S.SamplerConfig, allowed_tokens=None):
    """`sampling.sample_tokens` before the in-place KV cache (same sampling order and outputs; old cached forward)."""
    B, P = prompt.shape
    N = cfg.max_new_tokens
    model = tr.merge(graphdef, params)
    prompt_len = prompt_len.astype(jnp.int32)
    toks, pos, valid = S.left_align(prompt.astype(jnp.int32), prompt_len, cfg.pad_id)
    cache = tr.init_cache(model.cfg, B, P + N)
    h, cache = legacy_cached_forward(model, toks, positions=pos, attention_mask=valid, cache=cache, cache_index=0)
    logits = model.unembed(h[:, -1:])[:, 0]
    stops = jnp.asarray(cfg.stop_tokens, jnp.int32)

    def cond(c):
        return (c[0] < N) & ~jnp.all(c[4])

    def body(c):
        i, logits, cache, key, done, out_t, out_lp = c
        tok, lp = S.sample_logits(logits, jax.random.fold_in(key, i), temperature=cfg.temperature, top_k=cfg.top_k,
                                  top_p=cfg.top_p, allowed=S._allowed_at(allowed_tokens, i, B))
        tok = jnp.where(done, cfg.pad_id, tok)
        lp = jnp.where(done, 0.0, lp)
        out_t = jax.lax.dynamic_update_index_in_dim(out_t, tok, i, axis=1)
        out_lp = jax.lax.dynamic_update_index_in_dim(out_lp, lp, i, axis=1)
        if cfg.stop_tokens:
            done = done | jnp.any(tok[:, None] == stops[None, :], axis=-1)
        h, cache = legacy_cached_forward(model, tok[:, None], positions=(prompt_len + i)[:, None],
                                         attention_mask=jnp.ones((B, 1), bool), cache=cache, cache_index=P + i)
        return i + 1, model.unembed(h)[:, 0], cache, key, done, out_t, out_lp

    init = (jnp.int32(0), logits, cache, key, jnp.zeros((B,), bool),
            jnp.full((B, N), cfg.pad_id, jnp.int32), jnp.zeros((B, N), jnp.float32))
    steps, _, _, _, done, out_t, out_lp = jax.lax.while_loop(cond, body, init)
    if cfg.stop_tokens:
        is_stop = jnp.any(out_t[..., None] == stops, axis=-1)
        first = jnp.argmax(is_stop, axis=1)
        lengths = jnp.where(is_stop.any(1), first + 1, steps)
    else:
        lengths = jnp.full((B,), steps)
    return out_t, out_lp, lengths.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 5))
def legacy_generate_jit(graphdef, params, prompt, prompt_len, key, cfg, allowed_tokens=None):
    return legacy_sample_tokens(graphdef, params, prompt, prompt_len, key, cfg, allowed_tokens)
