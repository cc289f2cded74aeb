"""Where a decode step and a training step spend their time, kernel by kernel (`jax.profiler`, no viewer).

    python experiments/bench/gpu_profile.py [--what decode,train] [--smoke] [--top 15] [--json OUT]

Runs each workload once to compile, then again under `jax.profiler.trace(create_perfetto_trace=True)`, reads
the Perfetto JSON back and sums the complete events by name:
- decode: `sample_tokens` at SmolLM2-135M shape (bf16, P 128 + N 64, the backend's decode plan) at B 1 and 256;
- decode_pallas (not in the default --what): the same at B 1 with `decode_kernel="pallas"` (models/experimental/fused_decode.py);
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
import re
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


def summarize(events: list[dict], wall_s: float, steps: int, top: int, hlo_text: str = "") -> dict:
    """Events summed by name (kernel names) and by the HLO instruction each kernel runs (`args.hlo_op`, where the
    trace has it: not inside command buffers, CUDA graphs, where it names the buffer); each top kernel and op
    carries what it computes (`hlo_line` over the compiled module's text `hlo_text`)."""
    by = collections.defaultdict(lambda: [0.0, 0])
    by_op = collections.defaultdict(lambda: [0.0, 0, ""])
    for e in events:
        by[e["name"]][0] += e.get("dur", 0.0) / 1e6
        by[e["name"]][1] += 1
        op = (e.get("args") or {}).get("hlo_op")
        if op:
            by_op[op][0] += e.get("dur", 0.0) / 1e6
            by_op[op][1] += 1
            by_op[op][2] = e["name"]
    busy = sum(v[0] for v in by.values())
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])[:top]
    ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(wall_s=wall_s, device_busy_s=busy, idle_share=max(0.0, 1 - busy / wall_s) if wall_s else None,
                events=len(events), events_per_step=len(events) / steps,
                top=[dict(name=k[:120], seconds=v[0], count=v[1], share=v[0] / busy if busy else 0.0,
                          hlo=hlo_line(hlo_text, k)) for k, v in rows],
                top_ops=[dict(op=k, kernel=v[2][:80], seconds=v[0], count=v[1], share=v[0] / busy if busy else 0.0,
                              hlo=hlo_line(hlo_text, k)) for k, v in ops])


def hlo_line(text: str, op: str) -> str:
    """What the instruction `op` of HLO module text computes, in one line: its result and opcode, the JAX
    operation it came from (`op_name` metadata) and, for a fusion, the ROOT of the computation it calls (enough
    to tell a cache copy from a matmul). A kernel named like `input_reduce_fusion_58` (the GPU's names) is looked
    up as `input_reduce_fusion.58` when there is no instruction of its own name. "" when not found."""
    m = None
    for name in (op, re.sub(r"_(\d+)$", r".\1", op)):
        m = re.search(r"^\s*(?:ROOT\s+)?%?" + re.escape(name) + r" = (.*)$", text, re.M)
        if m:
            break
    if not m:
        return ""
    line = m.group(1)
    out = line.split("(", 1)[0]
    src = re.search(r'op_name="([^"]*)"', line)
    if src:
        out += " @" + src.group(1)[-100:]
    c = re.search(r"calls=%?([\w.-]+)", line)
    if c:
        body = re.search(r"^%?" + re.escape(c.group(1)) + r" .*?\{(.*?)^\}", text, re.M | re.S)
        root = re.search(r"ROOT\s+(.*)$", body.group(1), re.M) if body else None
        if root:
            out += " || ROOT " + root.group(1).split("(", 1)[0][:150]
    return out


def profiled(jitted, args: tuple, steps: int, top: int, dump: str | None = None, static: tuple = ()) -> dict:
    """Compile `jitted` for `args` once (`static`: the positions of its static arguments, which the compiled
    program no longer takes), run it to warm up, then once under the profiler."""
    compiled = jitted.lower(*args).compile()
    text = compiled.as_text()
    dyn = tuple(a for i, a in enumerate(args) if i not in static)
    fn = lambda: compiled(*dyn)  # noqa: E731
    jax.block_until_ready(fn())  # warm up outside the trace
    if dump:
        with gzip.open(dump, "wt") as f:
            f.write(text)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            wall = time.perf_counter() - t0
        return summarize(device_events(d), wall, steps, top, text)


def decode_case(B: int, smoke: bool, top: int, dump_dir: str | None = None, kernel: str = "xla") -> dict:
    if smoke:  # (hidden 64: a size the fused kernels take)
        cfg = tr.tiny_config(128, hidden_size=64, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
        P, N = 8, 8
    else:
        cfg, P, N = preset_config("smollm2-135m", param_dtype="bfloat16"), 128, 64
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    prompt = jax.random.randint(jax.random.key(1), (B, P), 1, cfg.vocab_size)
    plen = jnp.full((B,), P, jnp.int32)
    sc = S.SamplerConfig(max_new_tokens=N, temperature=1.0, decode_kernel=kernel)
    static = (0, 5)  # graphdef, SamplerConfig
    fn = jax.jit(S.sample_tokens, static_argnums=static)
    tag = "" if kernel == "xla" else "_pallas"
    out = profiled(fn, (gd, pa, prompt, plen, jax.random.key(2), sc), N, top,
                   dump_dir and os.path.join(dump_dir, f"hlo_decode{tag}_b{B}.txt.gz"), static=static)
    return dict(what="decode" + tag, batch=B, P=P, N=N, plan=S.decode_plan(sc, P + N, cfg.num_layers), **out)


def train_case(smoke: bool, top: int, dump_dir: str | None = None) -> dict:
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

    out = profiled(jax.jit(lambda s, b: ts.apply_update(s, b, loss_fn, 1)), (state, toks), 1, top,
                   dump_dir and os.path.join(dump_dir, "hlo_train.txt.gz"))
    return dict(what="train", batch=B, seq=T, **out)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--what", default="decode,train")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", default=None)
    p.add_argument("--dump-dir", default=None, help="write each workload's compiled HLO text here (gzip)")
    a = p.parse_args(argv)
    rows = []
    for w in a.what.split(","):
        if w == "decode":
            cases = [lambda B=B: decode_case(B, a.smoke, a.top, a.dump_dir) for B in ((2,) if a.smoke else (1, 256))]
        elif w == "decode_pallas":  # batch 1 with the fused kernels (their interpreter off a GPU)
            fused = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
            cases = [lambda: decode_case(1, a.smoke, a.top, a.dump_dir, fused)]
        else:
            cases = [lambda: train_case(a.smoke, a.top, a.dump_dir)]
        for case in cases:
            try:
                r = case()
            except Exception as e:  # noqa: BLE001  (one workload failing keeps the others)
                r = dict(what=w, error=f"{type(e).__name__}: {str(e)[:500]}")
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("top", "top_ops")}), flush=True)
            for t in r.get("top", []):
                print(f"   {t['share']:6.1%} {t['seconds'] * 1e3:9.3f} ms x{t['count']:<5d} {t['name']}"
                      f"\n        {t['hlo'][:300]}", flush=True)
            for t in r.get("top_ops", []):
                print(f"   op {t['share']:6.1%} {t['seconds'] * 1e3:9.3f} ms x{t['count']:<5d} {t['op']} [{t['kernel']}]"
                      f"\n        {t['hlo'][:300]}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=str(jax.devices()[0].device_kind), rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
