"""What XLA makes of a program for an H200, without an H200: deviceless compilation and a static cost table.

    python -m venv --system-site-packages /work/venvs/cudaaot
    /work/venvs/cudaaot/bin/pip install "jax-cuda12-plugin[with-cuda]==$(python -c 'import jax; print(jax.__version__)')"
    /work/venvs/cudaaot/bin/python experiments/bench/gpu_aot.py --what train --variants chunked,fused --json OUT
    /work/venvs/cudaaot/bin/python experiments/bench/gpu_aot.py --what decode --variants xla,pallas --batch 1

Needs jax's CUDA plugin (in a venv of its own, as above: ~5 GB, so the main environment stays CPU-only) but no
GPU: the script sets JAX_SKIP_CUDA_CONSTRAINTS_CHECK and
JAX_PLATFORMS=cpu, builds a one-device CUDA topology from an H200 description (`H200_TARGET` below: 132 SMs,
4.8 TB/s, compute capability 9.0) and compiles for it (`jax.experimental.topologies`). Without a device XLA
does not autotune, so its GEMM choices are heuristic; the fusion structure is XLA's own.

From the optimized HLO it lists every kernel launch of one call, the kernels inside `while` loops weighted by
their known trip counts:
- matmuls (cuBLAS custom calls and Triton GEMM fusions): FLOPs from the dot's shapes;
- attention (cuDNN custom calls);
- everything else (elementwise, reductions, copies, dynamic updates): bytes read and written, from the operand
  and result shapes; a kernel with a dynamic-update-slice is taken as in place (the update read and written,
  each other operand counted at most at the update's size), one that slices counts the slices it takes of
  each operand (two halves of one operand: both; an earlier version counted each operand at most at the result's
  size, an undercount). Estimates, not measurements.
and a floor for the step: matmul FLOPs at `--peak` plus the other kernels' bytes at `--bandwidth`; and a second
one with each matmul at its roofline (the longer of its FLOPs at `--peak` and its operand and result bytes at
`--bandwidth`: a GEMM that adds into a float32 accumulator, or has a short contraction, can be bound by its bytes;
Qwen's head dW GEMM, 1,024 rows into a [896, 151,936] float32 gradient, sits at the ridge). The top
memory kernels are printed with the JAX operation they came from. What:
- `train`: `train_mfu.py`'s step at the Qwen2.5-0.5B shape (variants chunked / fused head, `--remat-policy`,
  `--attn`);
- `llm`: one update of the LLM path's actor (PPO) or extractor (CISPO) loss at the SmolLM2-135M shape, B 8 x ~800
  tokens (variants actor / extractor; `--scan-unroll 0` = every layer);
- `decode`: `sampling.generate` at the SmolLM2-135M shape, or `--decode-preset`'s (variants: `decode_kernel`
  xla / pallas; `--batch`, `--seq` = prompt, `--new-tokens`): the kernel launches per decode step, by kind (the
  Pallas kernels are compiled by XLA's own Triton for sm_90 here, so this also checks that they build).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before jax is imported: no CUDA device, no version check (a test imports the parser)
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
from collections import defaultdict  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

H200_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 150000000000 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H200"
"""

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \((.*)\) -> .* \{$")
# not kernels; nor is the "-done" half of any async pair (copy, send, all-reduce, fusion in jax 0.11, ...): its
# kernel is the "-start", counted there
_SKIP = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "conditional", "call",
         "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "async-update"}


def h200_sharding():
    from jax.experimental import topologies
    topo = topologies.get_topology_desc(platform="cuda", target_config=H200_TARGET, topology="1x1x1")
    mesh = topologies.make_mesh(topo, (1,), ("x",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def shape_bytes(text: str) -> int:
    return sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d) for t, dims in _SHAPE.findall(text))


def shape_list(text: str) -> list[str]:
    """Every array shape in `text` (a tuple's one by one), without layouts: ["f32[4,256]", "bf16[8]"]."""
    return [f"{t}[{dims}]" for t, dims in _SHAPE.findall(text)]


def _tuple_items(text: str) -> list[str]:
    """The top-level items of a tuple shape: "((f32[2], s32[]), f32[1], u32[])" -> ["(f32[2], s32[])", "f32[1]",
    "u32[]"] (layouts kept)."""
    items, depth, start = [], 0, 1
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
            items.append(text[start:i].strip())
            start = i + 1
        if depth == 0 and i > 0:
            break
    return items


def _dims(text: str) -> list[int]:
    m = _SHAPE.search(text)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def parse(hlo: str) -> dict:
    """{computation: {"entry": bool, "params": {name: shape text}, "instrs": [(name, shape, op, rest)]}}."""
    comps, cur = {}, None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m:
            params = {p.split(":")[0].strip().lstrip("%"): p.split(":", 1)[1]
                      for p in re.split(r", (?=[\w.\-]+:)", m.group(2)) if ":" in p}
            cur = comps[m.group(1)] = dict(entry=line.startswith("ENTRY"), params=params, instrs=[])
            continue
        if cur is not None:
            mi = _INSTR.match(line)
            if mi:
                cur["instrs"].append(mi.groups())
    return comps


def _dot_flops(shapes: dict, rest: str, out_shape: str) -> float:
    ops = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
    lhs = _dims(shapes.get(ops[0], "")) if ops else []
    m = (re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
         or re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', rest))
    contract = [int(x.strip('" ')) for x in m.group(1).split(",") if x.strip('" ')] if m else []
    k = math.prod(lhs[i] for i in contract) if lhs and contract else 0
    return 2.0 * math.prod(_dims(out_shape)) * k


def _sliced_read(inner: dict, i: int, full: int) -> int:
    """Bytes a fusion reads of its operand i: the sum of the slices taken of it (through bitcasts and reshapes),
    at most its size, when slices, dynamic slices and gathers are its only uses inside the fusion; else all of it
    (two halves of one operand are two reads, not one)."""
    names = list(inner["params"])
    if i >= len(names):
        return full
    uses = defaultdict(list)
    for n2, s2, o2, r2 in inner["instrs"]:
        for operand in set(re.findall(r"%([\w.\-]+)", r2.split("), ", 1)[0])):
            uses[operand].append((n2, s2, o2))
    alias = {n2 for n2, _, o2, r2 in inner["instrs"] if o2 == "parameter" and re.match(rf"{i}\)", r2)}
    frontier, total = list(alias or {names[i]}), 0
    while frontier:
        for n2, s2, o2 in uses[frontier.pop()]:
            if o2 in ("bitcast", "reshape"):
                frontier.append(n2)
            elif o2 in ("slice", "dynamic-slice", "gather"):
                total += shape_bytes(s2)
            else:
                return full
    return min(total, full)


def kernels(hlo: str) -> list[dict]:
    """Every kernel launch of one call of the entry computation: name, kind, trips, bytes, flops, op_name."""
    comps = parse(hlo)
    out = []

    def walk(cname: str, trips: int):
        c = comps[cname]
        shapes = dict(c["params"])
        for name, shape, op, rest in c["instrs"]:
            shapes[name] = shape
        for name, shape, op, rest in c["instrs"]:
            if op == "while":
                n = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                body = re.search(r"body=%([\w.\-]+)", rest)
                if body:
                    walk(body.group(1), trips * (int(n.group(1)) if n else 1))
                continue
            if op in ("conditional", "call"):
                for sub in re.findall(r"(?:branch_computations=\{|to_apply=|, )%([\w.\-]+)", rest):
                    if sub in comps and not sub.startswith("fused"):
                        walk(sub, trips)
                continue
            if op in _SKIP or op.endswith("-done"):
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split("), ", 1)[0])
            if op == "fusion-start":  # ((operands...), result, context): the kernel writes the result only
                shape = _tuple_items(shape)[1]
            out_b = shape_bytes(shape)
            in_b = [shape_bytes(shapes.get(o, "")) for o in operands]
            called = re.search(r"calls=%([\w.\-]+)", rest)
            inner = comps.get(called.group(1)) if called else None
            inner_ops = {o2 for _, _, o2, _ in inner["instrs"]} if inner else {op}
            if "dynamic-update-slice" in inner_ops:  # in place: the buffer is neither read nor written whole
                names = dict(inner["params"]) if inner else dict(shapes)
                dus = next((r2 for _, _, o2, r2 in (inner["instrs"] if inner else [(name, shape, op, rest)])
                            if o2 == "dynamic-update-slice"), "")
                if inner:
                    names.update({n2: s2 for n2, s2, _, _ in inner["instrs"]})
                upd_ops = re.findall(r"%([\w.\-]+)", dus)
                upd = shape_bytes(names.get(upd_ops[1], "")) if len(upd_ops) > 1 else 0
                nbytes = 2 * upd + sum(min(b, upd) for b in in_b if b != out_b)
            elif inner_ops & {"dynamic-slice", "slice", "gather"}:  # reads slices of bigger operands
                nbytes = out_b + sum(_sliced_read(inner, i, b) if inner else min(b, out_b) for i, b in enumerate(in_b))
            else:
                nbytes = out_b + sum(in_b)
            meta = re.search(r'op_name="([^"]*)"', rest)
            kind, flops = "memory", 0.0
            target = re.search(r'custom_call_target="([^"]*)"', rest)
            if target and "fmha" in target.group(1):
                kind = "attention"
            elif target and ("gemm" in target.group(1) or "matmul" in target.group(1)):
                kind, flops = "matmul", _dot_flops(shapes, rest, shape)  # first shape of the tuple: the result
            elif called and called.group(1) in comps:
                inner = comps[called.group(1)]
                ishapes = dict(inner["params"])
                for n2, s2, o2, r2 in inner["instrs"]:
                    ishapes[n2] = s2
                dots = [(s2, r2) for n2, s2, o2, r2 in inner["instrs"] if o2 in ("dot", "convolution")]
                if dots or "__triton_gemm" in rest or "gemm_fusion" in name:
                    kind = "matmul"
                    flops = sum(_dot_flops(ishapes, r2, s2) for s2, r2 in dots)
                if meta is None:
                    roots = [r2 for n2, s2, o2, r2 in inner["instrs"] if 'op_name="' in r2]
                    meta = re.search(r'op_name="([^"]*)"', roots[-1]) if roots else None
            out.append(dict(name=name, kind=kind, trips=trips, bytes=nbytes * trips, flops=flops * trips,
                            op=meta.group(1) if meta else ""))

    entry = next(k for k, v in comps.items() if v["entry"])
    walk(entry, 1)
    return out


def summarize(ks: list[dict], peak: float, bandwidth: float, top: int = 12) -> dict:
    by = defaultdict(lambda: dict(launches=0, bytes=0, flops=0.0))
    for k in ks:
        b = by[k["kind"]]
        b["launches"] += k["trips"]
        b["bytes"] += k["bytes"]
        b["flops"] += k["flops"]
    mm_s = by["matmul"]["flops"] / peak
    mem_s = by["memory"]["bytes"] / bandwidth
    # each matmul at its roofline: its FLOPs at `peak` or its operands and result (an accumulator it adds into
    # included) at `bandwidth`, whichever takes longer
    mm_roof_s = sum(max(k["flops"] / peak, k["bytes"] / bandwidth) for k in ks if k["kind"] == "matmul")
    ops = defaultdict(lambda: [0, 0])  # bytes by JAX operation (without the jit prefix), memory kernels only
    for k in ks:
        if k["kind"] == "memory":
            key = re.sub(r"^jit\([^)]*\)/", "", k["op"])[:110]
            ops[key][0] += k["bytes"]
            ops[key][1] += k["trips"]
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(kinds={k: dict(v) for k, v in by.items()}, matmul_floor_s=mm_s, memory_floor_s=mem_s,
                floor_s=mm_s + mem_s, matmul_roofline_s=mm_roof_s, roofline_floor_s=mm_roof_s + mem_s,
                launches=sum(k["trips"] for k in ks),
                top_memory_ops=[dict(op=o, gb=b / 1e9, launches=n) for o, (b, n) in top_ops])


def train_program(variant: str, a):
    import optax
    import train_mfu  # this script's neighbour (its folder is on sys.path when run)

    from crl_jax.learner import train_state as ts
    from crl_jax.models import attention
    from crl_jax.models import transformer as tr
    from crl_jax.models.presets import preset_config

    if a.attn == "cudnn":
        _as_gpu(attention)
    cfg = preset_config("qwen2.5-0.5b", param_dtype="bfloat16", remat=bool(a.remat), remat_policy=a.remat_policy,
                        scan_unroll=a.scan_unroll, attn_impl=a.attn)
    B, T = a.batch, a.seq
    rep = h200_sharding()
    state = jax.eval_shape(lambda: ts.create_train_state(tr.create(cfg, jax.random.key(0)), optax.adamw(1e-5)))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), state)
    toks = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=rep)
    loss_fn = train_mfu.token_loss_fn(variant, B, T, a.head_chunk)
    step = jax.jit(lambda s, b: ts.apply_update(s, b, loss_fn, 1), donate_argnums=(0,))
    return step.lower(state, toks).compile()


def llm_program(loss: str, a):
    """One update of the LLM path's loss `loss` (actor: PPO over 8 replies of 16 tokens closing the turns of a
    768-token conversation; extractor: CISPO over a 16-token response after a 768-token prompt, as `gpu.sh`'s
    llm_head step) at the SmolLM2-135M shape, bf16, cuDNN attention, batch `a.batch`, the library's optimizer."""
    import llm_head  # this script's neighbour

    from crl_jax.learner import train_state as ts
    from crl_jax.learner.loss_fns import CISPOLossConfig, PPOLossConfig, actor_ppo_loss, extractor_cispo_loss
    from crl_jax.models import attention
    from crl_jax.models import transformer as tr
    from crl_jax.models.presets import preset_config

    _as_gpu(attention)
    cfg = preset_config("smollm2-135m", param_dtype="bfloat16", remat=bool(a.remat), remat_policy=a.remat_policy,
                        attn_impl=a.attn)
    cfg = cfg.replace(scan_unroll=a.scan_unroll or cfg.num_layers)
    rep = h200_sharding()
    put = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), t)  # noqa: E731
    state = put(jax.eval_shape(lambda: ts.create_train_state(tr.create(cfg, jax.random.key(0)), ts.make_optimizer())))
    _, batch = jax.eval_shape(lambda: llm_head.batches(loss, a.batch, 768, 16, 8, cfg.vocab_size))
    fn = extractor_cispo_loss(CISPOLossConfig()) if loss == "extractor" else actor_ppo_loss(PPOLossConfig())
    step = jax.jit(lambda s, b: ts.apply_update(s, b, fn, 1), donate_argnums=(0,))
    return step.lower(state, put(batch)).compile()


def _as_gpu(module):
    """The library refuses the GPU-only paths off a GPU; here the compile target is one."""
    module.jax = type("_GpuJax", (), {"__getattr__": lambda self, n: getattr(jax, n),
                                      "default_backend": staticmethod(lambda: "gpu")})()


def decode_program(kernel: str, a):
    """`sampling.generate` at the shape of `a.decode_preset` (SmolLM2-135M by default), bf16, batch `a.batch`,
    prompt `a.seq`, `a.new_tokens` new tokens, temperature 1, with `decode_kernel` = kernel."""
    from flax import nnx

    from crl_jax import sampling
    from crl_jax.models.experimental import fused_sample
    from crl_jax.models import transformer as tr
    from crl_jax.models.presets import preset_config

    _as_gpu(sampling)
    _as_gpu(fused_sample)  # `wanted` refuses "pallas" off a GPU
    rep = h200_sharding()
    cfg = preset_config(a.decode_preset, param_dtype="bfloat16")
    gd, params = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    put = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)  # noqa: E731

    def gen(params, prompt, plen, key):
        return sampling.generate((gd, params), prompt, plen, key, max_new_tokens=a.new_tokens, temperature=1.0,
                                 decode_kernel=kernel)

    args = (jax.tree.map(put, params), put(jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)),
            put(jax.ShapeDtypeStruct((a.batch,), jnp.int32)), put(jax.ShapeDtypeStruct((), jax.random.key(0).dtype)))
    from crl_jax.models.gpu_target import abstract_gpu
    with abstract_gpu():  # jax 0.11's Pallas lowering reads the target GPU from the mesh in context
        return jax.jit(gen).lower(*args).compile()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--what", default="train", help="train (variants: chunked, fused) | decode (variants: xla, pallas) "
                                                   "| llm (variants: actor, extractor)")
    p.add_argument("--decode-preset", default="smollm2-135m", help="decode: the model shape (models.presets)")
    p.add_argument("--variants", default="chunked,fused")
    p.add_argument("--new-tokens", type=int, default=128, help="decode: tokens generated")
    p.add_argument("--attn", default="cudnn")
    p.add_argument("--remat", type=int, default=1)
    p.add_argument("--remat-policy", default="nothing")
    p.add_argument("--scan-unroll", type=int, default=1, help="train: TransformerConfig.scan_unroll")
    p.add_argument("--head-chunk", type=int, default=1024, help="train: rows per vocabulary-head chunk (fused)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--peak", type=float, default=800e12, help="matmul FLOP/s for the floor (H200 dense bf16: 989e12)")
    p.add_argument("--bandwidth", type=float, default=4.0e12, help="bytes/s for the floor (H200 HBM3e: 4.8e12)")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--dump", default=None, help="write each variant's optimized HLO to DUMP.<variant>.hlo")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    for v in a.variants.split(","):
        if a.what == "decode":
            text = decode_program(v, a).as_text()
            if a.dump:
                with open(f"{a.dump}.{v}.hlo", "w") as f:
                    f.write(text)
            ks = kernels(text)
            loop = [k for k in ks if k["trips"] > 1]
            steps = max((k["trips"] for k in loop), default=1)
            kinds = defaultdict(int)
            for k in loop:
                kinds[re.sub(r"[._]\d+$", "", k["name"])] += k["trips"] // steps
            row = dict(variant=v, preset=a.decode_preset, batch=a.batch, prompt=a.seq, new_tokens=a.new_tokens,
                       decode_steps=steps,
                       launches_per_step=sum(k["trips"] for k in loop) / steps,
                       kernels_per_step=dict(sorted(kinds.items(), key=lambda kv: -kv[1])))
            rows.append(row)
            print(f"== decode_kernel={v}, B {a.batch}: {row['launches_per_step']:.0f} launches per decode step "
                  f"({steps} steps); {row['kernels_per_step']}", flush=True)
            continue
        comp = train_program(v, a) if a.what == "train" else llm_program(v, a)
        text = comp.as_text()
        if a.dump:
            with open(f"{a.dump}.{v}.hlo", "w") as f:
                f.write(text)
        mem = comp.memory_analysis()
        row = dict(variant=v, attn=a.attn, remat=a.remat, remat_policy=a.remat_policy, scan_unroll=a.scan_unroll,
                   head_chunk=a.head_chunk,
                   batch=a.batch, seq=a.seq,
                   temp_gb=getattr(mem, "temp_size_in_bytes", 0) / 1e9 if mem else None,
                   **summarize(kernels(text), a.peak, a.bandwidth, a.top))
        rows.append(row)
        k = row["kinds"]
        print(f"== {v}: {row['launches']} launches; matmul {k.get('matmul', {}).get('flops', 0) / 1e12:.1f} TFLOP "
              f"({row['matmul_floor_s'] * 1e3:.1f} ms at {a.peak / 1e12:.0f} TFLOP/s); other kernels "
              f"{k.get('memory', {}).get('bytes', 0) / 1e9:.1f} GB ({row['memory_floor_s'] * 1e3:.1f} ms at "
              f"{a.bandwidth / 1e12:.1f} TB/s); attention launches {k.get('attention', {}).get('launches', 0)}; "
              f"temp {row['temp_gb']:.1f} GB", flush=True)
        mm_gb = k.get("matmul", {}).get("bytes", 0) / 1e9
        print(f"   matmuls at their roofline {row['matmul_roofline_s'] * 1e3:.1f} ms ({mm_gb:.1f} GB in and out); "
              f"floor with it {row['roofline_floor_s'] * 1e3:.1f} ms + attention", flush=True)
        for t in row["top_memory_ops"]:
            print(f"   {t['gb']:8.2f} GB  x{t['launches']:<5d} {t['op']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
