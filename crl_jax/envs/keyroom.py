"""`keyroom`: a dark 5x5 room (7x7 map with its walls) whose corner holds a 2x2 sub-room behind a
locked door; the stairs down are inside the sub-room, a key `(` lies somewhere in the outer room.

Actions: the 8 compass moves, `pickup` (takes the key when standing on it) and `apply` (with the key,
next to the locked door: unlocks and opens it). As in NetHack, a locked door `+` blocks, an open door
`|` is passable but never diagonally ("You can't move diagonally into / out of a doorway.").
Only the 8 neighbours are visible; what was seen stays drawn. Reward 1 on the stairs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from crl_jax.envs.base import (DIR_NAMES, DIRS, G_AGENT, G_BLANK, G_DOWN, G_FLOOR, G_KEY, G_LOCKED, G_OPEN,
                               G_UP, G_WALL, MSG_NONE, Env, Obs, cell_mask, randint_u, sample_cells)

M = 7  # map side (5x5 room + walls)
# Top-left variant in map coordinates; other corners are mirror images.
_SUB = np.array([[1, 1], [1, 2], [2, 1], [2, 2]], np.int32)
_INNER_WALLS = np.array([[3, 1], [3, 2], [3, 3], [1, 3], [2, 3]], np.int32)
_DOORS = np.array([[3, 1], [3, 2], [1, 3], [2, 3]], np.int32)


@struct.dataclass
class KeyLevel:
    walls: jax.Array  # [7, 7] bool (door cell not a wall)
    door: jax.Array  # [2]
    stairs: jax.Array
    key_pos: jax.Array
    start: jax.Array


@struct.dataclass
class KeyState:
    key: jax.Array
    t: jax.Array
    done: jax.Array
    success: jax.Array
    msg: jax.Array
    level: KeyLevel
    pos: jax.Array
    seen: jax.Array
    has_key: jax.Array
    key_taken: jax.Array
    door_open: jax.Array


def _mirror(p, fr, fc):
    return jnp.stack([jnp.where(fr, M - 1 - p[..., 0], p[..., 0]), jnp.where(fc, M - 1 - p[..., 1], p[..., 1])], -1)


class KeyRoom(Env):
    name = "keyroom"
    action_names = DIR_NAMES + ("pickup", "apply")
    env_messages = ("Hello Agent, welcome to the key room!", "It's a wall.", "This door is locked.",
                    "You can't move diagonally into a doorway.", "You can't move diagonally out of a doorway.",
                    "You see here a key.", "You pick up the key.", "There is nothing here to pick up.",
                    "You unlock and open the door.", "You don't have anything to apply.",
                    "There is no locked door next to you.", "There is a staircase down here.")
    task_text = ("The staircase down (>) is in a small locked room. Find the key, pick it up, apply it next "
                 "to the locked door (+), then step on the stairs.")

    def __init__(self, *, max_steps: int = 50, **kw):
        super().__init__(max_steps=max_steps, **kw)

    def generate(self, key) -> KeyLevel:
        u = jax.random.uniform(key, (4 + M * M,))
        fr, fc = u[0] < 0.5, u[1] < 0.5
        sub = _mirror(jnp.asarray(_SUB), fr, fc)
        inner = _mirror(jnp.asarray(_INNER_WALLS), fr, fc)
        door = _mirror(jnp.asarray(_DOORS), fr, fc)[randint_u(u[2], 0, 4)]
        stairs = sub[randint_u(u[3], 0, 4)]
        border = jnp.ones((M, M), bool).at[1:-1, 1:-1].set(False)
        walls = border
        for i in range(_INNER_WALLS.shape[0]):
            walls = walls | cell_mask((M, M), inner[i])
        in_sub = jnp.zeros((M, M), bool)
        for i in range(4):
            in_sub = in_sub | cell_mask((M, M), sub[i])
        cells = sample_cells(u[4:], ~walls & ~in_sub, 2)
        walls = walls & ~cell_mask((M, M), door)
        return KeyLevel(walls=walls, door=door, stairs=stairs, key_pos=cells[0], start=cells[1])

    def level_code(self, lv):
        return jnp.concatenate([lv.door, lv.stairs, lv.key_pos, lv.start, lv.walls[1:-1, 1:-1].reshape(-1)
                                .astype(jnp.int32)])

    def _visible(self, pos):
        r = jnp.arange(M)
        return (jnp.abs(r[:, None] - pos[0]) <= 1) & (jnp.abs(r[None, :] - pos[1]) <= 1)

    def init_state(self, level, key):
        return KeyState(key=key, t=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False),
                        msg=jnp.array([2, MSG_NONE], jnp.int32), level=level, pos=level.start,
                        seen=self._visible(level.start), has_key=jnp.bool_(False), key_taken=jnp.bool_(False),
                        door_open=jnp.bool_(False))

    def _transition(self, st, action, key):
        lv = st.level
        is_move = action < 8
        d = jnp.asarray(DIRS)[jnp.minimum(action, 7)]
        target = st.pos + d
        diag = jnp.all(d != 0)
        wall = lv.walls[target[0], target[1]]  # the border keeps targets on the map
        to_door = jnp.all(target == lv.door)
        from_door = jnp.all(st.pos == lv.door)
        locked = to_door & ~st.door_open
        diag_in, diag_out = diag & to_door & ~locked, diag & from_door
        ok = is_move & ~wall & ~locked & ~diag_in & ~diag_out
        pos = jnp.where(ok, target, st.pos)
        on_key = jnp.all(pos == lv.key_pos) & ~st.key_taken
        success = jnp.all(pos == lv.stairs)
        move_msg = jnp.select([wall, locked, diag_in, diag_out, success, ok & on_key],
                              [3, 4, 5, 6, 13, 7], MSG_NONE)
        # pickup
        pick = (action == 8) & on_key
        pick_msg = jnp.where(pick, 8, 9)
        # apply
        near_door = jnp.max(jnp.abs(st.pos - lv.door)) <= 1
        unlock = (action == 9) & st.has_key & near_door & ~st.door_open
        apply_msg = jnp.select([~st.has_key, unlock], [11, 10], 12)
        msg0 = jnp.select([is_move, action == 8], [move_msg, pick_msg], apply_msg).astype(jnp.int32)
        st = st.replace(pos=pos, seen=st.seen | self._visible(pos), has_key=st.has_key | pick,
                        key_taken=st.key_taken | pick, door_open=st.door_open | unlock)
        return st, success.astype(jnp.float32), success, success, jnp.stack([msg0, jnp.int32(MSG_NONE)])

    def observe(self, st) -> Obs:
        lv, shape = st.level, (M, M)
        g = jnp.where(lv.walls, G_WALL, G_FLOOR)
        g = jnp.where(cell_mask(shape, lv.door), jnp.where(st.door_open, G_OPEN, G_LOCKED), g)
        g = jnp.where(cell_mask(shape, lv.start), G_UP, g)
        g = jnp.where(cell_mask(shape, lv.stairs), G_DOWN, g)
        g = jnp.where(cell_mask(shape, lv.key_pos) & ~st.key_taken, G_KEY, g)
        g = jnp.where(st.seen, g, G_BLANK)
        g = jnp.where(cell_mask(shape, st.pos), G_AGENT, g)
        return Obs(grid=g.astype(jnp.int32), message=st.msg)
