"""Training throughput and MFU of one actor update on a real-model shape with random weights.

    python experiments/bench/train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --json OUT

One step = forward + backward of the token log-prob loss + AdamW, bf16 parameters, optional remat per
block. `--variants chunked,full,cudnn` measures the library's vocabulary-tiled `train_state.token_logprobs`
and the full-logits version it replaced, both with einsum attention, and the tiled one with cuDNN
flash attention (`TransformerConfig.attn_impl="cudnn"`, GPU only; `cudnn_fullmask`: the same without
`is_causal`, so the kernel also computes the tiles above the diagonal; a `_bias` suffix: the causal mask handed to
cuDNN as a dense [B, 1, T, T] bias, with `is_causal`, the library's old path, where the unpadded forward now
passes no mask; `fused` / `cudnn_fused`: the loss through
`train_state.token_loss`, the head's gradient taken in its forward pass, three vocabulary matmuls, not four)
in one process; each variant's row is printed when done. MFU = model FLOPs / time / peak, with model
FLOPs = 6 * (non-embedding params + unembedding) * tokens + 6 * L * T * H_attn * tokens (causal attention
counted at half). Peak: `--peak`, else the dense bf16 peak of the device kind (`peak_flops`: H100 SXM and H200
989 TFLOP/s, H100 / H200 NVL 835, H100 PCIe 756, A100 312), else 989 TFLOP/s; each row says which it used.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from crl_jax.learner import train_state as ts
from crl_jax.models import attention
from crl_jax.models import transformer as tr
from crl_jax.models.presets import preset_config


def model_flops_per_token(cfg, seq: int) -> float:
    D = cfg.dim_head
    per_layer = (cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * D + cfg.num_heads * D * cfg.hidden_size
                 + 3 * cfg.hidden_size * cfg.intermediate_size)
    dense = cfg.num_layers * per_layer + cfg.hidden_size * cfg.vocab_size
    attn = cfg.num_layers * seq * cfg.num_heads * D  # QK^T and PV, causal half: 2 * 2 * T * H * D / 2 per token
    return 6.0 * dense + 6.0 * attn


_DENSE = attention.dense_attention


def _dense_mask(keep_causal: bool):
    """`dense_attention` handed the causal mask as a dense [B, T, T] one where the unpadded forward passes none (a
    [B, 1, T, T] bias for cuDNN, as the library did earlier), with or without its `is_causal` flag."""

    def attend(q, k, v, mask, num_kv_heads, impl="einsum", causal=False):
        if mask is None:
            T = q.shape[1]
            mask = jnp.broadcast_to(jnp.arange(T)[None, :] <= jnp.arange(T)[:, None], (q.shape[0], T, T))
        return _DENSE(q, k, v, mask, num_kv_heads, impl, causal and keep_causal)

    return attend


def old_token_logprobs(gd, params, tokens, mask):
    """The learner's log-probs of old: full [B, T, V] float32 logits (the baseline of --variants)."""
    logits = nnx.merge(gd, params)(tokens)[:, :-1].astype(jnp.float32)
    picked = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.where(mask[:, 1:], picked - jax.nn.logsumexp(logits, axis=-1), 0.0)


def token_loss_fn(variant: str, batch: int, seq: int, head_chunk: int = 1024):
    """The step's loss callback, -sum of every token's log-prob: through `train_state.token_loss` (variants ending
    in "fused": the head's gradient in its forward pass), the old full-logits function ("full"), or
    `train_state.token_logprobs` (the others). Also used by gpu_aot.py."""
    mask = jnp.ones((batch, seq), bool)
    den = jnp.float32(batch * (seq - 1))

    def loss_fn(gd, params, tokens):
        if variant.endswith("fused"):
            total, _, _ = ts.token_loss(gd, params, tokens, mask, lambda lp, aux: -lp, {}, head_chunk=head_chunk)
            return total, (den, {})
        if variant == "full":
            logp = old_token_logprobs(gd, params, tokens, mask)
        else:
            logp, _ = ts.token_logprobs(gd, params, tokens, mask)
        return -jnp.sum(logp), (den, {})

    return loss_fn


def measure(cfg, variant: str, a) -> dict:
    # explicit attention (the library's default "auto" takes cuDNN on a GPU): chunked / full = einsum attention
    cfg = cfg.replace(attn_impl="cudnn" if variant.startswith("cudnn") else "einsum")
    # cudnn_fullmask: a dense mask without `is_causal` (the kernel then computes the tiles above the diagonal too);
    # *_bias: a dense mask with `is_causal` (the library's old path); else no mask, `is_causal` alone
    masked = variant == "cudnn_fullmask" or variant.endswith("_bias")
    tr.dense_attention = _dense_mask(variant != "cudnn_fullmask") if masked else _DENSE  # what Transformer calls
    state = ts.create_train_state(tr.create(cfg, jax.random.key(0)), optax.adamw(1e-5))
    toks = jax.random.randint(jax.random.key(1), (a.batch, a.seq), 0, cfg.vocab_size)
    loss_fn = token_loss_fn(variant.removesuffix("_bias"), a.batch, a.seq, a.head_chunk)

    step = jax.jit(lambda s, b: ts.apply_update(s, b, loss_fn, 1), donate_argnums=(0,))
    t0 = time.time()
    comp = step.lower(state, toks).compile()
    mem = comp.memory_analysis()
    state, m = step(state, toks)
    jax.block_until_ready(m)
    compile_s = time.time() - t0
    times = []
    for _ in range(a.reps):
        t0 = time.time()
        state, m = step(state, toks)
        jax.block_until_ready(m)
        times.append(time.time() - t0)
    dt = sorted(times)[len(times) // 2]
    tokens = a.batch * a.seq
    flops = model_flops_per_token(cfg, a.seq) * tokens
    return dict(variant=variant, preset=a.preset, batch=a.batch, seq=a.seq, remat=a.remat, remat_policy=cfg.remat_policy,
                scan_unroll=cfg.scan_unroll, head_chunk=a.head_chunk,
                params_m=tr.num_params(state.params) / 1e6, step_s=dt, step_s_all=times, tokens_per_s=tokens / dt,
                tflops=flops / dt / 1e12, mfu=flops / dt / a.peak, peak=a.peak,
                peak_source=a.peak_source, compile_s=compile_s,
                temp_bytes=getattr(mem, "temp_size_in_bytes", None) if mem is not None else None,
                device=str(jax.devices()[0].device_kind), loss=float(m["loss"]))


# dense bf16 tensor-core peaks (NVIDIA's data sheets, no sparsity), by a substring of `device_kind`; the more
# specific names first ("NVIDIA H100 PCIe" and "NVIDIA H100 NVL" before the SXM part's "NVIDIA H100 80GB HBM3")
_PEAKS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
          ("A100", 312e12))


def peak_flops(device_kind: str) -> float | None:
    """The dense bf16 peak FLOP/s of a GPU by its `device_kind`, None for a kind not in the table (a CPU)."""
    for name, peak in _PEAKS:
        if name.lower() in device_kind.lower():
            return peak
    return None


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--remat", type=int, default=1)
    p.add_argument("--remat-policy", default="nothing", help="TransformerConfig.remat_policy: nothing | dots | mlp")
    p.add_argument("--scan-unroll", type=int, default=1, help="TransformerConfig.scan_unroll (layers per scan step)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--head-chunk", type=int, default=1024, help="fused variants: rows per vocabulary-head chunk")
    p.add_argument("--peak", type=float, default=None,
                   help="FLOP/s for the MFU (default: the device kind's dense bf16 peak, else 989e12)")
    p.add_argument("--variants", default="chunked",
                   help="comma list of chunked, full (the old full-logits path), cudnn, cudnn_fullmask, fused, cudnn_fused; "
                        "a _bias suffix: the old dense causal mask")
    p.add_argument("--smoke", action="store_true", help="tiny model, batch 2, seq 64, 1 rep (CPU)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    kind = str(jax.devices()[0].device_kind)
    kind_peak = peak_flops(kind)
    a.peak_source = "--peak" if a.peak else (kind if kind_peak else "default (989e12: kind not in the table)")
    a.peak = a.peak or kind_peak or 989e12
    if a.smoke:
        cfg = tr.tiny_config(1024, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                             remat=bool(a.remat), remat_policy=a.remat_policy, scan_unroll=a.scan_unroll)
        a.preset, a.batch, a.seq, a.reps = "tiny", 2, 64, 1
    else:
        cfg = preset_config(a.preset, param_dtype="bfloat16", remat=bool(a.remat), remat_policy=a.remat_policy,
                            scan_unroll=a.scan_unroll)
    rows = []
    for v in a.variants.split(","):
        try:
            rows.append(measure(cfg, v, a))
        except Exception as e:  # noqa: BLE001  (one variant failing, e.g. cuDNN missing, keeps the others)
            rows.append(dict(variant=v, error=f"{type(e).__name__}: {str(e)[:500]}"))
        print(json.dumps(rows[-1]), flush=True)
    out = dict(rows=rows)
    by = {r["variant"]: r for r in rows if "step_s" in r}
    for v, base in (("full", "chunked"), ("cudnn", "chunked"), ("fused", "chunked"), ("cudnn_fused", "cudnn"),
                    ("cudnn_fused", "cudnn_fused_bias")):
        if v in by and base in by:
            out[f"{v}_over_{base}_step_s"] = by[v]["step_s"] / by[base]["step_s"]
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
