"""The loop's periodic merge (METHOD.md §2 step 8): every `merge_every` steps the extractor rewrites the
bank chunk by chunk (`crl_jax.extractor.merge.merge_bank`); the merge generations that were applied become
extractor samples in the buffer (their ids are the `source` of the merged entries), so merged entries
earn reward like any other. Skipped inside the compiled program (`lax.cond`) on other steps.

`merge_into(...)` is shared by both paths; they differ in how the extractor answers: the tiny path
samples constrained op tokens (`run_merge` here), the LLM path writes JSON operations parsed by one host
callback per chunk (`crl_jax.backends.llm.merge`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from crl_jax.extractor.merge import grouped_chunk_bound, merge_bank
from crl_jax.sampling import SamplerConfig, sample_tokens

Piece = tuple[jax.Array, jax.Array]  # (tokens [L] int32, length [] int32) of one fixed prompt piece


class MergePieces(NamedTuple):
    """The fixed pieces of a merge prompt, in `crl_jax.extractor.merge.merge_family`'s layout: header, then
    (when lessons are carried) context + the carried lessons, then entries + the chunk's entries (each after
    `sep`), then suffix. Built once per Runtime (tiny path: `crl_jax.loop.runtime`; LLM path:
    `crl_jax.backends.llm.prompt_pieces.build_merge_pieces`)."""

    header: Piece
    sep: Piece
    context: Piece
    entries: Piece
    suffix: Piece


def merge_response_len(cfg) -> int:
    """Tokens a constrained merge response may use: room for `merge_chunk` entries of op + entry tokens."""
    return cfg.extraction.merge_chunk * (cfg.bank.entry_len + 1)


def merge_prompt_len(cfg, pieces: MergePieces, max_out: int | None = None) -> int:
    """Static merge prompt length: the pieces plus `max_out` (default: merge_chunk) carried and
    `merge_chunk` chunk entries."""
    b, e = cfg.bank, cfg.extraction
    max_out = e.merge_chunk if max_out is None else max_out
    fixed = sum(int(tokens.shape[0]) for tokens, _ in pieces)
    return fixed + (max_out + e.merge_chunk) * (int(pieces.sep[0].shape[0]) + b.entry_len)


def merge_similarity(cfg):
    """`merge_family(min_similarity=)`: the bank's similarity floor, None when off (chunks then ignore keys)."""
    return cfg.bank.min_similarity if cfg.bank.min_similarity > -1.0 else None


def max_chunks(cfg) -> int:
    """Chunks visited per merge (static): the whole bank, or `merge_max_chunks` of its oldest entries.
    The whole bank is ceil(capacity / chunk) chunks, or with the similarity floor on (each key group from a
    fresh chunk) `merge.grouped_chunk_bound` = capacity // 2 (empty chunks skip the generation)."""
    N, c = cfg.bank.capacity, cfg.extraction.merge_chunk
    whole = -(-N // c) if merge_similarity(cfg) is None else grouped_chunk_bound(N, c)
    m = cfg.extraction.merge_max_chunks
    return whole if m <= 0 else min(m, whole)


def merge_into(rt, bank, buffer, key, step, *, generate_fn, max_out: int, parse_fn=None, op_ids=None,
               fixed_width: bool = False, entry_map=None):
    """Merge family 0 of the bank with `rt.merge_pieces`; applied merges join the buffer
    -> (bank, buffer, number of merged chunks). `fixed_width`: entries take their full width in the
    prompt (the tiny compact layout, `merge.merge_family`); `entry_map`: the bank's entries as the extractor
    reads them (`LLMParts.extractor_segment`)."""
    cfg = rt.cfg
    p = rt.merge_pieces
    bank, s = merge_bank(bank, 1, generate_fn, key, step, source_start=buffer.next_id,
                         header_tokens=p.header, entry_sep=p.sep, context_prefix=p.context,
                         entries_prefix=p.entries, suffix=p.suffix,
                         max_prompt=merge_prompt_len(cfg, p, max_out), max_entries_out=max_out, op_ids=op_ids,
                         eos_id=rt.extractor_tokenizer.eos_id, chunk=cfg.extraction.merge_chunk,
                         max_chunks=max_chunks(cfg), pad_id=rt.extractor_tokenizer.pad_id, parse_fn=parse_fn,
                         min_similarity=merge_similarity(cfg), fixed_width=fixed_width, entry_map=entry_map)
    flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), s)
    P, R = buffer.prompt.shape[1], buffer.response.shape[1]
    pad2 = lambda x, n, v=0: jnp.pad(x, ((0, 0), (0, n - x.shape[1])), constant_values=v)  # noqa: E731
    buffer, _ = rt.buffer_ops.add_many(buffer, pad2(flat.prompt, P), flat.prompt_len, pad2(flat.response, R),
                                       flat.response_len, pad2(flat.logp, R, 0.0), step, flat.mask)
    return bank, buffer, jnp.sum(flat.mask).astype(jnp.int32)


def run_merge(rt, bank, buffer, eparams, key, step):
    """Tiny path: constrained op-token responses -> (bank, buffer, number of merged chunks)."""
    cfg = rt.cfg
    scfg = SamplerConfig(max_new_tokens=merge_response_len(cfg), temperature=cfg.extraction.temperature,
                         stop_tokens=(rt.tokenizer.eos_id,), pad_id=rt.tokenizer.pad_id)
    allowed = rt.tiny.response_allowed(merge_response_len(cfg))

    def generate_fn(prompt, plen, k):
        return sample_tokens(rt.extractor_graphdef, eparams, prompt, plen, k, scfg, allowed[None])

    return merge_into(rt, bank, buffer, key, step, generate_fn=generate_fn, max_out=cfg.extraction.merge_chunk,
                      op_ids=rt.tiny.op_ids, fixed_width=cfg.rollout.view == "compact")


def maybe_merge(rt, bank, buffer, eparams, key, step, enabled, run=run_merge):
    """`run` (a path's merge) on steps where (step + 1) % merge_every == 0 and `enabled` (traced bool)."""
    cfg = rt.cfg
    if not cfg.extraction.merge:  # static (part of the Runtime): no merge program, and no room for one in the buffer
        return bank, buffer, jnp.int32(0)
    due = ((step + 1) % cfg.extraction.merge_every == 0) & enabled
    return jax.lax.cond(due, lambda a: run(rt, *a, eparams, key, step),
                        lambda a: (a[0], a[1], jnp.int32(0)), (bank, buffer))
