"""Checkpoint loaders: Hugging Face folders (config.json + safetensors) and GGUF files.

`crl_jax.models.pretrained.from_pretrained(path, dtype=...)` returns `(Transformer, tokenizer)`:

- a folder with `config.json` and one or many `*.safetensors` (sharded checkpoints are listed by
  `model.safetensors.index.json`), read with safetensors' numpy API, no torch. bfloat16 tensors are
  read from the raw bytes as `ml_dtypes.bfloat16` because numpy has no bfloat16 of its own. The
  tokenizer comes from the same folder (`tokenizer.json`); a folder without one gives `None`.
- a `.gguf` file: see `crl_jax.models.gguf_loader` (dequantised weights, tokenizer from metadata).

Every checkpoint is first presented as a *tensor source* in Hugging Face naming and layout
(`model.layers.3.self_attn.q_proj.weight`, Linear weights `[out, in]`); `build_model` then stacks the
per-layer tensors along a leading layer axis, transposes Linear weights to our `[in, out]` layout,
checks every shape against the config, and fills an abstract (never randomly initialised) model.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Protocol

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open

# One error class for every unreadable checkpoint (run-folder Orbax checkpoints and model files alike): the
# CLI catches it and prints one line. Raised here with a message naming the file, tensor or config field.
from crl_jax.errors import CheckpointError, read_json  # noqa: F401  (CheckpointError: re-exported)
from crl_jax.models.transformer import Transformer, TransformerConfig, as_dtype
from crl_jax.text.tokenizers import HFTokenizer

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
# Defaults of the transformers config classes for keys a config.json may omit.
_FAMILY_DEFAULTS = {
    "llama": dict(rope_theta=10000.0, max_position_embeddings=2048, rms_norm_eps=1e-6),
    "qwen2": dict(rope_theta=10000.0, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3": dict(rope_theta=10000.0, max_position_embeddings=32768, rms_norm_eps=1e-6, head_dim=128),
}
_NP_TARGET = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


# ----------------------------------------------------------------------------------------------
# Hugging Face folders (the dispatch on path type: `crl_jax.models.pretrained.from_pretrained`)


def load_hf_folder(path: str, *, dtype: str = "float32"):
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"no config.json in model folder {path!r}")
    hf = read_json(cfg_file)
    cfg = config_from_hf(hf, dtype=dtype, source=cfg_file)
    tokenizer = None  # read first: a damaged tokenizer fails before the weights are
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        tokenizer = HFTokenizer.from_folder(path)
    with SafetensorsSource(path) as src:
        model = build_model(cfg, src)
    return model, tokenizer


# ----------------------------------------------------------------------------------------------
# config.json -> TransformerConfig


def _hashable(v):
    return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def rope_from_hf(hf: dict, default_theta: float) -> tuple[float, tuple | None]:
    """(rope_theta, rope_scaling items) from transformers-5 `rope_parameters` or older keys."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and params:
        if "full_attention" in params and isinstance(params["full_attention"], dict):  # per-layer-type form
            params = params["full_attention"]
        scaling = dict(params)
        theta = float(scaling.pop("rope_theta", hf.get("rope_theta", default_theta)))
    else:
        theta = float(hf.get("rope_theta", default_theta))
        scaling = dict(hf.get("rope_scaling") or {})
    if "type" in scaling and "rope_type" not in scaling:  # very old spelling
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, tuple(sorted((k, _hashable(v)) for k, v in scaling.items()))


def config_from_hf(hf: dict, *, dtype: str = "float32", source: str = "config.json") -> TransformerConfig:
    """Map a Hugging Face config dict (Llama / Qwen2 / Qwen3 causal LM) to a TransformerConfig; a field of the
    wrong type or value is a CheckpointError naming `source` and the field."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{source}: must hold a JSON object, got a {type(hf).__name__}")
    try:
        return _config_from_hf(hf, dtype, source)
    except CheckpointError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:  # TransformerConfig's own checks
        raise CheckpointError(f"{source}: {e}") from None


def _number(key: str, value, kind, source: str):
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or (kind is int and value != int(value)):
        raise CheckpointError(f"{source}: field {key!r} must be {'an integer' if kind is int else 'a number'}, "
                              f"got {value!r}")
    return kind(value)


def _config_from_hf(hf: dict, dtype: str, source: str) -> TransformerConfig:
    archs = hf.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch is None:  # fall back on model_type
        arch = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}.get(hf.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        shown = arch or hf.get("model_type")
        raise CheckpointError(
            f"{source}: unsupported architecture {shown!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]
    defaults = _FAMILY_DEFAULTS[family]

    def need(key, kind=int):
        if key not in hf:
            raise CheckpointError(f"{source}: missing field {key!r} needed for {arch}")
        return _number(key, hf[key], kind, source)

    def opt(key, default, kind=int):
        v = hf.get(key, default)
        return None if v is None else _number(key, v, kind, source)

    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only silu)")
    if hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias=true is not supported")
    theta, scaling = rope_from_hf(hf, defaults["rope_theta"])
    num_heads = need("num_attention_heads")
    head_dim = opt("head_dim", defaults.get("head_dim"))
    if family == "qwen2":
        attention_bias = True  # Qwen2 always has q/k/v biases; its config has no switch
    else:
        attention_bias = bool(hf.get("attention_bias", False))
    return TransformerConfig(
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=opt("num_key_value_heads", None) or num_heads,
        head_dim=head_dim or None,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=opt("rms_norm_eps", defaults["rms_norm_eps"], float),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        qk_norm=family == "qwen3",
        max_position_embeddings=opt("max_position_embeddings", defaults["max_position_embeddings"]),
        param_dtype=dtype,
        family=family,
    )


# ----------------------------------------------------------------------------------------------
# Safetensors


class TensorSource(Protocol):
    """Tensors in Hugging Face naming and layout (Linear weights `[out, in]`)."""

    def get(self, name: str) -> np.ndarray | None: ...  # None when absent

    def where(self, name: str) -> str: ...  # file that holds `name`, for error messages


def read_safetensors_header(file: str) -> dict:
    """The JSON header of a safetensors file, checked against the file size (catches truncation)."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"safetensors file {file!r} is truncated or corrupt ({size} bytes, no header)")
        n = int.from_bytes(raw, "little")
        if n <= 0 or 8 + n > size:
            raise CheckpointError(f"safetensors file {file!r} is truncated or corrupt (header length {n}, file {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"safetensors file {file!r} is corrupt: unreadable header ({e})") from None
    header.pop("__metadata__", None)
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if 8 + n + end > size:
        raise CheckpointError(
            f"safetensors file {file!r} is truncated: tensors need {8 + n + end} bytes, file has {size}"
        )
    header["__data_start__"] = 8 + n
    return header


class SafetensorsSource:
    """All tensors of a folder's `*.safetensors` files, opened with `safe_open(framework="np")`."""

    def __init__(self, folder: str):
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.isfile(index):
            weight_map = read_json(index).get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"{index!r}: weight_map must map tensor names to file names")
            files = sorted(set(weight_map.values()))
            for fn in files:
                if not os.path.isfile(os.path.join(folder, fn)):
                    raise FileNotFoundError(f"shard {fn!r} listed in {index!r} is missing")
        else:
            files = sorted(fn for fn in os.listdir(folder)
                           if fn.endswith(".safetensors") and os.path.isfile(os.path.join(folder, fn)))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in model folder {folder!r}")
        self._handles, self._headers, self._file_of = {}, {}, {}
        for fn in files:
            full = os.path.join(folder, fn)
            self._headers[full] = read_safetensors_header(full)
            try:
                self._handles[full] = safe_open(full, framework="np")
            except Exception as e:  # SafetensorError: anything the library finds wrong with the file
                raise CheckpointError(f"safetensors file {full!r} is corrupt: {e}") from None
            for name in self._handles[full].keys():
                self._file_of[name] = full

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handles.clear()  # handles are closed when garbage collected

    def where(self, name: str) -> str:
        return self._file_of.get(name, "<none>")

    def _resolve(self, name: str) -> str | None:
        if name in self._file_of:
            return name
        # Checkpoints of the bare base model (LlamaModel, ...) have no "model." prefix.
        if name.startswith("model.") and name[len("model."):] in self._file_of:
            return name[len("model."):]
        return None

    def get(self, name: str) -> np.ndarray | None:
        key = self._resolve(name)
        if key is None:
            return None
        file = self._file_of[key]
        info = self._headers[file][key]
        if info["dtype"] == "BF16":  # numpy cannot hold bfloat16: read the raw little-endian bytes
            begin, end = info["data_offsets"]
            raw = np.fromfile(file, dtype="<u2", count=(end - begin) // 2, offset=self._headers[file]["__data_start__"] + begin)
            return raw.view(ml_dtypes.bfloat16).reshape(info["shape"])
        try:
            return self._handles[file].get_tensor(key)
        except Exception as e:
            raise CheckpointError(f"cannot read tensor {key!r} from {file!r}: {e}") from None


# ----------------------------------------------------------------------------------------------
# Building the model


def _layer_spec(cfg: TransformerConfig) -> list[tuple[str, str, bool]]:
    """(our stacked param, HF per-layer suffix, transpose) for every per-layer tensor."""
    spec = [
        ("attn_norm", "input_layernorm.weight", False),
        ("wq", "self_attn.q_proj.weight", True),
        ("wk", "self_attn.k_proj.weight", True),
        ("wv", "self_attn.v_proj.weight", True),
        ("wo", "self_attn.o_proj.weight", True),
        ("mlp_norm", "post_attention_layernorm.weight", False),
        ("w_gate", "mlp.gate_proj.weight", True),
        ("w_up", "mlp.up_proj.weight", True),
        ("w_down", "mlp.down_proj.weight", True),
    ]
    if cfg.attention_bias:
        spec += [("bq", "self_attn.q_proj.bias", False), ("bk", "self_attn.k_proj.bias", False),
                 ("bv", "self_attn.v_proj.bias", False)]
    if cfg.qk_norm:
        spec += [("q_norm", "self_attn.q_norm.weight", False), ("k_norm", "self_attn.k_norm.weight", False)]
    return spec


def abstract_model(cfg: TransformerConfig) -> Transformer:
    """The model with shape-only parameters (no memory, no random init)."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))


def build_model(cfg: TransformerConfig, src: TensorSource) -> Transformer:
    """Fill an abstract `Transformer(cfg)` with tensors from `src` (HF naming, `[out, in]` Linear weights)."""
    graphdef, state = nnx.split(abstract_model(cfg))
    shapes = {k: tuple(v.shape) for k, v in nnx.to_pure_dict(state).items()}
    target = _NP_TARGET[cfg.param_dtype] if cfg.param_dtype in _NP_TARGET else np.dtype(as_dtype(cfg.param_dtype))

    def fetch(name: str, expected: tuple, transpose: bool) -> np.ndarray:
        w = src.get(name)
        if w is None:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint")
        hf_shape = tuple(reversed(expected)) if transpose else expected
        if tuple(w.shape) != hf_shape:
            raise CheckpointError(
                f"shape mismatch for tensor {name!r} in {src.where(name)}: expected {hf_shape} from the config, "
                f"found {tuple(w.shape)}"
            )
        return w.T if transpose else w

    def cast(w: np.ndarray) -> np.ndarray:
        # float32 first: ml_dtypes casts float16/bfloat16 -> bfloat16 via float32 anyway; rounding is RNE.
        return np.asarray(w, np.float32).astype(target, copy=False)

    params: dict[str, np.ndarray] = {}
    params["embed"] = cast(fetch("model.embed_tokens.weight", shapes["embed"], False))
    params["final_norm"] = cast(fetch("model.norm.weight", shapes["final_norm"], False))
    if not cfg.tie_embeddings:
        params["lm_head"] = cast(fetch("lm_head.weight", shapes["lm_head"], True))
    for ours, suffix, transpose in _layer_spec(cfg):
        stacked = np.empty(shapes[ours], target)  # [L, ...] filled layer by layer (no float32 copy of all)
        for i in range(cfg.num_layers):
            stacked[i] = cast(fetch(f"model.layers.{i}.{suffix}", shapes[ours][1:], transpose))
        params[ours] = stacked
    for i in range(cfg.num_layers):  # our attention has no output bias: only an all-zero one is harmless
        name = f"model.layers.{i}.self_attn.o_proj.bias"
        b = src.get(name)
        if b is not None and np.any(np.asarray(b, np.float32) != 0):
            raise CheckpointError(f"tensor {name!r}: an attention output bias is not supported by this transformer")
    missing = set(shapes) - set(params)
    if missing:  # a config switch the spec above does not know about
        raise CheckpointError(f"no checkpoint tensor mapped to parameters {sorted(missing)}")
    nnx.replace_by_pure_dict(state, {k: jnp.asarray(v) for k, v in params.items()})
    return nnx.merge(graphdef, state)


def build_from_getter(cfg: TransformerConfig, get: Callable[[str], np.ndarray | None], where: str) -> Transformer:
    """`build_model` for a plain function source (GGUF, tests)."""

    class _Src:
        def get(self, name):
            return get(name)

        def where(self, name):
            return where

    return build_model(cfg, _Src())
