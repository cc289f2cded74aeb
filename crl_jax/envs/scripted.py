"""A scripted explorer for the navigation envs, defined on the character view so that it runs the same
on our `room` and on the real MiniHack (feed it MiniHack's `chars_crop`).

Policy, given the characters [H, W] (uint8 ASCII) the agent sees, with `@` the agent:
1. if a `>` is visible, step towards it (the sign of the row / column offset, diagonal when both differ);
2. else score the 8 compass moves: +10 if the target cell is passable (not blank, wall `#` `-` `|`,
   locked door `+` or a known trap `^`; monsters count as passable: moving into them attacks), plus the
   number of blank (unexplored) cells in the 3x3 block two steps away in that direction, plus uniform
   noise in [0, 1.5) from `key`; take the best. No memory: the remembered map in the view is the memory.

Action ids follow `crl_jax.envs.base.DIR_NAMES` (north east south west northeast southeast southwest
northwest), the order of MiniHack's 8 compass moves in our adapters.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.base import DIRS, GLYPH_CHARS

_BLOCKED = np.zeros(256, bool)
for _c in " #-|+^":
    _BLOCKED[ord(_c)] = True
# (dy + 1, dx + 1) -> action id
_DIR_TO_ACTION = np.full((3, 3), 0, np.int32)
for _a, (_dy, _dx) in enumerate(DIRS):
    _DIR_TO_ACTION[_dy + 1, _dx + 1] = _a


def glyphs_to_chars(grid: jax.Array) -> jax.Array:
    """Glyph ids [H, W] of an `Obs` -> ASCII codes [H, W] uint8."""
    return jnp.asarray(GLYPH_CHARS)[grid]


def explorer_action(chars: jax.Array, key: jax.Array) -> jax.Array:
    """int32 action in [0, 8) for one view `chars` [H, W] (uint8 or int ASCII codes)."""
    chex.assert_rank(chars, 2)
    chars = jnp.asarray(chars, jnp.int32)
    h, w = chars.shape
    flat = chars.reshape(-1)
    pos = jnp.array(jnp.unravel_index(jnp.argmax(flat == ord("@")), (h, w)), jnp.int32)
    is_stairs = flat == ord(">")
    sp = jnp.array(jnp.unravel_index(jnp.argmax(is_stairs), (h, w)), jnp.int32)
    d = jnp.sign(sp - pos)
    to_stairs = jnp.asarray(_DIR_TO_ACTION)[d[0] + 1, d[1] + 1]

    dirs = jnp.asarray(DIRS)
    padded = jnp.pad(chars, 3, constant_values=ord(" "))  # blank beyond the view
    inside = jnp.pad(jnp.ones((h, w), jnp.int32), 3)
    nxt = pos[None, :] + dirs + 3  # [8, 2] in padded coordinates
    passable = ~jnp.asarray(_BLOCKED)[padded[nxt[:, 0], nxt[:, 1]]]
    far = pos[None, :] + 2 * dirs + 3
    offs = jnp.stack(jnp.meshgrid(jnp.arange(-1, 2), jnp.arange(-1, 2), indexing="ij"), -1).reshape(-1, 2)
    cells = far[:, None, :] + offs[None, :, :]  # [8, 9, 2]
    blank = (padded[cells[..., 0], cells[..., 1]] == ord(" ")) & (inside[cells[..., 0], cells[..., 1]] > 0)
    novelty = jnp.sum(blank, axis=-1).astype(jnp.float32)
    noise = jax.random.uniform(key, (8,)) * 1.5
    explore = jnp.argmax(10.0 * passable + novelty + noise).astype(jnp.int32)
    return jnp.where(jnp.any(is_stairs), to_stairs, explore).astype(jnp.int32)


def explorer_policy(obs, key: jax.Array) -> jax.Array:
    """`explorer_action` on an `Obs` of the pure-JAX envs (vmap for batches)."""
    return explorer_action(glyphs_to_chars(obs.grid), key)
