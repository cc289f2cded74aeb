"""Decoder-only transformer (Llama / Qwen2 / Qwen2.5 / Qwen3 families) as a Flax NNX module.

Layer weights are stacked along a leading layer axis and the blocks run under `lax.scan`, so a
30-layer model compiles as fast as a 1-layer one and the KV cache is one array per tensor
(`[L, B, S, Hkv, D]`). Weight layout is "in x out" (`x @ w`); loaders transpose Hugging Face's
`[out, in]` Linear weights.

Family differences, all switched by `TransformerConfig`:
- Llama: no biases, no q/k norm, RoPE theta (+ optional "llama3" / "linear" / "yarn" scaling).
- Qwen2 / Qwen2.5: bias on q, k, v projections (`attention_bias=True`).
- Qwen3: RMSNorm on q and k per head before RoPE (`qk_norm=True`), no biases.

Call forms (tokens are `[B, T]` int32):
- `model(tokens)` -> logits `[B, T, V]` (positions 0..T-1, causal, no padding).
- `model(tokens, positions=..., attention_mask=...)` -> logits, with per-row positions and a key
  validity mask `[B, T]` (padding-aware; padded keys are never attended to).
- `model(tokens, positions=..., cache=cache, cache_index=i, attention_mask=...)` -> (logits, cache):
  writes keys/values into slots `i .. i+T-1` of a cache made by `init_cache` and attends over every
  valid slot `<=` the query's own slot. `cache_index` is one scalar for the whole batch (batched
  prompts are left-padded by the sampler, so all rows advance together). With `layers=model.layer_list()` the
  blocks run as straight-line code over those pre-sliced (optionally q/k/v- and gate/up-fused) weights instead
  of the layer scan (the sampler does this for shallow models: no per-step slice of the stacked weights); the
  cache may then hold one buffer per layer (`split_cache`), as the sampler's does.

The cached path carries the whole `[L, B, S, Hkv, D]` cache through the layer scan and
writes only the new slots (`dynamic_update_slice` on the carried buffer, in place under jit: no copy of
the stacked layers per call), and attends block by block over the live slots `0 .. i+T-1` only
(`attn_block` slots per block, online softmax in float32), so a decode step costs what has been written,
not the cache's capacity. It is a forward-only path (the block loop has a data-dependent trip count, which
reverse-mode differentiation does not support); training uses the uncached call.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax.models.attention import attend_live, dense_attention
from crl_jax.models.layers import apply_rope, dense, rms_norm, rope_inv_freq, swiglu  # noqa: F401  (re-exported)
from crl_jax.models.transformer_config import (  # noqa: F401  (re-exported)
    TransformerConfig, as_dtype, checkpoint_policy, remat_block, remat_mlp, tiny_config)


# ----------------------------------------------------------------------------------------------
# Module


class Transformer(nnx.Module):
    """Stacked-layer decoder. See the module docstring for the call forms."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = as_dtype(cfg.param_dtype)
        H, I, L, D = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.dim_head
        Nq, Nkv, V = cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size
        init = nnx.initializers.normal(0.02)

        def p(shape, fn=init):
            return nnx.Param(fn(rngs.params(), shape, jnp.float32).astype(dt))

        ones = lambda k, s, d: jnp.ones(s, d)  # noqa: E731
        zeros = lambda k, s, d: jnp.zeros(s, d)  # noqa: E731
        self.embed = p((V, H))
        self.attn_norm = p((L, H), ones)
        self.wq = p((L, H, Nq * D))
        self.wk = p((L, H, Nkv * D))
        self.wv = p((L, H, Nkv * D))
        self.wo = p((L, Nq * D, H))
        if cfg.attention_bias:
            self.bq = p((L, Nq * D), zeros)
            self.bk = p((L, Nkv * D), zeros)
            self.bv = p((L, Nkv * D), zeros)
        if cfg.qk_norm:
            self.q_norm = p((L, D), ones)
            self.k_norm = p((L, D), ones)
        self.mlp_norm = p((L, H), ones)
        self.w_gate = p((L, H, I))
        self.w_up = p((L, H, I))
        self.w_down = p((L, I, H))
        self.final_norm = p((H,), ones)
        if not cfg.tie_embeddings:
            self.lm_head = p((H, V))

    # -- helpers -------------------------------------------------------------------------------

    def layer_params(self) -> dict:
        names = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]
        if self.cfg.attention_bias:
            names += ["bq", "bk", "bv"]
        if self.cfg.qk_norm:
            names += ["q_norm", "k_norm"]
        return {n: getattr(self, n)[...] for n in names}

    def embed_tokens(self, tokens):
        return jnp.take(self.embed[...], tokens, axis=0)

    def unembed_matrix(self):
        """The unembedding [H, V] (the embedding's transpose when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

    def unembed(self, h):
        # Tied: contract with the [V, H] embedding as stored. Contracting with `embed.T` made XLA:CPU copy the
        # transposed [H, V] matrix on every decode step (2 MB at V 2,048, H 256); on the 2-core CPU that copy
        # cost nothing measurable (x0.98), but it is free to avoid.
        if self.cfg.tie_embeddings:
            return dense(h, self.embed[...], "fk", preferred_element_type=jnp.float32)
        return dense(h, self.lm_head[...], preferred_element_type=jnp.float32)

    # -- forward -------------------------------------------------------------------------------

    def layer_list(self, fused: bool = False) -> list[dict]:
        """The stacked layer weights sliced into one dict per layer. A decode loop slices once, before the loop,
        and passes the list as `layers=`: inside the loop a layer `scan` would slice (copy) every layer's weights
        again at every step (on the 2-core CPU a batch-1 sampler call of the 4-layer bench shape is x1.27 faster
        without those copies). `fused`: q/k/v and gate/up concatenated into one
        matrix each ("wqkv", "w_gate_up", and the biases "bqkv"; the layer code splits their products), two and one
        matmuls fewer per layer, for another ~x1.1 at batch 1 (same weights copied once: the slicing is a copy
        anyway)."""
        lps = self.layer_params()
        out = [{k: v[i] for k, v in lps.items()} for i in range(self.cfg.num_layers)]
        if fused:
            for d in out:
                d["wqkv"] = jnp.concatenate([d.pop("wq"), d.pop("wk"), d.pop("wv")], axis=-1)
                d["w_gate_up"] = jnp.concatenate([d.pop("w_gate"), d.pop("w_up")], axis=-1)
                if self.cfg.attention_bias:
                    d["bqkv"] = jnp.concatenate([d.pop("bq"), d.pop("bk"), d.pop("bv")], axis=-1)
        return out

    def __call__(self, tokens, *, positions=None, attention_mask=None, cache=None, cache_index=None,
                 return_hidden: bool = False, attn_block: int = 128, layers=None):
        cfg = self.cfg
        B, T = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        padded = attention_mask is not None  # no mask: the uncached forward attends under the causal mask alone
        attention_mask = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
        inv_freq, attn_factor = self._rope()
        h = self.embed_tokens(tokens)

        lps = self.layer_params()
        if cache is None:
            if cfg.pack_mlp:  # gate / up packed once for all layers: [L, H, 2, I] (`_mlp`, `layers.swiglu`)
                lps["w_gate_up"] = jnp.stack([lps.pop("w_gate"), lps.pop("w_up")], axis=-2)
            causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]  # [q, k]
            mask = attention_mask[:, None, :] & causal[None] if padded else None  # [B, T, T]

            def block(h, lp):
                return self._layer(h, lp, positions, inv_freq, attn_factor, mask, causal=True)[0], None

            h, _ = jax.lax.scan(remat_block(block, cfg), h, lps, unroll=min(cfg.scan_unroll, cfg.num_layers))
            new_cache = None
        else:
            if cache_index is None:
                raise ValueError("cache_index is required when a cache is given")
            valid = jax.lax.dynamic_update_slice(cache["valid"], attention_mask, (0, cache_index))

            if layers is not None:  # straight-line layers over pre-sliced weights (`layer_list`)
                ks, vs = cache["k"], cache["v"]
                if isinstance(ks, (list, tuple)):  # one buffer per layer (`split_cache`)
                    ks, vs = list(ks), list(vs)
                    for i, lp in enumerate(layers):
                        h, ks[i], vs[i] = self._cached_layer(h, lp, None, positions, inv_freq, attn_factor, valid,
                                                             ks[i], vs[i], cache_index, attn_block)
                else:
                    for i, lp in enumerate(layers):
                        h, ks, vs = self._cached_layer(h, lp, i, positions, inv_freq, attn_factor, valid, ks, vs,
                                                       cache_index, attn_block)
            else:
                def cblock(carry, xs):  # the cache rides in the carry: updated in place, never restacked
                    h, kc, vc = carry
                    lp, layer = xs
                    return self._cached_layer(h, lp, layer, positions, inv_freq, attn_factor, valid, kc, vc,
                                              cache_index, attn_block), None

                idx = jnp.arange(cfg.num_layers, dtype=jnp.int32)
                (h, ks, vs), _ = jax.lax.scan(cblock, (h, cache["k"], cache["v"]), (lps, idx))
            new_cache = {"k": ks, "v": vs, "valid": valid}
        h = rms_norm(h, self.final_norm[...], cfg.rms_norm_eps)
        out = h if return_hidden else self.unembed(h)
        return out if cache is None else (out, new_cache)

    def last_hidden(self, tokens, lengths, prefix: "PrefixKV | None" = None):
        """Final-norm hidden state [B, H] at position lengths-1 of right-padded tokens [B, T]; equal to
        `self(tokens, attention_mask=arange(T) < lengths, return_hidden=True)[b, lengths[b] - 1]`.

        The last layer only needs the keys and values of every position: its attention output and MLP are
        computed for the one query position (with 2 layers this skips ~40% of the forward and of its
        gradient; the tiny actor scores only its next token).

        `prefix` (from `encode_prefix`): tokens [B, T] continue those prefixes, so the result equals
        `last_hidden` over each row's prefix and tokens packed together (up to float32 summation order), while
        only the T new rows are computed: the prefix enters as its stored keys and values.
        """
        T = tokens.shape[1]
        key_valid = jnp.arange(T)[None, :] < lengths[:, None]
        return self.hidden_at(tokens, jnp.clip(lengths - 1, 0, T - 1)[:, None], key_valid, prefix)[:, 0]

    def hidden_at(self, tokens, query, key_valid=None, prefix: "PrefixKV | None" = None):
        """Final-norm hidden states [B, W, H] at positions query [B, W] (in [0, T)) of tokens [B, T]; equal to
        `self(tokens, attention_mask=key_valid, return_hidden=True)` gathered at `query` (key_valid None: all).
        As in `last_hidden`, the last layer computes attention output and MLP for the W query positions only
        (the tiny extractor's losses score only the response window; `loss_fns.response_window_logits`)."""
        cfg = self.cfg
        B, T = tokens.shape
        t = jnp.arange(T)
        key_valid = jnp.ones((B, T), bool) if key_valid is None else key_valid.astype(bool)
        causal = t[None, None, :] <= t[None, :, None]  # [1, T, T]
        if prefix is None:
            positions = jnp.broadcast_to(t.astype(jnp.int32), (B, T))
        else:
            positions = (prefix.length[:, None] + t[None, :]).astype(jnp.int32)
            Lp = prefix.valid.shape[1]
            key_valid = jnp.concatenate([prefix.valid, key_valid], axis=1)  # keys: prefix slots, then the new rows
            causal = jnp.concatenate([jnp.ones((1, T, Lp), bool), causal], axis=2)
        mask = key_valid[:, None, :] & causal
        inv_freq, attn_factor = self._rope()
        lps = self.layer_params()
        past = (None, None) if prefix is None else (prefix.k, prefix.v)

        def block(h, xs):
            lp, pk, pv = xs
            return self._layer(h, lp, positions, inv_freq, attn_factor, mask,
                               past_kv=None if pk is None else (pk, pv))[0], None

        block = remat_block(block, cfg)
        h = self.embed_tokens(tokens)
        head = lambda x: None if x is None else x[:-1]  # noqa: E731
        tail = lambda x: None if x is None else x[-1]  # noqa: E731
        if cfg.num_layers > 1:
            h, _ = jax.lax.scan(block, h, (jax.tree_util.tree_map(head, lps), head(past[0]), head(past[1])))
        mq = jnp.take_along_axis(mask, query[:, :, None], axis=1)  # [B, W, keys]: the query rows' masks
        pk, pv = tail(past[0]), tail(past[1])
        hq, _ = self._layer(h, jax.tree_util.tree_map(tail, lps), positions, inv_freq, attn_factor, mq,
                            query_at=query, past_kv=None if pk is None else (pk, pv))
        return rms_norm(hq, self.final_norm[...], cfg.rms_norm_eps)

    def encode_prefix(self, tokens, lengths) -> "PrefixKV":
        """Keys and values of every layer for right-padded prefixes tokens [B, Lp] (lengths [B]), for
        `last_hidden(..., prefix=)`: what many prompts that start with the same text share is computed once."""
        B, Lp = tokens.shape
        t = jnp.arange(Lp)
        valid = t[None, :] < lengths[:, None]
        mask = valid[:, None, :] & (t[None, None, :] <= t[None, :, None])
        positions = jnp.broadcast_to(t.astype(jnp.int32), (B, Lp))
        inv_freq, attn_factor = self._rope()

        def block(h, lp):
            return self._layer(h, lp, positions, inv_freq, attn_factor, mask, return_kv=True)

        _, (k, v) = jax.lax.scan(block, self.embed_tokens(tokens), self.layer_params())
        return PrefixKV(k=k, v=v, valid=valid, length=lengths.astype(jnp.int32))

    def _rope(self):
        """(inverse frequencies [D/2] as a jax array, attention scaling) of this model's RoPE."""
        inv_freq, attn_factor = rope_inv_freq(self.cfg)
        return jnp.asarray(inv_freq), attn_factor

    def _layer(self, h, lp, positions, inv_freq, attn_factor, mask, *, query_at=None, past_kv=None,
               return_kv=False, causal=False):
        """One uncached decoder block -> (h, None), or (h, (k, v)) with `return_kv`. `query_at` [B, W]: keys
        and values of every position, but attention output and MLP for those W positions only (h comes back
        [B, W, H]). `past_kv` (k, v) [B, Lp, Hkv, D]: keys and values of earlier positions, attended before
        this block's own (`mask` then covers Lp + T keys). `causal`: `mask` includes the plain causal mask (the
        uncached forward), which `dense_attention` may pass on to a fused kernel."""
        x = rms_norm(h, lp["attn_norm"], self.cfg.rms_norm_eps)
        q, k, v = self._qkv(x, lp, positions, inv_freq, attn_factor)
        new_kv = (k, v) if return_kv else None
        if past_kv is not None:
            k = jnp.concatenate([past_kv[0].astype(k.dtype), k], axis=1)
            v = jnp.concatenate([past_kv[1].astype(v.dtype), v], axis=1)
        if query_at is not None:
            q = jnp.take_along_axis(q, query_at[:, :, None, None], axis=1)  # [B, W, Nq, D]
            h = jnp.take_along_axis(h, query_at[:, :, None], axis=1)  # [B, W, H]
        h = h + dense(self._attend(q, k, v, mask, causal), lp["wo"]).astype(h.dtype)
        return h + remat_mlp(self._mlp, self.cfg)(h, lp), new_kv

    def _cached_layer(self, h, lp, layer, positions, inv_freq, attn_factor, valid, kc, vc, cache_index, block):
        """One decoder block against the full cache kc / vc [L, B, S, Hkv, D] (or, with layer None, this layer's
        own buffers [B, S, Hkv, D]): writes this layer's new keys and values at slots cache_index.. (in place)
        and attends over the live slots -> (h, kc, vc)."""
        x = rms_norm(h, lp["attn_norm"], self.cfg.rms_norm_eps)
        q, k, v = self._qkv(x, lp, positions, inv_freq, attn_factor)
        if layer is None:
            at, k, v = (0, cache_index, 0, 0), k, v
        else:
            at, k, v = (layer, 0, cache_index, 0, 0), k[None], v[None]
        kc = jax.lax.dynamic_update_slice(kc, k.astype(kc.dtype), at)
        vc = jax.lax.dynamic_update_slice(vc, v.astype(vc.dtype), at)
        o = attend_live(q, kc, vc, layer, valid, cache_index, self.cfg.num_kv_heads, block)
        h = h + dense(o, lp["wo"]).astype(h.dtype)
        return h + self._mlp(h, lp), kc, vc

    def _mlp(self, h, lp):
        """With packed gate / up weights ("w_gate_up": [H, 2I] from `layer_list(fused=True)`, [H, 2, I] in the
        uncached forward; the same memory layout) one matmul, whose packed product `swiglu` differentiates in one
        pass; over [H, 2I] with `merge_gate_up` (the CPU's faster gradient)."""
        x = rms_norm(h, lp["mlp_norm"], self.cfg.rms_norm_eps)
        if "w_gate_up" in lp:
            w = lp["w_gate_up"]
            w = w.reshape((w.shape[0], -1) if self.cfg.merge_gate_up else (w.shape[0], 2, -1))
            act = swiglu(dense(x, w).reshape(x.shape[:-1] + (2, -1)))
        else:
            act = jax.nn.silu(dense(x, lp["w_gate"])) * dense(x, lp["w_up"])
        return dense(act, lp["w_down"]).astype(h.dtype)

    def _qkv(self, x, lp, positions, inv_freq, attn_factor):
        cfg = self.cfg
        B, T, _ = x.shape
        D = cfg.dim_head
        if "wqkv" in lp:
            nq, nkv = cfg.num_heads * D, cfg.num_kv_heads * D
            y = dense(x, lp["wqkv"])
            q, k, v = jnp.split(y + lp["bqkv"] if cfg.attention_bias else y, [nq, nq + nkv], axis=-1)
        else:
            q, k, v = dense(x, lp["wq"]), dense(x, lp["wk"]), dense(x, lp["wv"])
            if cfg.attention_bias:
                q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
        q = q.reshape(B, T, cfg.num_heads, D)
        k = k.reshape(B, T, cfg.num_kv_heads, D)
        v = v.reshape(B, T, cfg.num_kv_heads, D)
        if cfg.qk_norm:
            q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
            k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
        q = apply_rope(q, positions, inv_freq, attn_factor)
        k = apply_rope(k, positions, inv_freq, attn_factor)
        return q, k, v

    def _attend(self, q, k, v, mask, causal=False):
        """q [B,T,Nq,D], k/v [B,S,Nkv,D], mask [B,T,S] -> [B,T,Nq*D] (`attention.dense_attention`)."""
        return dense_attention(q, k, v, mask, self.cfg.num_kv_heads, self.cfg.attn_impl, causal)


class PrefixKV(NamedTuple):
    """Keys and values of right-padded prompt prefixes (`Transformer.encode_prefix`)."""

    k: jax.Array  # [L, B, Lp, Hkv, D]
    v: jax.Array  # [L, B, Lp, Hkv, D]
    valid: jax.Array  # [B, Lp] bool: slot < length
    length: jax.Array  # [B] int32 prefix tokens (the first new token's position)


def init_cache(cfg: TransformerConfig, batch: int, max_len: int, dtype=None, prefix: PrefixKV | None = None) -> dict:
    """Empty KV cache: k, v [L, B, S, Hkv, D] and the slot validity mask [B, S]; with `prefix` (`encode_prefix`)
    its keys and values fill the first slots."""
    dt = as_dtype(dtype or cfg.param_dtype)
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.dim_head)
    cache = {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt), "valid": jnp.zeros((batch, max_len), bool)}
    if prefix is not None:
        at = lambda x, y: jax.lax.dynamic_update_slice(x, y.astype(x.dtype), (0,) * x.ndim)  # noqa: E731
        cache = {"k": at(cache["k"], prefix.k), "v": at(cache["v"], prefix.v),
                 "valid": at(cache["valid"], prefix.valid)}
    return cache


def split_cache(cache: dict) -> dict:
    """The cache with k and v as lists of per-layer buffers [B, S, Hkv, D], for straight-line layers
    (`layers=`): each layer then writes and reads its own buffer. From the stacked [L, ...] arrays a decode step
    reads a layer through a slice, which XLA materialises (on an H200 at SmolLM2 shape, B 256: a copy of every
    layer's keys and values at every step, 29% of the decode's device time).
    `stack_cache` undoes it."""
    L = cache["k"].shape[0]
    return dict(cache, k=[cache["k"][i] for i in range(L)], v=[cache["v"][i] for i in range(L)])


def stack_cache(cache: dict) -> dict:
    """`split_cache` undone: k, v stacked back into [L, B, S, Hkv, D] arrays."""
    return dict(cache, k=jnp.stack(cache["k"]), v=jnp.stack(cache["v"]))


def create(cfg: TransformerConfig, key) -> Transformer:
    """Random-initialised model from a PRNG key."""
    return Transformer(cfg, rngs=nnx.Rngs(params=key))


def split(model: nnx.Module):
    """(graphdef, params): the static graph and the parameter pytree the train state carries."""
    return nnx.split(model, nnx.Param)


def merge(graphdef, params) -> Transformer:
    return nnx.merge(graphdef, params)


def apply(graphdef, params, tokens, **kw):
    """Pure forward from the split form (what compiled code calls)."""
    return nnx.merge(graphdef, params)(tokens, **kw)


def num_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
