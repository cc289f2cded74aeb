"""Decode before vs after the in-place KV cache and live-length attention, measured in one process: the old sampler (cache restacked by the
layer scan every step, attention over the whole capacity) vs the library's (cache written in place;
attention over the live blocks only).

    python experiments/bench/decode_cache.py                         # tiny model, B 1/8/64, P 64, N 192
    python experiments/bench/decode_cache.py --model smollm2-shape --batches 1,8 --prompt-len 32 --new-tokens 64
    python experiments/bench/decode_cache.py --smoke                 # a few seconds (CI)

Variants (same weights, prompts and key, greedy, no stop token so every step runs):
- `old`: experiments/bench/legacy_decode.py (the code before the in-place KV cache);
- `inplace`: the library with `attn_block` >= capacity (one block = the whole cache: item 2 alone);
- `live`: the library with `attn_block` = --block (items 2 + 3);
- `inplace_unrolled` / `live_unrolled`: the same with the layers as straight-line code (`unroll_layers` = the
  model's depth; on a CPU the library unrolls only models of <= 8 layers), for deep models on a GPU, where the
  block loop's data-dependent trip count costs a host round trip per iteration and a layer scan slices every
  layer's weights at every step (`sampling.decode_plan`);
- `unrolled_reduce`: `inplace_unrolled` with the one-query decode attention as multiply-and-reduce fusions
  (`attend_reduce` below) instead of two batched matmuls with M = the query group (3 at SmolLM2 shape), which
  may make XLA transpose the cache into the matmul's layout at every step (a candidate, not in the library);
- `pallas`: `inplace_unrolled` with `decode_kernel="pallas"`, three fused Pallas (Triton) kernels per layer
  (`models.experimental.fused_decode`; batch 1 only, so it runs at B 1 only; off a GPU in Pallas' interpreter, slow).
`--variants` picks a subset (`old` always runs: it is the reference of every ratio).
Each repeat runs every variant once (interleaved, so load changes hit all alike); printed: median ms per
generate call, decode tok/s, and the per-repeat ratio old / variant as min / median / max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import legacy_decode as LD  # noqa: E402

from crl_jax import sampling as S  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402


def attend_reduce(q, kc, vc, layer, valid, cache_index, num_kv_heads: int, block: int = 128):
    """`attention.attend_live` for one query per row (a decode step), as two reductions that read this layer's
    keys and values once, in the cache's own layout; other calls (the prefill) go to the library's."""
    B, T, Nq, D = q.shape
    if T != 1:
        return ATTEND_LIVE(q, kc, vc, layer, valid, cache_index, num_kv_heads, block)
    Kv, S = num_kv_heads, kc.shape[-3]
    k = kc if layer is None else jax.lax.dynamic_index_in_dim(kc, layer, 0, keepdims=False)  # [B, S, Kv, D]
    v = vc if layer is None else jax.lax.dynamic_index_in_dim(vc, layer, 0, keepdims=False)
    qg = q.reshape(B, Kv, Nq // Kv, D).astype(jnp.float32) / jnp.sqrt(jnp.float32(D))
    s = jnp.sum(qg[:, None] * k[:, :, :, None, :].astype(jnp.float32), axis=-1)  # [B, S, Kv, G]
    ok = valid & (jnp.arange(S)[None, :] <= cache_index)  # [B, S]
    s = jnp.where(ok[:, :, None, None], s, -jnp.inf)
    m = s.max(axis=1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    l = p.sum(axis=1)  # [B, Kv, G]
    o = jnp.sum(p[..., None] * v[:, :, :, None, :].astype(jnp.float32), axis=1)  # [B, Kv, G, D]
    o = o / jnp.where(l > 0, l, 1.0)[..., None]
    return o.reshape(B, 1, Nq * D).astype(vc.dtype)


ATTEND_LIVE = tr.attend_live
FUSED = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"  # the kernels' interpreter off a GPU


def sample_reduce(*args):
    """`sampling.sample_tokens` traced with `attend_reduce` as the transformer's cached attention (its own
    function, so jit keeps its own cache of programs)."""
    tr.attend_live = attend_reduce
    try:
        return S.sample_tokens(*args)
    finally:
        tr.attend_live = ATTEND_LIVE


def build(name: str, dtype: str):
    if name == "micro":  # --smoke
        cfg = tr.tiny_config(128, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    elif name == "tiny":
        cfg = tr.tiny_config(512, param_dtype=dtype, max_position_embeddings=4096)
    else:
        from crl_jax.models.presets import preset_config

        cfg = preset_config("smollm2-135m", param_dtype=dtype)
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    return gd, pa, cfg


def uptime() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def run(model: str, batches, P: int, N: int, block: int, reps: int, dtype: str,
        names=("old", "inplace", "live")) -> list[dict]:
    gd, pa, cfg = build(model, dtype)
    new = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    red = jax.jit(sample_reduce, static_argnums=(0, 5))
    rows = []
    for B in batches:
        prompt = jax.random.randint(jax.random.key(1), (B, P), 1, cfg.vocab_size)
        plen = jnp.full((B,), P, jnp.int32)
        key = jax.random.key(2)
        base = dict(max_new_tokens=N, temperature=0.0)
        unroll = dict(unroll_layers=cfg.num_layers)
        every = {
            "old": lambda: LD.legacy_generate_jit(gd, pa, prompt, plen, key, S.SamplerConfig(**base)),
            "inplace": lambda: new(gd, pa, prompt, plen, key, S.SamplerConfig(**base, attn_block=P + N)),
            "live": lambda: new(gd, pa, prompt, plen, key, S.SamplerConfig(**base, attn_block=block)),
            "inplace_unrolled": lambda: new(gd, pa, prompt, plen, key,
                                            S.SamplerConfig(**base, attn_block=P + N, **unroll)),
            "live_unrolled": lambda: new(gd, pa, prompt, plen, key,
                                         S.SamplerConfig(**base, attn_block=block, **unroll)),
            "unrolled_reduce": lambda: red(gd, pa, prompt, plen, key,
                                           S.SamplerConfig(**base, attn_block=P + N, **unroll)),
            "pallas": lambda: new(gd, pa, prompt, plen, key,
                                  S.SamplerConfig(**base, attn_block=P + N, **unroll, decode_kernel=FUSED)),
        }
        variants = {k: f for k, f in every.items() if k == "old" or (k in names and (k != "pallas" or B == 1))}
        outs = {k: jax.block_until_ready(f()) for k, f in variants.items()}  # compile + warm
        same = all(bool((outs[k][0] == outs["old"][0]).all()) for k in outs)
        times = {k: [] for k in variants}
        for _ in range(reps):
            for k, f in variants.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                times[k].append(time.perf_counter() - t0)
        row = dict(model=model, batch=B, P=P, N=N, block=block, dtype=dtype, reps=reps, same_tokens=same,
                   load=uptime())
        for k in variants:
            row[f"{k}_ms"] = 1e3 * statistics.median(times[k])
            row[f"{k}_tok_s"] = B * N / statistics.median(times[k])
            if k != "old":
                r = sorted(o / v for o, v in zip(times["old"], times[k]))
                row[f"old_over_{k}"] = [r[0], statistics.median(r), r[-1]]
        rows.append(row)
        print(json.dumps(row), flush=True)  # each batch's row as soon as it is measured
    return rows


def table(rows) -> str:
    out = ["| model | B | P | N | variant | ms / call | tok/s | old / variant (min/med/max) | same tokens | load |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda r: " / ".join(f"{x:.2f}" for x in r)  # noqa: E731
    for r in rows:
        for k in [c[:-3] for c in r if c.endswith("_ms")]:
            ratio = f(r[f"old_over_{k}"]) if k != "old" else "1"
            out.append(f"| {r['model']} | {r['batch']} | {r['P']} | {r['N']} | {k} | {r[f'{k}_ms']:.1f} | "
                       f"{r[f'{k}_tok_s']:,.0f} | {ratio} | {r['same_tokens']} | {r['load']} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny", choices=["tiny", "smollm2-shape"])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=192)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--variants", default="old,inplace,live",
                   help="comma list of old, inplace, live, inplace_unrolled, live_unrolled, unrolled_reduce, pallas")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        a.model, a.batches, a.prompt_len, a.new_tokens, a.block, a.reps = "micro", "2", 8, 8, 4, 1
    rows = run(a.model, [int(b) for b in a.batches.split(",")], a.prompt_len, a.new_tokens, a.block, a.reps, a.dtype,
               tuple(a.variants.split(",")))
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    print(table(rows))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
