"""Greedy evaluation on fixed task pools, with and without experience (METHOD.md §2, last paragraph).

Held-in = the first `eval.tasks` levels of the training pool; held-out = the first `eval.tasks` levels of
the disjoint evaluation pool (on the room's families: `eval.tasks` episodes, the families in turn, each
episode at its own layout). Both play `env.for_evaluation()`: the env itself, or, for envs whose episodes
draw their own layouts (the room's families), the env drawing only layouts that training never draws.
"With experience" retrieves plain cosine top-1 from the current bank (no diversity re-ranking, usage counts
untouched: evaluation never changes the state); "without" is the same episode with no experience segment. Each
task is played once, greedily, from a fixed key. The with- and without-experience episodes of a pool run as one
batch (one compiled rollout per pool).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.actor.experience import query_keys, retrieve_entries
from crl_jax.actor.rollout import episode_reset_keys, play

EVAL_KEY = 1234  # evaluation episodes use a fixed key: the same levels and env randomness every time


def pool_episodes(env, eval_tasks: int, heldout: bool):
    """(env played, tasks [n], key) of one pool's evaluation episodes (reset keys `episode_reset_keys(key, n)`):
    `env.for_evaluation()` (layouts training never draws, where episodes draw their own), the first
    min(eval_tasks, num_tasks) tasks (with per-episode layouts: eval_tasks episodes, the tasks in turn)."""
    env = env.for_evaluation() if hasattr(env, "for_evaluation") else env  # (host pools have no layouts)
    if getattr(env, "episode_layouts", False):
        tasks = jnp.arange(eval_tasks, dtype=jnp.int32) % env.num_tasks
    else:
        tasks = jnp.arange(min(eval_tasks, env.num_tasks), dtype=jnp.int32)
    return env, tasks, jax.random.fold_in(jax.random.key(EVAL_KEY), int(heldout))


def pool_setup(rt, state, heldout: bool):
    """The evaluation episodes of one pool, shared by the tiny and the LLM path: (env, renderer, key, tasks [n],
    task tokens [n, Lt], lengths [n], retrieved exp [n, L], exp_len [n], has [n]) — the first n tasks, a
    fixed key, plain top-1 retrieval (no diversity bookkeeping) for methods with a bank."""
    env, renderer, key, tasks, tt, tl, _, exp, exp_len, has = pool_retrieval(rt, state, heldout, state.bank)
    return env, renderer, key, tasks, tt, tl, exp, exp_len, has


def pool_retrieval(rt, state, heldout: bool, bank):
    """`pool_setup` from `bank` (e.g. the state's bank with some entries left out), with the retrieved slots:
    (env, renderer, key, tasks, task tokens, lengths, slots [n] (-1: none), exp, exp_len, has)."""
    env, tasks, key = pool_episodes(rt.eval_env if heldout else rt.env, rt.cfg.eval.tasks, heldout)
    renderer = rt.eval_renderer if heldout else rt.renderer
    n = tasks.shape[0]
    tt = (rt.eval_task_tokens if heldout else rt.train_task_tokens)[tasks]
    tl = (rt.eval_task_len if heldout else rt.train_task_len)[tasks]
    q = query_keys(rt.embedder, env, renderer, key, tasks, tt, tl)
    _, slots, exp, exp_len, has = retrieve_entries(rt.bank_ops, bank, None, state.step, q,
                                                   jnp.broadcast_to(state.flags.uses_bank, (n,)), diverse=False)
    return env, renderer, key, tasks, tt, tl, slots, exp, exp_len, has


def greedy_success(rt, state, env, renderer, key, tasks, task_tokens, task_len, variants) -> jax.Array:
    """[V, n] float32: each of the n pool episodes played once per experience variant, all as one batch with the
    same reset keys (same level and env randomness in every variant). `variants`: V tuples (exp [n, L],
    exp_len [n], has [n]); evaluation plays (retrieved, none), `bank replay` also the pick among working entries."""
    cfg = rt.cfg
    n, v = tasks.shape[0], len(variants)
    rep = lambda x: jnp.concatenate([x] * v, 0)  # noqa: E731  rows [i n, (i + 1) n): variant i
    cat = lambda i: jnp.concatenate([var[i] for var in variants], 0)  # noqa: E731
    temp = 0.0 if cfg.eval.greedy else cfg.actor.temperature
    ep = play(state.actor.graphdef, state.actor.params, env, renderer, rt.tiny.seg, rt.tiny.action_ids, key,
              tasks=rep(tasks), task_tokens=rep(task_tokens), task_len=rep(task_len), exp=cat(0), exp_len=cat(1),
              has_exp=cat(2), num_turns=rt.num_turns, temperature=temp, turn_marker=cfg.rollout.turn_marker,
              reset_keys=rep(episode_reset_keys(key, n)), share_prefix=cfg.rollout.share_prefix, prefix_block=n,
              turn_block=cfg.rollout.turn_block)
    return ep.success.astype(jnp.float32).reshape(v, n)


def evaluate_pool(rt, state, *, heldout: bool) -> tuple[jax.Array, jax.Array]:
    """(success with experience, success without) [] of greedy episodes on one pool."""
    env, renderer, key, tasks, tt, tl, exp, exp_len, has = pool_setup(rt, state, heldout)
    s = greedy_success(rt, state, env, renderer, key, tasks, tt, tl,
                       [(exp, exp_len, has), (exp, exp_len, jnp.zeros_like(has))])
    return s[0].mean(), s[1].mean()


def evaluate_all(rt, state, pool_fn=None) -> dict:
    """The four evaluation metrics; `pool_fn` (default `evaluate_pool`) plays one pool (the LLM path its own)."""
    pool_fn = pool_fn or evaluate_pool
    out = {}
    for pool, heldout in (("heldin", False), ("heldout", True)):
        with_exp, without = pool_fn(rt, state, heldout=heldout)
        out[f"eval_{pool}_with_exp"] = jnp.where(state.flags.uses_bank, with_exp, jnp.nan)
        out[f"eval_{pool}_without_exp"] = without
    return out
