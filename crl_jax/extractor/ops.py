"""Extractor prompts and operations, in token space (jit-able) and as structured text (host side).

Prompt construction (`build_distill_prompt`): the distillation prompt is, in this order,

    header, goal, [trajectory_prefix], trajectory, outcome, [retrieved_prefix, retrieved], [suffix]

packed into a fixed buffer of `budget` tokens. Everything but the trajectory is always kept whole
(a static check makes sure their buffers fit); the trajectory is truncated from the LEFT (its oldest
moves go first) to what is left. `retrieved_prefix` appears only when an entry was retrieved
(`retrieved_len > 0`). Header, outcome and label texts come from the caller as token segments, built
once with the tokenizer: a segment is `(tokens[Li], length)` or a bare array (see `crl_jax.text.packing`).

Operations, constrained format (tiny models). The response is an operation token -- one of the ids
`op_ids = (<ADD>, <UPDATE>, <RETURN>)` -- followed by the entry's tokens, which end at EOS, at the next
operation token, or at the response length, and are clipped to `entry_len`:
- `parse_constrained` -> one operation: op in {0 add, 1 update, 2 return}. A first token that is not an
  op token, an empty response, or an add / update with an empty entry gives (return, invalid).
- `parse_constrained_ops` -> up to `max_ops` operations, one per op token (the merge format: each
  `<ADD>` starts a merged entry). Text before the first op token is ignored (and flagged).

Operations, structured text (LLMs): `parse_operations` / `parse_operations_with_stats`, re-exported from
`crl_jax.extractor.ops_json` (JSON list inside `<answer>...</answer>`; never raises).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax.numpy as jnp

from crl_jax.extractor.ops_json import MAX_OPS as MAX_OPS_JSON  # noqa: F401
from crl_jax.extractor.ops_json import Operation, ParseStats, parse_operations, parse_operations_with_stats  # noqa: F401
from crl_jax.text.packing import as_segment, capacity, pack_segments, truncate_left

ADD, UPDATE, RETURN = 0, 1, 2
OP_NAMES = ("add", "update", "return")


def build_distill_prompt(header, goal, trajectory, traj_len, outcome_tokens, retrieved, retrieved_len, budget: int,
                         *, trajectory_prefix=None, retrieved_prefix=None, suffix=None, pad_id: int = 0,
                         moves_last: bool = False, outcome_last: bool = False, end_cell=None):
    """-> (prompt [budget] int32, length []). See the module docstring for the layout.

    header / goal / outcome_tokens / prefixes / suffix: segments. trajectory [T], traj_len []: the
    episode's tokens. retrieved [Le], retrieved_len []: the entry that guided the episode (0 = none).
    `budget` is static and must hold every part except the trajectory at full buffer size.
    moves_last: header, goal, retrieved, moves, outcome, suffix: with a fixed-width trajectory every move
    sits at a fixed distance from the answer (copying it is one relative-position lookup) and the outcome,
    which decides ADD or RETURN, is the token before the answer (the compact view's layout).
    outcome_last: the outcome after the answer label, the prompt's last token: the op is then predicted at the
    outcome's own position (read through the residual stream, no attention needed); the moves keep their
    distance from the answer (the two tokens between them only swap).
    end_cell: a segment right after the trajectory (`extraction.forms`: the episode's end cell, which a FACT
    entry copies); None: no such segment.
    """
    empty = jnp.zeros((0,), jnp.int32)
    header, goal, outcome = as_segment(header), as_segment(goal), as_segment(outcome_tokens)
    t_pre = as_segment(trajectory_prefix if trajectory_prefix is not None else empty)
    r_pre = as_segment(retrieved_prefix if retrieved_prefix is not None else empty)
    suf = as_segment(suffix if suffix is not None else empty)
    ret = as_segment((retrieved, retrieved_len))
    has_ret = ret[1] > 0
    r_pre = (r_pre[0], jnp.where(has_ret, r_pre[1], 0))
    end = as_segment(end_cell if end_cell is not None else empty)
    fixed = [header, goal, t_pre, outcome, r_pre, ret, suf] + ([end] if end_cell is not None else [])
    need = sum(capacity(s) for s in fixed)
    if need > budget:
        raise ValueError(f"build_distill_prompt: budget {budget} < {need} tokens needed by the header, goal, "
                         f"outcome, retrieved entry and labels at full size; raise the prompt budget")
    used = sum(s[1] for s in fixed)
    traj = truncate_left(trajectory, traj_len, budget - used, pad_id=pad_id)
    order = [header, goal, r_pre, ret, t_pre, traj, outcome, suf] if moves_last else \
        [header, goal, t_pre, traj, outcome, r_pre, ret, suf]
    if end_cell is not None:
        order.insert(next(j for j, x in enumerate(order) if x is traj) + 1, end)
    if outcome_last:
        order = [s for s in order if s is not outcome] + [outcome]
    return pack_segments(order, size=budget, pad_id=pad_id)


def _op_index(tok, op_ids):
    """Index k in {0, 1, 2} of an op token, or -1."""
    hits = tok[..., None] == op_ids
    return jnp.where(hits.any(-1), jnp.argmax(hits, -1), -1).astype(jnp.int32)


def _content_end(response, length, eos_id):
    """First position that is EOS or >= length."""
    R = response.shape[0]
    i = jnp.arange(R, dtype=jnp.int32)
    stop = (response == eos_id) | (i >= length)
    return jnp.where(stop.any(), jnp.argmax(stop), R).astype(jnp.int32)


def _gather_entry(response, start, stop, entry_len: int, pad_id: int):
    """tokens response[start:stop] clipped to entry_len -> (entry [entry_len], len)."""
    R = response.shape[0]
    j = jnp.arange(entry_len, dtype=jnp.int32)
    n = jnp.clip(stop - start, 0, entry_len)
    tok = response[jnp.clip(start + j, 0, R - 1)]
    return jnp.where(j < n, tok, pad_id), n


def parse_constrained(response, length, op_ids, eos_id: int, entry_len: int, pad_id: int = 0):
    """One operation from response [R] -> (op [] int32, entry [entry_len], entry_len [], valid [] bool).

    op: 0 add, 1 update, 2 return. Invalid responses (no op token first, empty add / update) come back as
    (2, zeros, 0, False); a well-formed `<RETURN>` is (2, zeros, 0, True).
    """
    response = jnp.asarray(response, jnp.int32)
    chex.assert_rank(response, 1)
    op_ids = jnp.asarray(op_ids, jnp.int32)
    length = jnp.asarray(length, jnp.int32)
    end = _content_end(response, length, eos_id)
    k = jnp.where(end > 0, _op_index(response[0], op_ids), -1)
    # The entry runs from 1 to the next op token or the end.
    i = jnp.arange(response.shape[0], dtype=jnp.int32)
    later_op = (_op_index(response, op_ids) >= 0) & (i >= 1) & (i < end)
    stop = jnp.where(later_op.any(), jnp.argmax(later_op), end).astype(jnp.int32)
    entry, n = _gather_entry(response, 1, stop, entry_len, pad_id)
    writes = (k == ADD) | (k == UPDATE)
    valid = (k == RETURN) | (writes & (n > 0))
    keep = writes & valid
    op = jnp.where(keep, k, RETURN).astype(jnp.int32)
    return op, jnp.where(keep, entry, pad_id), jnp.where(keep, n, 0), valid


class ConstrainedOps(NamedTuple):
    """Up to M operations parsed from one response (fixed shapes)."""

    op: jnp.ndarray  # [M] int32 in {0, 1, 2}; 2 (return) in unused rows
    entry: jnp.ndarray  # [M, entry_len] int32
    entry_len: jnp.ndarray  # [M] int32
    mask: jnp.ndarray  # [M] bool: an add / update with a non-empty entry
    num_ops: jnp.ndarray  # [] int32: op tokens seen (may exceed M; the extra ones are dropped)
    stray: jnp.ndarray  # [] bool: content before the first op token (ignored)


def parse_constrained_ops(response, length, op_ids, eos_id: int, entry_len: int, max_ops: int,
                          pad_id: int = 0) -> ConstrainedOps:
    """Every op token in response[:end] starts an operation whose entry runs to the next op token or the end."""
    response = jnp.asarray(response, jnp.int32)
    chex.assert_rank(response, 1)
    op_ids = jnp.asarray(op_ids, jnp.int32)
    R = response.shape[0]
    end = _content_end(response, jnp.asarray(length, jnp.int32), eos_id)
    i = jnp.arange(R, dtype=jnp.int32)
    kind = _op_index(response, op_ids)
    is_op = (kind >= 0) & (i < end)
    # positions of the first max_ops + 1 op tokens (R = none); the extra one bounds the last entry
    pos = jnp.nonzero(is_op, size=max_ops + 1, fill_value=R)[0].astype(jnp.int32)
    starts, nexts = pos[:max_ops], jnp.minimum(pos[1:], end)
    present = starts < R
    k = jnp.where(present, kind[jnp.clip(starts, 0, R - 1)], RETURN)
    entries, lens = [], []
    for m in range(max_ops):
        e, n = _gather_entry(response, starts[m] + 1, nexts[m], entry_len, pad_id)
        entries.append(e)
        lens.append(n)
    entry, n = jnp.stack(entries), jnp.stack(lens)
    mask = present & ((k == ADD) | (k == UPDATE)) & (n > 0)
    first = jnp.where(is_op.any(), jnp.argmax(is_op), end)
    return ConstrainedOps(op=jnp.where(mask, k, RETURN).astype(jnp.int32), entry=jnp.where(mask[:, None], entry, pad_id),
                          entry_len=jnp.where(mask, n, 0), mask=mask, num_ops=jnp.sum(is_op).astype(jnp.int32),
                          stray=first > 0)
