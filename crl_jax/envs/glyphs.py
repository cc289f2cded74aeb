"""The observation vocabulary shared by every grid env and the renderer: glyph ids (`GLYPHS`), the message
slots and the `Obs` pytree. A leaf module: `crl_jax.envs.base` (which re-exports all of it) and
`crl_jax.envs.render` both import it.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import struct

# ---------------------------------------------------------------------------------------------
# Glyphs: (character, legend description). Ids are global so one token table serves every env.
# Walls are drawn as '#' in every env (documented choice; MiniHack draws room walls as '-'/'|').
# ---------------------------------------------------------------------------------------------
GLYPHS: tuple[tuple[str, str | None], ...] = (
    (" ", None),  # 0 unseen / solid stone (never in the legend)
    ("@", "you"),  # 1
    (".", "floor"),  # 2
    (">", "stairs down"),  # 3
    ("<", "stairs up"),  # 4
    ("^", "teleportation trap"),  # 5
    ("#", "wall"),  # 6
    ("(", "key"),  # 7
    ("+", "locked door"),  # 8
    ("|", "open door"),  # 9
    ("0", "boulder"),  # 10
    ("_", "target"),  # 11
    ("*", "boulder on target"),  # 12
    (".", "frozen ice"),  # 13
    ("O", "hole"),  # 14
    ("G", "goal"),  # 15
    (":", "newt"),  # 16  monsters from here on (see room.MONSTERS)
    ("d", "jackal"),  # 17
    ("x", "grid bug"),  # 18
    ("F", "lichen"),  # 19
    ("r", "sewer rat"),  # 20
    ("k", "kobold"),  # 21
    ("o", "goblin"),  # 22
    ("Z", "kobold zombie"),  # 23
)
G_BLANK, G_AGENT, G_FLOOR, G_DOWN, G_UP, G_TRAP, G_WALL, G_KEY, G_LOCKED, G_OPEN = range(10)
G_BOULDER, G_TARGET, G_BOULDER_ON_TARGET, G_ICE, G_HOLE, G_GOAL = range(10, 16)
G_MONSTER0 = 16
NUM_GLYPHS = len(GLYPHS)
GLYPH_CHARS = np.array([ord(c) for c, _ in GLYPHS], np.uint8)  # glyph id -> ASCII code

COMMON_MESSAGES = ("", "That is not a valid action.")
MSG_NONE, MSG_INVALID = 0, 1
NUM_MSG_SLOTS = 2


@struct.dataclass
class Obs:
    grid: jax.Array  # [H, W] int32 glyph ids
    message: jax.Array  # [2] int32 message ids
