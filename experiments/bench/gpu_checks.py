"""Correctness checks of the backend-dependent paths, run where they apply (gpu.sh's `gpu_checks` step).

    python experiments/bench/gpu_checks.py [--smoke] [--json OUT]

1. Attention implementations: logits and gradients of a small bf16 Qwen-like model (grouped heads, right
   padding, T 512) with attn_impl "cudnn" (on a GPU; "xla" elsewhere) against "einsum", as relative errors
   ||a - b|| / ||b|| over the valid positions (bf16 operands land between 1e-3 and 1e-2).
2. Decode plan: greedy float32 decoding of a 10-layer model with the backend's default plan (`decode_plan`: on
   a GPU one attention block, every layer unrolled) and with the CPU plan (128-slot blocks, layer scan) gives
   the same tokens.
3. Fused decode kernels (`decode_kernel="pallas"`, on a GPU; Pallas' interpreter elsewhere): greedy float32
   batch-1 decoding of a 6-layer model gives the same tokens as XLA's path (log-probs within 1e-3), and the same
   again from the decode weights made once (`sampling.prepare`) at temperature 1; one bf16
   decode step at SmolLM2-135M shape (30 layers; 2 with --smoke) gives logits within 3e-2 relative of XLA's.
Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import sampling as S
from crl_jax.models import transformer as tr


def rel(a, b, where) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.where(where, a - b, 0.0)
    return float(np.linalg.norm(d) / max(np.linalg.norm(np.where(where, b, 0.0)), 1e-30))


def attention_check(smoke: bool = False) -> dict:
    impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
    cfg = tr.tiny_config(4096, hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8, num_kv_heads=2,
                         attention_bias=True, param_dtype="bfloat16", max_position_embeddings=1024)
    B, T = 4, 512
    if smoke:
        cfg, T = cfg.replace(hidden_size=64, intermediate_size=128, num_layers=2, vocab_size=256), 64
    toks = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    lens = jnp.array([T, T - 13, T // 4 + 1, 7])
    mask = jnp.arange(T)[None, :] < lens[:, None]
    out = {}
    # "einsum" with the key mask is the reference; `impl` runs it with the key mask (a [B, 1, T, T] bias for
    # cuDNN) and without one ("causal": right padding needs none, the learner's form: cuDNN's causal kernel).
    for name, attn_impl, key_mask in (("einsum", "einsum", mask), (impl, impl, mask), (impl + "_causal", impl, None)):
        gd, pa = tr.split(tr.create(cfg.replace(attn_impl=attn_impl), jax.random.key(0)))

        def loss(p):
            logits = tr.merge(gd, p)(toks, attention_mask=key_mask).astype(jnp.float32)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), toks[:, 1:, None], axis=-1)[..., 0]
            return -jnp.sum(jnp.where(mask[:, 1:], logp, 0.0)) / mask[:, 1:].sum(), logits  # next-token NLL

        (l, logits), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(pa)
        out[name] = (float(l), logits, g)
    row = dict(impl=impl, loss_einsum=out["einsum"][0])
    for name, tag in ((impl, ""), (impl + "_causal", "_causal")):
        ge, gi = jax.tree.leaves(out["einsum"][2]), jax.tree.leaves(out[name][2])
        row.update({f"loss_impl{tag}": out[name][0], f"grad_rel_max{tag}": max(rel(a, b, True) for a, b in zip(gi, ge)),
                    f"logits_rel{tag}": rel(out[name][1], out["einsum"][1], mask[..., None])})
    row["ok"] = all(bool(row[f"logits_rel{t}"] < 2e-2 and row[f"grad_rel_max{t}"] < 5e-2
                         and np.isfinite(row[f"loss_impl{t}"])) for t in ("", "_causal"))
    return row


def decode_plan_check(smoke: bool = False) -> dict:
    cfg = tr.tiny_config(512, num_layers=10, max_position_embeddings=512)
    if smoke:
        cfg = cfg.replace(hidden_size=32, intermediate_size=64)
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    prompt = jax.random.randint(jax.random.key(1), (4, 40), 1, cfg.vocab_size)
    plen = jnp.array([40, 33, 12, 1], jnp.int32)
    run = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    base = dict(max_new_tokens=20 if smoke else 200, temperature=0.0)
    auto = run(gd, pa, prompt, plen, jax.random.key(2), S.SamplerConfig(**base))
    cpu = run(gd, pa, prompt, plen, jax.random.key(2), S.SamplerConfig(**base, attn_block=128, unroll_layers=8))
    plan = S.decode_plan(S.SamplerConfig(**base), 40 + base["max_new_tokens"], cfg.num_layers)
    same = bool((np.asarray(auto[0]) == np.asarray(cpu[0])).all())
    lp = float(np.abs(np.asarray(auto[1]) - np.asarray(cpu[1])).max())
    return dict(plan=dict(attn_block=plan[0], unrolled=plan[1]), same_tokens=same, logprob_max_abs_diff=lp,
                ok=same and lp < 1e-3)


def fused_decode_check(smoke: bool = False) -> dict:
    from crl_jax.models.experimental import fused_decode as fd
    from crl_jax.models.presets import preset_config

    kind = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
    cfg = tr.tiny_config(512, hidden_size=256, intermediate_size=512, num_layers=6, num_heads=4, num_kv_heads=2,
                         attention_bias=True, max_position_embeddings=512)
    N = 100
    if smoke:
        cfg, N = cfg.replace(hidden_size=64, intermediate_size=64, num_layers=2, vocab_size=256), 10
    gd, pa = tr.split(tr.create(cfg, jax.random.key(0)))
    pa = jax.tree_util.tree_map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape, x.dtype), pa)
    prompt = jax.random.randint(jax.random.key(1), (1, 40), 1, cfg.vocab_size)
    same, lp = {}, 0.0
    for temp in (0.0, 1.0):  # greedy, and a draw (models.experimental.fused_sample: the same uniforms as XLA's loop)
        out = {k: S.generate((gd, pa), prompt, jnp.array([33]), jax.random.key(2), max_new_tokens=N,
                             temperature=temp, decode_kernel=k) for k in ("xla", kind)}
        same[temp] = bool((np.asarray(out[kind][0]) == np.asarray(out["xla"][0])).all())
        lp = max(lp, float(np.abs(np.asarray(out[kind][1]) - np.asarray(out["xla"][1])).max()))
    # The decode weights made once (`sampling.prepare`, what the sampler benchmarks time) feed the same kernels.
    prep = S.generate(S.prepare((gd, pa)), prompt, jnp.array([33]), jax.random.key(2), max_new_tokens=N,
                      temperature=1.0, decode_kernel=kind)
    same["prepared"] = bool((np.asarray(prep[0]) == np.asarray(out[kind][0])).all())
    # One bf16 step at the benchmark's shape (what sampler.py --decode-kernel pallas times).
    big = preset_config("smollm2-135m", param_dtype="bfloat16")
    if smoke:  # (the interpreter runs the head's 384 vocabulary tiles one by one: 32 here)
        big = big.replace(num_layers=2, vocab_size=4096)
    model = tr.create(big, jax.random.key(4))
    P, S_cap = 128, 256
    cache = tr.init_cache(big, 1, S_cap)
    layers = model.layer_list(fused=True)
    toks = jax.random.randint(jax.random.key(5), (1, P), 0, big.vocab_size)

    @jax.jit
    def steps(cache):
        _, cache = model(toks, cache=cache, cache_index=0, return_hidden=True, layers=layers)
        cache = tr.split_cache(cache)
        tok, pos = jnp.array([17]), jnp.array([P])
        h, _ = model(tok[:, None], positions=pos[:, None], cache=cache, cache_index=P, return_hidden=True,
                     layers=layers)
        got, _ = fd.decode_step(model, layers, tok, pos, cache, P, interpret=kind == "pallas_interpret")
        return got, model.unembed(h)[:, 0]

    got, want = steps(cache)
    r = rel(got, want, np.ones(want.shape, bool))
    return dict(kernel=kind, same_tokens=same[0.0], same_tokens_temperature_1=same[1.0],
                prepared_same_tokens=same["prepared"], logprob_max_abs_diff=lp,
                bf16_step_logits_rel=r, ok=all(same.values()) and lp < 1e-3 and r < 3e-2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU, CI)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind)}
    checks = (("attention", attention_check), ("decode_plan", decode_plan_check), ("fused_decode", fused_decode_check))
    for name, fn in checks:
        try:
            rows[name] = fn(a.smoke)
        except Exception as e:  # noqa: BLE001  (report and go on to the next check)
            rows[name] = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
        print(name, json.dumps(rows[name]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(rows[k]["ok"] for k, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
