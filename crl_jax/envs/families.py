"""`room` with `families=True`: task families of the dark room whose every episode has its own layout.

Each task index is a FAMILY. A family's hidden fact is its goal (stairs) cell, a function of (`pool_seed`,
pool, family) only (`family_goal`). Every EPISODE draws its own layout from its reset key (`draw_layout`):
the start cell and `obstacles` interior stone cells (drawn `#` once seen; moving into one is a bump, like
the outer wall). A plan copied from another episode of the family starts elsewhere and meets other stones,
so it rarely reaches the goal, while a policy that knows the goal cell walks there (`goal_solver`).

Why the stones are interior only: with at most 3 of them among the inner (S-2)x(S-2) cells, the 8-connected
room stays connected (the outer ring always is, and every inner cell keeps a free neighbour), so every
layout is solvable without a search. Why no goal on a corner: a run of moves into a corner ends there from
anywhere (the walls funnel it), so a copied plan would succeed there whatever the layout.

Layout pools (`layouts`): a layout is an evaluation layout iff a hash of (goal, start, stones) falls in
the lowest `eval_permille` / 1000 of the hash range, as levels are split between pools in `base.py`. The
training env draws only training layouts (rejection, `fold_in(key, attempt)`); `for_evaluation()` is the
same env drawing only evaluation layouts, which the loop's evaluation plays (`actor.evaluate`). So held-in
evaluation = trained families at layouts never played in training, whatever the keys, and held-out = the
eval pool's families (never trained), also at evaluation layouts.

The query carries the family only (`query_observation = False`: the retrieval query is built from the task
token, not the first observation; `crl_jax.actor.experience.query_from_observation`): with the start cell in
the query, a moves archive would retrieve a plan played from the same start and copying would work again.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
from flax import struct

from crl_jax.envs.base import DIRS, G_AGENT, G_WALL, cell_mask, level_hash, sample_cells
from crl_jax.envs.room import Room, RoomLevel

LAYOUT_SALT = 0x4C41  # folds the episode key into its layout key (the state keeps the episode key itself)
MAX_OBSTACLES = 3  # more interior stones could cut a cell off (see the module docstring)


@struct.dataclass
class FamilyLevel(RoomLevel):
    stone: jax.Array = None  # [S, S] bool interior stone cells of this episode's layout


def goal_cells(size: int) -> jax.Array:
    """[S, S] bool: the cells a family's goal may be (every cell but the four corners)."""
    c = jnp.arange(size)
    edge = (c == 0) | (c == size - 1)
    return ~(edge[:, None] & edge[None, :])


def family_goal(pool_seed: int, pool_id: int, family, size: int) -> jax.Array:
    """[2] int32: the goal cell of `family` (a function of the pool seed, pool and family only)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(pool_seed), pool_id), family)
    u = jax.random.uniform(key, (size * size,))
    return sample_cells(u, goal_cells(size), 1)[0]


def draw_layout(key, goal, size: int, obstacles: int):
    """(start [2], stone [S, S] bool) of one episode: a start cell other than the goal, and `obstacles`
    distinct interior cells other than the start and the goal."""
    s = size
    u = jax.random.uniform(key, (2 * s * s,))
    start = sample_cells(u[: s * s], ~cell_mask((s, s), goal), 1)[0]
    inner = jnp.zeros((s, s), bool).at[1:s - 1, 1:s - 1].set(True)
    free = inner & ~cell_mask((s, s), goal) & ~cell_mask((s, s), start)
    stone = jnp.zeros((s, s), bool)
    if obstacles:
        cells = sample_cells(u[s * s:], free, obstacles)
        stone = stone.at[cells[:, 0], cells[:, 1]].set(True)
    return start, stone


class FamilyRoom(Room):
    """The dark room's family variant (`make("room", families=True, obstacles=3, ...)`)."""

    task_text = "Find the staircase down (>) of this room family and step on it."
    query_observation = False  # retrieval sees the family only (module docstring)
    episode_layouts = True

    def __init__(self, *, obstacles: int = 3, layouts: str = "train", **kw):
        if kw.get("traps") or kw.get("monster"):
            raise ValueError("room: families=True supports neither traps nor monsters")
        super().__init__(**kw)
        if not 0 <= obstacles <= MAX_OBSTACLES or (obstacles and self.size < 4):
            raise ValueError(f"room: obstacles must be in [0, {MAX_OBSTACLES}] (and size >= 4 for any), "
                             f"got {obstacles} at size {self.size}")
        if layouts not in ("train", "eval"):
            raise ValueError(f"room: layouts must be 'train' or 'eval', got {layouts!r}")
        self.obstacles, self.layouts = int(obstacles), layouts

    def for_evaluation(self) -> "FamilyRoom":
        """The same families drawing evaluation layouts only (never drawn by this env in training)."""
        ev = copy.copy(self)
        ev.layouts = "eval"
        return ev

    # ---- families and layouts -----------------------------------------------------------------
    def family_goal(self, task) -> jax.Array:
        """[2] int32 goal cell of task (family) index `task` (modulo `num_tasks`)."""
        task = jnp.mod(jnp.asarray(task, jnp.int32), self.num_tasks)
        return family_goal(self.pool_seed, {"train": 0, "eval": 1}[self.pool], task, self.size)

    def layout_level(self, goal, start, stone) -> FamilyLevel:
        no = jnp.array([-1, -1], jnp.int32)
        return FamilyLevel(start=start, stairs=goal, trap=no, mon_kind=jnp.int32(0),
                           mon_pos=jnp.full((2, 2), -1, jnp.int32), mon_alive=jnp.zeros((2,), bool),
                           mon_hp=jnp.zeros((2,), jnp.int32), stone=stone)

    def is_eval_layout(self, level: FamilyLevel) -> jax.Array:
        """[] bool: `level`'s layout belongs to the evaluation layouts."""
        return (level_hash(self.level_code(level)) % jnp.uint32(1000)) < jnp.uint32(self.eval_permille)

    def episode_level(self, key, task) -> FamilyLevel:
        """The level of an episode of family `task` reset with `key`: the first layout drawn from
        `fold_in(fold_in(key, LAYOUT_SALT), attempt)` that lies in this env's layout pool."""
        goal = self.family_goal(task)
        base = jax.random.fold_in(key, LAYOUT_SALT)
        want_eval = self.layouts == "eval"

        def draw(i):
            return self.layout_level(goal, *draw_layout(jax.random.fold_in(base, i), goal, self.size,
                                                        self.obstacles))

        def cond(carry):
            return self.is_eval_layout(carry[1]) != want_eval

        def body(carry):
            return carry[0] + 1, draw(carry[0] + 1)

        return jax.lax.while_loop(cond, body, (jnp.int32(0), draw(0)))[1]

    # ---- Env hooks ----------------------------------------------------------------------------
    def generate(self, key) -> FamilyLevel:
        k1, k2 = jax.random.split(key)
        goal = sample_cells(jax.random.uniform(k1, (self.size ** 2,)), goal_cells(self.size), 1)[0]
        return self.layout_level(goal, *draw_layout(k2, goal, self.size, self.obstacles))

    def level_code(self, lv: FamilyLevel):
        return jnp.concatenate([lv.stairs, lv.start, lv.stone.reshape(-1)]).astype(jnp.int32)

    def task_level(self, task) -> FamilyLevel:
        """A family's level at a fixed layout (key 0): what a level-keyed caller sees of family `task`."""
        return self.episode_level(jax.random.key(0), task)

    def reset(self, key, task):
        state = self.init_state(self.episode_level(key, task), key)
        return state, self.observe(state)

    def _transition(self, st, action, key):
        target = st.pos + jnp.asarray(DIRS)[action]
        s = self.size
        in_room = jnp.all((target >= 0) & (target < s))
        blocked = in_room & st.level.stone[jnp.clip(target[0], 0, s - 1), jnp.clip(target[1], 0, s - 1)]
        moved, reward, term, success, msg = super()._transition(st, action, key)
        bump = jnp.array([2 + 1, 0], jnp.int32)  # "It's solid stone." (the room's own message)
        keep = st.replace(pos=st.pos, seen=st.seen)
        moved = jax.tree.map(lambda a, b: jnp.where(blocked, a, b), keep, moved)
        return (moved, jnp.where(blocked, 0.0, reward), term & ~blocked, success & ~blocked,
                jnp.where(blocked, bump, msg))

    def glyph_map(self, st):
        g = super().glyph_map(st)
        return jnp.where(st.level.stone & st.seen & (g != G_AGENT), G_WALL, g)


def make_room(*, families: bool = False, **kw) -> Room:
    """`make("room", ...)`: the plain room, or with `families=True` its family variant (`FamilyRoom`)."""
    return FamilyRoom(**kw) if families else Room(**kw)


make_room.param_classes = (FamilyRoom,)  # its keywords beyond `families` (config_checks.env_param_types)


def goal_solver(env: FamilyRoom, state, key) -> jax.Array:
    """Scripted policy that knows the family's goal: the move that brings the agent closest (Chebyshev, then
    Euclidean) to the goal among the moves onto a cell it does not see as stone (`#`) or outside the room;
    ties broken by `key`. Reads only the goal and what the agent sees (its 3x3 neighbourhood)."""
    s = env.size
    cand = state.pos[None, :] + jnp.asarray(DIRS)
    inside = jnp.all((cand >= 0) & (cand < s), axis=-1)
    c = jnp.clip(cand, 0, s - 1)
    stone = state.level.stone[c[:, 0], c[:, 1]]  # adjacent cells are always in view
    d = cand - state.level.stairs[None, :]
    score = -(jnp.max(jnp.abs(d), -1) * 10.0 + jnp.sum(d * d, -1) * 0.1) + jax.random.uniform(key, (8,)) * 0.05
    return jnp.argmax(jnp.where(inside & ~stone, score, -jnp.inf)).astype(jnp.int32)
