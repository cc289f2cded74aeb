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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.actor.experience import query_keys
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.envs.actions import token_to_action

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


def entry_levels(bank_keys, level_queries) -> jax.Array:
    """[N] int32: for each entry key [N, D] the level whose query [n, D] it matches best (cosine)."""
    return jnp.argmax(bank_keys @ level_queries.T, axis=1).astype(jnp.int32)


def replay_share(env, action_ids, bank, level_queries, tasks, reset_keys) -> jax.Array:
    """[] share of the bank's valid entries whose plan succeeds on their level (NaN for an empty bank).
    `level_queries` [n, D], `tasks` [n], `reset_keys` [n]: the candidate levels, their queries and reset keys."""
    lvl = entry_levels(bank.keys, level_queries)
    ok = jax.vmap(lambda t, e, el, k: replay_plan(env, action_ids, t, e, el, k))(
        tasks[lvl], bank.tokens, bank.lengths, reset_keys[lvl])
    n = bank.valid.sum()
    return jnp.where(n > 0, jnp.sum(ok & bank.valid) / jnp.maximum(n, 1), jnp.nan).astype(jnp.float32)


def bank_replay_success(rt, bank) -> jax.Array:
    """`replay_share` over the training pool of a Runtime of the tiny models on a built-in env (on families:
    its mean over `REPLAY_LAYOUTS` evaluation layouts of each family)."""
    n = rt.env.num_tasks
    tasks = jnp.arange(n, dtype=jnp.int32)
    key = jax.random.key(REPLAY_KEY)
    q = query_keys(rt.embedder, rt.env, rt.renderer, key, tasks, rt.train_task_tokens, rt.train_task_len)
    if not getattr(rt.env, "episode_layouts", False):
        return replay_share(rt.env, rt.tiny.action_ids, bank, q, tasks, episode_reset_keys(key, n))
    env = rt.env.for_evaluation()  # the family's query has no observation: `q` is the same for any layout
    keys = jnp.stack([episode_reset_keys(jax.random.fold_in(key, i), n) for i in range(REPLAY_LAYOUTS)])
    return jnp.mean(jax.vmap(lambda k: replay_share(env, rt.tiny.action_ids, bank, q, tasks, k))(keys))
