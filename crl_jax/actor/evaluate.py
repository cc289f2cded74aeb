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
    env, tasks, key = pool_episodes(rt.eval_env if heldout else rt.env, rt.cfg.eval.tasks, heldout)
    renderer = rt.eval_renderer if heldout else rt.renderer
    n = tasks.shape[0]
    tt = (rt.eval_task_tokens if heldout else rt.train_task_tokens)[tasks]
    tl = (rt.eval_task_len if heldout else rt.train_task_len)[tasks]
    q = query_keys(rt.embedder, env, renderer, key, tasks, tt, tl)
    _, _, exp, exp_len, has = retrieve_entries(rt.bank_ops, state.bank, None, state.step, q,
                                               jnp.broadcast_to(state.flags.uses_bank, (n,)), diverse=False)
    return env, renderer, key, tasks, tt, tl, exp, exp_len, has


def evaluate_pool(rt, state, *, heldout: bool) -> tuple[jax.Array, jax.Array]:
    """(success with experience, success without) [] of greedy episodes on one pool."""
    cfg = rt.cfg
    env, renderer, key, tasks, tt, tl, exp, exp_len, has = pool_setup(rt, state, heldout)
    n = tasks.shape[0]
    two = lambda x: jnp.concatenate([x, x], 0)  # noqa: E731  rows [0, n): with experience, [n, 2n): without
    temp = 0.0 if cfg.eval.greedy else cfg.actor.temperature
    # Both halves get the same reset keys: same level and env randomness with and without experience.
    ep = play(state.actor.graphdef, state.actor.params, env, renderer, rt.tiny.seg, rt.tiny.action_ids, key,
              tasks=two(tasks), task_tokens=two(tt), task_len=two(tl), exp=two(exp), exp_len=two(exp_len),
              has_exp=jnp.concatenate([has, jnp.zeros_like(has)]), num_turns=rt.num_turns, temperature=temp,
              turn_marker=cfg.rollout.turn_marker, reset_keys=two(episode_reset_keys(key, n)),
              share_prefix=cfg.rollout.share_prefix, prefix_block=n, turn_block=cfg.rollout.turn_block)
    s = ep.success.astype(jnp.float32)
    return s[:n].mean(), s[n:].mean()


def evaluate_all(rt, state, pool_fn=None) -> dict:
    """The four evaluation metrics; `pool_fn` (default `evaluate_pool`) plays one pool (the LLM path its own)."""
    pool_fn = pool_fn or evaluate_pool
    out = {}
    for pool, heldout in (("heldin", False), ("heldout", True)):
        with_exp, without = pool_fn(rt, state, heldout=heldout)
        out[f"eval_{pool}_with_exp"] = jnp.where(state.flags.uses_bank, with_exp, jnp.nan)
        out[f"eval_{pool}_without_exp"] = without
    return out
