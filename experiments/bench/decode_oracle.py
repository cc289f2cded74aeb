"""How far is a batch-1 decode step from the least it can cost on this machine? (issue #16)

    python experiments/bench/decode_oracle.py [--batch 1] [--vocab 2048] [--reps 9]

Both programs run 32 steps under one jitted `fori_loop`, on the Llama-3 shape of the Tunix benchmarks
(`tunix_common.bench_shape`, random weights, float32), interleaved call by call:
- `decode`: our cached forward of one token per step (`Transformer.__call__` with the KV cache, greedy
  feed; the sampler's model work without its sampling: straight-line layers over weights sliced and fused once
  before the loop, as `sampling.sample_tokens` runs a model this shallow), after a 32-token prefill that is
  timed apart; `decode_scan`: the same with the layer scan (what deeper models run);
- `oracle`: only the matvecs through every weight matrix (q, k, v, o, gate, up, down of each layer and the
  unembedding) plus one norm per block so values stay finite: what reading the weights costs.
Prints ms per step of each, the weight bytes per step and the rate the oracle reads them at, and the
per-repeat ratio decode / oracle (min / median / max): the part above 1 is the fixed cost of the step's
other small ops (attention over the cache, RoPE, norms, cache writes), which a batch-1 step on a CPU pays
per op.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_common as tc  # noqa: E402

from crl_jax.models import transformer as tr  # noqa: E402

P = N = 32


def programs(gd, cfg, B):
    def prefill(pa, prompt):
        m = tr.merge(gd, pa)
        h, cache = m(prompt, positions=jnp.broadcast_to(jnp.arange(P), (B, P)), cache=tr.init_cache(cfg, B, P + N),
                     cache_index=0, return_hidden=True)
        return m.unembed(h[:, -1:])[:, 0], cache

    def decode(pa, logits, cache, straight: bool):
        m = tr.merge(gd, pa)
        # What `sampling.sample_tokens` does for a model this shallow: weights sliced (and q/k/v, gate/up fused)
        # once before the loop; `straight=False` is the layer scan (deep models), slicing inside the loop.
        layers = jax.lax.optimization_barrier(m.layer_list(fused=True)) if straight else None

        def body(i, c):
            logits, cache = c
            tok = jnp.argmax(logits, -1).astype(jnp.int32)
            h, cache = m(tok[:, None], positions=jnp.full((B, 1), P + i, jnp.int32), cache=cache,
                         attention_mask=jnp.ones((B, 1), bool), cache_index=P + i, return_hidden=True,
                         layers=layers)
            return m.unembed(h)[:, 0], cache

        return jax.lax.fori_loop(0, N, body, (logits, cache))[0]

    def oracle(per, emb, x):
        """per: one weight dict per layer, sliced before the call (a slice of the stacked weights inside the
        program measured as a copy per step, 2-5x slower, which is not what the oracle is for)."""

        def body(i, x):
            h = x
            for w in per:
                q, k, v = h @ w["wq"], h @ w["wk"], h @ w["wv"]
                h = h + q @ w["wo"] + 1e-3 * (k.sum() + v.sum())
                h = h + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
                h = h / (1e-3 + jnp.abs(h).max())
            return h + 1e-3 * (h @ emb.T)[:, : h.shape[1]]

        return jax.lax.fori_loop(0, N, body, x)

    return jax.jit(prefill), jax.jit(decode, static_argnums=3), jax.jit(oracle)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args(argv)
    cfg = tc.crl_config(tc.bench_shape(a.vocab))
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    prefill, decode, oracle = programs(gd, cfg, a.batch)
    prompt = jnp.asarray(np.random.default_rng(0).integers(2, a.vocab, (a.batch, P)), jnp.int32)
    x = jnp.ones((a.batch, cfg.hidden_size), jnp.float32)
    m = tr.merge(gd, pa)
    lps = m.layer_params()
    per = [{k: v[layer] for k, v in lps.items()} for layer in range(cfg.num_layers)]
    ow = (per, m.embed[...], x)
    logits, cache = jax.block_until_ready(prefill(pa, prompt))
    jax.block_until_ready((decode(pa, logits, cache, True), decode(pa, logits, cache, False), oracle(*ow)))

    def timed(f, *args):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        return time.perf_counter() - t0

    t = {"prefill": [], "decode": [], "decode_scan": [], "oracle": []}
    load0 = tc.loadavg()
    for _ in range(a.reps):
        t["prefill"].append(timed(prefill, pa, prompt))
        t["decode"].append(timed(decode, pa, logits, cache, True))
        t["decode_scan"].append(timed(decode, pa, logits, cache, False))
        t["oracle"].append(timed(oracle, *ow))
    mb = sum(int(np.prod(v.shape)) for k, v in tr.merge(gd, pa).layer_params().items()
             if k.startswith("w")) * 4 / 1e6 + a.vocab * cfg.hidden_size * 4 / 1e6
    ms = {k: 1e3 * statistics.median(v) for k, v in t.items()}
    print(f"B={a.batch}, {tr.num_params(pa) / 1e6:.2f}M params, load {load0} -> {tc.loadavg()}")
    print(f"prefill {ms['prefill']:.2f} ms; decode {ms['decode'] / N:.3f} ms/step (layer scan "
          f"{ms['decode_scan'] / N:.3f}); oracle {ms['oracle'] / N:.3f} ms/step ({mb:.1f} MB of weights per step -> "
          f"{mb * N / ms['oracle']:.1f} GB/s)")
    for name in ("decode", "decode_scan"):
        ratio = [d / o for d, o in zip(t[name], t["oracle"])]
        print(f"{name} / oracle per repeat: x{tc.fmt_spread(ratio)} (min / median / max)")


if __name__ == "__main__":
    main()
