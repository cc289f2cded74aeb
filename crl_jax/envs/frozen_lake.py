"""`frozen_lake`: 6x6 frozen lake (gym FrozenLake semantics on random maps).

Start top-left, goal `G` bottom-right, holes `O` (each other cell a hole with prob 0.2, redrawn until a
4-connected path exists). 4 moves; a move off the lake leaves the agent in place. `slippery=True`: the
intended direction with prob 1/3, each perpendicular one with prob 1/3 (gym's rule). A hole ends the
episode with reward 0, the goal with reward 1. The whole lake is visible.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from crl_jax.envs.base import DIRS, G_AGENT, G_GOAL, G_HOLE, G_ICE, MSG_NONE, Env, Obs, cell_mask, randint_u

S = 6


@struct.dataclass
class LakeLevel:
    holes: jax.Array  # [6, 6] bool


@struct.dataclass
class LakeState:
    key: jax.Array
    t: jax.Array
    done: jax.Array
    success: jax.Array
    msg: jax.Array
    level: LakeLevel
    pos: jax.Array


def reachable(free: jax.Array, start) -> jax.Array:
    """[H, W] bool: cells 4-connected to `start` through `free` cells (fixed-iteration flood fill)."""
    h, w = free.shape
    r = cell_mask((h, w), start) & free

    def body(_, r):
        p = jnp.pad(r, 1)
        grown = r | p[:-2, 1:-1] | p[2:, 1:-1] | p[1:-1, :-2] | p[1:-1, 2:]
        return grown & free

    return jax.lax.fori_loop(0, h * w, body, r)


class FrozenLake(Env):
    name = "frozen_lake"
    action_names = ("north", "east", "south", "west")
    env_messages = ("You stand at the edge of a frozen lake.", "You cannot go that way.",
                    "You fall through a hole in the ice!", "You reach the goal!", "You slip on the ice!")
    task_text = "Cross the frozen lake to the goal (G) without falling into a hole (O)."

    def __init__(self, *, slippery: bool = False, hole_prob: float = 0.2, max_steps: int = 40, **kw):
        super().__init__(max_steps=max_steps, **kw)
        self.slippery, self.hole_prob = bool(slippery), float(hole_prob)
        if slippery:
            self.task_text += " The ice is slippery: you may slide sideways."

    def generate(self, key) -> LakeLevel:
        def draw(k):
            holes = jax.random.uniform(k, (S, S)) < self.hole_prob
            return holes.at[0, 0].set(False).at[S - 1, S - 1].set(False)

        def cond(c):
            return ~reachable(~c[1], jnp.array([0, 0]))[S - 1, S - 1]

        def body(c):
            return c[0] + 1, draw(jax.random.fold_in(key, c[0] + 1))

        _, holes = jax.lax.while_loop(cond, body, (jnp.int32(0), draw(jax.random.fold_in(key, 0))))
        return LakeLevel(holes=holes)

    def level_code(self, lv):
        return lv.holes.reshape(-1).astype(jnp.int32)

    def init_state(self, level, key):
        return LakeState(key=key, t=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False),
                         msg=jnp.array([2, MSG_NONE], jnp.int32), level=level, pos=jnp.zeros((2,), jnp.int32))

    def _transition(self, st, action, key):
        # Perpendicular directions of north/east/south/west are the neighbours in that cyclic order.
        slip = randint_u(jax.random.uniform(key), 0, 3) - 1 if self.slippery else jnp.int32(0)
        a = jnp.mod(action + slip, 4)
        target = st.pos + jnp.asarray(DIRS)[a]
        inside = jnp.all((target >= 0) & (target < S))
        pos = jnp.where(inside, target, st.pos)
        hole = st.level.holes[pos[0], pos[1]]
        success = jnp.all(pos == S - 1)
        msg0 = jnp.select([hole, success, ~inside], [4, 5, 3], MSG_NONE)
        msg1 = jnp.where(slip != 0, 6, MSG_NONE)
        return (st.replace(pos=pos), success.astype(jnp.float32), hole | success, success,
                jnp.stack([msg0, msg1]).astype(jnp.int32))

    def observe(self, st) -> Obs:
        g = jnp.where(st.level.holes, G_HOLE, G_ICE)
        g = g.at[S - 1, S - 1].set(G_GOAL)
        g = jnp.where(cell_mask((S, S), st.pos), G_AGENT, g)
        return Obs(grid=g.astype(jnp.int32), message=st.msg)
