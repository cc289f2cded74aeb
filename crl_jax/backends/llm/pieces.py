"""Prompt templates -> token pieces, rendered once on the host; packed inside jit.

A template is rendered through the model's chat template with *sentinels* (`slot("GOAL")`, a NUL-
delimited name) in place of every token-valued field; the rendered text is then cut at the sentinels
into a `Layout`: literal text pieces (tokenised once) and named slots in their order of appearance.
Inside jit `Layout.pack(values, size)` concatenates literal tokens and slot segments with
`crl_jax.text.packing.pack_segments`, so prompts are built from token arrays with fixed shapes.

Tokenising the pieces separately gives a valid encoding of the rendered text (byte-level BPE decodes
by concatenating bytes), not necessarily the one `encode(text)` would give; the golden tests compare
the decoded text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from crl_jax.text import prompts
from crl_jax.text.packing import pack_segments

_SLOT = re.compile("\x00([A-Za-z_0-9]+)\x00")


def slot(name: str) -> str:
    """Sentinel text standing for the token-valued field `name`."""
    return f"\x00{name}\x00"


def split_slots(text: str) -> list[tuple[str, str]]:
    """Text with sentinels -> [(kind, value)] with kind "text" or "slot", in order (empty texts dropped)."""
    parts = _SLOT.split(text)
    out = []
    for i, p in enumerate(parts):
        if i % 2 == 0:
            if p:
                out.append(("text", p))
        else:
            out.append(("slot", p))
    return out


def encode(tok, text: str) -> np.ndarray:
    return np.asarray(tok.encode(text) if text else [], np.int32)


def token_row(tok, text: str):
    """(tokens [max(1, n)] int32, length []) of one literal piece."""
    ids = encode(tok, text)
    return jnp.asarray(ids if ids.size else np.zeros((1,), np.int32)), jnp.int32(ids.size)


def token_table(tok, texts: list[str]):
    """(tokens [R, W], lengths [R]) of several literal pieces, right-padded with 0."""
    enc = [encode(tok, t) for t in texts]
    w = max(1, max(e.size for e in enc))
    out = np.zeros((len(texts), w), np.int32)
    for i, e in enumerate(enc):
        out[i, : e.size] = e
    return jnp.asarray(out), jnp.asarray([e.size for e in enc], jnp.int32)


@dataclass(frozen=True, eq=False)
class Layout:
    """Literal token pieces and slots in order. `items[i]` is ("text", (tokens, length)) or ("slot", name)."""

    items: tuple
    texts: tuple  # the literal texts (for docs / debugging)

    @classmethod
    def from_text(cls, tok, text: str) -> Layout:
        parts = split_slots(text)
        items = tuple(("text", token_row(tok, v)) if k == "text" else ("slot", v) for k, v in parts)
        return cls(items=items, texts=tuple(v for k, v in parts if k == "text"))

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(v for k, v in self.items if k == "slot")

    def fixed_capacity(self) -> int:
        return sum(int(v[0].shape[0]) for k, v in self.items if k == "text")

    def pack(self, values: dict, size: int | None = None, pad_id: int = 0):
        """values: slot name -> segment `(tokens[L], length)` -> (tokens [size], length)."""
        missing = set(self.slots) - set(values)
        if missing:
            raise KeyError(f"Layout.pack: no value for slots {sorted(missing)}")
        segs = [v if k == "text" else values[v] for k, v in self.items]
        return pack_segments(segs, size=size, pad_id=pad_id)


def chat_text(tok, messages: list[tuple[str, str]], add_generation_prompt: bool) -> str:
    return tok.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                   add_generation_prompt=add_generation_prompt)


def sub_layout(tok, name: str, folder: str, inner: str, **fields):
    """A template with one token-valued field `inner` -> ((pre tokens, len), (post tokens, len))."""
    text = prompts.render(name, folder, **{inner: slot("X")}, **fields)
    pre, post = text.split(slot("X"))
    return token_row(tok, pre), token_row(tok, post)
