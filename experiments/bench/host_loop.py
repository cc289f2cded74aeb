"""Per-step time split of the host-env loop (crl_jax/host/driver.py): host environment vs compiled compute.

    python experiments/bench/host_loop.py [--quick] [--preset micro|real] [--steps N]

`real` = experiments/configs/minihack_real.yaml (real MiniHack-Room-Ultimate-5x5 through the adapter);
`micro` = the tests' micro config on the same adapter. One warm-up step compiles the pieces (reported
separately); the timed steps run without evaluation. "host env" = adapter resets and steps plus
text -> tokens rendering; "compiled" = the jitted calls (task sampling, prepare, T turn calls, finish)
including device waits and transfers. Runs on CPU and GPU.
"""

from __future__ import annotations

import argparse
import os
import time

import jax

from crl_jax import loop
from crl_jax.host import driver as host_loop
from crl_jax.config import load
from crl_jax.loop.runtime import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The micro config of tests/slow/test_host_loop.py.
MICRO = ["env.name=minihack-room", "env.params.variant=ultimate", "env.params.max_obs_tokens=200",
         "rollout.groups=2", "rollout.group_size=2", "env.max_turns=3", "env.num_train_tasks=4",
         "env.num_eval_tasks=4", "extraction.batch=4", "extraction.buffer_capacity=16", "bank.capacity=16",
         "eval.tasks=3", "eval.every=2", "extraction.merge_every=2", "loss.turn_rows=8",
         "actor.hidden_size=32", "actor.num_layers=1", "actor.intermediate_size=64",
         "extractor.hidden_size=32", "extractor.num_layers=1", "extractor.intermediate_size=64",
         "extraction.max_new_tokens=6", "bank.entry_len=8", "extraction.prompt_len=200",
         "rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false"]


def config(preset: str):
    if preset == "real":
        return load(os.path.join(ROOT, "experiments/configs/minihack_real.yaml"), ["eval.every=0"])
    return load(None, MICRO + ["eval.every=0"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="both", choices=["micro", "real", "both"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 timed steps")
    a = ap.parse_args()
    steps = 2 if a.quick else a.steps
    print(f"backend {jax.default_backend()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print("| preset | N x T | compile s (1st step) | step s | host env s/step | compiled s/step | host share |")
    print("|---|---|---|---|---|---|---|")
    for preset in (["micro", "real"] if a.preset == "both" else [a.preset]):
        cfg = config(preset)
        rt = build(cfg)
        state = loop.init_state(rt, jax.random.key(0), cfg)
        t0 = time.perf_counter()
        state, _ = host_loop.run_steps(rt, state, 1, 10**9)
        compile_s = time.perf_counter() - t0
        tm = host_loop.Timer()
        t0 = time.perf_counter()
        state, _ = host_loop.run_steps(rt, state, steps, 10**9, timer=tm)
        wall = (time.perf_counter() - t0) / steps
        h, c = tm.host_env / steps, tm.compiled / steps
        N = cfg.rollout.groups * cfg.rollout.group_size
        print(f"| {preset} | {N} x {rt.num_turns} | {compile_s:.1f} | {wall:.2f} | {h:.3f} | {c:.3f} | "
              f"{h / max(h + c, 1e-9):.0%} |", flush=True)


if __name__ == "__main__":
    main()
