"""The synthetic replies of the format prior (`crl_jax.backends.llm.format_prior`) as token pieces, shared by its
rows on the built-in grids and on host environments (`crl_jax.backends.llm.host_prior`): random lessons made of
generic words, the answer format's closing text and the extractor's JSON operations (`add` of a lesson,
`return`), in either model's tokens, and the teacher-forced packing of prompt ++ target.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.backends.llm.pieces import token_row, token_table
from crl_jax.backends.llm.prompt_pieces import actor_head, user_turn
from crl_jax.text.packing import pack_segments

ADD_P = 2.0 / 3.0  # share of `add` targets in the synthetic distillation rows
MAX_PRIOR_TURNS = 2  # synthetic distillation trajectories: 1..2 turns (the prompt stays short)
# Lesson words: generic, level-free vocabulary (a lesson made of them is random text, not advice).
WORDS = ("wall", "room", "stairs", "corner", "move", "turn", "door", "floor", "path", "edge", "early", "late",
         "left", "right", "up", "down", "dark", "light", "near", "far", "first", "again", "step", "look",
         "wait", "try", "avoid", "follow", "check", "keep", "side", "center", "around", "back", "open", "long")


# ------------------------------------------------------------------------------------------------
# Synthetic rows (teacher-forced: tokens [n, W], loss mask [n, W] on the target tokens)


def pick(table, key):
    """A random row (tokens, length) of a token table (tokens [R, W], lengths [R])."""
    i = jax.random.randint(key, (), 0, table[0].shape[0])
    return jnp.asarray(table[0])[i], jnp.asarray(table[1])[i]


def words(tables, key, n_max: int, cap: int):
    """Random words: the first without, the others with a leading space -> (tokens [cap], length)."""
    first, rest = tables
    ks = jax.random.split(key, n_max + 1)
    n = jax.random.randint(ks[0], (), 1, n_max + 1)
    segs = [pick(first, ks[1])]
    for i in range(1, n_max):
        t, ln = pick(rest, ks[i + 1])
        segs.append((t, jnp.where(i < n, ln, 0)))
    return pack_segments(segs, size=cap)


def lesson(rt, key, cap: int, side: str = "actor"):
    """Random lesson text "<title>w w</title><content>w w w ...</content>" -> (tokens [cap], length) in the
    `side` model's tokens."""
    t = rt_tables(rt, side)
    k1, k2 = jax.random.split(key)
    return pack_segments([t["title_open"], words(t["words"], k1, 3, 16), t["title_close"],
                          words(t["words"], k2, 8, 40), t["content_close"]], size=cap)


_TABLES: dict[tuple[int, str], dict] = {}


def rt_tables(rt, side: str = "actor") -> dict:
    """Token pieces of the synthetic replies in the tokens of one model, `side` = "actor" (moves, lessons as
    experience) or "extractor" (JSON operations, lessons) (host, built once per runtime and side)."""
    if (id(rt), side) in _TABLES:
        return _TABLES[(id(rt), side)]
    with jax.ensure_compile_time_eval():  # host constants even when first asked inside a trace
        t = _tables(rt, rt.tokenizer if side == "actor" else rt.extractor_tokenizer)
    t = jax.tree_util.tree_map(np.asarray, t)
    _TABLES[(id(rt), side)] = t
    return t


def answer_affixes(rt, tok) -> tuple[str, str]:
    """(text before, text after) a move in an actor reply's answer format (no opening after a prefill)."""
    prefilled = bool(rt.llm.actor_pieces.prefill)
    close = "</answer>" if prefilled else "</answer>" + tok.token_text(tok.eos_id)  # a prefilled reply stops at '>'
    return ("" if prefilled else "<answer>"), close


def _tables(rt, tok) -> dict:
    names = list(rt.env.action_names) or [""]  # text games: no fixed moves (their rows: `host_prior`)
    dp = rt.llm.distill_pieces
    eot = tok.token_text(tok.eos_id)
    open_, close = answer_affixes(rt, tok)
    d_open = "" if dp.prefill else "<answer>["
    t = {
        "moves": token_table(tok, [open_ + n for n in names]),
        "move_close": token_row(tok, close),
        "words": (token_table(tok, list(WORDS)), token_table(tok, [" " + w for w in WORDS])),
        "title_open": token_row(tok, "<title>"), "title_close": token_row(tok, "</title><content>"),
        "content_close": token_row(tok, ".</content>"),
        "add_open": token_row(tok, d_open + '{"op": "add", "text": "'),
        "add_close": token_row(tok, '"}]</answer>' + eot),
        "return": token_row(tok, d_open + '{"op": "return"}]</answer>' + eot),
    }
    return t


def distill_budget(rt) -> int:
    """Static width of a synthetic distillation prompt (<= MAX_PRIOR_TURNS turns: nothing is cut)."""
    dp = rt.llm.distill_pieces
    per_turn = dp.traj_cap // max(dp.num_turns, 1)
    return min(rt.cfg.extraction.prompt_len, dp.fixed_capacity + MAX_PRIOR_TURNS * per_turn)


def op_reply(rt, k_lesson, k_op):
    """A synthetic extractor target in the extractor's tokens: one `add` of a random lesson (probability ADD_P)
    or a `return`, in the JSON answer format -> (tokens [R], length)."""
    t = rt_tables(rt, "extractor")
    R = reply_width(rt)
    text = lesson(rt, k_lesson, rt.cfg.bank.entry_len, "extractor")
    add, add_len = pack_segments([t["add_open"], text, t["add_close"]], size=R)
    ret, ret_len = pack_segments([t["return"]], size=R)
    is_add = jax.random.uniform(k_op) < ADD_P
    return jnp.where(is_add, add, ret), jnp.where(is_add, add_len, ret_len)


def reply_width(rt) -> int:
    """Static room of a synthetic extractor target (tokens)."""
    t = rt_tables(rt, "extractor")
    return rt.cfg.bank.entry_len + int(t["add_open"][0].shape[0]) + int(t["add_close"][0].shape[0])


def teacher_forced(prompt, plen, reply, rlen, width: int):
    """prompt ++ reply in [width] -> (tokens, mask of the reply's tokens)."""
    toks, total = pack_segments([(prompt, plen), (reply, rlen)], size=width)
    t = jnp.arange(width)
    return toks, (t >= plen) & (t < total)


def actor_row(rt, ks, task_tokens, task_len, obs, obs_len, reply, reply_len):
    """One actor row of the format prior: the loop's head (a random task of `task_tokens` [n, L]; half the rows with
    a random lesson as experience) and its first turn showing `obs`, target `reply` -> (tokens [W], mask [W]).
    `ks`: the row's keys (task, lesson, experience on/off = ks[0..2]; the callers draw obs and reply from the rest)."""
    p = rt.llm.actor_pieces
    task = jax.random.randint(ks[0], (), 0, task_tokens.shape[0])
    exp, exp_len = lesson(rt, ks[1], p.entry_cap)
    head = actor_head(p, exp, exp_len, jax.random.uniform(ks[2]) < 0.5, task_tokens[task], task_len[task])
    prompt, plen = pack_segments([head] + user_turn(p, 0, jnp.bool_(False), obs, obs_len))
    return teacher_forced(prompt, plen, reply, reply_len, p.head_cap + p.turn_cap)
