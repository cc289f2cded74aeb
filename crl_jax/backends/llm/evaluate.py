"""Greedy evaluation of the LLM actor on fixed task pools, with and without experience (as
`crl_jax.actor.evaluate`: plain cosine top-1, no bookkeeping; both halves share reset keys)."""

from __future__ import annotations

import jax.numpy as jnp

from crl_jax.actor.evaluate import pool_setup
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.backends.llm.adapters import actor_params
from crl_jax.backends.llm.rollout import play


def evaluate_pool(rt, state, *, heldout: bool):
    cfg = rt.cfg
    env, renderer, key, tasks, tt, tl, exp, exp_len, has = pool_setup(rt, state, heldout)
    n = tasks.shape[0]
    two = lambda x: jnp.concatenate([x, x], 0)
    temp = 0.0 if cfg.eval.greedy else cfg.actor.temperature
    ep = play(rt, actor_params(state), key, env=env, renderer=renderer, tasks=two(tasks), task_tokens=two(tt),
              task_len=two(tl), exp=two(exp), exp_len=two(exp_len), has_exp=jnp.concatenate([has, jnp.zeros_like(has)]),
              temperature=temp, reset_keys=two(episode_reset_keys(key, n)), prefix_block=n)
    s = ep.success.astype(jnp.float32)
    return s[:n].mean(), s[n:].mean()
