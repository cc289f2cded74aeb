"""What the compiled decode program does with the KV cache (for the next GPU profile; no timing).

    python experiments/bench/decode_hlo.py [--model smollm2-shape] [--batch 256] [--smoke] [--json OUT]

Compiles `sampling.sample_tokens` with the backend's decode plan (`decode_plan`) and counts, in the
optimized HLO, the instructions whose result has the cache's shape [L, B, S, Hkv, D] (and, under
`layer_buffer`, one layer's [B, S, Hkv, D]: straight-line layers decode over per-layer buffers,
`transformer.split_cache`): copies, converts, dynamic-update-slices and fusions. In place, one decode step should only write the new slot of each layer, so
whole-cache copies or converts inside the loop are bytes the step did not need to move (on a CPU, XLA
computes a bf16 cache's update in float32: a convert of the whole cache per layer and step). Also counted:
while loops, and the instructions of the whole module. The HLO text is kept with --dump FILE.
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import jax.numpy as jnp

from crl_jax import sampling as S
from crl_jax.models import transformer as tr


def count(txt: str, shape: str) -> dict:
    """Cache-shaped instructions by kind in HLO text `txt`; `shape` like "4,8,64,2,32"."""
    kinds = {"copy": 0, "convert": 0, "dynamic-update-slice": 0, "fusion": 0, "other": 0}
    pat = re.compile(r"=\s*\w+\[" + re.escape(shape) + r"\]\S*\s+([\w-]+)\(")
    for line in txt.splitlines():
        m = pat.search(line)
        if m:
            op = m.group(1)
            kinds[op if op in kinds else "other"] += 1
    kinds["while_loops"] = len(re.findall(r"\swhile\(", txt))
    kinds["instructions"] = sum(1 for line in txt.splitlines() if re.match(r"\s+(ROOT\s+)?%\S+ = ", line))
    return kinds


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-shape", choices=["smollm2-shape", "micro"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--smoke", action="store_true", help="a 2-layer micro model, B 2, P = N = 8 (CI)")
    p.add_argument("--dump", default=None, help="write the optimized HLO text here")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        a.model, a.batch, a.prompt_len, a.new_tokens = "micro", 2, 8, 8
    if a.model == "micro":
        cfg = tr.tiny_config(128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             param_dtype=a.dtype)
    else:
        from crl_jax.models.presets import preset_config

        cfg = preset_config("smollm2-135m", param_dtype=a.dtype)
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    B, P, N = a.batch, a.prompt_len, a.new_tokens
    sc = S.SamplerConfig(max_new_tokens=N, temperature=1.0)
    block, unrolled = S.decode_plan(sc, P + N, cfg.num_layers)
    fn = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    txt = fn.lower(gd, pa, jnp.ones((B, P), jnp.int32), jnp.full((B,), P, jnp.int32), jax.random.key(1),
                   sc).compile().as_text()
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(txt)
    shape = f"{cfg.num_layers},{B},{P + N},{cfg.num_kv_heads},{cfg.dim_head}"
    layer_shape = shape.split(",", 1)[1]  # one layer's buffer (`transformer.split_cache`, straight-line layers)
    row = dict(model=a.model, batch=B, P=P, N=N, dtype=a.dtype, backend=jax.default_backend(),
               device=str(jax.devices()[0].device_kind), attn_block=block, layers_unrolled=unrolled,
               cache_shape=f"[{shape}]", cache_mib=2 * cfg.num_layers * B * (P + N) * cfg.num_kv_heads * cfg.dim_head
               * jnp.dtype(tr.as_dtype(a.dtype)).itemsize / 2**20, **count(txt, shape),
               layer_buffer={k: v for k, v in count(txt, layer_shape).items() if k not in ("while_loops", "instructions")})
    print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)
    return row


if __name__ == "__main__":
    main()
