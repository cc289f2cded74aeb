"""`sokoban`: a 6x6 room (8x8 map with its walls), 2 boulders `0`, 2 targets `_` (`*` a boulder on a
target). 4 moves; walking into a boulder pushes it when the cell behind is free floor. Reward 1 only
when both boulders are on targets (that ends the episode).

Generation by reverse play, so every level is solvable: place `n_walls` random inner walls, the targets
with a boulder on each and the player; then `reverse_steps` random reverse moves (the player steps to a
free cell and, with prob `pull_prob`, pulls the boulder behind it along); each is the inverse of a legal
push or walk. Redrawn until at least one boulder is off its target.
"""

from __future__ import annotations

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from crl_jax.envs.base import (DIRS, G_AGENT, G_BOULDER, G_BOULDER_ON_TARGET, G_FLOOR, G_TARGET, G_WALL, MSG_NONE,
                               Env, Obs, cell_mask, randint_u, sample_cells)

M = 8
NB = 2


@struct.dataclass
class SokoLevel:
    walls: jax.Array  # [8, 8] bool
    targets: jax.Array  # [2, 2]
    boxes: jax.Array  # [2, 2]
    start: jax.Array  # [2]


@struct.dataclass
class SokoState:
    key: jax.Array
    t: jax.Array
    done: jax.Array
    success: jax.Array
    msg: jax.Array
    level: SokoLevel
    pos: jax.Array
    boxes: jax.Array  # [2, 2]


def _box_at(boxes, cell):
    """[NB] bool: which boulder is on `cell`."""
    return jnp.all(boxes == cell, axis=-1)


def _solved(boxes, targets):
    return jnp.all(jnp.any(jnp.all(boxes[:, None, :] == targets[None, :, :], -1), -1))


class Sokoban(Env):
    name = "sokoban"
    action_names = ("north", "east", "south", "west")
    env_messages = ("Push both boulders (0) onto the targets (_).", "It's a wall.",
                    "With great effort you move the boulder.", "You try to move the boulder, but in vain.",
                    "The boulder fills a target.", "Both boulders are on their targets!")
    task_text = "Push both boulders (0) onto the two targets (_). Boulders can only be pushed, not pulled."

    def __init__(self, *, n_walls: int = 2, reverse_steps: int = 40, pull_prob: float = 0.8, max_steps: int = 60,
                 **kw):
        super().__init__(max_steps=max_steps, **kw)
        self.n_walls, self.reverse_steps, self.pull_prob = int(n_walls), int(reverse_steps), float(pull_prob)

    def _draw(self, key) -> SokoLevel:
        u = jax.random.uniform(key, (2 * M * M + 2 * self.reverse_steps,))
        inner = jnp.zeros((M, M), bool).at[1:-1, 1:-1].set(True)
        walls = ~inner
        if self.n_walls:
            wc = sample_cells(u[: M * M], inner, self.n_walls)
            for i in range(self.n_walls):
                walls = walls | cell_mask((M, M), wc[i])
        cells = sample_cells(u[M * M: 2 * M * M], ~walls, NB + 1)
        targets, player = cells[:NB], cells[NB]
        ur = u[2 * M * M:].reshape(self.reverse_steps, 2)

        def body(carry, uu):
            pos, boxes = carry
            d = jnp.asarray(DIRS)[randint_u(uu[0], 0, 4)]
            q = pos + d
            free = ~walls[q[0], q[1]] & ~jnp.any(_box_at(boxes, q))
            behind = _box_at(boxes, pos - d) & (uu[1] < self.pull_prob) & free
            boxes = jnp.where(behind[:, None], pos[None, :], boxes)
            return (jnp.where(free, q, pos), boxes), None

        (player, boxes), _ = jax.lax.scan(body, (player, targets), ur)
        return SokoLevel(walls=walls, targets=targets, boxes=boxes, start=player)

    def generate(self, key) -> SokoLevel:
        def cond(c):
            return _solved(c[1].boxes, c[1].targets)

        def body(c):
            return c[0] + 1, self._draw(jax.random.fold_in(key, c[0] + 1))

        return jax.lax.while_loop(cond, body, (jnp.int32(0), self._draw(jax.random.fold_in(key, 0))))[1]

    def level_code(self, lv):
        # Boulders are interchangeable: sort them so that the code names the position, not the order.
        b = lv.boxes[:, 0] * M + lv.boxes[:, 1]
        t = lv.targets[:, 0] * M + lv.targets[:, 1]
        return jnp.concatenate([lv.walls.reshape(-1).astype(jnp.int32), jnp.sort(b), jnp.sort(t),
                                lv.start]).astype(jnp.int32)

    def init_state(self, level, key):
        return SokoState(key=key, t=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False),
                         msg=jnp.array([2, MSG_NONE], jnp.int32), level=level, pos=level.start, boxes=level.boxes)

    def _transition(self, st, action, key):
        walls, d = st.level.walls, jnp.asarray(DIRS)[action]
        q = st.pos + d
        q2 = jnp.clip(q + d, 0, M - 1)
        box = _box_at(st.boxes, q)
        pushing = jnp.any(box)
        can_push = pushing & ~walls[q2[0], q2[1]] & ~jnp.any(_box_at(st.boxes, q2))
        wall = walls[q[0], q[1]]
        ok = ~wall & (~pushing | can_push)
        boxes = jnp.where((box & can_push)[:, None], q2[None, :], st.boxes)
        pos = jnp.where(ok, q, st.pos)
        success = _solved(boxes, st.level.targets)
        on_target = can_push & jnp.any(jnp.all(q2 == st.level.targets, -1))
        msg0 = jnp.select([wall, pushing & ~can_push, success, on_target, can_push], [3, 5, 7, 6, 4], MSG_NONE)
        st = st.replace(pos=pos, boxes=boxes)
        return st, success.astype(jnp.float32), success, success, jnp.stack([msg0, MSG_NONE]).astype(jnp.int32)

    def observe(self, st) -> Obs:
        shape = (M, M)
        g = jnp.where(st.level.walls, G_WALL, G_FLOOR)
        tmask = jnp.zeros(shape, bool)
        bmask = jnp.zeros(shape, bool)
        for i in range(NB):
            tmask = tmask | cell_mask(shape, st.level.targets[i])
            bmask = bmask | cell_mask(shape, st.boxes[i])
        g = jnp.where(tmask, G_TARGET, g)
        g = jnp.where(bmask, jnp.where(tmask, G_BOULDER_ON_TARGET, G_BOULDER), g)
        g = jnp.where(cell_mask(shape, st.pos), G_AGENT, g)
        return Obs(grid=g.astype(jnp.int32), message=st.msg)


def bfs_solve(walls: np.ndarray, boxes, targets, start, max_states: int = 200_000) -> int | None:
    """Host-side reference: the fewest moves that put every boulder on a target, or None."""
    walls = np.asarray(walls)
    targets = frozenset(map(tuple, np.asarray(targets).tolist()))
    s0 = (tuple(np.asarray(start).tolist()), frozenset(map(tuple, np.asarray(boxes).tolist())))
    seen, queue = {s0}, deque([(s0, 0)])
    while queue and len(seen) < max_states:
        (p, bx), n = queue.popleft()
        if bx == targets:
            return n
        for dr, dc in ((-1, 0), (0, 1), (1, 0), (0, -1)):
            q = (p[0] + dr, p[1] + dc)
            if walls[q]:
                continue
            nb = bx
            if q in bx:
                q2 = (q[0] + dr, q[1] + dc)
                if walls[q2] or q2 in bx:
                    continue
                nb = (bx - {q}) | {q2}
            s = (q, nb)
            if s not in seen:
                seen.add(s)
                queue.append((s, n + 1))
    return None
