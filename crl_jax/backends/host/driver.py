"""The Complementary RL loop with a host-side environment (real MiniHack through its adapter).

Same algorithm and state as `crl_jax.loop`, split where the simulator has to run on the host:

    [jit] begin:   tasks [N] and per-episode reset keys of the step (from `step_keys(state).roll`)
    [host]         reset N games (one adapter instance each), render the first observations to tokens
    [jit] prepare: `loop.prepare` (guided/free split, retrieval) with those observation tokens
    T x ( [jit] turn: build the N prompts (`rollout.build_prompt`), `last_logits`, sample an action token
          [host]      step the unfinished games; finished games are absorbing (not stepped again) )
    [jit] finish:  `loop.finish` (credit, distillation, co-update, merge) on the collected `Episodes`

`run_steps(rt, state, num_steps, last_step)` has exactly the contract of `loop.compiled_chunk(rt, n)(state,
last_step)`: `(state, metrics)` with every key of `loop.step_with_eval` stacked over `num_steps` (numpy
arrays), evaluations (`crl_jax.backends.host.evaluate`) every `eval.every` steps and at `last_step`, NaN otherwise.
`crl_jax.infra.run.run` can use it in place of the compiled chunk for a Runtime whose `env.is_host` is set.

Determinism: episode seeds are the reset keys `rollout.episode_reset_keys(roll, N)` of the step (as the
built-in loop uses them), turned into ints; the adapters reseed every game from (seed, task) on reset,
so a step is a pure function of the `LoopState` and a resumed run repeats an uninterrupted one.

The pieces (games, jitted parts, `play_host`) are in `crl_jax.backends.host.play`, the evaluation in
`crl_jax.backends.host.evaluate`.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from crl_jax.actor.evaluate import evaluate_all
from crl_jax.backends.host import evaluate as host_eval
from crl_jax.backends.host.play import _Clock, Games, Timer, compiled, games_of, play_host, seeds_from_key_data  # noqa: F401
from crl_jax.loop import EVAL_KEYS, REPLAY_KEYS, eval_due
from crl_jax.loop.runtime import is_host  # noqa: F401  (re-exported: host_loop.is_host)


def host_step(rt, state, timer=None):
    """One training iteration with the host env -> (state, metrics {name: float32 []}) (no evaluation)."""
    fns, games = compiled(rt), games_of(rt)
    with _Clock(timer, "compiled"):
        tasks, kd, k_play = fns.begin(state)
        tasks, kd = jax.device_get((tasks, kd))
    with _Clock(timer, "host_env"):
        obs, obs_len = games.reset(seeds_from_key_data(kd), tasks)
    with _Clock(timer, "compiled"):
        p = fns.prepare(state, obs, obs_len)
    ep = play_host(rt, fns.turn(float(rt.cfg.actor.temperature)), games, state.actor.params, k_play,
                   task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len, has_exp=p.has_exp,
                   obs=obs, obs_len=obs_len, timer=timer)
    with _Clock(timer, "compiled"):
        state, m = fns.finish(state, p, ep)
        m = jax.device_get(m)
    if timer is not None:
        timer.steps += 1
    return state, m


def run_steps(rt, state, num_steps: int, last_step, *, timer: Timer | None = None):
    """`num_steps` host-env iterations -> (state, metrics {name: float32 [num_steps]}); the contract of
    `loop.compiled_chunk(rt, num_steps)(state, last_step)`."""
    last = int(last_step)
    rows = []
    for _ in range(num_steps):
        state, m = host_step(rt, state, timer)
        if eval_due(int(state.step), last, rt.cfg.eval.every):
            t0 = time.perf_counter()
            # (no replay of the bank's plans: the host's levels are stepped outside the program)
            ev = {**evaluate_all(rt, state, host_eval.evaluate_pool),
                  **{k: np.float32(np.nan) for k in REPLAY_KEYS}}
            if timer is not None:
                timer.eval += time.perf_counter() - t0
        else:
            ev = {k: np.float32(np.nan) for k in EVAL_KEYS + REPLAY_KEYS}
        rows.append({**m, **ev})
    metrics = {k: np.stack([np.asarray(r[k], np.float32) for r in rows]) for k in rows[0]} if rows else {}
    return state, metrics


def chunk(rt, num_steps: int):
    """Drop-in for `loop.compiled_chunk(rt, num_steps)`: `(state, last_step) -> (state, metrics [num_steps])`."""
    return functools.partial(_chunk, rt, num_steps)


def _chunk(rt, num_steps, state, last_step):
    return run_steps(rt, state, num_steps, last_step)
