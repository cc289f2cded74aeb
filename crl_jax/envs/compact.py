"""The compact view of a grid observation: a few atomic tokens a from-scratch transformer reads quickly.

Measured on the dark room: a 2-layer transformer trained by RL on the ~113-byte
NetHack-style text (`crl_jax.envs.render`) stays at random success for 150 steps, while a table indexed by
(level, turn) learns the task in ~60: what is slow is reading the level and the turn out of bytes. The
compact view gives the same information the text shows around the hero as one token per fact:

    <r{row}> <c{col}> <cell> x 9        (the hero's row and column, then the 3x3 neighbourhood row-major)

where `<cell>` is the byte token of the glyph's character (`@` in the centre, blank outside the grid or
where the text shows nothing). It is read from the rendered glyph grid (`env.observe`), so dark-room
semantics are unchanged: cells the text would not show are blank here too. The level and turn tokens
(`<L{i}>`, `<E{i}>` for held-out levels, `<t{i}>`) are the task and turn segments of the prompt; they
live in the same vocabulary (`compact_vocabulary`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.base import G_AGENT, GLYPH_CHARS, NUM_GLYPHS


def probe_obs(env):
    """The abstract (shape and dtype only) observation of `env`, without computing one."""
    return jax.eval_shape(lambda k: env.observe(env.init_state(env.generate(k), k)), jax.random.key(0))


def grid_shape(env) -> tuple[int, int]:
    """(H, W) of the env's observation grid (static)."""
    return tuple(int(d) for d in probe_obs(env).grid.shape)


def compact_vocabulary(num_train: int, num_eval: int, num_turns: int, grid: tuple[int, int],
                       forms: bool = False) -> tuple[str, ...]:
    """The extra tokens of the compact view: levels of both pools, turns, rows, columns, prompt markers
    (and, with `forms`, the FACT form marker last: the other tokens keep their ids)."""
    h, w = grid
    return (tuple(f"<L{i}>" for i in range(num_train)) + tuple(f"<E{i}>" for i in range(num_eval))
            + tuple(f"<t{i}>" for i in range(num_turns)) + tuple(f"<r{i}>" for i in range(h))
            + tuple(f"<c{i}>" for i in range(w)) + MARKERS + (FORM_MARKERS if forms else ()))


# Prompt markers of the compact layouts (actor: tip, action; extractor: distil, moves, outcomes, old tip,
# answer; merge: header, separator, context, entries, answer).
MARKERS = ("<TIP>", "<ACT>", "<DISTIL>", "<MOVES>", "<FAIL>", "<SUCC>", "<OLD>", "<OP>", "<MERGE>", "<SEP>",
           "<CTX>", "<TIPS>", "<MERGED>")
# The entry forms (`extraction.forms`): <MOVES> (a marker of the default vocabulary) writes the moves, <FACT>
# (added only with the option, so the default vocabulary is unchanged) the episode's end cell.
FORMS = ("<MOVES>", "<FACT>")
FORM_MARKERS = ("<FACT>",)


@dataclass(frozen=True, eq=False)
class CompactRenderer:
    """`renderer(state_or_obs) -> (tokens int32[11], length int32[] = 11)`, jit- and vmap-able."""

    env: object
    row_ids: np.ndarray  # [H] token of <r{i}>
    col_ids: np.ndarray  # [W] token of <c{j}>
    glyph_ids: np.ndarray  # [NUM_GLYPHS] byte token of each glyph's character
    max_len: int = 11

    def __call__(self, state_or_obs):
        grid = self.env.as_obs(state_or_obs).grid
        h, w = grid.shape
        flat = jnp.argmax((grid == G_AGENT).reshape(-1))  # the hero's cell (0 if absent, never in practice)
        r, c = flat // w, flat % w
        dr = jnp.array([-1, -1, -1, 0, 0, 0, 1, 1, 1])
        dc = jnp.array([-1, 0, 1, -1, 0, 1, -1, 0, 1])
        rr, cc = r + dr, c + dc
        inside = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
        cells = jnp.where(inside, grid[jnp.clip(rr, 0, h - 1), jnp.clip(cc, 0, w - 1)], 0)
        toks = jnp.concatenate([jnp.asarray(self.row_ids)[r][None], jnp.asarray(self.col_ids)[c][None],
                                jnp.asarray(self.glyph_ids)[cells]])
        return toks.astype(jnp.int32), jnp.int32(self.max_len)


def is_fact(entry, entry_len, row_ids):
    """[...] bool: entries [..., L] of lengths [...] that are FACT entries of the entry forms (a cell in this
    view's tokens, `crl_jax.extractor.forms`): the first token a row token [H] and at least two tokens."""
    return (jnp.asarray(entry)[..., 0, None] == jnp.asarray(row_ids, jnp.int32)).any(-1) & (entry_len >= 2)


def make_compact_renderer(env, tokenizer) -> CompactRenderer:
    """The compact renderer of `env` for a tokenizer holding `compact_vocabulary`'s tokens."""
    h, w = grid_shape(env)
    glyph_ids = []
    for g in range(NUM_GLYPHS):
        ids = tokenizer.encode(chr(GLYPH_CHARS[g]))
        if len(ids) != 1:
            raise ValueError(f"compact view: glyph {chr(GLYPH_CHARS[g])!r} is not one token of this tokenizer")
        glyph_ids.append(ids[0])
    return CompactRenderer(env=env, row_ids=np.array([tokenizer.extra_id(f"<r{i}>") for i in range(h)], np.int32),
                           col_ids=np.array([tokenizer.extra_id(f"<c{j}>") for j in range(w)], np.int32),
                           glyph_ids=np.array(glyph_ids, np.int32))
