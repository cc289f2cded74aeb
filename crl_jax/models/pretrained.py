"""`from_pretrained(path, dtype=...)`: a Hugging Face folder (`crl_jax.models.loading`) or a `.gguf` file
(`crl_jax.models.gguf_loader`) -> `(Transformer, tokenizer)`. Re-exported as `crl_jax.models.from_pretrained`.

The dispatch on the path's type lives here, above both loaders, so neither loader imports the other's
module (the GGUF loader builds its model with `loading.build_from_getter`).
"""

from __future__ import annotations

import os

from crl_jax.errors import CheckpointError
from crl_jax.models.gguf_loader import load_gguf
from crl_jax.models.loading import _NP_TARGET, load_hf_folder


def from_pretrained(path, *, dtype: str = "float32"):
    """(model, tokenizer) from a Hugging Face folder or a `.gguf` file; parameters stored in `dtype`."""
    path = os.fspath(path)
    if dtype not in _NP_TARGET:
        raise ValueError(f"from_pretrained: dtype must be one of {sorted(_NP_TARGET)}, got {dtype!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist (expected a Hugging Face folder or a .gguf file)")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(4)
        if path.endswith(".gguf") or magic == b"GGUF":
            return load_gguf(path, dtype=dtype)
        raise CheckpointError(f"{path!r} is a file but not a GGUF file; pass a Hugging Face model folder or a .gguf file")
    return load_hf_folder(path, dtype=dtype)
