"""Does the entry forms' prior follow a FACT tip? (`extraction.forms`, METHOD.md §6)

    PYTHONPATH=$PWD python experiments/fact_tip_prior.py [--steps N] [overrides ...]

Fits the tiny prior of the embedded default with `extraction.forms=true` (into a private cache, timed; `--steps`
sets `pretrain.actor_steps`), then plays the prior's actor on the plain built-in room with a FACT tip naming
the level's stairs cell, from scripted starts: every cell of the room but the stairs, on every level of both
pools (32 + 32 levels x 24 starts). Prints the success rate (greedy, and sampled at temperature 1) with a 95%
Wilson interval, and the same without a tip for reference. Synthetic data only: the prior never saw a level.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.actor.rollout import play
from crl_jax.config import load
from crl_jax.learner import pretrain
from crl_jax.loop.runtime import build
from crl_jax.models import transformer as tr


class ScriptedStarts:
    """The env `env` with `reset(key, i)` returning the i-th of precomputed states (a scripted start)."""

    def __init__(self, env, states):
        self.env, self.states = env, states

    def reset(self, key, i):
        st = jax.tree_util.tree_map(lambda x: x[i], self.states)
        return st, self.env.observe(st)

    def step(self, state, action):
        return self.env.step(state, action)


def scripted_states(env):
    """States (stacked) of every level of `env` started on every cell but its stairs, their stairs [N, 2] and
    levels [N]."""
    s = env.size
    cells = np.array([(r, c) for r in range(s) for c in range(s)], np.int32)
    out, stairs, tasks = [], [], []
    for task in range(env.num_tasks):
        lv = env.task_level(task)
        st0 = env.init_state(lv, jax.random.key(task))
        for r, c in cells:
            if (r, c) == tuple(np.asarray(lv.stairs)):
                continue
            pos = jnp.asarray([r, c], jnp.int32)
            out.append(st0.replace(pos=pos, seen=env._visible(pos)))
            stairs.append(np.asarray(lv.stairs))
            tasks.append(task)
    return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *out), np.stack(stairs), np.asarray(tasks)


def wilson(k: int, n: int, z: float = 1.96):
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return p, c - h, c + h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=None, help="pretrain.actor_steps (default: the config's)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    ov = ["extraction.forms=true", f"pretrain.cache_dir={tempfile.mkdtemp(prefix='fact_tip_prior_')}"] + a.overrides
    if a.steps is not None:
        ov.append(f"pretrain.actor_steps={a.steps}")
    cfg = load(None, ov)
    rt = build(cfg)
    t0 = time.time()
    params = pretrain.prior_params(rt)
    print(f"prior {pretrain.prior_id(cfg)}: actor_steps={cfg.pretrain.actor_steps} extractor_steps="
          f"{cfg.pretrain.extractor_steps} fitted in {time.time() - t0:.0f} s")
    gd = tr.split(tr.create(rt.actor_config, jax.random.key(0)))[0]
    for pool, env in (("train", rt.env), ("eval", rt.eval_env)):
        states, stairs, tasks = scripted_states(env)
        n = stairs.shape[0]
        L = cfg.bank.entry_len
        exp = np.zeros((n, L), np.int32)
        exp[:, 0] = np.asarray(rt.tiny.row_ids)[stairs[:, 0]]
        exp[:, 1] = np.asarray(rt.tiny.col_ids)[stairs[:, 1]]
        senv = ScriptedStarts(env, states)
        tok, tlen = (rt.train_task_tokens, rt.train_task_len) if pool == "train" else \
            (rt.eval_task_tokens, rt.eval_task_len)
        tt, tl = tok[tasks], tlen[tasks]  # each level's own task token
        for label, has, temp in (("fact tip, greedy", True, 0.0), ("fact tip, temperature 1", True, 1.0),
                                 ("no tip, greedy", False, 0.0)):
            ep = jax.jit(lambda k: play(gd, params["actor"], senv, rt.renderer, rt.tiny.seg, rt.tiny.action_ids, k,
                                        tasks=jnp.arange(n), task_tokens=tt, task_len=tl, exp=jnp.asarray(exp),
                                        exp_len=jnp.full((n,), 2, jnp.int32), has_exp=jnp.full((n,), has),
                                        num_turns=rt.num_turns, temperature=temp))(jax.random.key(1))
            k = int(np.asarray(ep.success).sum())
            p, lo, hi = wilson(k, n)
            turns = float(np.asarray(ep.turns)[np.asarray(ep.success)].mean()) if k else float("nan")
            print(f"{pool:5s} {label:24s} success {p:.3f} [{lo:.3f}, {hi:.3f}] ({k}/{n}), "
                  f"mean turns when solved {turns:.2f}")


if __name__ == "__main__":
    main()
