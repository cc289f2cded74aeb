"""One compiled iteration of the LLM path, on the same `crl_jax.loop.LoopState` as the tiny path.

Steps (METHOD.md §2): `crl_jax.loop.prepare` (tasks, guided/free split, retrieval) -> `play` (multi-turn
chat rollouts, free-text answers) -> extractor credit -> distillation with JSON operations (one host
callback) -> split-GRPO actor batch of whole conversations + CISPO extractor batch -> one co-update ->
the periodic merge by the updated extractor (JSON answers, `crl_jax.llm.merge`).
Metrics carry the tiny loop's keys (plus `invalid_action_frac`, `prompt_fill`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax import bank as bank_lib
from crl_jax import buffer as buffer_lib
from crl_jax import loop as tiny
from crl_jax import train_state as ts
from crl_jax.batches import episode_advantages, extractor_batch
from crl_jax.llm.distill import distill
from crl_jax.llm.evaluate import evaluate_all
from crl_jax.llm.merge import maybe_merge
from crl_jax.llm.merge import prompt_len as merge_prompt_len
from crl_jax.llm.rollout import LLMEpisodes, play
from crl_jax.models import transformer as tr


def _model(graphdef, cfg, host, key):
    if host is None:
        return tr.create(cfg, key)
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), host))


def init_state(rt, key, cfg=None) -> tiny.LoopState:
    """Fresh LoopState: pretrained weights (separate copies for actor and extractor), empty bank and buffer."""
    cfg = cfg or rt.cfg
    k_run, k_a, k_e = jax.random.split(key, 3)
    a_w, e_w = rt.actor_weights, rt.extractor_weights
    if cfg.format_prior.enabled:  # METHOD.md §6: the same format prior for every method (cached)
        from crl_jax.llm.format_prior import starting_weights

        w = starting_weights(rt)
        a_w, e_w = w["actor"], w["extractor"]
    actor = _model(rt.actor_graphdef, rt.actor_config, a_w, jax.random.fold_in(k_a, cfg.actor.init_seed))
    extractor = _model(rt.extractor_graphdef, rt.extractor_config, e_w,
                       jax.random.fold_in(k_e, cfg.extractor.init_seed))
    bank = bank_lib.init(cfg.bank.capacity, cfg.bank.entry_len, cfg.bank.key_dim)
    if cfg.method == "offline":
        from crl_jax.bank_io import load_jsonl

        bank = load_jsonl(bank, rt.tokenizer, cfg.bank.offline_path, rt.embedder)
    state = tiny.LoopState(
        flags=tiny.MethodFlags.from_config(cfg),
        actor=ts.create_train_state(actor, rt.actor_tx), extractor=ts.create_train_state(extractor, rt.extractor_tx),
        # merge samples share the buffer with distillations: prompts as wide as the longer of the two
        bank=bank, buffer=buffer_lib.init(cfg.extraction.buffer_capacity,
                                          max(cfg.extraction.prompt_len, merge_prompt_len(cfg, rt.merge_pieces)),
                                          cfg.extraction.max_new_tokens),
        key=k_run, step=jnp.int32(0), env_steps=jnp.int32(0))
    # Distinct buffers for every leaf: `compiled_chunk` donates the state, and XLA refuses to donate one
    # buffer twice (small constants such as the zero counters can share one).
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), state)


def actor_batch(rt, ep: LLMEpisodes, guided, split):
    """Whole conversations [N, P] as rows, reply tokens trained, split-GRPO advantages and weights."""
    G, K = guided.shape
    adv, w = episode_advantages(rt, ep.reward.reshape(G, K), guided, split)
    batch = ts.ActorBatch(tokens=ep.tokens, loss_mask=ep.loss_mask, behavior_logp=ep.logp,
                          advantages=adv.reshape(-1), weight=w.reshape(-1))
    return batch, {"adv_abs_mean": jnp.abs(adv).mean()}


def iteration(rt, state: tiny.LoopState):
    cfg = rt.cfg
    p = tiny.prepare(rt, state)
    k = tiny.step_keys(state)
    ep = play(rt, state.actor.params, k.roll, env=rt.env, renderer=rt.renderer, tasks=p.tasks,
              task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len, has_exp=p.has_exp,
              temperature=cfg.actor.temperature)
    return finish(rt, state, p, ep)


def finish(rt, state: tiny.LoopState, p: tiny.Prepared, ep: LLMEpisodes):
    cfg = rt.cfg
    G, K = cfg.rollout.groups, cfg.rollout.group_size
    N = G * K
    k = tiny.step_keys(state)
    step, flags = state.step, state.flags
    guided, slots, has_exp = p.guided, p.slots, p.has_exp
    success = ep.success.astype(jnp.float32)

    # credit before this step's edits change any entry's source
    entry_ids = jnp.where(has_exp, slots, -1)
    er = tiny.entry_credit(cfg.extraction.reward, success, entry_ids, guided, G, K, cfg.bank.capacity)
    bank = bank_lib.credit(p.bank, slots, has_exp, 2.0 * success - 1.0, has_exp)
    bank, _, _, _ = bank_lib.take_credit(bank)
    credited = er.count > 0
    buffer = buffer_lib.credit(state.buffer, bank.source, er.mean, jnp.ones_like(er.count),
                               credited & (bank.source >= 0))

    mask = has_exp if cfg.extraction.distill == "guided_only" else jnp.ones((N,), bool)

    def do_distill(bb):
        d = distill(rt, bb[0], bb[1], state.extractor.params, k.ext, step, task_tokens=p.task_tokens,
                    task_len=p.task_len, episodes=ep, keys=p.q, exp=p.exp, exp_len=p.exp_len, has_exp=has_exp,
                    slots=slots, mask=mask)
        return d.bank, d.buffer, jnp.stack([d.n_add, d.n_update, d.n_return, d.n_invalid]).astype(jnp.int32)

    bank, buffer, ops = jax.lax.cond(flags.edits_bank, do_distill,
                                     lambda bb: (bb[0], bb[1], jnp.zeros((4,), jnp.int32)), (bank, buffer))

    ab, a_metrics = actor_batch(rt, ep, guided.reshape(G, K), flags.split_advantage)
    ready = buffer_lib.ready(buffer, cfg.extraction.batch) & flags.trains_extractor
    buffer, eb = extractor_batch(rt, buffer, step, ready)
    ab = ab.replace(weight=jnp.where(flags.trains_actor, ab.weight, 0.0))
    actor, extractor, u_metrics = rt.co_update(state.actor, state.extractor, ab, eb)
    bank, buffer, n_merged = maybe_merge(rt, bank, buffer, extractor.params, k.merge, step,
                                         flags.edits_bank & flags.merge)

    played = jnp.maximum(ep.turns.sum(), 1).astype(jnp.float32)
    metrics = {
        "success_guided": tiny._masked_mean(success, guided),
        "success_free": tiny._masked_mean(success, ~guided),
        "success_all": success.mean(),
        "retrieved_frac": tiny._masked_mean(has_exp.astype(jnp.float32), guided),
        "episode_turns": ep.turns.astype(jnp.float32).mean(),
        "bank_size": bank_lib.size(bank).astype(jnp.float32),
        "extractor_reward_mean": jnp.where(credited.any(), jnp.sum(jnp.where(credited, er.mean, 0.0))
                                           / jnp.maximum(credited.sum(), 1), jnp.nan),
        "extractor_ready": ready.astype(jnp.float32),
        "ops_add": ops[0].astype(jnp.float32), "ops_update": ops[1].astype(jnp.float32),
        "ops_return": ops[2].astype(jnp.float32), "ops_invalid": ops[3].astype(jnp.float32),
        "merged_entries": n_merged.astype(jnp.float32),
        "buffer_overflow": buffer.overflow_count.astype(jnp.float32),
        "invalid_action_frac": ep.invalid.sum().astype(jnp.float32) / played,
        "prompt_fill": ep.length.max().astype(jnp.float32) / ep.tokens.shape[1],
        **a_metrics, **u_metrics,
    }
    env_steps = state.env_steps + ep.turns.sum().astype(jnp.int32)
    metrics["env_steps"] = env_steps.astype(jnp.float32)
    new = tiny.LoopState(flags=flags, actor=actor, extractor=extractor, bank=bank, buffer=buffer, key=state.key,
                         step=step + 1, env_steps=env_steps)
    return new, metrics


def step_with_eval(rt, state, last_step):
    """iteration, then the four evaluations every `eval.every` steps and at `last_step` (NaN otherwise)."""
    state, m = iteration(rt, state)
    every = rt.cfg.eval.every
    due = (state.step == last_step) if every == 0 else ((state.step % every == 0) | (state.step == last_step))
    nan = {k: jnp.float32(jnp.nan) for k in tiny.EVAL_KEYS}
    ev = jax.lax.cond(due, lambda s: evaluate_all(rt, s), lambda s: nan, state)
    return state, {**m, **ev}


def run_steps(rt, state, num_steps: int, last_step):
    return jax.lax.scan(lambda s, _: step_with_eval(rt, s, last_step), state, None, length=num_steps)


@functools.lru_cache(maxsize=16)
def compiled_chunk(rt, num_steps: int):
    """Jitted `(state, last_step) -> (state, metrics [num_steps])` (the CLI's unit between checkpoints).

    The input state is DONATED (two models with AdamW states do not fit twice in memory): do not use it
    after the call."""
    return jax.jit(lambda s, last: run_steps(rt, s, num_steps, last), donate_argnums=(0,))
