"""Greedy evaluation of the LLM actor on fixed task pools, with and without experience (as
`crl_jax.evaluate`: plain cosine top-1, no bookkeeping; both halves share reset keys)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.evaluate import EVAL_KEY
from crl_jax.llm.rollout import play
from crl_jax.rollout import episode_reset_keys


def evaluate_pool(rt, state, *, heldout: bool):
    from crl_jax.loop import query_keys, retrieve_entries

    cfg = rt.cfg
    env = rt.eval_env if heldout else rt.env
    renderer = rt.eval_renderer if heldout else rt.renderer
    n = min(cfg.eval.tasks, env.num_tasks)
    tasks = jnp.arange(n, dtype=jnp.int32)
    tt = (rt.eval_task_tokens if heldout else rt.train_task_tokens)[:n]
    tl = (rt.eval_task_len if heldout else rt.train_task_len)[:n]
    key = jax.random.fold_in(jax.random.key(EVAL_KEY), int(heldout))
    q = query_keys(rt, env, renderer, key, tasks, tt, tl)
    _, _, exp, exp_len, has = retrieve_entries(rt, state.bank, None, state.step, q,
                                               jnp.broadcast_to(state.flags.uses_bank, (n,)), diverse=False)
    two = lambda x: jnp.concatenate([x, x], 0)
    temp = 0.0 if cfg.eval.greedy else cfg.actor.temperature
    ep = play(rt, state.actor.params, key, env=env, renderer=renderer, tasks=two(tasks), task_tokens=two(tt),
              task_len=two(tl), exp=two(exp), exp_len=two(exp_len), has_exp=jnp.concatenate([has, jnp.zeros_like(has)]),
              temperature=temp, reset_keys=two(episode_reset_keys(key, n)))
    s = ep.success.astype(jnp.float32)
    return s[:n].mean(), s[n:].mean()


def evaluate_all(rt, state) -> dict:
    out = {}
    for pool, heldout in (("heldin", False), ("heldout", True)):
        with_exp, without = evaluate_pool(rt, state, heldout=heldout)
        out[f"eval_{pool}_with_exp"] = jnp.where(state.flags.uses_bank, with_exp, jnp.nan)
        out[f"eval_{pool}_without_exp"] = without
    return out
