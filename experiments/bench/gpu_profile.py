"""Where a decode step and a training step spend their time, kernel by kernel (`jax.profiler`, no viewer).

    python experiments/bench/gpu_profile.py [--what decode,train] [--smoke] [--top 15] [--json OUT]

Runs each workload once to compile, then again under `jax.profiler.trace(create_perfetto_trace=True)`, reads
the Perfetto JSON back and sums the complete events by name:
- decode: `sample_tokens` at SmolLM2-135M shape (bf16, P 128 + N 64, the backend's decode plan) at B 1 and 256;
- train: one Qwen2.5-0.5B-shape AdamW step (bf16, B 8 x T 2,048, remat, tiled log-probs, the default attention).
For each: the wall time, the device's busy time (the sum of its events; on a CPU, the XLA thunks), the idle
share (wall minus busy: launch gaps, host round trips), device events per decode step, and the top events by
total time with their share. `--smoke`: micro models on whatever backend (CI keeps the parser honest).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from crl_jax import sampling as S
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tr
from crl_jax.models.presets import preset_config


def device_events(trace_dir: str) -> list[dict]:
    """Complete events ("ph": "X") of the device lanes of the newest Perfetto trace under `trace_dir` (GPU / TPU
    processes: their stream lanes where there are any; on a CPU backend the XLA executor threads, without the
    Python frames, the PjRt wrappers and the control-flow thunks that contain other events)."""
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True))[-1]
    with gzip.open(path) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    dev = {p for p, n in procs.items() if "/device:" in n}
    if dev:
        lanes = {k for k, n in threads.items() if k[0] in dev}
        streams = {k for k in lanes if "Stream" in threads[k]}  # kernels; other lanes (XLA Ops / Modules) repeat them
        keep = streams or lanes
        return [e for e in ev if e.get("ph") == "X" and (e["pid"], e["tid"]) in keep]
    # CPU backend: the executor threads, without the wrappers that contain other events (no double counting)
    nested = ("ThunkExecutor", "while", "conditional", "call")
    return [e for e in ev if e.get("ph") == "X" and "XLAEigen" in threads.get((e["pid"], e["tid"]), "")
            and not e["name"].startswith(nested)]


def summarize(events: list[dict], wall_s: float, steps: int, top: int) -> dict:
    by = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        by[e["name"]][0] += e.get("dur", 0.0) / 1e6
        by[e["name"]][1] += 1
    busy = sum(v[0] for v in by.values())
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(wall_s=wall_s, device_busy_s=busy, idle_share=max(0.0, 1 - busy / wall_s) if wall_s else None,
                events=len(events), events_per_step=len(events) / steps,
                top=[dict(name=k[:120], seconds=v[0], count=v[1], share=v[0] / busy if busy else 0.0) for k, v in rows])


def profiled(fn, steps: int, top: int) -> dict:
    jax.block_until_ready(fn())  # compile and warm up outside the trace
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            wall = time.perf_counter() - t0
        return summarize(device_events(d), wall, steps, top)


def decode_case(B: int, smoke: bool, top: int) -> dict:
    if smoke:
        cfg = tr.tiny_config(128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
        P, N = 8, 8
    else:
        cfg, P, N = preset_config("smollm2-135m", param_dtype="bfloat16"), 128, 64
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    prompt = jax.random.randint(jax.random.key(1), (B, P), 1, cfg.vocab_size)
    plen = jnp.full((B,), P, jnp.int32)
    sc = S.SamplerConfig(max_new_tokens=N, temperature=1.0)
    fn = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    out = profiled(lambda: fn(gd, pa, prompt, plen, jax.random.key(2), sc), N, top)
    return dict(what="decode", batch=B, P=P, N=N, plan=S.decode_plan(sc, P + N, cfg.num_layers), **out)


def train_case(smoke: bool, top: int) -> dict:
    if smoke:
        cfg, B, T = tr.tiny_config(256, hidden_size=32, intermediate_size=64, num_layers=1, remat=True), 2, 32
    else:
        cfg, B, T = preset_config("qwen2.5-0.5b", param_dtype="bfloat16", remat=True), 8, 2048
    state = ts.create_train_state(tr.create(cfg, jax.random.key(0)), optax.adamw(1e-5))
    toks = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    mask = jnp.ones((B, T), bool)

    def loss_fn(gd, params, batch):
        logp, _ = ts.token_logprobs(gd, params, batch, mask)
        return -jnp.sum(logp), (jnp.float32(B * (T - 1)), {})

    step = jax.jit(lambda s, b: ts.apply_update(s, b, loss_fn, 1))
    out = profiled(lambda: step(state, toks)[1], 1, top)
    return dict(what="train", batch=B, seq=T, **out)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--what", default="decode,train")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    for w in a.what.split(","):
        cases = [lambda B=B: decode_case(B, a.smoke, a.top) for B in ((2,) if a.smoke else (1, 256))] \
            if w == "decode" else [lambda: train_case(a.smoke, a.top)]
        for case in cases:
            try:
                r = case()
            except Exception as e:  # noqa: BLE001  (one workload failing keeps the others)
                r = dict(what=w, error=f"{type(e).__name__}: {str(e)[:500]}")
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
            for t in r.get("top", []):
                print(f"   {t['share']:6.1%} {t['seconds'] * 1e3:9.3f} ms x{t['count']:<5d} {t['name']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=str(jax.devices()[0].device_kind), rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
