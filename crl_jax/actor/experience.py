"""Which rollouts get experience, and which entry each gets (METHOD.md §2 steps 1-2, and evaluation).

The same functions serve every path (built-in envs, host adapters, LLMs) and both uses: training retrieval
(diversity re-ranking with usage bookkeeping in the bank) and evaluation's greedy top-1 (bank untouched).

- `guided_mask`: the first K/2 rollouts of each group are guided (all K without the group split; none for
  GRPO or during warm-up);
- `query_from_observation` / `query_keys`: the retrieval query = embedding of the task text followed by
  the rendered first observation (new entries are keyed by the same vector, so queries and keys share one
  space);
- `retrieve_entries`: one entry (or none, below `bank.min_similarity`) per guided rollout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax import bank as bank_lib
from crl_jax.actor.rollout import first_observation
from crl_jax.text.packing import pack_segments


def guided_mask(rt, flags, step) -> jax.Array:
    """[G, K] bool: which rollouts retrieve experience this step (`flags`: the run's `MethodFlags`)."""
    cfg = rt.cfg
    G, K = cfg.rollout.groups, cfg.rollout.group_size
    n_guided = jnp.where(flags.group_split, K // 2, K)
    guided = jnp.arange(K) < n_guided
    return jnp.broadcast_to(guided, (G, K)) & (step >= cfg.bank.warmup_steps) & flags.uses_bank


def query_from_observation(rt, task_tokens, task_len, obs, obs_len):
    """[N, D] embeddings of task text + rendered first observation."""
    q, q_len = jax.vmap(lambda a, b, c, d: pack_segments([(a, b), (c, d)]))(task_tokens, task_len, obs, obs_len)
    return rt.embedder(q, q_len)


def query_keys(rt, env, renderer, key, tasks, task_tokens, task_len):
    """Retrieval queries [N, D] of episodes played from `key` on a built-in env (its first observations)."""
    obs, obs_len = first_observation(env, renderer, key, tasks)
    return query_from_observation(rt, task_tokens, task_len, obs, obs_len)


def retrieve_entries(rt, bank, key, step, q, guided, *, diverse: bool = True):
    """-> (bank, slots [N], exp [N, L], exp_len [N], has_exp [N]) for a flat guided mask [N].

    diverse: the training retrieval (diversity re-ranking, usage bookkeeping). Otherwise evaluation's greedy
    top-1 (bank unchanged; `bank.eval_prefer_used` breaks similarity ties toward the best-credited, then the
    most used entry)."""
    b = rt.cfg.bank
    floor = b.min_similarity if b.min_similarity > -1.0 else None
    task = jnp.zeros(q.shape[:1], jnp.int32)
    if diverse:
        bank, slots, found = bank_lib.retrieve(bank, q, task, key, step, top_k=1, candidates=b.candidates,
                                               query_mask=guided, min_similarity=floor,
                                               diversity_lambda=b.diversity_lambda, recent_steps=b.recent_steps,
                                               demote_p=b.demote_p, shared_ties=b.shared_ties)
        slot, has = slots[:, 0], found[:, 0] & guided
    else:
        slot, has = bank_lib.retrieve_best(bank, q, task, min_similarity=floor, query_mask=guided,
                                           used_bonus=1e-6 if b.eval_prefer_used else 0.0,
                                           credit_bonus=1e-4 if b.eval_prefer_used else 0.0)
    safe = jnp.maximum(slot, 0)
    exp = jnp.where(has[:, None], bank.tokens[safe], 0)
    exp_len = jnp.where(has, bank.lengths[safe], 0)
    return bank, jnp.where(has, slot, -1), exp, exp_len, has
