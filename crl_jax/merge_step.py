"""The loop's periodic merge (METHOD.md §2 step 8): every `merge_every` steps the extractor rewrites the
bank chunk by chunk (`crl_jax.merge.merge_bank`); the merge generations that were applied become
extractor samples in the buffer (their ids are the `source` of the merged entries), so merged entries
earn reward like any other. Skipped inside the compiled program (`lax.cond`) on other steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax import buffer as buffer_lib
from crl_jax.merge import merge_bank
from crl_jax.sampling import SamplerConfig, sample_tokens


def merge_response_len(cfg) -> int:
    """Tokens a merge response may use: room for `merge_chunk` entries of op + entry tokens."""
    return cfg.extraction.merge_chunk * (cfg.bank.entry_len + 1)


def merge_prompt_len(rt) -> int:
    b, e = rt.cfg.bank, rt.cfg.extraction
    pieces = sum(int(rt.merge_pieces[k][0].shape[0]) for k in ("header", "sep", "context", "entries", "suffix"))
    return pieces + 2 * e.merge_chunk * (int(rt.merge_pieces["sep"][0].shape[0]) + b.entry_len)


def run_merge(rt, bank, buffer, eparams, key, step):
    """Merge family 0 of the bank now -> (bank, buffer, number of merged chunks)."""
    cfg = rt.cfg
    scfg = SamplerConfig(max_new_tokens=merge_response_len(cfg), temperature=cfg.extraction.temperature,
                         stop_tokens=(rt.tokenizer.eos_id,), pad_id=rt.tokenizer.pad_id)
    allowed = rt.response_allowed(merge_response_len(cfg))

    def generate_fn(prompt, plen, k):
        return sample_tokens(rt.extractor_graphdef, eparams, prompt, plen, k, scfg, allowed[None])

    p = rt.merge_pieces
    bank, s = merge_bank(bank, 1, generate_fn, key, step, source_start=buffer.next_id,
                         header_tokens=p["header"], entry_sep=p["sep"], context_prefix=p["context"],
                         entries_prefix=p["entries"], suffix=p["suffix"], max_prompt=merge_prompt_len(rt),
                         max_entries_out=cfg.extraction.merge_chunk, op_ids=rt.op_ids, eos_id=rt.tokenizer.eos_id,
                         chunk=cfg.extraction.merge_chunk, pad_id=rt.tokenizer.pad_id)
    flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), s)
    P, R = buffer.prompt.shape[1], buffer.response.shape[1]
    pad2 = lambda x, n, v=0: jnp.pad(x, ((0, 0), (0, n - x.shape[1])), constant_values=v)  # noqa: E731
    buffer, _ = buffer_lib.add_many(buffer, pad2(flat.prompt, P), flat.prompt_len, pad2(flat.response, R),
                                    flat.response_len, pad2(flat.logp, R, 0.0), step, flat.mask)
    return bank, buffer, jnp.sum(flat.mask).astype(jnp.int32)


def maybe_merge(rt, bank, buffer, eparams, key, step, enabled):
    """run_merge on steps where (step + 1) % merge_every == 0 and `enabled` (traced bool)."""
    cfg = rt.cfg
    due = ((step + 1) % cfg.extraction.merge_every == 0) & enabled
    return jax.lax.cond(due, lambda a: run_merge(rt, *a, eparams, key, step),
                        lambda a: (a[0], a[1], jnp.int32(0)), (bank, buffer))
