"""Do the bank's plans work? Each valid entry's moves replayed open-loop on its level (a diagnostic).

The built-in levels are deterministic, so an entry of the tiny default (a sequence of action tokens) either
reaches the goal on its level or it does not: `bank_replay_success` is the share of valid entries whose
plan does, a measure of what the extractor writes that needs no actor. An entry's level is the training
level whose retrieval query its key matches best (keys are the queries of the episodes they came from, and
the task text names the level). Everything is a pure function of the bank: jitted inside the loop's
program, at evaluation steps only (`loop.step_with_eval`).

On an env whose episodes draw their own layouts (`Env.episode_layouts`: the room's families) an entry's
level is its family, and its plan is replayed on `REPLAY_LAYOUTS` layouts of that family that training never
draws (`env.for_evaluation()`): `bank_replay_success` is then the mean share over them, i.e. how often a
written plan works on a fresh layout of its family (a copied plan rarely does: see `envs/families.py`).

With the entry forms (`extraction.forms`) a FACT entry names a cell, not moves: it "replays to success" when
that cell is its level's goal as the view shows it (the hero's `<r> <c>` standing on the stairs), i.e. when an
actor that goes to the named cell would succeed (the goal-knowing solver does on 99.7% of layouts). On an env
whose levels have no stairs cell a FACT entry counts as failed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.actor.experience import query_keys
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.envs.actions import token_to_action
from crl_jax.envs.compact import is_fact

REPLAY_KEY = 4321  # the levels' reset keys (fixed: the replay of a bank never depends on the run's keys)
REPLAY_LAYOUTS = 4  # fresh layouts per family where episodes draw their own layouts


def replay_plan(env, action_ids, task, tokens, length, reset_key) -> jax.Array:
    """[] bool: the moves `tokens[:length]` (action tokens [L]; a token that is no action is an invalid move)
    played from `env.reset(reset_key, task)` reach success. Moves after the episode ended change nothing."""
    state, _ = env.reset(reset_key, task)
    actions = token_to_action(tokens, action_ids)

    def body(s, i):
        ns, _, _, _, _ = env.step(s, actions[i])
        return jax.tree.map(lambda a, b: jnp.where(i < length, a, b), ns, s), None

    state, _ = jax.lax.scan(body, state, jnp.arange(tokens.shape[0]))
    return state.success.astype(bool)


def goal_fact(env, renderer, task, reset_key) -> jax.Array:
    """[2] int32: the view's `<r> <c>` tokens of the hero standing on the goal of `env.reset(reset_key, task)`'s
    level (-1s where the level has no stairs cell): the FACT that names that goal."""
    state, _ = env.reset(reset_key, task)
    stairs = getattr(state.level, "stairs", None)
    if stairs is None or not hasattr(state, "pos"):
        return jnp.full((2,), -1, jnp.int32)
    return renderer(state.replace(pos=stairs))[0][:2].astype(jnp.int32)


def entry_levels(bank_keys, level_queries) -> jax.Array:
    """[N] int32: for each entry key [N, D] the level whose query [n, D] it matches best (cosine)."""
    return jnp.argmax(bank_keys @ level_queries.T, axis=1).astype(jnp.int32)


def replay_ok(env, action_ids, bank, level_queries, tasks, reset_keys, renderer=None, row_ids=None) -> jax.Array:
    """[N] bool: each bank entry's plan succeeds on its level (valid or not). `level_queries` [n, D], `tasks` [n],
    `reset_keys` [n]: the candidate levels, their queries and reset keys. With `row_ids` (the entry forms' row
    tokens [H]) and the view's `renderer`, a FACT entry succeeds when it names its level's goal (`goal_fact`)."""
    lvl = entry_levels(bank.keys, level_queries)
    ok = jax.vmap(lambda t, e, el, k: replay_plan(env, action_ids, t, e, el, k))(
        tasks[lvl], bank.tokens, bank.lengths, reset_keys[lvl])
    if row_ids is not None:
        goals = jax.vmap(lambda t, k: goal_fact(env, renderer, t, k))(tasks, reset_keys)[lvl]  # [N, 2]
        fact = is_fact(bank.tokens, bank.lengths, row_ids)
        ok = jnp.where(fact, jnp.all(bank.tokens[:, :2] == goals, axis=-1), ok)
    return ok


def _valid_mean(ok, valid) -> jax.Array:
    n = valid.sum()
    return jnp.where(n > 0, jnp.sum(ok * valid) / jnp.maximum(n, 1), jnp.nan).astype(jnp.float32)


def replay_share(env, action_ids, bank, level_queries, tasks, reset_keys, renderer=None, row_ids=None) -> jax.Array:
    """[] share of the bank's valid entries whose plan succeeds on their level (`replay_ok`; NaN for an empty
    bank)."""
    return _valid_mean(replay_ok(env, action_ids, bank, level_queries, tasks, reset_keys, renderer, row_ids),
                       bank.valid)


def can_replay(rt) -> bool:
    """Entries replay only as the tiny models' tokens on a built-in env (an LLM's entries are text, a host game
    has no pure step function)."""
    return rt.backend.name == "builtin" and rt.tiny is not None


def level_queries(rt):
    """(tasks [n], key, queries [n, D]) of the training pool's levels as replay sees them (`REPLAY_KEY`): an
    entry's level is the one whose query its key matches best (`entry_levels`)."""
    tasks = jnp.arange(rt.env.num_tasks, dtype=jnp.int32)
    key = jax.random.key(REPLAY_KEY)
    return tasks, key, query_keys(rt.embedder, rt.env, rt.renderer, key, tasks, rt.train_task_tokens,
                                  rt.train_task_len)


def entry_replays(rt, bank) -> jax.Array:
    """[N] float32: for each bank entry of a Runtime of the tiny models on a built-in env, the share of its
    level's replay layouts on which it succeeds (0 or 1 on fixed levels; over `REPLAY_LAYOUTS` evaluation layouts
    of its family where episodes draw their own layouts)."""
    n = rt.env.num_tasks
    tasks, key, q = level_queries(rt)
    fact = (rt.renderer, rt.tiny.row_ids)
    if not getattr(rt.env, "episode_layouts", False):
        return replay_ok(rt.env, rt.tiny.action_ids, bank, q, tasks, episode_reset_keys(key, n), *fact
                         ).astype(jnp.float32)
    env = rt.env.for_evaluation()  # the family's query has no observation: `q` is the same for any layout
    keys = jnp.stack([episode_reset_keys(jax.random.fold_in(key, i), n) for i in range(REPLAY_LAYOUTS)])
    ok = jax.vmap(lambda k: replay_ok(env, rt.tiny.action_ids, bank, q, tasks, k, *fact))(keys)
    return jnp.mean(ok.astype(jnp.float32), axis=0)


def bank_replay_success(rt, bank) -> jax.Array:
    """[] the valid entries' mean of `entry_replays` (NaN for an empty bank)."""
    return _valid_mean(entry_replays(rt, bank), bank.valid)
