"""The extractor's side of one LLM step: distillation prompts, free-text generation, JSON operations.

For each distilled episode the extractor reads goal, outcome, the entry that guided it (if any) and the
transcript (`crl_jax.backends.llm.prompt_pieces.distill_prompt`) and answers with a JSON list of at most 3
operations in `<answer>...</answer>`. Parsing is the step's only host work: ONE batched
`jax.pure_callback` (`crl_jax.extractor.ops_json.parse_operations_callback`: decode -> parse -> encode the
entries), which never raises; malformed outputs count as invalid and write nothing.

Operations are applied in (episode, position) order with a `lax.scan`, so the result is deterministic.
`add` writes a new entry keyed by the episode's retrieval query; `update` rewrites the entry retrieved
for that episode (ignored when there was none, or when an earlier add of this step reused its slot).
A response that wrote anything is one extractor sample in the buffer; its id is the written entries'
`source`, so they later earn reward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.backends.llm.adapters import extractor_params
from crl_jax.backends.llm.prompt_pieces import distill_prompt
from crl_jax.extractor.distill import (ADD, UPDATE, DistillOut, apply_operations, resolve_ops, store_invalid,
                                      store_returns, update_targets)
from crl_jax.extractor.ops_json import parse_operations_callback
from crl_jax.sampling import SamplerConfig, sample_tokens


def distill_prompts(rt, task_tokens, task_len, ep, exp, exp_len, has_exp):
    """[N, Pd] prompts and [N] lengths (Pd = extraction.prompt_len)."""
    p, budget, pad = rt.llm.distill_pieces, rt.cfg.extraction.prompt_len, rt.tokenizer.pad_id
    return jax.vmap(lambda g, gl, o, ol, a, ac, s, e, el, he: distill_prompt(p, budget, g, gl, o, ol, a, ac, s, e, el,
                                                                             he, pad))(
        task_tokens, task_len, ep.obs, ep.obs_len, ep.actions, ep.active, ep.success, exp, exp_len, has_exp)


def parse_responses(rt, resp, rlen):
    """Host callback: response tokens [N, R] -> op arrays (see `operations_to_arrays`)."""
    tok, prefill = rt.tokenizer, rt.llm.distill_pieces.prefill
    # the prefill (e.g. '<answer>[') ends the prompt: the reply is read as its continuation
    decode = (lambda ids: prefill + tok.decode(ids)) if prefill else tok.decode
    return parse_operations_callback(resp, rlen, decode, tok.encode, rt.cfg.bank.entry_len)


def distill(rt, bank, buffer, eparams, key, step, *, task_tokens, task_len, episodes, keys, exp, exp_len, has_exp,
            slots, mask, return_value=None, return_ok=None) -> DistillOut:
    cfg = rt.cfg
    N = task_tokens.shape[0]
    prompts, plen = distill_prompts(rt, task_tokens, task_len, episodes, exp, exp_len, has_exp)
    scfg = SamplerConfig(max_new_tokens=cfg.extraction.max_new_tokens, temperature=cfg.extraction.temperature,
                         stop_tokens=(rt.tokenizer.eos_id,), pad_id=rt.tokenizer.pad_id)
    resp, logp, rlen = sample_tokens(rt.extractor_graphdef, extractor_params(eparams), prompts, plen, key, scfg)
    ops = parse_responses(rt, resp, rlen)
    M = ops["op"].shape[1]
    chosen = ops["op"]
    unretrieved = ops["mask"] & (chosen == UPDATE) & ~has_exp[:, None] & mask[:, None]
    target = update_targets(bank, has_exp, slots)[:, None]  # the retrieved entry was not pruned this step
    ops = dict(ops, op=resolve_ops(chosen, target, cfg.extraction.update_unretrieved))
    op_ok = ops["mask"] & ((ops["op"] == ADD) | ((ops["op"] == UPDATE) & target)) & mask[:, None]
    writes = op_ok.any(1)
    P, R = buffer.prompt.shape[1], buffer.response.shape[1]
    pad2 = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1])))
    buffer, ids = rt.buffer_ops.add_many(buffer, pad2(prompts, P), plen, pad2(resp, R), rlen, pad2(logp, R), step,
                                         writes)
    rep = lambda x: jnp.repeat(x, M, axis=0)  # noqa: E731
    flat = lambda x: x.reshape((N * M,) + x.shape[2:])  # noqa: E731
    bank = apply_operations(rt.bank_ops, bank, flat(op_ok), flat(ops["op"]), flat(ops["entry"]),
                            flat(ops["entry_len"]), rep(keys), rep(slots), rep(ids), key, step,
                            fallback_add=cfg.extraction.update_unretrieved == "add")
    valid = ops["valid"] & mask
    n_add = jnp.sum(op_ok & (ops["op"] == ADD))
    n_update = jnp.sum(op_ok & (ops["op"] == UPDATE))
    n_invalid = jnp.sum(mask & ~ops["valid"])
    n_return = jnp.sum(valid & ~writes)
    n_failed = jnp.sum(writes & ~episodes.success.astype(bool))
    n_ret_trained = jnp.int32(0)
    if return_value is not None and cfg.extraction.return_samples > 0:  # a RETURN sample is its whole reply
        buffer, stored = store_returns(buffer, valid & ~writes, prompts, plen, resp, rlen, logp, return_value,
                                       return_ok, cfg.extraction.return_samples, jax.random.fold_in(key, 7), step)
        n_ret_trained = jnp.sum(stored)
    buffer, n_inv_trained = store_invalid(rt, buffer, mask & ~ops["valid"], prompts, plen, resp, rlen, logp, key,
                                          step)
    return DistillOut(bank, buffer, n_add, n_update, n_return, n_invalid, n_failed, n_ret_trained,
                      jnp.sum(unretrieved), n_inv_trained, jnp.sum(op_ok & (ops["op"] == ADD), 1).astype(jnp.int32),
                      jnp.sum(op_ok & (ops["op"] == UPDATE), 1).astype(jnp.int32))
