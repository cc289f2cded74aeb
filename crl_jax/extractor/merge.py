"""Merge: the extractor rewrites one task family of the bank chunk by chunk (METHOD.md §2 step 8).

`merge_family(bank, family, generate_fn, key, step, ...)` is a pure, jit-able function (a `lax.scan` over
a static number of chunks; empty chunks are masked and skip generation with `lax.cond`).

Semantics:
- Snapshot. At the start, the valid entries of `family` are listed in insertion order (`insert_order`,
  oldest first) and cut into chunks of `chunk` entries. Entries written by this merge are never chunk
  members again in the same call.
- Prompt of chunk i (packed into `max_prompt` tokens, layout fixed):
      header, [context_prefix, (entry_sep, c) for each carried entry c], entries_prefix,
      (entry_sep, e) for each entry e of chunk i, suffix
  `context_prefix` appears only when something is carried.
- Carry (sliding window of one chunk). What is carried from chunk i into chunk i+1 is what now stands
  for chunk i in the bank: its merged entries when the merge was applied, otherwise its own (unchanged)
  entries, at most `max_entries_out` either way. The carried entries are context only: they are never
  replaced again, and chunk i+1's merged output replaces chunk i+1's entries alone. Chunk 0 has no carry.
- Response. `generate_fn(prompt [1, P], prompt_len [1], key) -> (tokens [1, R], logp [1, R], len [1])`
  (the caller closes over the extractor's parameters and its constrained-decoding mask). By default the
  response is read as a sequence of constrained ops (`crl_jax.extractor.parse_constrained_ops`): each
  `<ADD>` starts a merged entry that runs to the next op token / EOS / the end; `<UPDATE>` / `<RETURN>`
  tokens only end the previous entry. `parse_fn(response [R], length []) -> (op [K], entry [K, L],
  entry_len [K], mask [K])` replaces that reader (the LLM path parses JSON operations on the host); only
  masked `add` rows (op 0) become merged entries either way. At most `max_entries_out` entries, and never
  more than the chunk has sources (a merge never grows the bank, so adding merged entries never evicts
  anything).
- Apply. `bank.apply_merge(bank, chunk_slots, merged..., task=family, step, source)` invalidates the
  chunk's entries and adds the merged ones (key = normalised mean of the sources' keys, written by
  apply_merge). A chunk whose response holds no non-empty `<ADD>` entry is NOT applied (its entries
  stay): a bad generation cannot wipe a chunk of the bank. Such responses are counted as invalid.
- Provenance. Applied chunk k gets `source = source_start + (number of applied chunks before k)`, or -1
  when `source_start < 0`. Pass `source_start = buffer.next_id` and add the samples whose `mask` is True
  to the extractor buffer in chunk order (`buffer.add_many` does) so that their buffer ids equal the
  `source` recorded on the merged entries; `MergeSamples.source` repeats it for checking.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from crl_jax import bank as bank_lib
from crl_jax.extractor.ops import ADD, parse_constrained_ops
from crl_jax.text.packing import as_segment, capacity, pack_segments

_INT_MAX = jnp.iinfo(jnp.int32).max


class MergeSamples(NamedTuple):
    """One row per chunk slot [C] (C = max_chunks), for the extractor buffer and metrics."""

    prompt: jax.Array  # [C, P] int32
    prompt_len: jax.Array  # [C] int32
    response: jax.Array  # [C, R] int32
    logp: jax.Array  # [C, R] float32 behaviour log-probs
    response_len: jax.Array  # [C] int32
    attempted: jax.Array  # [C] bool: the chunk had entries and a response was generated
    mask: jax.Array  # [C] bool: the merge was applied (a training sample that wrote entries)
    source: jax.Array  # [C] int32 source id written on the merged entries (-1 where not applied)
    num_sources: jax.Array  # [C] int32 entries of the chunk
    num_merged: jax.Array  # [C] int32 merged entries written


def family_order(bank, family, max_len: int):
    """Slots of valid entries of `family`, oldest first, -1 padded -> (slots [max_len], count [])."""
    member = bank.valid & (bank.task == family)
    order = jnp.argsort(jnp.where(member, bank.insert_order, _INT_MAX), stable=True).astype(jnp.int32)
    n = jnp.sum(member).astype(jnp.int32)
    pad = max(0, max_len - order.shape[0])
    order = jnp.concatenate([order, jnp.full((pad,), -1, jnp.int32)])[:max_len]
    return jnp.where(jnp.arange(max_len) < n, order, -1), n


def grouped_order(bank, family, chunk: int, num_chunks: int, min_similarity):
    """Chunk slots of `family` where chunks never mix entries of different key groups
    -> (slots [num_chunks * chunk] (-1 = empty), group_start [num_chunks] bool).

    An entry's group is its anchor: the oldest valid entry of the family whose key has cosine >=
    `min_similarity` with its own (itself if none is older). Groups are laid out by anchor age, each from
    a fresh chunk, members oldest first; a chunk that starts a group starts a new carry window. Entries
    of one level share a key (its query), so a merge never combines two levels' entries. An entry that would
    sit alone in its chunk (a group of one, or a group's tail of one) is not laid out: `merge_family` never
    rewrites a lone entry (the carry is context only, so it has nothing to merge with), so it takes no
    chunk. With `num_chunks >= grouped_chunk_bound(capacity, chunk)` every other entry of the family gets
    its chunk; a smaller `num_chunks` (merge_max_chunks) keeps the oldest groups' chunks.
    """
    N = bank.capacity
    member = bank.valid & (bank.task == family)
    order_v = jnp.where(member, bank.insert_order, _INT_MAX)
    sim = jnp.matmul(bank.keys, bank.keys.T, precision=jax.lax.Precision.HIGHEST)
    near = member[:, None] & member[None, :] & (sim >= min_similarity)
    anchor_age = jnp.min(jnp.where(near, order_v[None, :], _INT_MAX), axis=1)  # [N] insert order of the anchor
    anchor_age = jnp.where(member, jnp.minimum(anchor_age, order_v), _INT_MAX)
    by_age = jnp.argsort(order_v, stable=True)
    srt = by_age[jnp.argsort(anchor_age[by_age], stable=True)]  # by (anchor age, own age)
    a_s, m_s = anchor_age[srt], member[srt]
    k = jnp.arange(N)
    new = m_s & ((k == 0) | (a_s != jnp.roll(a_s, 1)))
    grp = jnp.maximum(jnp.cumsum(new) - 1, 0)
    first = jax.lax.cummax(jnp.where(new, k, 0))
    rank = k - first
    sizes = jax.ops.segment_sum(m_s.astype(jnp.int32), grp, num_segments=N)
    nchunks = sizes // chunk + (sizes % chunk >= 2)  # full chunks, and the tail when it holds >= 2 entries
    start = jnp.cumsum(nchunks) - nchunks  # first chunk of each group
    laid = m_s & (rank // chunk < nchunks[grp])  # not a lone entry
    pos = jnp.where(laid, start[grp] * chunk + rank, num_chunks * chunk)
    slots = jnp.full((num_chunks * chunk,), -1, jnp.int32).at[pos].set(srt.astype(jnp.int32), mode="drop")
    gs = jnp.zeros((num_chunks,), bool).at[jnp.where(nchunks > 0, start, num_chunks)].set(True, mode="drop")
    return slots, gs


def grouped_chunk_bound(capacity: int, chunk: int) -> int:
    """Static number of chunks that holds every chunk `grouped_order` lays out, for any bank of `capacity`.

    Group g of n_g entries takes floor(n_g / chunk) chunks, plus one for a tail of >= 2 entries: every
    chunk laid out holds >= 2 of the family's (distinct) entries, so there are at most floor(N / 2) of
    them (N = capacity), and banks of N / 2 two-entry groups take exactly that many. The ungrouped bound
    ceil(N / chunk) is too small: a fresh chunk per group needs sum_g ceil(n_g / chunk) chunks, up to
    ceil(N / chunk) + (number of groups) - 1. Chunks past the last group's are empty and skip the
    generation (`lax.cond` in `merge_family`; under a vmap over seeds the cond becomes a select and every
    slot generates). chunk = 1 lays nothing out (1 slot kept: shapes >= 1).
    """
    return max(1, capacity // 2) if chunk >= 2 else 1


def _empty():
    return jnp.zeros((0,), jnp.int32)


def merge_family(bank, family, generate_fn: Callable, key, step, *, header_tokens, max_prompt: int,
                 max_entries_out: int, op_ids=None, eos_id: int = -1, chunk: int = 5,
                 max_chunks: int | None = None, source_start=-1, entry_sep=None, context_prefix=None,
                 entries_prefix=None, suffix=None, pad_id: int = 0, parse_fn: Callable | None = None,
                 min_similarity=None, fixed_width: bool = False, entry_map: Callable | None = None):
    """Merge the entries of one task family -> (bank, MergeSamples). See the module docstring.

    header_tokens / entry_sep / context_prefix / entries_prefix / suffix: token segments
    (`(tokens[Li], length)` or a bare array). max_prompt: static prompt buffer P; it must hold the layout
    at full size (checked). max_chunks: static, default ceil(capacity / chunk), or with min_similarity
    `grouped_chunk_bound(capacity, chunk)`. min_similarity: chunks hold only entries of one key group
    (`grouped_order`), the carry restarts with each group, and a single entry is not rewritten.
    fixed_width: every entry in the prompt takes its full `entry_len` slots (padding included), so the
    tokens of the newest entry sit at fixed distances from the answer (the compact view's layout).
    entry_map: `(tokens [L], length) -> (tokens [L], length)`, an entry (bank or carried) as the prompt shows
    it (the LLM path's actor -> extractor id map); default: as stored.
    """
    N, L = bank.capacity, bank.entry_len
    if max_chunks is not None:
        C = max_chunks
    else:
        C = -(-N // chunk) if min_similarity is None else grouped_chunk_bound(N, chunk)
    M = max_entries_out
    if chunk < 1 or M < 1 or C < 1:
        raise ValueError(f"merge_family: chunk ({chunk}), max_entries_out ({M}) and max_chunks ({C}) must be >= 1")
    header = as_segment(header_tokens)
    sep, ctx_pre, ent_pre, suf = (as_segment(s if s is not None else _empty())
                                  for s in (entry_sep, context_prefix, entries_prefix, suffix))
    need = (capacity(header) + capacity(ctx_pre) + capacity(ent_pre) + capacity(suf)
            + (M + chunk) * (capacity(sep) + L))
    if need > max_prompt:
        raise ValueError(f"merge_family: max_prompt={max_prompt} < {need} tokens needed for the header, labels, "
                         f"{M} carried and {chunk} chunk entries of {L} tokens; raise max_prompt")
    if parse_fn is None:
        if op_ids is None:
            raise ValueError("merge_family: give op_ids (constrained responses) or a parse_fn")
        op_ids = jnp.asarray(op_ids, jnp.int32)

        def parse_fn(resp, rlen):
            o = parse_constrained_ops(resp, rlen, op_ids, eos_id, L, M, pad_id=pad_id)
            return o.op, o.entry, o.entry_len, o.mask
    if min_similarity is None:
        slots_all, _ = family_order(bank, family, C * chunk)
        group_start = jnp.zeros((C,), bool)
    else:
        slots_all, group_start = grouped_order(bank, family, chunk, C, min_similarity)
    family = jnp.asarray(family, jnp.int32)
    source_start = jnp.asarray(source_start, jnp.int32)

    carry0 = (jnp.full((M, L), pad_id, jnp.int32), jnp.zeros((M,), jnp.int32), jnp.zeros((M,), bool))
    show = entry_map or (lambda t, n: (t, n))

    def prompt_for(b, carry, cslots):
        c_tok, c_len, c_mask = carry
        present = cslots >= 0
        safe = jnp.clip(cslots, 0, N - 1)
        segs = [header, (ctx_pre[0], jnp.where(c_mask.any(), ctx_pre[1], 0))]
        for m in range(M):
            c_t, c_n = show(c_tok[m], c_len[m])
            if fixed_width:
                c_t, c_n = jnp.where(jnp.arange(L) < c_n, c_t, pad_id), L
            segs += [(sep[0], jnp.where(c_mask[m], sep[1], 0)), (c_t, jnp.where(c_mask[m], c_n, 0))]
        segs.append(ent_pre)
        for j in range(chunk):
            e_tok, e_n = show(b.tokens[safe[j]], b.lengths[safe[j]])
            if fixed_width:
                e_tok, e_n = jnp.where(jnp.arange(L) < e_n, e_tok, pad_id), L
            segs += [(sep[0], jnp.where(present[j], sep[1], 0)), (e_tok, jnp.where(present[j], e_n, 0))]
        segs.append(suf)
        return pack_segments(segs, size=max_prompt, pad_id=pad_id)

    dummy_out = jax.eval_shape(generate_fn, jax.ShapeDtypeStruct((1, max_prompt), jnp.int32),
                               jax.ShapeDtypeStruct((1,), jnp.int32), key)
    R = dummy_out[0].shape[-1]

    def body(state, xs):
        c, fresh = xs
        b0, carry, applied_so_far = state
        carry = jax.tree.map(lambda z, x: jnp.where(fresh, z, x), carry0, carry)  # a new group: no context
        cslots = jax.lax.dynamic_slice(slots_all, (c * chunk,), (chunk,))
        present = cslots >= 0
        n_src = jnp.sum(present).astype(jnp.int32)
        # grouped chunks: a group's lone entry has nothing to merge with and is left as it is (its credit
        # stays with the generation that wrote it); grouped_order does not lay such chunks out, this guards
        attempted = n_src > (1 if min_similarity is not None else 0)
        prompt, plen = prompt_for(b0, carry, cslots)

        def gen(_):
            t, lp, n = generate_fn(prompt[None], plen[None], jax.random.fold_in(key, c))
            return t[0].astype(jnp.int32), lp[0].astype(jnp.float32), n[0].astype(jnp.int32)

        def skip(_):
            return jnp.full((R,), pad_id, jnp.int32), jnp.zeros((R,), jnp.float32), jnp.zeros((), jnp.int32)

        resp, logp, rlen = jax.lax.cond(attempted, gen, skip, None)
        op, entry, entry_len, op_mask = parse_fn(resp, rlen)
        is_add = op_mask & (op == ADD)
        # keep the first n_src ADD entries, compacted to the front (merged rows are written in order)
        rank = jnp.cumsum(is_add) - 1
        keep = is_add & (rank < n_src)
        dest = jnp.where(keep, rank, M)
        m_tok = jnp.full((M, L), pad_id, jnp.int32).at[dest].set(entry.astype(jnp.int32), mode="drop")
        m_len = jnp.zeros((M,), jnp.int32).at[dest].set(entry_len.astype(jnp.int32), mode="drop")
        m_mask = jnp.arange(M) < jnp.sum(keep)
        apply = attempted & m_mask.any()
        src = jnp.where(source_start >= 0, source_start + applied_so_far, -1)
        b = jax.lax.cond(apply, lambda bb: bank_lib.apply_merge(bb, cslots, m_tok, m_len, m_mask, family, step,
                                                                src)[0], lambda bb: bb, b0)
        # carry: merged rows if applied, else the chunk's own first M entries; unchanged for an empty chunk
        own_slots = cslots[:M] if chunk >= M else jnp.pad(cslots, (0, M - chunk), constant_values=-1)
        own_safe = jnp.clip(own_slots, 0, N - 1)
        own_present = own_slots >= 0
        own = (jnp.where(own_present[:, None], b0.tokens[own_safe], pad_id),
               jnp.where(own_present, b0.lengths[own_safe], 0), own_present)
        new_carry = jax.tree.map(lambda x, y: jnp.where(apply, x, y), (m_tok, m_len, m_mask), own)
        new_carry = jax.tree.map(lambda x, y: jnp.where(attempted, x, y), new_carry, carry)
        row = MergeSamples(prompt, plen, resp, logp, rlen, attempted, apply, jnp.where(apply, src, -1), n_src,
                           jnp.where(apply, jnp.sum(m_mask), 0).astype(jnp.int32))
        return (b, new_carry, applied_so_far + apply.astype(jnp.int32)), row

    (bank, _, _), samples = jax.lax.scan(body, (bank, carry0, jnp.zeros((), jnp.int32)), (jnp.arange(C), group_start))
    return bank, samples



def merge_bank(bank, num_families: int, generate_fn: Callable, key, step, *, source_start=-1, **kw):
    """`merge_family` for families 0..num_families-1 in order (a `lax.scan`) -> (bank, MergeSamples [F, C]).

    Source ids continue across families (family f starts after the applied chunks of families < f), so
    adding the masked samples to the buffer row-major keeps ids and `source` in step.
    """
    source_start = jnp.asarray(source_start, jnp.int32)

    def body(state, f):
        b, start = state
        b, samples = merge_family(b, f, generate_fn, jax.random.fold_in(key, f), step, source_start=start, **kw)
        used = jnp.sum(samples.mask).astype(jnp.int32)
        return (b, jnp.where(start >= 0, start + used, start)), samples

    (bank, _), samples = jax.lax.scan(body, (bank, source_start), jnp.arange(num_families, dtype=jnp.int32))
    return bank, samples
