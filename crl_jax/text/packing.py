"""Token-space segment packing: fixed-shape, jit-able building blocks for prompts.

A *segment* is a pair `(tokens[Li] int32, length)`: the first `length` ids are content, the rest is
padding whose values never matter. A bare array `tokens[Li]` is accepted as a segment whose every token is
content. Lengths may be traced; buffer sizes are static (shapes), so one compiled program serves every
prompt.

- `pack_segments(segments, size=None) -> (tokens[P], length)`: concatenate the contents back to back into
  a right-padded buffer; `P = sum(Li)` by default (nothing can overflow), or `size` (overflow is cut off
  at the end and `length == min(total, size)`).
- `truncate_left(tokens[L], length, budget) -> (tokens[L], new_length)`: keep the LAST
  `min(length, budget)` content tokens, moved to the front (old context is dropped first).
"""

from __future__ import annotations

from typing import Sequence

import chex
import jax.numpy as jnp


def as_segment(seg):
    """`(tokens[L], length)` from a pair or a bare 1-D array (all content). Length clipped to [0, L]."""
    if isinstance(seg, (tuple, list)):
        if len(seg) != 2:
            raise ValueError(f"a segment is (tokens, length); got a sequence of {len(seg)} items")
        tokens, length = seg
    else:
        tokens = seg
        length = jnp.shape(tokens)[0]
    tokens = jnp.asarray(tokens, jnp.int32)
    chex.assert_rank(tokens, 1)
    length = jnp.clip(jnp.asarray(length, jnp.int32), 0, tokens.shape[0])
    chex.assert_rank(length, 0)
    return tokens, length


def capacity(seg) -> int:
    """Static buffer size Li of a segment."""
    return int(as_segment(seg)[0].shape[0])


def pack_segments(segments: Sequence, size: int | None = None, pad_id: int = 0):
    """Concatenate segment contents: list of `(tokens[Li], length)` -> `(tokens[P], length [])`.

    `P = size` or `sum(Li)`. Positions `>= length` hold `pad_id`. Contents that do not fit in `size`
    are cut off at the end.
    """
    segs = [as_segment(s) for s in segments]
    P = int(size) if size is not None else sum(int(t.shape[0]) for t, _ in segs)
    out = jnp.full((P,), pad_id, jnp.int32)
    offset = jnp.zeros((), jnp.int32)
    for tokens, length in segs:
        i = jnp.arange(tokens.shape[0], dtype=jnp.int32)
        pos = jnp.where(i < length, offset + i, P)  # P = out of bounds, dropped
        out = out.at[pos].set(tokens, mode="drop")
        offset = offset + length
    return out, jnp.minimum(offset, P)


def truncate_left(tokens, length, budget, pad_id: int = 0):
    """Keep the last `min(length, budget)` of `tokens[:length]`, moved to the front -> (tokens[L], len)."""
    tokens, length = as_segment((tokens, length))
    L = tokens.shape[0]
    new_len = jnp.clip(jnp.minimum(length, jnp.asarray(budget, jnp.int32)), 0, L)
    start = length - new_len
    i = jnp.arange(L, dtype=jnp.int32)
    taken = tokens[jnp.clip(start + i, 0, L - 1)]
    return jnp.where(i < new_len, taken, pad_id), new_len


def truncate_right(tokens, length, budget, pad_id: int = 0):
    """Keep the first `min(length, budget)` tokens -> (tokens[L], len)."""
    tokens, length = as_segment((tokens, length))
    new_len = jnp.clip(jnp.minimum(length, jnp.asarray(budget, jnp.int32)), 0, tokens.shape[0])
    i = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    return jnp.where(i < new_len, tokens, pad_id), new_len
