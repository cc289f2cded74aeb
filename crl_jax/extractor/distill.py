"""The extractor's side of one step: distillation prompts, generation, operations applied to the bank.

For each distilled episode the extractor reads (goal = task text, moves = the actions taken, outcome,
the entry that guided it if any) and answers with one constrained operation: `<ADD>` + entry,
`<UPDATE>` + entry (rewrites the retrieved entry), or `<RETURN>`. Entries of the tiny default are
sequences of action tokens (a plan); the response mask enforces op-token-first, then actions or EOS.

With `extraction.forms` the op token is followed by a form token, `<MOVES>` (the entry is the moves) or `<FACT>`
(the entry is the episode's end cell, shown in the prompt after the moves): `crl_jax.extractor.forms`.

Operations are applied in episode order (a `lax.scan`), so the result is deterministic. Every add or
update is a generation that can later earn reward: it goes into the extractor sample buffer, and its
buffer id becomes the entry's `source`. `<RETURN>` and malformed responses write nothing and are counted.
An `<UPDATE>` on an episode that retrieved nothing is written as an ADD (`resolve_ops`,
`extraction.update_unretrieved`).

With `extraction.return_samples = n > 0` (our extension) up to n well-formed `<RETURN>` decisions per step
also go into the buffer, already credited with `credit.return_values` (what playing without an entry earned
in the episode's group): the extractor then learns when writing beats not writing, and a run whose
extractor stopped writing still has samples that can teach it to write again. A tiny RETURN sample is
its op token alone (what follows it is never read); an LLM one is its whole reply.
With `extraction.return_counterfactual` (tiny path) they are drawn among every distilled episode, whatever op it
drew: a RETURN's reward is known without playing it, so an episode the extractor wrote also yields the no-write
sample its write is compared with (behaviour log-prob: the sampler's, `return_logprob`). Sampled RETURNs alone
leave an extractor that writes nearly every failed episode with ~1 no-write sample per step.
With `extraction.invalid_samples = n > 0` (METHOD.md §3's option) up to n malformed replies per step go into
the buffer credited with `extraction.invalid_reward` (-1): the extractor is taught not to write them.
An `<UPDATE>` whose entry this step's pruning removed is resolved as one with nothing retrieved
(`update_targets`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from crl_jax import bank as bank_lib
from crl_jax import token_draw
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.extractor.forms import FACT, parse_form
from crl_jax.extractor.ops import build_distill_prompt, parse_constrained
from crl_jax.losses.credit import outcome_scores
from crl_jax.models import transformer as tr
from crl_jax.sampling import SamplerConfig, sample_tokens

ADD, UPDATE, RETURN = 0, 1, 2


def resolve_ops(op, has_exp, update_unretrieved: str):
    """The operations to apply: op [...] with an UPDATE chosen where nothing was retrieved (`has_exp` False,
    broadcast against op) turned into an ADD when `update_unretrieved == "add"` (our decision,
    `extraction.update_unretrieved`): there is no entry to rewrite, so the entry is written as a new one.
    With "ignore" such an UPDATE writes nothing, as a RETURN does; an extractor whose UPDATEs are rewarded
    on guided episodes can then drift into writing nothing at all (no-op UPDATEs on every other episode,
    no new entries, the bank pruned away; seen on 1 of 5 demo seeds)."""
    if update_unretrieved == "add":
        return jnp.where((op == UPDATE) & ~has_exp, ADD, op)
    return op


class DistillOut(NamedTuple):
    bank: object
    buffer: object
    n_add: jax.Array
    n_update: jax.Array
    n_return: jax.Array
    n_invalid: jax.Array
    n_add_failed: jax.Array  # adds / updates written from failed episodes (what RL should learn to avoid)
    n_return_trained: jax.Array = jnp.int32(0)  # no-write decisions stored with their reward (return_samples)
    n_update_unretrieved: jax.Array = jnp.int32(0)  # UPDATEs chosen with nothing retrieved (`resolve_ops`)
    n_invalid_trained: jax.Array = jnp.int32(0)  # malformed replies stored with `invalid_reward` (invalid_samples)
    adds: jax.Array | None = None  # [N] int32 ADDs written from each episode (the outcome-split op rates)
    updates: jax.Array | None = None  # [N] int32 UPDATEs written from each episode
    op_entropy: jax.Array = jnp.float32(jnp.nan)  # [] mean entropy of the op token over the distilled episodes
    facts: jax.Array | None = None  # [N] int32 FACT entries written from each episode (`extraction.forms`)


def store_invalid(rt, buffer, invalid, prompts, plen, resp, rlen, logp, key, step):
    """Up to `extraction.invalid_samples` of the malformed replies `invalid` [N] (drawn uniformly) into the
    buffer, each credited once with `extraction.invalid_reward`, their whole reply trained -> (buffer, count)."""
    n = rt.cfg.extraction.invalid_samples
    if n <= 0:
        return buffer, jnp.int32(0)
    value = jnp.full(invalid.shape, rt.cfg.extraction.invalid_reward, jnp.float32)
    buffer, stored = store_returns(buffer, invalid, prompts, plen, resp, rlen, logp, value, jnp.ones_like(invalid),
                                   n, jax.random.fold_in(key, 8), step)
    return buffer, jnp.sum(stored).astype(jnp.int32)


def distill_prompts(rt, task_tokens, task_len, episodes, success, exp, exp_len, has_exp, end_cell=None):
    """Per-episode distillation prompts [N, P] and lengths [N] (trajectory truncated from the left).

    Compact view: the moves are a fixed-width block of T tokens (PAD after the last move) right before
    the answer, so the entry's j-th token copies the block's j-th token at a fixed distance.
    `end_cell` [N, 2] (`extraction.forms`): the episode's end cell `<r> <c>`, right after the moves (what a
    FACT entry copies; the moves alone do not say where the episode ended)."""
    d = rt.tiny.distill
    budget = rt.cfg.extraction.prompt_len
    compact = rt.cfg.rollout.view == "compact"
    moves, n_moves = episodes.action_tokens, episodes.turns
    if compact:
        T = moves.shape[1]
        moves = jnp.where(jnp.arange(T)[None] < n_moves[:, None], moves, rt.tokenizer.pad_id)
        n_moves = jnp.full_like(n_moves, T)

    def one(tt, tl, moves, n_moves, ok, e, el, he, end):
        i = ok.astype(jnp.int32)
        return build_distill_prompt(d.header, (tt, tl), moves, n_moves, (d.outcome[0][i], d.outcome[1][i]),
                                    e, jnp.where(he, el, 0), budget, trajectory_prefix=d.trajectory,
                                    retrieved_prefix=d.retrieved, suffix=d.answer,
                                    pad_id=rt.tokenizer.pad_id, moves_last=compact,
                                    outcome_last=rt.cfg.extraction.outcome_last, end_cell=end)

    return jax.vmap(one)(task_tokens, task_len, moves, n_moves, success, exp, exp_len, has_exp, end_cell)


def op_entropy(logits, op_ids, temperature: float, mask) -> jax.Array:
    """[] mean over `mask` [N] of the entropy (nats) of the op token's distribution: softmax over the op
    tokens `op_ids` [3] of `logits` [N, V] / temperature (the response mask's first step; temperature 0 =
    greedy sampling, measured at 1). NaN when nothing is masked. A collapsed extractor (ADD always) is at 0,
    a uniform one at log 3."""
    z = logits[:, op_ids].astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
    logp = jax.nn.log_softmax(z, axis=-1)
    h = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    m = mask.astype(jnp.float32)
    return jnp.where(m.sum() > 0, jnp.sum(h * m) / jnp.maximum(m.sum(), 1.0), jnp.nan)


def return_logprob(first_logits, first_allowed, return_id: int, temperature: float, mix: float) -> jax.Array:
    """[N] log-prob of the op token `return_id` under the sampler's first-step distribution: the logits
    `first_logits` [N, V] masked to `first_allowed` [V], over `temperature` (greedy: 1), mixed with the uniform
    over the allowed tokens by `mix` (`extraction.op_explore`), as `token_draw.sample_logits` draws it."""
    x = token_draw.filter_logits(first_logits, temperature=temperature if temperature > 0 else 1.0,
                                 allowed=first_allowed)
    if mix > 0:
        x = token_draw.mix_uniform(jax.nn.log_softmax(x, axis=-1), jnp.float32(mix))
    return jax.nn.log_softmax(x, axis=-1)[:, return_id]


def update_targets(bank, has_exp, slots):
    """[N] bool: the entry an episode retrieved (`slots` [N], where `has_exp`) is still in `bank` — this
    step's pruning may have removed it before distillation. An UPDATE without a target is resolved like one
    chosen where nothing was retrieved (`resolve_ops`): written as a new entry, or not at all."""
    return has_exp & bank_lib.can_update(bank, slots)


def apply_operations(bank_ops: bank_lib.BankOps, bank, writes, op, entry, entry_len, keys, slots, ids, key, step,
                     fallback_add: bool = False):
    """Apply operations in order (a `lax.scan` over the leading axis [M]): where `writes`, `op` ADD adds
    `entry` under `keys` (family 0; a full bank evicts by `bank_ops`' policy), UPDATE rewrites the entry in
    `slots`; `ids` become the entries' source. `bank_ops`: a Runtime's `rt.bank_ops`.

    An update must not rewrite a slot that an earlier add of the same call has reused: it is pinned to the
    insertion counter the entry had before the call (`bank.update(expect_order=...)`). Such an update (its
    entry evicted by an earlier add of the call) is written as an add with `fallback_add`
    (`extraction.update_unretrieved="add"`), and is dropped otherwise.
    """
    orders = bank.insert_order[jnp.maximum(slots, 0)]

    def apply_one(b, xs):
        w, o, e, el, k, s, sid, order, i = xs
        added, _ = bank_ops.add(b, e, el, k, jnp.int32(0), step, sid, rng=jax.random.fold_in(key, 1000 + i))
        updated = bank_ops.update(b, s, e, el, step, sid, expect_order=order)
        as_add = (o == ADD) | (fallback_add & ~bank_lib.can_update(b, s, order))  # its entry is gone
        nb = jax.tree_util.tree_map(lambda a, u: jnp.where(as_add, a, u), added, updated)
        return jax.tree_util.tree_map(lambda n_, o_: jnp.where(w, n_, o_), nb, b), None

    bank, _ = jax.lax.scan(apply_one, bank, (writes, op, entry, entry_len, keys, slots, ids, orders,
                                             jnp.arange(writes.shape[0])))
    return bank


def store_returns(buffer, is_return, prompts, plen, resp, rlen, logp, value, ok, num: int, key, step):
    """Up to `num` of the RETURN decisions `is_return` [N] (where `ok` [N]), drawn uniformly with `key`,
    into the buffer in episode order, each credited once with its `value` [N] -> (buffer, stored [N] bool).

    prompts [N, P'] / resp, logp [N, R'] are padded to the buffer's widths here; rlen [N] is what the
    CISPO loss will train (1 = the op token alone)."""
    cand = is_return & ok
    if num <= 0:
        return buffer, jnp.zeros_like(cand)
    prio = jnp.where(cand, jax.random.uniform(key, cand.shape), -1.0)
    _, idx = jax.lax.top_k(prio, min(num, cand.shape[0]))
    chosen = jnp.zeros_like(cand).at[idx].set(True) & cand
    P, R = buffer.prompt.shape[1], buffer.response.shape[1]
    pad2 = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1])))  # noqa: E731
    buffer, ids = buffer_lib.add_many(buffer, pad2(prompts, P), plen, pad2(resp, R), rlen, pad2(logp, R), step,
                                      chosen)
    buffer = buffer_lib.credit(buffer, ids, value, jnp.ones_like(ids), chosen)
    return buffer, chosen


def distill(rt, bank, buffer, eparams, key, step, *, task_tokens, task_len, episodes, keys, exp, exp_len,
            has_exp, slots, mask, return_value=None, return_ok=None) -> DistillOut:
    """Generate one operation per masked episode and apply them to bank and buffer in episode order.
    `return_value` / `return_ok` [N]: the reward of a RETURN per episode (`credit.return_values`); with
    `extraction.return_samples > 0` that many RETURN decisions are stored with it (module docstring)."""
    cfg = rt.cfg
    forms = cfg.extraction.forms
    prompts, plen = distill_prompts(rt, task_tokens, task_len, episodes, episodes.success, exp, exp_len, has_exp,
                                    episodes.end_cell if forms else None)
    scfg = SamplerConfig(max_new_tokens=cfg.extraction.max_new_tokens, temperature=cfg.extraction.temperature,
                         stop_tokens=(rt.tokenizer.eos_id,), pad_id=rt.tokenizer.pad_id,
                         first_mix=cfg.extraction.op_explore)
    allowed = rt.tiny.response_allowed(cfg.extraction.max_new_tokens)[None]
    resp, logp, rlen = sample_tokens(rt.extractor_graphdef, eparams, prompts, plen, key, scfg, allowed)
    if forms:
        t = rt.tiny
        chosen, form, entry, entry_len, valid = jax.vmap(
            lambda r, n: parse_form(r, n, t.op_ids, t.form_ids, t.action_ids, t.row_ids, t.col_ids,
                                    rt.tokenizer.eos_id, cfg.bank.entry_len))(resp, rlen)
    else:
        chosen, entry, entry_len, valid = jax.vmap(
            lambda r, n: parse_constrained(r, n, rt.tiny.op_ids, rt.tokenizer.eos_id, cfg.bank.entry_len))(resp, rlen)
    target = update_targets(bank, has_exp, slots)
    op = resolve_ops(chosen, target, cfg.extraction.update_unretrieved)
    writes = mask & valid & ((op == ADD) | ((op == UPDATE) & target))
    P, R = buffer.prompt.shape[1], buffer.response.shape[1]  # the buffer may be wider (merge samples)
    pad2 = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1])))  # noqa: E731
    buffer, ids = rt.buffer_ops.add_many(buffer, pad2(prompts, P), plen, pad2(resp, R), rlen, pad2(logp, R), step,
                                         writes)
    if cfg.extraction.oracle_write_reward:  # the diagnostic oracle: each write's reward now, its episode's outcome
        buffer = rt.buffer_ops.credit(buffer, ids, outcome_scores(episodes.success), jnp.ones_like(ids), writes)

    bank = apply_operations(rt.bank_ops, bank, writes, op, entry, entry_len, keys, slots, ids, key, step,
                            fallback_add=cfg.extraction.update_unretrieved == "add")
    # the op token's distribution: one more forward of the prompts (the sampler keeps no distribution)
    model = tr.merge(rt.extractor_graphdef, eparams)
    first = model.unembed(model.last_hidden(prompts, plen)[:, None])[:, 0]  # [N, V] the response's first step
    n_ret_trained = jnp.int32(0)
    if return_value is not None and cfg.extraction.return_samples > 0:
        is_return, ret_resp, ret_logp = mask & valid & ~writes, resp, logp
        if cfg.extraction.return_counterfactual:  # every episode's RETURN, sampled or not (module docstring)
            lp = return_logprob(first, allowed[0, 0], rt.tiny.op_ids[RETURN], cfg.extraction.temperature,
                                cfg.extraction.op_explore)
            is_return = mask
            ret_resp = jnp.zeros_like(resp).at[:, 0].set(rt.tiny.op_ids[RETURN])
            ret_logp = jnp.zeros_like(logp).at[:, 0].set(lp)
        buffer, stored = store_returns(buffer, is_return, prompts, plen, ret_resp, jnp.ones_like(rlen), ret_logp,
                                       return_value, return_ok, cfg.extraction.return_samples,
                                       jax.random.fold_in(key, 7), step)
        n_ret_trained = jnp.sum(stored)
    n_invalid = jnp.sum(mask & ~valid)
    buffer, n_inv_trained = store_invalid(rt, buffer, mask & ~valid, prompts, plen, resp, rlen, logp, key, step)
    n_add = jnp.sum(writes & (op == ADD))
    n_update = jnp.sum(writes & (op == UPDATE))
    n_failed = jnp.sum(writes & ~episodes.success.astype(bool))
    ent = op_entropy(first, rt.tiny.op_ids, cfg.extraction.temperature, mask)
    return DistillOut(bank, buffer, n_add, n_update, jnp.sum(mask) - n_add - n_update - n_invalid, n_invalid,
                      n_failed, n_ret_trained, jnp.sum(mask & valid & (chosen == UPDATE) & ~has_exp), n_inv_trained,
                      (writes & (op == ADD)).astype(jnp.int32), (writes & (op == UPDATE)).astype(jnp.int32), ent,
                      (writes & (form == FACT)).astype(jnp.int32) if forms else None)
