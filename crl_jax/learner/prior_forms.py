"""The entry forms' synthetic prior data (`extraction.forms`, METHOD.md §6): skills, never answers.

- actor, "go to the named cell, avoiding what it sees": a random target cell shown as a FACT tip
  (`<TIP> <r{i}> <c{j}>`), the hero at a random cell of a random grid; target = uniform over the compass moves
  that reduce the Chebyshev distance to the target without entering a cell the view shows as blocked
  (`BLOCKED`: stone or unseen blank, wall, trap, boulder, hole, locked door). Where no move does, the
  unblocked moves that come closest; where every move is blocked, all moves.
- extractor, "write an episode in either form": after the op token the form is uniform over MOVES / FACT
  (which to write is left to RL); after MOVES the moves are copied, after FACT the episode's end cell, which
  the distillation prompt shows after the moves (`distill.distill_prompts(end_cell=...)`).

Every draw comes from the row's key: the task segment, the target or end cell and the grid are independent,
so no level or family token is ever paired with a fact (tests assert it over the data).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.base import (DIR_NAMES, DIRS, G_AGENT, G_BLANK, G_BOULDER, G_DOWN, G_FLOOR, G_HOLE, G_LOCKED,
                               G_TRAP, G_UP, G_WALL, Obs)
from crl_jax.envs.compact import probe_obs

# Cells a move must not enter (what the scripted explorer avoids, `crl_jax.envs.scripted`; plus boulders and holes)
BLOCKED = np.array([G_BLANK, G_WALL, G_TRAP, G_LOCKED, G_BOULDER, G_HOLE], np.int32)
# Glyphs of the random grids (floor most often, every kind of obstacle present)
_CELLS = np.array([G_FLOOR, G_FLOOR, G_FLOOR, G_FLOOR, G_UP, G_DOWN, G_BLANK, G_WALL, G_WALL, G_TRAP, G_BOULDER],
                  np.int32)
FACT_TIP_P = 0.5  # share of the tip rows whose tip is a FACT (the others a plan of moves)


def move_deltas(action_names) -> tuple[np.ndarray, np.ndarray]:
    """(deltas [A, 2] int32, is_move [A] bool) of an env's actions: the compass moves' (row, col) steps."""
    names = list(action_names)
    d = np.zeros((len(names), 2), np.int32)
    m = np.zeros((len(names),), bool)
    for a, n in enumerate(names):
        if n in DIR_NAMES:
            d[a], m[a] = DIRS[DIR_NAMES.index(n)], True
    return d, m


def goto_moves(grid, target, deltas, is_move):
    """[A] float32: the "go to `target`" distribution for the hero (G_AGENT) on `grid` [H, W]: uniform over the
    moves that reduce the Chebyshev distance to `target` [2] and enter no `BLOCKED` cell (outside the grid is
    stone); else over the unblocked moves that come closest; else over every move. All zero when the hero
    stands on the target (nothing to learn there)."""
    h, w = grid.shape
    flat = jnp.argmax((grid == G_AGENT).reshape(-1))
    pos = jnp.stack([flat // w, flat % w])
    nxt = pos[None] + jnp.asarray(deltas)  # [A, 2]
    inside = (nxt[:, 0] >= 0) & (nxt[:, 0] < h) & (nxt[:, 1] >= 0) & (nxt[:, 1] < w)
    cell = grid[jnp.clip(nxt[:, 0], 0, h - 1), jnp.clip(nxt[:, 1], 0, w - 1)]
    free = jnp.asarray(is_move) & inside & ~(cell[:, None] == jnp.asarray(BLOCKED)).any(-1)
    d_now = jnp.max(jnp.abs(target - pos))
    d_next = jnp.max(jnp.abs(target[None] - nxt), axis=-1)
    closer = free & (d_next < d_now)
    best = free & (d_next == jnp.min(jnp.where(free, d_next, h + w)))
    cand = jnp.where(closer.any(), closer, jnp.where(free.any(), best, jnp.asarray(is_move)))
    p = cand.astype(jnp.float32) / jnp.maximum(cand.sum(), 1)
    return jnp.where(d_now > 0, p, 0.0)


def random_grid_obs(key, probe: Obs, cells=_CELLS):
    """A random observation shaped like `probe` (`compact.probe_obs`): glyphs drawn uniformly from `cells` (default:
    this module's, with the obstacles a go-to tip must avoid), the hero on one cell, no message."""
    h, w = probe.grid.shape
    k1, k2 = jax.random.split(key)
    grid = jnp.asarray(cells)[jax.random.randint(k1, (h, w), 0, len(cells))]
    hero = jax.random.randint(k2, (), 0, h * w)
    grid = grid.reshape(-1).at[hero].set(G_AGENT).reshape(h, w)
    return Obs(grid=grid.astype(probe.grid.dtype), message=jnp.zeros(probe.message.shape, probe.message.dtype))


def random_cell(key, row_ids, col_ids, entry_len: int):
    """A random cell -> (cell [2] (row, col), FACT entry [entry_len] = `<r> <c>` then zeros, length 2)."""
    kr, kc = jax.random.split(key)
    r = jax.random.randint(kr, (), 0, row_ids.shape[0])
    c = jax.random.randint(kc, (), 0, col_ids.shape[0])
    entry = jnp.zeros((entry_len,), jnp.int32).at[0].set(row_ids[r]).at[1].set(col_ids[c])
    return jnp.stack([r, c]), entry, jnp.int32(2)


def goto_row(rt, key):
    """One actor row's FACT tip and target: (entry [L], length, observation, target [V]) where the observation is
    a random grid and the target `goto_moves` towards the tip's cell over the action tokens."""
    t = rt.tiny
    k1, k2 = jax.random.split(key)
    cell, entry, n = random_cell(k1, t.row_ids, t.col_ids, rt.cfg.bank.entry_len)
    obs = random_grid_obs(k2, probe_obs(rt.env))
    deltas, is_move = move_deltas(rt.env.action_names)
    p = goto_moves(obs.grid, cell, deltas, is_move)
    return entry, n, obs, jnp.zeros((rt.vocab_size,), jnp.float32).at[t.action_ids].set(p)


def maybe_goto(rt, key, plan, plen, obs, target):
    """One actor row's tip made a FACT tip with probability `FACT_TIP_P` -> (fact [] bool, (plan, plen, obs,
    target)): the `goto_row` ones where fact, else the given plan [L], length, observation and target [V]."""
    k1, k2 = jax.random.split(key)
    fact = jax.random.uniform(k1) < FACT_TIP_P
    return fact, jax.tree_util.tree_map(lambda a, b: jnp.where(fact, a, b), goto_row(rt, k2),
                                        (plan, plen, obs, target))


def form_response_parts(rt, key, n: int, moves, n_moves):
    """The forms of `n` synthetic extractor rows: (end cells [n, 2] tokens for the prompt, form token [n], entry
    [n, L], length [n]): FACT (the end cell) or MOVES (a copy of `moves` [n, L] / `n_moves` [n]), half each."""
    t = rt.tiny
    L = rt.cfg.bank.entry_len
    k1, k2 = jax.random.split(key)
    _, cells, _ = jax.vmap(lambda k: random_cell(k, t.row_ids, t.col_ids, L))(jax.random.split(k1, n))
    fact = jax.random.bernoulli(k2, 0.5, (n,))
    entry = jnp.where(fact[:, None], cells, moves)
    length = jnp.where(fact, 2, n_moves).astype(jnp.int32)
    return cells[:, :2], jnp.where(fact, t.form_ids[1], t.form_ids[0]), entry, length


def form_target(rt, n: int, weight: float = 1.0):
    """[n, V] the form token's soft target: uniform over MOVES / FACT, times `weight`."""
    return jnp.zeros((n, rt.vocab_size), jnp.float32).at[:, rt.tiny.form_ids].set(0.5 * weight)
