"""GGUF files (llama.cpp): metadata -> TransformerConfig, dequantised tensors -> Transformer, tokenizer.

Read with `gguf.GGUFReader` (memory-mapped) and dequantised tensor by tensor with
`gguf.quants.dequantize` to float32, then cast to the requested storage dtype. GGUF tensor shapes
are listed innermost-first, but the numpy arrays the reader hands out are already `[out, in]`, the
Hugging Face layout, so the tensors are renamed to Hugging Face names and go through the same
`build_model` as safetensors checkpoints.

llama.cpp's converter reorders the rows of q/k projection weights of `llama`-architecture models
(from the "rotate half" RoPE layout to interleaved pairs); `_unpermute` undoes it. Qwen2/Qwen3 files
are not permuted.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from crl_jax.errors import CheckpointError
from crl_jax.models.loading import build_from_getter
from crl_jax.models.transformer import TransformerConfig
from crl_jax.text.tokenizers import HFTokenizer

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3")

# Hugging Face per-layer suffix -> GGUF per-layer name.
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_tensor_name(hf_name: str) -> str | None:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    m = _LAYER_RE.fullmatch(hf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k reordering: per head, rows [first half | second half] -> interleaved pairs."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_rows`: interleaved pairs -> the "rotate half" layout our RoPE uses."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_metadata(reader, prefix: str = "") -> dict:
    """GGUF key/value metadata as Python values (strings, numbers, lists), keys starting with `prefix`."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix):
            out[key] = field.contents()
    return out


def config_from_gguf(meta: dict, tensor_names: set, *, dtype: str, source: str) -> TransformerConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise CheckpointError(f"{source}: unsupported GGUF architecture {arch!r}; supported: {list(SUPPORTED_GGUF_ARCHS)}")

    def need(key):
        full = f"{arch}.{key}"
        if full not in meta:
            raise CheckpointError(f"{source}: GGUF metadata key {full!r} is missing")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ()) or None
    if vocab is None:
        raise CheckpointError(f"{source}: cannot tell the vocabulary size (no {arch}.vocab_size, no tokens)")
    head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
    scaling = None
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in ("linear", "yarn"):
        items = {"rope_type": kind, "factor": float(meta[f"{arch}.rope.scaling.factor"])}
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        if orig:
            items["original_max_position_embeddings"] = int(orig)
        scaling = tuple(sorted(items.items()))
    elif kind not in (None, "none"):
        raise CheckpointError(f"{source}: unsupported GGUF rope scaling type {kind!r}")
    if "rope_freqs.weight" in tensor_names:
        # Llama 3.1 files store their rope scaling only as a per-frequency factor tensor.
        warnings.warn(f"{source}: ignoring rope_freqs.weight (llama3 rope scaling from GGUF is not supported)")
    return TransformerConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        head_dim=int(head_dim) if head_dim else None,
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 2048)),
        param_dtype=dtype,
        family=arch,
    )


def load_gguf(path: str, *, dtype: str = "float32"):
    """(Transformer, HFTokenizer) from a GGUF file."""
    try:
        reader = GGUFReader(path)
    except Exception as e:  # truncated or not GGUF: the reader raises ValueError / struct errors
        raise CheckpointError(f"cannot read GGUF file {path!r}: {type(e).__name__}: {e}") from None
    meta = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    cfg = config_from_gguf(meta, set(tensors), dtype=dtype, source=path)
    permuted = meta.get("general.architecture") == "llama"

    def get(hf_name: str) -> np.ndarray | None:
        name = gguf_tensor_name(hf_name)
        t = tensors.get(name) if name else None
        if t is None:
            return None
        # A plain in-memory copy first: slicing the reader's np.memmap block by block is ~5x slower.
        w = np.asarray(dequantize(np.array(t.data), t.tensor_type), np.float32)
        if permuted and name.endswith("attn_q.weight"):
            w = unpermute_rows(w, cfg.num_heads)
        elif permuted and name.endswith("attn_k.weight"):
            w = unpermute_rows(w, cfg.num_kv_heads)
        return w

    model = build_from_getter(cfg, get, path)
    tokenizer = HFTokenizer.from_gguf_metadata(meta)
    return model, tokenizer
