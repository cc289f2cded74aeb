"""Train with a host-side environment (e.g. real MiniHack) into `crl_jax.infra.run.run`-format run folders.

Until `crl_jax.infra.run` dispatches host Runtimes itself, this driver swaps the compiled chunk for the host loop
(`crl_jax.backends.host.driver.chunk`, same contract) and otherwise runs `crl_jax.infra.run.run` unchanged: metrics.csv,
TensorBoard, checkpoints and resume, summary.json. It also prints the host-env vs compiled time split.

    python experiments/host_run.py --config experiments/configs/minihack_real.yaml --method crl --seed 0 \
        --out runs/minihack_real/crl_s0 [key=value ...]
    python experiments/host_run.py --config ... --runs grpo:0,crl:1 --out runs/minihack_real  # -> OUT/grpo_s0, ...

Several runs in one process share one Runtime and so one set of compiled pieces (compiled once).
"""

from __future__ import annotations

import argparse
import json
import os

from crl_jax import loop
from crl_jax.backends.host import driver as host_loop
from crl_jax.config import load
from crl_jax.infra import run


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--method", default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", default=None, help="method:seed,... (one process; run folders OUT/method_sSEED)")
    ap.add_argument("--jax-cache", default=None, help="persistent compilation cache folder (reruns skip compiles)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.jax_cache:
        import jax

        jax.config.update("jax_compilation_cache_dir", a.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    ov = list(a.overrides)
    ov += [f"method={a.method}"] * (a.method is not None) + [f"seed={a.seed}"] * (a.seed is not None)
    ov += [f"steps={a.steps}"] * (a.steps is not None)
    runs = [(a.out, load(a.config, ov))]
    if a.runs:
        runs = [(os.path.join(a.out, f"{m}_s{sd}"), load(a.config, ov + [f"method={m}", f"seed={sd}"]))
                for m, sd in (r.split(":") for r in a.runs.split(","))]
    compiled_chunk = loop.compiled_chunk
    timer = None

    def chunk(rt, n):
        if not host_loop.is_host(rt):
            return compiled_chunk(rt, n)
        return lambda state, last: host_loop.run_steps(rt, state, n, last, timer=timer)

    loop.compiled_chunk = chunk  # crl_jax.infra.run looks it up on the module at call time
    try:
        for out, cfg in runs:
            timer = host_loop.Timer()
            summary = run.run(cfg, out, progress=False)
            summary["timing"] = timer.as_dict()
            print(out, json.dumps(summary), flush=True)
    finally:
        loop.compiled_chunk = compiled_chunk


if __name__ == "__main__":
    main()
