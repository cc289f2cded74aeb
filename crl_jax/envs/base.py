"""Environment API shared by the pure-JAX grid environments (gymnax / jumanji style).

An environment is a Python object holding only static configuration; all dynamic data lives in a
`flax.struct` state pytree, so `reset` / `step` are pure and jit- / vmap-able:

- `env.reset(key, task) -> (state, obs)`: `task` is an int index into the env's finite seeded pool
  (`env.num_tasks`, taken modulo `num_tasks`); `key` seeds the episode's own dynamics (monster moves,
  slippery ice), carried in `state.key`.
- `env.step(state, action) -> (state, obs, reward f32[], done bool[], info)`; `info` holds int32
  scalars `success` (the episode has reached its goal; stays 1 afterwards), `invalid` (this turn's
  action was -1 / out of range), `truncated` (this turn hit `max_steps`).
- After `done` a step is absorbing: state unchanged, reward 0, so fixed-length `lax.scan`s work.
- Action -1 (or any out-of-range id) is an invalid model output: it consumes the turn (step count
  +1, may truncate), leaves the rest of the state unchanged and sets `info["invalid"] = 1`.
- `obs` is an `Obs` of fixed-shape int arrays: `grid` [H, W] glyph ids (see `GLYPHS`) and `message`
  [2] message ids into `env.messages` (joined by two spaces on one line, as NetHack does; 0 = nothing).

Task generation is separate from dynamics: `env.generate(key) -> level` draws a level, and
`env.task_level(task)` picks the level of a task. Train and eval pools are disjoint by construction:
a level belongs to the eval pool iff a hash of its defining integers (`env.level_code`) falls in the
lowest `eval_permille` / 1000 of the hash range; a task's level is the first candidate drawn from
`fold_in(fold_in(key(pool_seed), pool_id), task)` (and then `fold_in(., attempt)`) that lies in its pool.

An env whose episodes draw their own layout from the reset key (`episode_layouts`, the room's families) splits
layouts the same way: `for_evaluation()` returns it drawing only the layouts training never draws (every other
env returns itself), and `query_observation = False` keeps the first observation out of the retrieval query.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.glyphs import (  # noqa: F401  (re-exported: the envs import them from here)
    COMMON_MESSAGES,
    G_AGENT,
    G_BLANK,
    G_BOULDER,
    G_BOULDER_ON_TARGET,
    G_DOWN,
    G_FLOOR,
    G_GOAL,
    G_HOLE,
    G_ICE,
    G_KEY,
    G_LOCKED,
    G_MONSTER0,
    G_OPEN,
    G_TARGET,
    G_TRAP,
    G_UP,
    G_WALL,
    GLYPH_CHARS,
    GLYPHS,
    MSG_INVALID,
    MSG_NONE,
    NUM_GLYPHS,
    NUM_MSG_SLOTS,
    Obs,
)
from crl_jax.envs.render import render_text

POOL_IDS = {"train": 0, "eval": 1}

# The 8 NetHack compass moves (row, col) deltas, in the order of the action names.
DIR_NAMES = ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
DIRS = np.array([[-1, 0], [0, 1], [1, 0], [0, -1], [-1, 1], [1, 1], [1, -1], [-1, -1]], np.int32)


def level_hash(code: jax.Array) -> jax.Array:
    """uint32 FNV-1a-style hash of an int32 vector [K] with a final avalanche (deterministic)."""
    code = jnp.asarray(code, jnp.int32).reshape(-1).astype(jnp.uint32)

    def body(h, x):
        return (h ^ x) * jnp.uint32(16777619), None

    h, _ = jax.lax.scan(body, jnp.uint32(2166136261), code)
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def sample_cells(u: jax.Array, mask: jax.Array, n: int) -> jax.Array:
    """n distinct cells [n, 2], uniform among the True cells of `mask` [H, W] (needs >= n of them).

    `u` [H * W] are uniform(0, 1) draws: callers draw all of a step's randomness with one
    `jax.random.uniform` call, since every separate call compiles its own threefry graph.
    """
    h, w = mask.shape
    scores = u + mask.reshape(-1).astype(jnp.float32) * 2.0
    idx = jax.lax.top_k(scores, n)[1]
    return jnp.stack([idx // w, idx % w], axis=-1).astype(jnp.int32)


def randint_u(u: jax.Array, low, high) -> jax.Array:
    """Integer in [low, high) from a uniform(0, 1) draw `u`."""
    return jnp.minimum(low + jnp.floor(u * (high - low)).astype(jnp.int32), high - 1)


def categorical_u(u: jax.Array, probs) -> jax.Array:
    """Index drawn from the (unnormalised, static) weights `probs` by inverse CDF of `u`."""
    p = np.asarray(probs, np.float64)
    cdf = jnp.asarray(np.cumsum(p) / p.sum(), jnp.float32)
    return jnp.minimum(jnp.sum(u >= cdf), len(p) - 1).astype(jnp.int32)


def cell_mask(shape, cell) -> jax.Array:
    """[H, W] bool, True at `cell` [2]."""
    rows = jnp.arange(shape[0])[:, None]
    cols = jnp.arange(shape[1])[None, :]
    return (rows == cell[0]) & (cols == cell[1])


def egocentric_crop(glyphs: jax.Array, pos: jax.Array, size: int) -> jax.Array:
    """[size, size] crop of `glyphs` [H, W] centred on `pos`, blank (stone) outside the map."""
    r = size // 2
    padded = jnp.pad(glyphs, r, constant_values=G_BLANK)
    return jax.lax.dynamic_slice(padded, (pos[0], pos[1]), (size, size))


class Env:
    """Base class. Subclasses set the class attributes and implement the `_`-methods."""

    name: str = "env"
    action_names: tuple[str, ...] = ()
    env_messages: tuple[str, ...] = ()
    task_text: str = ""
    query_observation: bool = True  # the retrieval query holds the first observation (after the task text)
    episode_layouts: bool = False  # each episode draws its own layout from its reset key (not only the task's)

    def __init__(self, *, pool: str = "train", num_tasks: int | None = None, pool_seed: int = 0,
                 max_steps: int = 30, eval_permille: int = 200, legend: bool = True):
        if pool not in POOL_IDS:
            raise ValueError(f"make(...): pool must be 'train' or 'eval', got {pool!r}")
        if num_tasks is None:
            num_tasks = 1000 if pool == "train" else 200
        if num_tasks < 1:
            raise ValueError(f"make(...): num_tasks must be >= 1, got {num_tasks}")
        if not 0 < eval_permille < 1000:
            raise ValueError(f"make(...): eval_permille must be in (0, 1000), got {eval_permille}")
        self.pool = pool
        self.num_tasks = int(num_tasks)
        self.pool_seed = int(pool_seed)
        self.max_steps = int(max_steps)
        self.eval_permille = int(eval_permille)
        self.legend = bool(legend)  # text view ends with "Legend: ..." (off: shorter prompts for tiny models)
        self.messages = COMMON_MESSAGES + tuple(self.env_messages)

    # ---- subclass hooks ------------------------------------------------------------------
    def generate(self, key: jax.Array) -> Any:
        """Draw one level (pytree) from `key`."""
        raise NotImplementedError

    def level_code(self, level: Any) -> jax.Array:
        """int32 [K]: the integers that define a level (for pool membership and identity tests)."""
        raise NotImplementedError

    def init_state(self, level: Any, key: jax.Array) -> Any:
        raise NotImplementedError

    def _transition(self, state: Any, action: jax.Array, key: jax.Array):
        """Valid action -> (state, reward f32[], terminated bool[], success bool[], message [2] i32)."""
        raise NotImplementedError

    def observe(self, state: Any) -> Obs:
        raise NotImplementedError

    # ---- API ---------------------------------------------------------------------------------
    @property
    def num_actions(self) -> int:
        return len(self.action_names)

    def msg_id(self, text: str) -> int:
        return self.messages.index(text)

    def in_pool(self, level: Any) -> jax.Array:
        is_eval = (level_hash(self.level_code(level)) % jnp.uint32(1000)) < jnp.uint32(self.eval_permille)
        return is_eval if self.pool == "eval" else ~is_eval

    def task_level(self, task) -> Any:
        task = jnp.mod(jnp.asarray(task, jnp.int32), self.num_tasks)
        base = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.pool_seed), POOL_IDS[self.pool]), task)

        def cond(carry):
            return ~self.in_pool(carry[1])

        def body(carry):
            i = carry[0] + 1
            return i, self.generate(jax.random.fold_in(base, i))

        _, level = jax.lax.while_loop(cond, body, (jnp.int32(0), self.generate(jax.random.fold_in(base, 0))))
        return level

    def for_evaluation(self) -> "Env":
        """The env the loop's evaluation plays: this one (an env with per-episode layouts returns itself drawing
        only layouts that training never draws)."""
        return self

    def reset(self, key: jax.Array, task) -> tuple[Any, Obs]:
        state = self.init_state(self.task_level(task), key)
        return state, self.observe(state)

    def step(self, state: Any, action) -> tuple[Any, Obs, jax.Array, jax.Array, dict]:
        action = jnp.asarray(action, jnp.int32)
        invalid = (action < 0) | (action >= self.num_actions)
        key, sub = jax.random.split(state.key)
        moved, reward, terminated, success, msg = self._transition(
            state, jnp.clip(action, 0, self.num_actions - 1), sub)
        moved = moved.replace(key=key, msg=msg, success=success)
        # Invalid output: only the turn counter and the message change.
        kept = state.replace(msg=jnp.array([MSG_INVALID, MSG_NONE], jnp.int32))
        new = jax.tree.map(lambda a, b: jnp.where(invalid, a, b), kept, moved)
        reward = jnp.where(invalid, 0.0, reward).astype(jnp.float32)
        terminated = terminated & ~invalid
        t = state.t + 1
        truncated = (t >= self.max_steps) & ~terminated
        new = new.replace(t=t, done=terminated | truncated)
        # Absorbing after done.
        out = jax.tree.map(lambda old, nw: jnp.where(state.done, old, nw), state, new)
        live = ~state.done
        info = {
            "success": out.success.astype(jnp.int32),
            "invalid": (invalid & live).astype(jnp.int32),
            "truncated": (truncated & live).astype(jnp.int32),
        }
        return out, self.observe(out), jnp.where(live, reward, 0.0), out.done, info

    def render(self, state_or_obs: Any) -> str:
        """Host-side text of a single (unbatched) state or obs: the exact text the model sees."""
        return render_text(self, state_or_obs)

    def as_obs(self, state_or_obs: Any) -> Obs:
        return state_or_obs if isinstance(state_or_obs, Obs) else self.observe(state_or_obs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pool={self.pool!r}, num_tasks={self.num_tasks}, max_steps={self.max_steps})"
