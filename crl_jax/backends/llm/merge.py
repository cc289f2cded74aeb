"""The periodic merge on the LLM path (METHOD.md §2 step 8): the extractor reads a chunk of lessons
(merge_system / merge_user templates, with the lessons carried from the previous chunk) and answers with
a JSON list of `add` operations in `<answer>...</answer>`; those lessons replace the chunk. As for
distillation, the prompt holds one worked example (`llm_prompt.merge_example`) and ends with a prefilled
`<answer>[` (`llm_prompt.merge_prefill`), which the parser puts back before the reply.

Bank walk, carry, provenance and the buffer samples are the tiny path's (`crl_jax.extractor.merge_step.merge_into`
over `crl_jax.extractor.merge.merge_family`). Only the reading differs: each chunk's response goes through the same
host parser as distillation (`crl_jax.extractor.ops_json`, one `jax.pure_callback` per generated chunk; empty
chunks skip both generation and callback). A malformed answer, or one without an `add`, leaves the chunk
as it was and writes no sample. At most `MAX_OPS` (3) lessons come out of a chunk, as the prompt says.
"""

from __future__ import annotations

from crl_jax.backends.llm.adapters import extractor_params
from crl_jax.backends.llm.prompt_pieces import merge_prefill
from crl_jax.extractor.merge_step import maybe_merge as _maybe_merge
from crl_jax.extractor.merge_step import MergePieces, merge_into, merge_prompt_len
from crl_jax.extractor.ops_json import MAX_OPS, parse_operations_callback
from crl_jax.sampling import SamplerConfig, sample_tokens


def max_out(cfg) -> int:
    """Merged lessons per chunk: the JSON answer's operation cap, at most the chunk size."""
    return min(cfg.extraction.merge_chunk, MAX_OPS)


def prompt_len(cfg, pieces: MergePieces) -> int:
    """Static length of a merge prompt (`pieces`: `crl_jax.backends.llm.prompt_pieces.build_merge_pieces`)."""
    return merge_prompt_len(cfg, pieces, max_out(cfg))


def parse_merge_response(rt, resp, rlen):
    """One response [R] -> (op [3], entry [3, L], entry_len [3], mask [3]) through the host JSON parser; with
    `llm_prompt.merge_prefill` the reply is read as the continuation of the prefill ('<answer>[')."""
    etok = rt.extractor_tokenizer  # the reply in the extractor's tokens, the entries in the actor's (the bank's)
    prefill = merge_prefill(rt.cfg.prompts, rt.cfg.llm_prompt)
    decode = (lambda ids: prefill + etok.decode(ids)) if prefill else etok.decode
    ops = parse_operations_callback(resp[None], rlen[None], decode, rt.tokenizer.encode, rt.cfg.bank.entry_len)
    return ops["op"][0], ops["entry"][0], ops["entry_len"][0], ops["mask"][0]


def run_merge(rt, bank, buffer, eparams, key, step):
    """Merge the bank now with the extractor's free-text JSON answers -> (bank, buffer, merged chunks)."""
    cfg = rt.cfg
    scfg = SamplerConfig(max_new_tokens=cfg.extraction.max_new_tokens, temperature=cfg.extraction.temperature,
                         stop_tokens=(rt.extractor_tokenizer.eos_id,), pad_id=rt.extractor_tokenizer.pad_id)
    params = extractor_params(eparams)  # LoRA: base + adapters, once for the whole merge

    def generate_fn(prompt, plen, k):
        return sample_tokens(rt.extractor_graphdef, params, prompt, plen, k, scfg)

    return merge_into(rt, bank, buffer, key, step, generate_fn=generate_fn, max_out=max_out(cfg),
                      parse_fn=lambda r, n: parse_merge_response(rt, r, n), entry_map=rt.llm.extractor_segment)


def maybe_merge(rt, bank, buffer, eparams, key, step, enabled):
    """`run_merge` every `merge_every` steps when `enabled` (traced bool)."""
    return _maybe_merge(rt, bank, buffer, eparams, key, step, enabled, run=run_merge)
