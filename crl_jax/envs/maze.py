"""`maze`: MazeWalk-style 9x9 maze: a perfect maze of 4x4 cells (at odd coordinates) with its walls,
random start (`<`) and stairs down (`>`) on cells; 8 compass moves (a diagonal move needs an open
target cell, as NetHack lets you squeeze between wall corners); reward 1 on the stairs.

Generation: randomised Prim's algorithm on the 4x4 cell graph (15 fixed iterations, so it jits).
`dark=True` shows only the 8 neighbours and remembers what was seen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from crl_jax.envs.base import (DIR_NAMES, DIRS, G_AGENT, G_BLANK, G_DOWN, G_FLOOR, G_UP, G_WALL, MSG_NONE, Env,
                               Obs, cell_mask, sample_cells)

N = 4  # cells per side
SIZE = 2 * N + 1
_CELL_DIRS = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], np.int32)


@struct.dataclass
class MazeLevel:
    walls: jax.Array  # [9, 9] bool
    start: jax.Array  # [2]
    stairs: jax.Array  # [2]


@struct.dataclass
class MazeState:
    key: jax.Array
    t: jax.Array
    done: jax.Array
    success: jax.Array
    msg: jax.Array
    level: MazeLevel
    pos: jax.Array
    seen: jax.Array  # [9, 9] bool


def prim_maze(u: jax.Array) -> jax.Array:
    """walls [9, 9] bool of a perfect maze from uniforms u [(N*N - 1) * N*N*4 + N*N]."""
    nn = N * N
    first = jnp.argmax(u[:nn])
    in_tree = jnp.zeros((nn,), bool).at[first].set(True)
    walls = jnp.ones((SIZE, SIZE), bool).at[2 * (first // N) + 1, 2 * (first % N) + 1].set(False)
    rc = jnp.stack(jnp.meshgrid(jnp.arange(N), jnp.arange(N), indexing="ij"), -1).reshape(nn, 1, 2)
    nb = rc + jnp.asarray(_CELL_DIRS)[None]  # [nn, 4, 2]
    nb_ok = jnp.all((nb >= 0) & (nb < N), -1)
    nb_idx = jnp.clip(nb[..., 0], 0, N - 1) * N + jnp.clip(nb[..., 1], 0, N - 1)

    def body(i, carry):
        in_tree, walls = carry
        # Candidate edges: a cell outside the tree next to a cell inside it.
        cand = (~in_tree)[:, None] & nb_ok & in_tree[nb_idx]
        score = jnp.where(cand.reshape(-1), jax.lax.dynamic_slice(u, (nn + i * nn * 4,), (nn * 4,)), -1.0)
        e = jnp.argmax(score)
        c, d = e // 4, e % 4
        r0, c0 = 2 * (c // N) + 1, 2 * (c % N) + 1
        dr, dc = jnp.asarray(_CELL_DIRS)[d]
        walls = walls.at[r0, c0].set(False).at[r0 + dr, c0 + dc].set(False)
        return in_tree.at[c].set(True), walls

    _, walls = jax.lax.fori_loop(0, nn - 1, body, (in_tree, walls))
    return walls


class Maze(Env):
    name = "maze"
    action_names = DIR_NAMES
    env_messages = ("Hello Agent, welcome to the maze!", "It's a wall.", "There is a staircase down here.")
    task_text = "Find the staircase down (>) in the maze and step on it."

    def __init__(self, *, dark: bool = False, max_steps: int = 50, **kw):
        super().__init__(max_steps=max_steps, **kw)
        self.dark = bool(dark)

    def generate(self, key) -> MazeLevel:
        nn = N * N
        u = jax.random.uniform(key, (nn + (nn - 1) * nn * 4 + nn,))
        walls = prim_maze(u[: nn + (nn - 1) * nn * 4])
        cells = sample_cells(u[-nn:], jnp.ones((N, N), bool), 2) * 2 + 1
        return MazeLevel(walls=walls, start=cells[0], stairs=cells[1])

    def level_code(self, lv):
        return jnp.concatenate([lv.walls.reshape(-1).astype(jnp.int32), lv.start, lv.stairs])

    def _visible(self, pos):
        if not self.dark:
            return jnp.ones((SIZE, SIZE), bool)
        r = jnp.arange(SIZE)
        return (jnp.abs(r[:, None] - pos[0]) <= 1) & (jnp.abs(r[None, :] - pos[1]) <= 1)

    def init_state(self, level, key):
        return MazeState(key=key, t=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False),
                         msg=jnp.array([2, MSG_NONE], jnp.int32), level=level, pos=level.start,
                         seen=self._visible(level.start))

    def _transition(self, st, action, key):
        target = st.pos + jnp.asarray(DIRS)[action]
        inside = jnp.all((target >= 0) & (target < SIZE))
        free = inside & ~st.level.walls[jnp.clip(target[0], 0, SIZE - 1), jnp.clip(target[1], 0, SIZE - 1)]
        pos = jnp.where(free, target, st.pos)
        success = jnp.all(pos == st.level.stairs)
        msg0 = jnp.select([~free, success], [3, 4], MSG_NONE).astype(jnp.int32)
        st = st.replace(pos=pos, seen=st.seen | self._visible(pos))
        return st, success.astype(jnp.float32), success, success, jnp.stack([msg0, jnp.int32(MSG_NONE)])

    def observe(self, st) -> Obs:
        lv, shape = st.level, (SIZE, SIZE)
        g = jnp.where(lv.walls, G_WALL, G_FLOOR)
        g = jnp.where(cell_mask(shape, lv.start), G_UP, g)
        g = jnp.where(cell_mask(shape, lv.stairs), G_DOWN, g)
        g = jnp.where(st.seen, g, G_BLANK)
        g = jnp.where(cell_mask(shape, st.pos), G_AGENT, g)
        return Obs(grid=g.astype(jnp.int32), message=st.msg)
