"""Calibration of the pure-JAX `room` env against the real MiniHack Room-5x5 family.

The same two policies drive both environments:
- `random`: uniform over the 8 compass moves;
- `explorer`: `crl_jax.envs.scripted.explorer_action`, defined on the character view (MiniHack's
  `chars_crop` here, the JAX env's glyphs mapped to characters there), so one policy function acts on
  both.

`python -m crl_jax.envs.adapters.calibrate [--episodes 500] [--variants random,dark,...]` prints the
success-rate table of crl_jax/envs/README.md with a two-proportion z statistic per row.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs import make
from crl_jax.envs.adapters.minihack import VARIANTS, MiniHackRoom
from crl_jax.envs.scripted import explorer_action, explorer_policy

# Flags of our `room` env for each MiniHack variant.
ROOM_PARAMS = {
    "random": {},
    "dark": {"dark": True},
    "trap": {"traps": True},
    "monster": {"monster": True},
    "ultimate": {"dark": True, "traps": True, "monster": True},
}
POLICIES = ("random", "explorer")


def run_minihack(variant: str, policy: str, episodes: int, seed: int = 0, *, batch: int = 16,
                 max_steps: int = 30) -> np.ndarray:
    """Success (0/1) of `episodes` real-MiniHack episodes on tasks 0..episodes-1 -> int32 [episodes].

    `batch` games run in lock-step (one adapter each) so the explorer is one vmapped call per move.
    """
    envs = [MiniHackRoom(variant, max_steps=max_steps, num_tasks=max(episodes, 1)) for _ in range(batch)]
    n_act = len(envs[0].action_names)

    @jax.jit
    def explore(chars, ep, t):  # [B, 9, 9], [B], [B] -> [B]; key per (episode, move)
        keys = jax.vmap(lambda e, s: jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), e), s))(ep, t)
        return jax.vmap(explorer_action)(chars, keys)

    rng = np.random.default_rng(seed)
    out = np.zeros(episodes, np.int32)
    states, eps, next_ep = [None] * batch, [-1] * batch, 0
    blank = np.full((9, 9), ord(" "), np.uint8)
    while True:
        for b in range(batch):  # finished (or idle) slots take the next episode
            if states[b] is None or states[b].done:
                if states[b] is not None:
                    out[eps[b]] = int(states[b].success)
                    states[b] = None
                if next_ep < episodes:
                    states[b], _ = envs[b].reset(seed * 1_000_003 + next_ep, next_ep)
                    eps[b], next_ep = next_ep, next_ep + 1
        live = [b for b in range(batch) if states[b] is not None]
        if not live:
            break
        if policy == "random":
            acts = rng.integers(n_act, size=batch)
        else:
            chars = np.stack([states[b].chars if states[b] is not None else blank for b in range(batch)])
            ep = np.array([max(e, 0) for e in eps], np.int32)
            t = np.array([states[b].t if states[b] is not None else 0 for b in range(batch)], np.int32)
            acts = np.asarray(explore(chars, ep, t))
        for b in live:
            states[b], _, _, _, _ = envs[b].step(states[b], int(acts[b]))
    for e in envs:
        e.close()
    return out


def run_jax_room(variant: str, episodes: int, seed: int = 0, *, max_steps: int = 30) -> dict[str, np.ndarray]:
    """Success (0/1) of `episodes` episodes of our `room` env per policy -> {policy: int32 [episodes]}.

    Both policies run in one vmapped, scanned program (one compilation per variant).
    """
    env = make("room", max_steps=max_steps, num_tasks=max(episodes, 1), **ROOM_PARAMS[variant])

    def episode(key, task, use_explorer):
        k_reset, k_pol = jax.random.split(key)
        state, obs = env.reset(k_reset, task)

        def body(carry, k):
            state, obs = carry
            k_rand, k_exp = jax.random.split(k)
            rand = jax.random.randint(k_rand, (), 0, env.num_actions)
            a = jnp.where(use_explorer, explorer_policy(obs, k_exp), rand)
            state, obs, _, _, _ = env.step(state, a)
            return (state, obs), None

        (state, _), _ = jax.lax.scan(body, (state, obs), jax.random.split(k_pol, max_steps))
        return state.success

    keys = jax.random.split(jax.random.key(seed), 2 * episodes)
    tasks = jnp.tile(jnp.arange(episodes), 2)
    flags = jnp.arange(2 * episodes) >= episodes
    succ = np.asarray(jax.jit(jax.vmap(episode))(keys, tasks, flags), np.int32)
    return {"random": succ[:episodes], "explorer": succ[episodes:]}


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> float:
    """Pooled two-proportion z statistic of k1/n1 vs k2/n2 (0 when both rates are 0 or 1)."""
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    return 0.0 if se == 0 else (k1 / n1 - k2 / n2) / se


def table(episodes: int, variants, seed: int = 0) -> list[dict]:
    rows = []
    for v in variants:
        t0 = time.perf_counter()
        ours = run_jax_room(v, episodes, seed + 1)
        t_ours = time.perf_counter() - t0
        for pol in POLICIES:
            t0 = time.perf_counter()
            real = run_minihack(v, pol, episodes, seed)
            t_real = time.perf_counter() - t0
            z = two_proportion_z(int(real.sum()), episodes, int(ours[pol].sum()), episodes)
            rows.append({"variant": v, "policy": pol, "minihack": real.mean(), "room": ours[pol].mean(), "z": z,
                         "t_real": t_real, "t_ours": t_ours})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=500)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = table(args.episodes, args.variants.split(","), args.seed)
    print(f"| variant | policy | real MiniHack | JAX room | z | time real / ours-both-policies (s) |  (n = {args.episodes})")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['policy']} | {r['minihack']:.3f} | {r['room']:.3f} | {r['z']:+.2f} "
              f"| {r['t_real']:.1f} / {r['t_ours']:.1f} |")


if __name__ == "__main__":
    main()
