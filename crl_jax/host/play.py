"""The pieces of the host-env driver (`crl_jax.host.driver`): N adapter games of one pool, the jitted parts
of one step (`compiled(rt)`: begin, prepare, turn, finish, evaluation query), and `play_host`, which plays
the games turn by turn between jitted `rollout.sample_turn` calls.

When every game has finished before turn T, the remaining turns are not computed: they are filled with
copies of the last turn marked inactive (`active = False`, `logp = 0`), which the losses, credit and
distillation ignore (they read only active turns and the first `turns` actions).
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.actor.experience import query_from_observation, retrieve_entries
from crl_jax.actor.rollout import Episodes, episode_reset_keys, sample_turn
from crl_jax.envs.actions import action_allowed_mask
from crl_jax.envs.adapters.common import seed_to_int
from crl_jax.loop import finish, prepare, sample_tasks, step_keys

# Maximum traces of each compiled piece when `TRACE_GUARD` is on (tests): the turn function is compiled
# once per sampling temperature (training, evaluation), the evaluation query once per pool.
MAX_TRACES = {"begin": 1, "prepare": 1, "turn": 2, "finish": 1, "eval_query": 2}
TRACE_GUARD = False  # wrap the pieces in `chex.assert_max_traces` (set before the first `compiled(rt)`)


class Fns(NamedTuple):
    begin: object  # state -> (tasks [N], reset key data [N, ...] uint32, turn sampling key)
    prepare: object  # (state, obs [N, Lo], obs_len [N]) -> loop.Prepared
    turn: object  # temperature -> jitted (params, k_play, t, task_tokens, task_len, exp, exp_len, has_exp, obs, obs_len,
    #               live [N]: the games not yet finished, whose rows `rollout.turn_block` computes)
    finish: object  # (state, Prepared, Episodes) -> (state, metrics)
    eval_query: object  # heldout -> jitted (state, obs [n, Lo], obs_len [n]) -> (exp, exp_len, has)


def _guard(name, fn):
    return chex.assert_max_traces(fn, n=MAX_TRACES[name]) if TRACE_GUARD else fn


@functools.lru_cache(maxsize=8)
def compiled(rt) -> Fns:
    """The jitted pieces of one Runtime, built once (shared by every seed, method and run length)."""
    cfg = rt.cfg
    N = cfg.rollout.groups * cfg.rollout.group_size

    def begin(state):
        roll = step_keys(state).roll
        # (tasks, reset key data, sampling key of the turns) as `rollout.play` derives them from `roll`
        return sample_tasks(rt, state), jax.random.key_data(episode_reset_keys(roll, N)), jax.random.fold_in(roll, 1)

    def prepare_step(state, obs, obs_len):
        return prepare(rt, state, obs, obs_len)

    def finish_step(state, p, ep):
        return finish(rt, state, p, ep)

    def turn_at(temperature):  # the tiny models' one constrained action token (the LLM's: `host.llm_play`)
        allowed = action_allowed_mask(rt.tiny.action_ids, rt.vocab_size)

        def turn(params, k_play, t, task_tokens, task_len, exp, exp_len, has_exp, obs, obs_len, live):
            chex.assert_rank([task_tokens, exp, obs, obs_len, live], [2, 2, 2, 1, 1])
            return sample_turn(rt.actor_graphdef, params, rt.tiny.seg, allowed, rt.tiny.action_ids, k_play, t,
                               task_tokens, task_len, exp, exp_len, has_exp, obs, obs_len, temperature=temperature,
                               turn_marker=cfg.rollout.turn_marker, turn_block=cfg.rollout.turn_block, live=live)

        return jax.jit(_guard("turn", turn))

    def query_at(heldout):
        n = eval_size(rt, heldout)
        tt = (rt.eval_task_tokens if heldout else rt.train_task_tokens)[:n]
        tl = (rt.eval_task_len if heldout else rt.train_task_len)[:n]

        def eval_query(state, obs, obs_len):
            q = query_from_observation(rt.embedder, tt, tl, obs, obs_len)
            _, _, exp, exp_len, has = retrieve_entries(rt.bank_ops, state.bank, None, state.step, q,
                                                       jnp.broadcast_to(state.flags.uses_bank, (n,)), diverse=False)
            return exp, exp_len, has

        return jax.jit(_guard("eval_query", eval_query))

    return Fns(begin=jax.jit(_guard("begin", begin)), prepare=jax.jit(_guard("prepare", prepare_step)),
               turn=functools.lru_cache(maxsize=None)(turn_at), finish=jax.jit(_guard("finish", finish_step)),
               eval_query=functools.lru_cache(maxsize=None)(query_at))


def eval_size(rt, heldout: bool) -> int:
    return min(rt.cfg.eval.tasks, (rt.eval_env if heldout else rt.env).num_tasks)


class Games:
    """N games of one host pool (one adapter each) and the host side of their rollouts."""

    def __init__(self, env, renderer, n: int):
        self.env, self.renderer, self.n = env, renderer, n
        self.adapters = [env.make() for _ in range(n)]

    def reset(self, seeds, tasks):
        """seeds, tasks: [n] ints -> first observation tokens [n, Lo], lengths [n]."""
        self.states, texts = [], []
        for a, s, k in zip(self.adapters, seeds, tasks):
            st, text = a.reset(int(s), int(k))
            self.states.append(st)
            texts.append(text)
        self.texts = texts
        self.done = np.zeros((self.n,), bool)
        self.ret = np.zeros((self.n,), np.float32)
        self.succ = np.zeros((self.n,), bool)
        return self.renderer.batch(texts)

    def step(self, actions):
        """Step the unfinished games with actions [n] -> (obs [n, Lo], obs_len [n], active [n])."""
        active = ~self.done
        for i in np.flatnonzero(active):
            st, text, r, d, info = self.adapters[i].step(self.states[i], int(actions[i]))
            self.states[i], self.texts[i] = st, text
            self.ret[i] += r
            self.succ[i] |= bool(info["success"] if "success" in info else info["won"])  # text games: "won"
            self.done[i] |= bool(d)
        obs, obs_len = self.renderer.batch(self.texts)
        return obs, obs_len, active


class Timer:
    """Seconds spent on the host environment (resets, steps, rendering) vs compiled calls (incl. waits)."""

    def __init__(self):
        self.host_env = 0.0
        self.compiled = 0.0
        self.eval = 0.0  # host evaluation (both parts), not in the two above
        self.steps = 0

    def as_dict(self):
        return {"steps": self.steps, "host_env_s": round(self.host_env, 3), "compiled_s": round(self.compiled, 3),
                "eval_s": round(self.eval, 3)}


class _Clock:
    def __init__(self, timer, attr):
        self.timer, self.attr = timer, attr

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer is not None:
            setattr(self.timer, self.attr, getattr(self.timer, self.attr) + time.perf_counter() - self.t0)


def play_host(rt, turn_fn, games: Games, params, k_play, *, task_tokens, task_len, exp, exp_len, has_exp, obs,
              obs_len, timer=None) -> Episodes:
    """Play the (already reset) games for up to T turns; obs/obs_len: their first observations."""
    T = rt.num_turns
    outs, actives = [], []
    for t in range(T):
        if games.done.all():
            break
        with _Clock(timer, "compiled"):
            out = jax.device_get(turn_fn(params, k_play, jnp.int32(t), task_tokens, task_len, exp, exp_len, has_exp,
                                         obs, obs_len, jnp.asarray(~games.done)))
        with _Clock(timer, "host_env"):
            obs, obs_len, active = games.step(out[4])
        outs.append(out)
        actives.append(active)
    while len(outs) < T:  # every game finished: the rest are inactive copies
        outs.append(outs[-1])
        actives.append(np.zeros((games.n,), bool))
    stack = lambda i: np.stack([o[i] for o in outs], axis=1)
    active = np.stack(actives, axis=1)
    return Episodes(prompts=jnp.asarray(stack(0)), prompt_len=jnp.asarray(stack(1)),
                    action_tokens=jnp.asarray(stack(2)), actions=jnp.asarray(stack(4)),
                    logp=jnp.asarray(np.where(active, stack(3), 0.0).astype(np.float32)),
                    active=jnp.asarray(active), reward=jnp.asarray(games.ret.copy()),
                    success=jnp.asarray(games.succ.copy()), turns=jnp.asarray(active.sum(1).astype(np.int32)))


def seeds_from_key_data(data) -> list[int]:
    """Per-episode int seeds from reset key data [N, ...] (as `seed_to_int` of each key)."""
    return [seed_to_int(np.asarray(row)) for row in np.asarray(data)]


@functools.lru_cache(maxsize=4)
def games_of(rt, heldout: bool = False) -> Games:
    """The N games of a Runtime's train (or eval) pool, made once and reused by every step."""
    N = rt.cfg.rollout.groups * rt.cfg.rollout.group_size
    return Games(rt.eval_env if heldout else rt.env, rt.eval_renderer if heldout else rt.renderer, N)
