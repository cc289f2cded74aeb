"""Which rollouts get experience, and which entry each gets (METHOD.md §2 steps 1-2, and evaluation).

The same functions serve every path (built-in envs, host adapters, LLMs) and both uses: training retrieval
(diversity re-ranking with usage bookkeeping in the bank) and evaluation's greedy top-1 (bank untouched).

- `guided_mask`: the first K/2 rollouts of each group are guided (all K without the group split; none for
  GRPO or during warm-up);
- `query_from_observation` / `query_keys`: the retrieval query = embedding of the task text followed by
  the rendered first observation (new entries are keyed by the same vector, so queries and keys share one
  space); of the task text alone where the env says so (`Env.query_observation`: the room's families,
  whose first observation names the episode's start cell);
- `retrieve_entries`: the config's retrieval (bound once: a Runtime's `rt.bank_ops`); one entry (or none,
  below `bank.min_similarity`) per guided rollout.
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


# `with_obs=False`: copies of the task segment in the query. The compact view's task is one token, whose hashed key
# is one bucket of 2 x key_dim (16 families at key_dim 64 gave one identical pair); over three copies its bigrams and
# trigrams tell the families apart (largest cosine between two families: 0.79 at 16 families, 0.93 at 64, below
# the default bank.min_similarity 0.95).
TASK_COPIES = 3


def query_from_observation(embedder, task_tokens, task_len, obs, obs_len, *, with_obs: bool = True):
    """[N, D] embeddings (`embedder`: a Runtime's `rt.embedder`) of task text + rendered first observation
    (`with_obs=False`, an env's `query_observation`: of the task text alone, `TASK_COPIES` times)."""
    if not with_obs:
        q, q_len = jax.vmap(lambda a, b: pack_segments([(a, b)] * TASK_COPIES))(task_tokens, task_len)
        return embedder(q, q_len)
    q, q_len = jax.vmap(lambda a, b, c, d: pack_segments([(a, b), (c, d)]))(task_tokens, task_len, obs, obs_len)
    return embedder(q, q_len)


def query_keys(embedder, env, renderer, key, tasks, task_tokens, task_len):
    """Retrieval queries [N, D] of episodes played from `key` on a built-in env (its first observations)."""
    obs, obs_len = first_observation(env, renderer, key, tasks)
    return query_from_observation(embedder, task_tokens, task_len, obs, obs_len,
                                 with_obs=getattr(env, "query_observation", True))


def retrieve_entries(retriever: bank_lib.BankOps | bank_lib.Retriever, bank, key, step, q, guided, *,
                     diverse: bool = True):
    """-> (bank, slots [N], exp [N, L], exp_len [N], has_exp [N]) for a flat guided mask [N]; `retriever`: the
    bound retrieval, a Runtime's `rt.bank_ops` (`crl_jax.backends.base.bank_ops`) or a `bank.make_retriever`.

    diverse: the training retrieval (`retriever.retrieve`: diversity re-ranking, usage bookkeeping).
    Otherwise evaluation's greedy top-1 (`retriever.best`; the bank unchanged)."""
    task = jnp.zeros(q.shape[:1], jnp.int32)
    if diverse:
        bank, slots, found = retriever.retrieve(bank, q, task, key, step, query_mask=guided)
        slot, has = slots[:, 0], found[:, 0] & guided
    else:
        slot, has = retriever.best(bank, q, task, query_mask=guided)
    safe = jnp.maximum(slot, 0)
    exp = jnp.where(has[:, None], bank.tokens[safe], 0)
    exp_len = jnp.where(has, bank.lengths[safe], 0)
    return bank, jnp.where(has, slot, -1), exp, exp_len, has
