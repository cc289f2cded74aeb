"""The text the model sees, on the host (`render_text`) and as token ids inside jit (`make_token_renderer`).

Text layout (NetHack / MiniHack text view: message, map, legend)::

    <message slot 0>[  <message slot 1>]     (one line, NetHack's two-space join; empty if none)
    <map row 0>                              (H rows of the obs grid, trailing blanks stripped)
    ...
    Legend: @: you, >: stairs down, .: floor (visible symbols only, in glyph-id order)

There is no trailing newline. Glyphs are listed in `crl_jax.envs.glyphs.GLYPHS`: `@` you, `>` stairs
down, `<` up stairs at the start cell, `.` floor, `^` a discovered teleportation trap, `#` walls (all
envs), a letter or `:` for a monster, blank for unseen cells and solid stone.

The text is a concatenation of *pieces* from a fixed per-env table (message texts, one piece per map
cell, newlines, legend entries). Which pieces appear is a pure function of the obs (`piece_slots`), used
both by `render_text` (host) and by the token renderer (device), so the two agree by construction. The
token renderer tokenises every piece separately once on the host and concatenates the pieces' token ids
on device (gathers, no Python per step). The result decodes to exactly the rendered
text for the byte tokenizer and for byte-level BPE tokenizers (GPT-2 / Llama-3 / Qwen / SmolLM2 style),
whose decoders concatenate bytes; it is a valid encoding, not necessarily the shortest one.
Tokenizers whose decoder changes spacing (SentencePiece Metaspace with prefix handling, WordPiece) are
rejected at build time when a piece does not round-trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import chex
import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.glyphs import GLYPHS, NUM_GLYPHS, NUM_MSG_SLOTS, Obs

LEGEND_PREFIX = "Legend: "


def piece_table(env) -> list[str]:
    """All text pieces of `env`, in a fixed order (the index is the piece id)."""
    msgs = list(env.messages)
    pieces = list(msgs)  # message, first on the line
    pieces += [("  " + m) if m else "" for m in msgs]  # message after another one
    pieces += [c for c, _ in GLYPHS]  # map cells
    pieces += ["\n", LEGEND_PREFIX]
    pieces += [f"{c}: {d}" if d else "" for c, d in GLYPHS]  # first legend entry
    pieces += [f", {c}: {d}" if d else "" for c, d in GLYPHS]  # later legend entries
    return pieces


def _offsets(env):
    m = len(env.messages)
    o_msg_first, o_msg_rest = 0, m
    o_glyph = 2 * m
    o_nl = o_glyph + NUM_GLYPHS
    o_legend = o_nl + 1
    o_leg_first = o_legend + 1
    o_leg_rest = o_leg_first + NUM_GLYPHS
    return o_msg_first, o_msg_rest, o_glyph, o_nl, o_legend, o_leg_first, o_leg_rest


def piece_slots(env, obs: Obs, xp=jnp) -> tuple[jax.Array, jax.Array]:
    """Piece ids [P] and active flags [P] for one obs; P = 3 + H * (W + 1) + 1 + NUM_GLYPHS.

    `xp` is `jax.numpy` (device, jit) or `numpy` (host rendering: no per-op dispatch or compilation).
    """
    chex.assert_rank([obs.grid, obs.message], [2, 1])
    o_mf, o_mr, o_g, o_nl, o_leg, o_lf, o_lr = _offsets(env)
    i32 = xp.int32
    grid = xp.asarray(obs.grid).astype(i32)
    msg = xp.asarray(obs.message).astype(i32)
    h, w = grid.shape
    # Message line: slot 0, then slot 1 prefixed by two spaces when slot 0 is non-empty.
    m0, m1 = msg[0], msg[1]
    msg_ids = xp.stack([o_mf + m0, xp.where(m0 > 0, o_mr, o_mf) + m1, xp.asarray(o_nl, i32)]).astype(i32)
    msg_act = xp.stack([m0 > 0, m1 > 0, xp.asarray(True)])
    # Map rows with trailing blanks stripped.
    nonblank = grid != 0
    cols = xp.arange(w)[None, :]
    last = xp.max(xp.where(nonblank, cols, -1), axis=1)  # [H]
    cell_ids = o_g + grid
    cell_act = cols <= last[:, None]
    row_ids = xp.concatenate([cell_ids, xp.full((h, 1), o_nl, i32)], axis=1).reshape(-1)
    row_act = xp.concatenate([cell_act, xp.ones((h, 1), bool)], axis=1).reshape(-1)
    # Legend: glyphs present (with a description), first one without the leading ", ".
    g = xp.arange(NUM_GLYPHS).astype(i32)
    has_desc = xp.asarray(np.array([d is not None for _, d in GLYPHS]))
    present = xp.any(grid.reshape(-1)[:, None] == g[None, :], axis=0) & has_desc
    earlier = (xp.cumsum(present.astype(i32)) - present.astype(i32)) > 0
    leg_ids = xp.concatenate([xp.asarray([o_leg], i32), xp.where(earlier, o_lr, o_lf) + g])
    leg_act = xp.concatenate([xp.asarray([True]), present]) & getattr(env, "legend", True)
    ids = xp.concatenate([msg_ids, row_ids, leg_ids]).astype(i32)
    act = xp.concatenate([msg_act, row_act, leg_act])
    return ids, act


def render_text(env, state_or_obs) -> str:
    """Host-side text of one unbatched state or obs (computed with numpy)."""
    obs = jax.device_get(env.as_obs(state_or_obs))
    ids, act = piece_slots(env, obs, xp=np)
    table = piece_table(env)
    return "".join(table[i] for i, a in zip(ids.tolist(), act.tolist()) if a)


@dataclass(frozen=True, eq=False)
class TokenRenderer:
    """`renderer(state_or_obs) -> (tokens int32[max_len], length int32[])`, jit- and vmap-able.

    Positions >= length hold `pad_id`. Batch with `jax.vmap(renderer)`.
    """

    env: object
    table: np.ndarray  # [num_pieces, Lmax] int32 token ids of each piece
    lengths: np.ndarray  # [num_pieces] int32
    max_len: int
    pad_id: int

    def __call__(self, state_or_obs) -> tuple[jax.Array, jax.Array]:
        obs = self.env.as_obs(state_or_obs)
        ids, act = piece_slots(self.env, obs)
        table = jnp.asarray(self.table)
        lens = jnp.where(act, jnp.asarray(self.lengths)[ids], 0)  # [P]
        ends = jnp.cumsum(lens)  # [P]
        k = jnp.arange(self.max_len)
        # Output position k holds token k - start(p) of the piece p whose span contains k: a gather
        # (scatters are slow on CPU under vmap).
        p = jnp.minimum(jnp.sum(ends[None, :] <= k[:, None], axis=1), ids.shape[0] - 1)  # [max_len]
        j = k - (ends[p] - lens[p])
        total = ends[-1]
        toks = table[ids[p], jnp.clip(j, 0, self.table.shape[1] - 1)]
        return jnp.where(k < total, toks, self.pad_id).astype(jnp.int32), total.astype(jnp.int32)


def make_token_renderer(env, tokenizer, *, pad_id: int | None = None) -> TokenRenderer:
    """Tokenise every text piece of `env` once; raise if a piece does not round-trip."""
    pieces = piece_table(env)
    enc = []
    for p in pieces:
        ids = list(tokenizer.encode(p)) if p else []
        if p and tokenizer.decode(ids) != p:
            raise ValueError(
                f"make_token_renderer: tokenizer does not round-trip the piece {p!r} "
                f"(decoded {tokenizer.decode(ids)!r}); the token renderer needs a byte-level tokenizer")
        enc.append(ids)
    lmax = max(1, max(len(e) for e in enc))
    table = np.zeros((len(pieces), lmax), np.int32)
    lengths = np.array([len(e) for e in enc], np.int32)
    for i, e in enumerate(enc):
        table[i, : len(e)] = e
    # Upper bound of the text length in tokens: the longest piece each slot can hold.
    o_mf, o_mr, o_g, o_nl, o_leg, o_lf, o_lr = _offsets(env)
    m = len(env.messages)
    probe = jax.eval_shape(lambda k: env.observe(env.init_state(env.generate(k), k)), jax.random.key(0))
    h, w = probe.grid.shape
    assert probe.message.shape == (NUM_MSG_SLOTS,)
    glyph_max = lengths[o_g:o_g + NUM_GLYPHS].max()
    max_len = int(
        lengths[o_mf:o_mf + m].max() + max(lengths[o_mr:o_mr + m].max(), lengths[o_mf:o_mf + m].max())
        + lengths[o_nl] * (1 + h) + glyph_max * h * w
        + (lengths[o_leg] + np.maximum(lengths[o_lf:o_lf + NUM_GLYPHS], lengths[o_lr:o_lr + NUM_GLYPHS]).sum()
           if getattr(env, "legend", True) else 0))
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_id", 0) or 0
    return TokenRenderer(env=env, table=table, lengths=lengths, max_len=max_len, pad_id=int(pad_id))
