"""Env throughput: steps/s of each pure-JAX env under vmap at batch 1, 64, 1024 (CPU or GPU).

Each measurement is one jitted `lax.scan` of `--steps` vmapped steps with random actions (and, in the
second column, the byte-tokenizer token renderer on every new observation), timed after a warm-up run;
the ratio column is the speed-up over batch 1 in the same process.

    python experiments/bench/envs.py            # full
    python experiments/bench/envs.py --quick    # short run
    python experiments/bench/envs.py --envs room,sokoban --batch 1,4096
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from crl_jax.envs import make
from crl_jax.envs.render import make_token_renderer
from crl_jax.text.tokenizers import ByteTokenizer

CONFIGS = {
    "room": dict(dark=True, traps=True, monster=True),
    "maze": {},
    "keyroom": {},
    "sokoban": {},
    "frozen_lake": dict(slippery=True),
}


def build(env, batch, steps, render):
    rend = make_token_renderer(env, ByteTokenizer()) if render else None

    def run(key):
        k0, k1 = jax.random.split(key)
        st, _ = jax.vmap(env.reset)(jax.random.split(k0, batch), jnp.arange(batch))

        def body(carry, k):
            st, acc = carry
            a = jax.random.randint(k, (batch,), 0, env.num_actions)
            st, obs, r, d, info = jax.vmap(env.step)(st, a)
            acc = acc + r.sum()
            if rend is not None:
                toks, lens = jax.vmap(rend)(obs)
                acc = acc + lens.sum() * 1e-9 + toks[:, 0].sum() * 1e-12
            return (st, acc), None

        (st, acc), _ = jax.lax.scan(body, (st, jnp.float32(0)), jax.random.split(k1, steps))
        return acc

    return jax.jit(run)


def measure(env, batch, steps, render, reps):
    f = build(env, batch, steps, render)
    jax.block_until_ready(f(jax.random.key(0)))  # compile + warm-up
    best = float("inf")
    for i in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(jax.random.key(i + 1)))
        best = min(best, time.perf_counter() - t0)
    return batch * steps / best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", default=",".join(CONFIGS))
    p.add_argument("--batch", default="1,64,1024")
    p.add_argument("--steps", type=int, default=200, help="steps per timed scan")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="30 steps, 1 repetition")
    args = p.parse_args()
    steps, reps = (30, 1) if args.quick else (args.steps, args.reps)
    batches = [int(b) for b in args.batch.split(",")]
    dev = jax.devices()[0]
    print(f"device: {dev.platform} ({dev.device_kind}), jax {jax.__version__}, {steps} steps x {reps} reps")
    print(f"{'env':<12} {'batch':>6} {'steps/s':>12} {'x batch1':>9} {'+render/s':>12} {'x batch1':>9}")
    for name in args.envs.split(","):
        env = make(name, num_tasks=max(batches), **CONFIGS[name])
        base = {}
        for b in batches:
            row = []
            for render in (False, True):
                sps = measure(env, b, steps, render, reps)
                base.setdefault(render, sps)
                row += [sps, sps / base[render]]
            print(f"{name:<12} {b:>6} {row[0]:>12,.0f} {row[1]:>9.1f} {row[2]:>12,.0f} {row[3]:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
