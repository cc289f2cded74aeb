"""Greedy evaluation with a host-side environment: the semantics of `crl_jax.actor.evaluate` on host games
(tiny models or an LLM actor: `crl_jax.host.llm_play`).

Held-in = the first `eval.tasks` levels of the training pool, held-out = the first `eval.tasks` levels
of the evaluation pool; each level is played once from the fixed key `evaluate.EVAL_KEY` (the same
reset keys as the built-in evaluation: `episode_reset_keys(fold_in(key(EVAL_KEY), heldout), n)`), with
experience (plain cosine top-1 from the current bank, no diversity re-ranking, the bank untouched) and
without, both halves from the same seeds. Evaluation never changes the state.

The 2n episodes run through the training turn function's batch of N games, in chunks of N rows (the
last chunk padded with copies of its first row, whose results are dropped): no extra game instances
beyond N per pool and one compiled turn shape. With greedy actions (the default) chunking changes
nothing; with sampled evaluation the draws depend on the row's place in its chunk (still deterministic).
Methods without a bank (grpo) play only the n episodes without experience. The four metrics are
`crl_jax.actor.evaluate.evaluate_all` over this `evaluate_pool` (as on every path).
"""

from __future__ import annotations

import jax
import numpy as np

from crl_jax.actor.evaluate import EVAL_KEY
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.host.llm_play import compiled_llm, play_llm_host
from crl_jax.host.play import compiled, eval_size, games_of, play_host, seeds_from_key_data


def evaluate_pool(rt, state, *, heldout: bool) -> tuple[float, float]:
    """(success with experience, success without) of greedy episodes on one pool (with: NaN without bank)."""
    cfg = rt.cfg
    fns, games = compiled(rt), games_of(rt, heldout)
    N = games.n
    n = eval_size(rt, heldout)
    key = jax.random.fold_in(jax.random.key(EVAL_KEY), int(heldout))
    seeds = np.asarray(seeds_from_key_data(jax.random.key_data(episode_reset_keys(key, n))), object)
    tasks = np.arange(n)
    tt = np.asarray((rt.eval_task_tokens if heldout else rt.train_task_tokens)[:n])
    tl = np.asarray((rt.eval_task_len if heldout else rt.train_task_len)[:n])
    uses_bank = bool(state.flags.uses_bank)
    # Retrieval queries need every level's first observation: reset in chunks of N games.
    first = [games.reset(*_pad(N, seeds[i:i + N], tasks[i:i + N])) for i in range(0, n, N)]
    obs = np.concatenate([o for o, _ in first])[:n]
    obs_len = np.concatenate([ol for _, ol in first])[:n]
    if uses_bank:
        exp, exp_len, has = (np.asarray(x) for x in jax.device_get(fns.eval_query(heldout)(state, obs, obs_len)))
        rows = np.concatenate([np.arange(n), np.arange(n)])  # [0, n): with experience, [n, 2n): without
        has = np.concatenate([has, np.zeros_like(has)])
        exp, exp_len = np.concatenate([exp, exp]), np.concatenate([exp_len, exp_len])
    else:
        rows = np.arange(n)
        L = rt.cfg.bank.entry_len
        exp, exp_len, has = np.zeros((n, L), np.int32), np.zeros((n,), np.int32), np.zeros((n,), bool)
    temp = 0.0 if cfg.eval.greedy else float(cfg.actor.temperature)
    k_play = jax.random.fold_in(key, 1)
    if rt.llm is not None:  # the actor's effective parameters once, every chunk's LLM turns
        params = compiled_llm(rt).params(state)
        play = lambda **kw: play_llm_host(rt, games, params, k_play, temperature=temp, **kw)  # noqa: E731
    else:
        turn = fns.turn(temp)
        play = lambda **kw: play_host(rt, turn, games, state.actor.params, k_play, **kw)  # noqa: E731
    success = []
    for i in range(0, len(rows), N):
        r = _pad(N, rows[i:i + N])[0]
        ob, ol = games.reset(seeds[r], tasks[r])
        ep = play(task_tokens=tt[r], task_len=tl[r], exp=_pad(N, exp[i:i + N])[0],
                  exp_len=_pad(N, exp_len[i:i + N])[0], has_exp=_pad(N, has[i:i + N])[0], obs=ob, obs_len=ol)
        success.append(np.asarray(ep.success)[: min(N, len(rows) - i)])
    s = np.concatenate(success).astype(np.float32)
    if uses_bank:
        return float(s[:n].mean()), float(s[n:].mean())
    return float("nan"), float(s.mean())


def _pad(N, *arrays):
    """Pad each array's first axis to N rows with copies of its first row."""
    out = []
    for a in arrays:
        a = np.asarray(a)
        if len(a) < N:
            a = np.concatenate([a, np.repeat(a[:1], N - len(a), axis=0)])
        out.append(a)
    return out
