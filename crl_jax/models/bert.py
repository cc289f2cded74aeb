"""BERT encoder (post-LayerNorm, GELU, absolute positions) as a Flax NNX module, with a safetensors loader.

Used for the MiniLM sentence embedder (`sentence-transformers/all-MiniLM-L6-v2`, 6 layers, width 384,
12 heads), but written for any Hugging Face `BertModel` checkpoint. Layer weights are stacked on a
leading layer axis and the blocks run under `lax.scan` (as in `transformer.py`). Weight layout is
"in x out" (`x @ w`); the loader transposes Hugging Face's `[out, in]` Linear weights.

Call form: `model(tokens[B, T] int32, attention_mask[B, T] bool, token_type_ids=None) -> hidden[B, T, H]`
(last hidden state, float32). Padded keys are never attended to; padded query rows still produce
values (as in Hugging Face) — pool them away with the mask.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522  # word-piece vocabulary V
    hidden_size: int = 384  # width H
    intermediate_size: int = 1536  # feed-forward width I
    num_layers: int = 6  # encoder blocks
    num_heads: int = 12  # attention heads (head dim = H / heads)
    max_position_embeddings: int = 512  # longest sequence
    type_vocab_size: int = 2  # token-type (segment) ids
    layer_norm_eps: float = 1e-12  # epsilon in every LayerNorm

    @classmethod
    def from_hf(cls, cfg: dict) -> "BertConfig":
        act = cfg.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"config.json: hidden_act={act!r} unsupported (only exact 'gelu')")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("config.json: only position_embedding_type='absolute' is supported")
        return cls(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                   intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                   num_heads=cfg["num_attention_heads"],
                   max_position_embeddings=cfg["max_position_embeddings"],
                   type_vocab_size=cfg.get("type_vocab_size", 2),
                   layer_norm_eps=cfg.get("layer_norm_eps", 1e-12))


def layer_norm(x, w, b, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


class Bert(nnx.Module):
    """Stacked-layer BERT encoder; see the module docstring."""

    _LAYER = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_w", "ln1_b",
              "wi", "bi", "wf", "bf", "ln2_w", "ln2_b")

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
        init = nnx.initializers.normal(0.02)

        def p(shape, kind="normal"):
            if kind == "ones":
                return nnx.Param(jnp.ones(shape, jnp.float32))
            if kind == "zeros":
                return nnx.Param(jnp.zeros(shape, jnp.float32))
            return nnx.Param(init(rngs.params(), shape, jnp.float32))

        self.word_emb = p((cfg.vocab_size, H))
        self.pos_emb = p((cfg.max_position_embeddings, H))
        self.type_emb = p((cfg.type_vocab_size, H))
        self.emb_ln_w, self.emb_ln_b = p((H,), "ones"), p((H,), "zeros")
        self.wq, self.wk, self.wv, self.wo = (p((L, H, H)) for _ in range(4))
        self.bq, self.bk, self.bv, self.bo = (p((L, H), "zeros") for _ in range(4))
        self.ln1_w, self.ln1_b = p((L, H), "ones"), p((L, H), "zeros")
        self.wi, self.bi = p((L, H, I)), p((L, I), "zeros")
        self.wf, self.bf = p((L, I, H)), p((L, H), "zeros")
        self.ln2_w, self.ln2_b = p((L, H), "ones"), p((L, H), "zeros")

    def __call__(self, tokens, attention_mask, token_type_ids=None):
        chex.assert_rank([tokens, attention_mask], 2)
        cfg = self.cfg
        B, T = tokens.shape
        if T > cfg.max_position_embeddings:
            raise ValueError(f"sequence length {T} > max_position_embeddings {cfg.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(tokens)
        mask = attention_mask.astype(bool)
        eps = cfg.layer_norm_eps
        h = (jnp.take(self.word_emb[...], tokens, axis=0) + self.pos_emb[...][:T][None]
             + jnp.take(self.type_emb[...], token_type_ids, axis=0))
        h = layer_norm(h, self.emb_ln_w[...], self.emb_ln_b[...], eps)
        nh, d = cfg.num_heads, cfg.hidden_size // cfg.num_heads

        def block(h, lp):
            q = (h @ lp["wq"] + lp["bq"]).reshape(B, T, nh, d)
            k = (h @ lp["wk"] + lp["bk"]).reshape(B, T, nh, d)
            v = (h @ lp["wv"] + lp["bv"]).reshape(B, T, nh, d)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
            s = jnp.where(mask[:, None, None, :], s, jnp.finfo(jnp.float32).min)
            a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(B, T, -1)
            h = layer_norm(h + a @ lp["wo"] + lp["bo"], lp["ln1_w"], lp["ln1_b"], eps)
            f = jax.nn.gelu(h @ lp["wi"] + lp["bi"], approximate=False) @ lp["wf"] + lp["bf"]
            return layer_norm(h + f, lp["ln2_w"], lp["ln2_b"], eps), None

        lps = {n: getattr(self, n)[...] for n in self._LAYER}
        h, _ = jax.lax.scan(block, h, lps)
        return h


def load_bert(folder: str) -> Bert:
    """A `Bert` from a Hugging Face folder (`config.json` + `model.safetensors`), float32."""
    cfg_path, w_path = os.path.join(folder, "config.json"), os.path.join(folder, "model.safetensors")
    for f in (cfg_path, w_path):
        if not os.path.isfile(f):
            raise FileNotFoundError(f"BERT folder {folder!r} has no {os.path.basename(f)}")
    with open(cfg_path) as f:
        cfg = BertConfig.from_hf(json.load(f))
    w = load_file(w_path)
    # Some exports prefix every name with "bert.".
    w = {k[5:] if k.startswith("bert.") else k: v for k, v in w.items()}

    def get(name):
        try:
            return np.asarray(w[name], np.float32)
        except KeyError:
            raise KeyError(f"{w_path}: missing tensor {name!r}") from None

    def stack(fmt, transpose=False):
        arrs = [get(fmt.format(i)) for i in range(cfg.num_layers)]
        return np.stack([a.T if transpose else a for a in arrs])

    pre = "encoder.layer.{}."
    values = {
        "word_emb": get("embeddings.word_embeddings.weight"),
        "pos_emb": get("embeddings.position_embeddings.weight"),
        "type_emb": get("embeddings.token_type_embeddings.weight"),
        "emb_ln_w": get("embeddings.LayerNorm.weight"), "emb_ln_b": get("embeddings.LayerNorm.bias"),
    }
    for ours, theirs in (("q", "attention.self.query"), ("k", "attention.self.key"),
                         ("v", "attention.self.value"), ("o", "attention.output.dense"),
                         ("i", "intermediate.dense"), ("f", "output.dense")):
        values["w" + ours] = stack(pre + theirs + ".weight", transpose=True)
        values["b" + ours] = stack(pre + theirs + ".bias")
    for ours, theirs in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
        values[ours + "_w"] = stack(pre + theirs + ".weight")
        values[ours + "_b"] = stack(pre + theirs + ".bias")
    # Build with abstract shapes (no random init of 30k x 384 tables), then fill in the real weights.
    model = nnx.eval_shape(lambda: Bert(cfg, rngs=nnx.Rngs(0)))
    for name, val in values.items():
        want = getattr(model, name).shape
        if tuple(val.shape) != tuple(want):
            raise ValueError(f"{w_path}: tensor for {name} has shape {val.shape}, expected {want}")
        setattr(model, name, nnx.Param(jnp.asarray(val)))
    return model
