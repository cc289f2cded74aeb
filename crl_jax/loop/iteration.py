"""The Complementary RL loop, once for every path: `LoopState`, one `iteration`, the evaluation schedule,
the scanned chunk and the pure `train`.

`iteration(rt, state) -> (state, metrics)` is METHOD.md §2 as one pure function; `rt.backend`
(`crl_jax.backends.base`) supplies what depends on the models and the environment:

 1. sample G training tasks, K rollouts each; the first K/2 of a group are guided (retrieve one entry),
    the rest free (never see bank content); GRPO and warm-up steps have no guided rollouts;
 2. query = embedding of the task text + first observation; retrieval with diversity re-ranking
    (`crl_jax.actor.experience`);
 3. multi-turn rollouts (`backend.play`);
 4. extractor credit: each guided outcome (+1/-1) goes to the entry that guided it, and the per-entry
    reward to the extractor sample that last wrote the entry (before this step's edits); pruning;
 5. distillation of every (or every guided) episode and bank edits in a fixed order (`backend.distill`);
 6. actor batch (split GRPO) and extractor batch (CISPO, when the buffer holds a ready batch), one
    `co_update`;
 7. merge every `merge_every` steps (`backend.merge`).

`train(cfg, key)` = init + `lax.scan(iteration)`; `jax.vmap(lambda k: train(cfg, k)[1])(keys)` runs a seed
sweep as one program. The CLI runs the same `iteration` in scanned chunks between checkpoints, so a
resumed run is identical to an uninterrupted one. Host-side environments (`crl_jax.host.driver`) run
`prepare` and `finish` as jitted pieces around rollouts played on the host.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from crl_jax import bank as bank_lib
from crl_jax.actor.evaluate import evaluate_all
from crl_jax.actor.experience import guided_mask, query_from_observation, retrieve_entries
from crl_jax.actor.replay import bank_replay_success, can_replay
from crl_jax.actor.rollout import first_observation
from crl_jax.bank.io import load_jsonl
from crl_jax.config import ConfigError
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.extractor.archive import archive
from crl_jax.learner import precision
from crl_jax.learner import train_state as ts
from crl_jax.loop import diagnostics
from crl_jax.loop.runtime import Runtime, build, is_host
from crl_jax.losses import credit


@struct.dataclass
class MethodFlags:
    """Which parts of the method run (METHOD.md §4), as traced booleans: every method and ablation of
    one config shares one compiled program, and the skipped parts cost nothing at run time (`lax.cond`)."""

    uses_bank: jax.Array  # guided rollouts retrieve experience (all but grpo)
    edits_bank: jax.Array  # the bank is written online (crl, static_online, exp_only, archive)
    trains_actor: jax.Array  # actor updates (all but exp_only)
    trains_extractor: jax.Array  # extractor updates (crl, exp_only)
    group_split: jax.Array  # K/2 guided + K/2 free (ablation: every rollout guided)
    split_advantage: jax.Array  # per-subgroup advantages (ablation: one normalisation over the group)
    merge: jax.Array  # periodic merge (ablation: none)
    archive: jax.Array = None  # the successful episodes' moves are the entries, no extractor call (archive)
    # archive's entries are the successful episodes' end cells (oracle_archive); set only with extraction.forms,
    # so the default state's leaves are unchanged
    oracle: jax.Array = None

    @classmethod
    def from_config(cls, cfg) -> "MethodFlags":
        b = lambda v: jnp.asarray(bool(v))  # noqa: E731
        return cls(uses_bank=b(cfg.uses_bank), edits_bank=b(cfg.edits_bank), trains_actor=b(cfg.trains_actor),
                   trains_extractor=b(cfg.trains_extractor), group_split=b(cfg.loss.group_split),
                   split_advantage=b(cfg.loss.advantage == "split"), merge=b(cfg.extraction.merge),
                   archive=b(cfg.archives), oracle=b(cfg.oracle) if cfg.extraction.forms else None)


@struct.dataclass
class LoopState:
    flags: MethodFlags
    actor: ts.TrainState
    extractor: ts.TrainState
    bank: bank_lib.ExperienceBank
    buffer: buffer_lib.SampleBuffer
    key: jax.Array
    step: jax.Array  # [] int32 iterations done
    env_steps: jax.Array  # [] int32 environment steps taken so far (training rollouts)


def init_state(rt: Runtime, key, cfg=None) -> LoopState:
    """Fresh state from a run key: the backend's starting models (`rt.backend.init_models`), an empty bank
    (or the offline bank file), an empty sample buffer (their shapes bound in `rt.bank_ops` / `rt.buffer_ops`).
    `cfg` (default `rt.cfg`) sets the method flags, the models' init seeds and the offline bank file."""
    cfg = cfg or rt.cfg
    be = rt.backend
    k_run, k_a, k_e = jax.random.split(key, 3)
    actor, extractor = be.init_models(rt, cfg, k_a, k_e)
    bank = rt.bank_ops.init()
    if cfg.method == "offline":  # fill the bank from a JSON-lines file written by `crl-jax bank export`
        bank = load_jsonl(bank, rt.tokenizer, cfg.bank.offline_path, rt.embedder,
                          num_tasks=getattr(rt.env, "num_tasks", None))
    state = LoopState(
        flags=MethodFlags.from_config(cfg),
        # the Runtime's optimizers and precision (rt.cfg's param_dtype): one compiled program
        actor=ts.create_train_state(actor, rt.actor_tx, precision.master_dtype(rt.cfg.actor)),
        extractor=ts.create_train_state(extractor, rt.extractor_tx, precision.master_dtype(rt.cfg.extractor)),
        bank=bank,
        buffer=rt.buffer_ops.init(),
        key=k_run, step=jnp.int32(0), env_steps=jnp.int32(0))
    if be.donate:
        # Distinct buffers for every leaf: `compiled_chunk` donates the state, and XLA refuses to donate one
        # buffer twice (small constants such as the zero counters can share one).
        state = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), state)
    return state


def entry_credit(variant, success, entry_ids, guided, G, K, capacity):
    """Per-entry extractor rewards of one step (METHOD.md §2 step 6) from flat [N = G*K] episode data."""
    return credit.entry_rewards(variant, success.reshape(G, K), entry_ids.reshape(G, K), capacity,
                                 guided=guided.reshape(G, K))


class StepKeys(NamedTuple):
    task: jax.Array
    roll: jax.Array
    ret: jax.Array
    ext: jax.Array
    merge: jax.Array
    rows: jax.Array


def step_keys(state: LoopState) -> StepKeys:
    """The keys of one iteration, a pure function of (run key, step)."""
    return StepKeys(*jax.random.split(jax.random.fold_in(state.key, state.step), 6))


def sample_tasks(rt: Runtime, state: LoopState) -> jax.Array:
    """[N = G*K] training-pool task indices of this step (each of G tasks repeated K times)."""
    G, K = rt.cfg.rollout.groups, rt.cfg.rollout.group_size
    return jnp.repeat(jax.random.randint(step_keys(state).task, (G,), 0, rt.env.num_tasks), K)


class Prepared(NamedTuple):
    """Everything the rollouts of one step need, decided before they start (steps 1-2)."""

    tasks: jax.Array  # [N] int32
    task_tokens: jax.Array  # [N, Lt]
    task_len: jax.Array  # [N]
    guided: jax.Array  # [N] bool
    q: jax.Array  # [N, D] retrieval queries (also the keys of new entries)
    bank: bank_lib.ExperienceBank  # after retrieval bookkeeping
    slots: jax.Array  # [N] retrieved slot or -1
    exp: jax.Array  # [N, L] retrieved entry tokens (0 where none)
    exp_len: jax.Array  # [N]
    has_exp: jax.Array  # [N] bool


def prepare(rt: Runtime, state: LoopState, obs=None, obs_len=None) -> Prepared:
    """Steps 1-2: tasks, guided/free split, retrieval. `obs` [N, Lo] / `obs_len` [N]: the rendered first
    observations (default: from the built-in env with the reset keys `play` uses); host-side environments
    pass their own."""
    cfg = rt.cfg
    N = cfg.rollout.groups * cfg.rollout.group_size
    k = step_keys(state)
    tasks = sample_tasks(rt, state)
    task_tokens, task_len = rt.train_task_tokens[tasks], rt.train_task_len[tasks]
    guided = guided_mask(rt, state.flags, state.step).reshape(N)
    if obs is None:
        obs, obs_len = first_observation(rt.env, rt.renderer, k.roll, tasks)
    q = query_from_observation(rt.embedder, task_tokens, task_len, obs, obs_len,
                               with_obs=getattr(rt.env, "query_observation", True))
    bank, slots, exp, exp_len, has_exp = retrieve_entries(rt.bank_ops, state.bank, k.ret, state.step, q, guided)
    return Prepared(tasks, task_tokens, task_len, guided, q, bank, slots, exp, exp_len, has_exp)


def iteration(rt: Runtime, state: LoopState):
    """One step on any backend: `prepare` -> the backend's compiled rollouts -> `finish`."""
    p = prepare(rt, state)
    ep = rt.backend.play(rt, state, p, step_keys(state).roll)
    return finish(rt, state, p, ep)


def distill_mask(mode: str, guided):
    """[N] bool: the episodes distilled, every one ("all") or the guided subgroup ("guided_only") whether or not
    its query found an entry (with `has_exp` instead, an empty bank, or a level with no entry, never got its first
    one)."""
    return guided.astype(bool) if mode == "guided_only" else jnp.ones(guided.shape, bool)


def finish(rt: Runtime, state: LoopState, p: Prepared, ep):
    """Steps 4-7 from the played episodes (of any backend: `success`, `reward`, `turns` [N] and what the
    backend's distill / actor batch read): credit, pruning, distillation, co-update, merge -> (state, metrics)."""
    cfg, be = rt.cfg, rt.backend
    G, K = cfg.rollout.groups, cfg.rollout.group_size
    N = G * K
    k = step_keys(state)
    step, flags = state.step, state.flags
    guided, slots, has_exp = p.guided, p.slots, p.has_exp
    success = ep.success.astype(jnp.float32)

    # 4. extractor credit, before this step's edits change any entry's source
    # (one computation: the per-entry outcome credit is the extractor's reward in the default variant and
    # the bank's lifetime record, which evaluation's tie-break reads, in every variant)
    entry_ids = jnp.where(has_exp, slots, -1)
    outcome = entry_credit("outcome", success, entry_ids, guided, G, K, cfg.bank.capacity)
    er = outcome if cfg.extraction.reward == "outcome" else entry_credit(cfg.extraction.reward, success, entry_ids,
                                                                         guided, G, K, cfg.bank.capacity)
    bank = rt.bank_ops.credit(p.bank, outcome.sum, outcome.count)
    credited = er.count > 0
    buffer = rt.buffer_ops.credit(state.buffer, bank.source, er.mean, jnp.ones_like(er.count),
                                  credited & (bank.source >= 0) & (not cfg.extraction.oracle_write_reward))
    # pruning (our extension): entries whose credit this step is below `bank.prune_below` are removed
    bank, n_pruned = rt.bank_ops.prune(bank, er.mean, credited & flags.edits_bank)

    # 5. distillation (skipped at run time for methods that do not edit the bank); a RETURN decision's reward
    # is what its group's free rollouts earned (stored only with extraction.return_samples > 0)
    mask = distill_mask(cfg.extraction.distill, guided)
    ret_value, ret_ok = credit.return_values(cfg.extraction.reward, success.reshape(G, K), guided.reshape(G, K))

    forms = rt.tiny is not None and cfg.extraction.forms  # per-episode FACT writes as a third row

    def packed(d):
        return d.bank, d.buffer, jnp.stack([d.n_add, d.n_update, d.n_return, d.n_invalid,
                                            d.n_add_failed, d.n_return_trained, d.n_update_unretrieved,
                                            d.n_invalid_trained]).astype(jnp.int32), \
            jnp.stack([d.adds, d.updates] + ([jnp.zeros((N,), jnp.int32) if d.facts is None else d.facts]
                                             if forms else [])).astype(jnp.int32), \
            jnp.asarray(d.op_entropy, jnp.float32)

    def do_distill(bb):
        return packed(be.distill(rt, bb[0], bb[1], state.extractor.params, k.ext, step, task_tokens=p.task_tokens,
                                 task_len=p.task_len, episodes=ep, keys=p.q, exp=p.exp, exp_len=p.exp_len,
                                 has_exp=has_exp, slots=slots, mask=mask, return_value=ret_value.reshape(N),
                                 return_ok=ret_ok.reshape(N)))

    def no_edit(bb):
        return bb[0], bb[1], jnp.zeros((8,), jnp.int32), jnp.zeros((3 if forms else 2, N), jnp.int32), \
            jnp.float32(jnp.nan)

    branches = [no_edit, do_distill]
    if rt.tiny is not None:  # archive's entries are plans of action tokens (config check: tiny models only)
        branches.append(lambda bb: packed(archive(rt, bb[0], bb[1], k.ext, step, episodes=ep, keys=p.q,
                                                  slots=slots)))
    arch = len(branches) - 1
    if forms:  # oracle_archive: the end cells (config check: only with the forms)
        branches.append(lambda bb: packed(archive(rt, bb[0], bb[1], k.ext, step, episodes=ep, keys=p.q,
                                                  slots=slots, fact=True)))
        arch = jnp.where(flags.oracle, len(branches) - 1, arch)
    # 0: no bank edit, 1: the extractor distils (skipped at run time by the switch), 2: archive, 3: oracle_archive
    which = jnp.where(flags.edits_bank, jnp.where(flags.archive, arch, 1), 0)
    bank, buffer, ops, per_ep, op_ent = jax.lax.switch(which, branches, (bank, buffer))
    n_add, n_upd, n_ret, n_inv = ops[0], ops[1], ops[2], ops[3]
    n_failed_ep = jnp.sum(~ep.success.astype(bool) & mask)

    # 6. one co-update
    ab, a_metrics = be.actor_batch(rt, ep, guided.reshape(G, K), flags.split_advantage, k.rows)
    ready = rt.buffer_ops.ready(buffer) & flags.trains_extractor
    buffer, eb = be.extractor_batch(rt, buffer, step, ready, jax.random.fold_in(k.rows, 1))
    ab = ab.replace(weight=jnp.where(flags.trains_actor, ab.weight, 0.0))  # zero weight: no actor step
    actor, extractor, u_metrics = rt.co_update(state.actor, state.extractor, ab, eb)

    # 7. merge
    bank, buffer, n_merged = be.merge(rt, bank, buffer, extractor.params, k.merge, step,
                                      flags.edits_bank & flags.merge & ~flags.archive)

    metrics = {
        "success_guided": masked_mean(success, guided),
        "success_free": masked_mean(success, ~guided),
        "success_all": success.mean(),
        "retrieved_frac": masked_mean(has_exp.astype(jnp.float32), guided),
        "pruned_entries": n_pruned.astype(jnp.float32),
        "episode_turns": ep.turns.astype(jnp.float32).mean(),
        "bank_size": rt.bank_ops.size(bank).astype(jnp.float32),
        "extractor_reward_mean": jnp.where(credited.any(), jnp.sum(jnp.where(credited, er.mean, 0.0))
                                           / jnp.maximum(credited.sum(), 1), jnp.nan),
        "extractor_ready": ready.astype(jnp.float32),
        "ops_add": n_add.astype(jnp.float32), "ops_update": n_upd.astype(jnp.float32),
        "ops_return": n_ret.astype(jnp.float32), "ops_invalid": n_inv.astype(jnp.float32),
        "ops_return_trained": ops[5].astype(jnp.float32), "ops_update_unretrieved": ops[6].astype(jnp.float32),
        "ops_invalid_trained": ops[7].astype(jnp.float32),
        "write_rate_failed": jnp.where(flags.edits_bank & (n_failed_ep > 0),
                                       ops[4] / jnp.maximum(n_failed_ep, 1), jnp.nan).astype(jnp.float32),
        "merged_entries": n_merged.astype(jnp.float32),
        "buffer_overflow": buffer.overflow_count.astype(jnp.float32),
        # rewards that found their sample gone (evicted from the buffer before its entry was first tried)
        "credit_dropped": buffer.dropped.astype(jnp.float32),
        # is the extractor learning? (loop/diagnostics.py)
        **{k_: jnp.where(flags.edits_bank, v, jnp.nan).astype(jnp.float32)
           for k_, v in diagnostics.op_rates(per_ep[0], per_ep[1], success, mask).items()},
        "retrieved_credit_pos": diagnostics.positive_credit_share(p.bank, slots, has_exp).astype(jnp.float32),
        "op_entropy": op_ent,
        **({k_: jnp.where(flags.edits_bank, v, jnp.nan).astype(jnp.float32)
            for k_, v in diagnostics.fact_shares(per_ep[2], per_ep[0] + per_ep[1]).items()} if forms else {}),
        **be.episode_metrics(rt, ep), **a_metrics, **u_metrics,
    }
    env_steps = state.env_steps + ep.turns.sum().astype(jnp.int32)
    metrics["env_steps"] = env_steps.astype(jnp.float32)
    new = LoopState(flags=flags, actor=actor, extractor=extractor, bank=bank, buffer=buffer, key=state.key,
                    step=step + 1, env_steps=env_steps)
    return new, metrics


def masked_mean(x, m):
    """Mean of x over m (NaN when m is empty)."""
    m = m.astype(jnp.float32)
    return jnp.where(m.sum() > 0, jnp.sum(x * m) / jnp.maximum(m.sum(), 1.0), jnp.nan)


EVAL_KEYS = ("eval_heldin_with_exp", "eval_heldin_without_exp", "eval_heldout_with_exp", "eval_heldout_without_exp")


def eval_due(step, last_step, every: int):
    """Is an evaluation due after `step` iterations: every `every` steps and at `last_step` (`every` = 0:
    only at `last_step`). Python ints (the host driver) or traced scalars (the compiled loop)."""
    return (step == last_step) if every == 0 else ((step % every == 0) | (step == last_step))


def step_with_eval(rt: Runtime, state: LoopState, last_step):
    """iteration, then (every eval.every steps and at `last_step`) the four evaluations; NaN otherwise.

    `last_step` is a traced scalar, so runs of different lengths share one compiled program.
    """
    state, m = iteration(rt, state)
    keys = EVAL_KEYS + REPLAY_KEYS
    nan = {k: jnp.float32(jnp.nan) for k in keys}
    ev = jax.lax.cond(eval_due(state.step, last_step, rt.cfg.eval.every),
                      lambda s: {**evaluate_all(rt, s, rt.backend.evaluate_pool), **bank_replay(rt, s)},
                      lambda s: nan, state)
    return state, {**m, **ev}


REPLAY_KEYS = ("bank_replay_success",)


def bank_replay(rt: Runtime, state: LoopState) -> dict:
    """At evaluation: the share of the bank's valid entries whose plan succeeds when replayed on its level
    (`actor.replay`; the tiny models' plans on a built-in env, NaN on other paths and without a bank)."""
    if not can_replay(rt):
        return {"bank_replay_success": jnp.float32(jnp.nan)}
    v = bank_replay_success(rt, state.bank)
    return {"bank_replay_success": jnp.where(state.flags.uses_bank, v, jnp.nan).astype(jnp.float32)}


def run_steps(rt: Runtime, state: LoopState, num_steps: int, last_step):
    """`num_steps` iterations as one `lax.scan` -> (state, metrics with a leading [num_steps] axis)."""
    return jax.lax.scan(lambda s, _: step_with_eval(rt, s, last_step), state, None, length=num_steps)


def train(cfg, key):
    """Pure run: init + scan over all `cfg.steps` -> (final LoopState, metrics [steps]).

    jit- and vmap-able in `key`: `jax.jit(jax.vmap(lambda k: train(cfg, k)))(keys)` is a seed sweep.
    (Built-in environments and tiny models; the LLM path runs through `crl_jax.infra.run.run`.)
    """
    rt = build(cfg)
    if is_host(rt):
        raise ConfigError(f"env.name={cfg.env.name!r} is a host-side environment: it cannot run inside one "
                          "compiled program; use crl_jax.infra.run.run (crl-jax train), which steps it on the host")
    return run_steps(rt, init_state(rt, key, cfg), cfg.steps, cfg.steps)


@functools.lru_cache(maxsize=16)
def compiled_chunk(rt: Runtime, num_steps: int):
    """Jitted `(state, last_step) -> run_steps(...)` for a fixed chunk length (the CLI's unit between
    checkpoints); shared by every seed and run length of one config. When the backend says so
    (`rt.backend.donate`, the LLM path) the input state is DONATED: do not use it after the call."""
    return jax.jit(lambda s, last: run_steps(rt, s, num_steps, last),
                   donate_argnums=(0,) if rt.backend.donate else ())
