"""The LLM extractor's CISPO loss: vocabulary head over every position vs over the response window only.

    python experiments/bench/extractor_head.py                     # SmolLM2-135M shape, B 2, P 256 + R 128
    python experiments/bench/extractor_head.py --prompt-len 768 --reps 5 --json OUT
    python experiments/bench/extractor_head.py --smoke             # a micro model (CI keeps it running)

An extractor row is a prompt (the trajectory to distil) and a response of at most R tokens. Both variants run
the same forward pass (`model(tokens, return_hidden=True)`); `full` scores every position with the vocabulary
head (`train_state.token_logprobs`), `window` only the R positions after the prompt
(`train_state.window_token_logprobs`, what `loss_fns.extractor_cispo_loss` uses when the batch carries its
`response_width`). Timed: `jit(value_and_grad(loss))`, the two variants in turn per repeat (ratio per repeat,
min / median / max), plus each program's compiled temporary memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import CISPOLossConfig, extractor_cispo_loss
from crl_jax.models import transformer as tr


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        cfg = tr.tiny_config(512, hidden_size=32, intermediate_size=64, num_layers=2)
        a.batch, a.prompt_len, a.response_len, a.reps = 2, 24, 8, 1
    else:
        from crl_jax.models.presets import preset_config

        cfg = preset_config("smollm2-135m", param_dtype=a.dtype)
    B, P, R = a.batch, a.prompt_len, a.response_len
    T = P + R
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    t = jnp.arange(T)[None]
    mask = (t >= P) & (t < T)
    batch = ts.ExtractorBatch(
        tokens=jax.random.randint(jax.random.key(1), (B, T), 1, cfg.vocab_size),
        loss_mask=jnp.broadcast_to(mask, (B, T)),
        behavior_logp=jnp.where(mask, -5.0, 0.0) * jnp.ones((B, 1)), advantages=jnp.linspace(-1, 1, B),
        ready=jnp.asarray(True), response_width=R)
    fn = extractor_cispo_loss(CISPOLossConfig())

    def loss(pa, b):
        num, (den, _) = fn(gd, pa, b)
        return num / den

    vg = jax.jit(jax.value_and_grad(loss))
    variants = {"full": batch.replace(response_width=None), "window": batch}
    row = dict(batch=B, prompt_len=P, response_len=R, dtype=a.dtype, device=str(jax.devices()[0].device_kind))
    for k, b in variants.items():
        row[f"{k}_temp_mib"] = vg.lower(params, b).compile().memory_analysis().temp_size_in_bytes / 2**20
    vals = {k: float(jax.block_until_ready(vg(params, b))[0]) for k, b in variants.items()}  # compile + warm
    row["loss_rel_diff"] = abs(vals["window"] - vals["full"]) / max(abs(vals["full"]), 1e-12)
    times = {k: [] for k in variants}
    for _ in range(a.reps):
        for k, b in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(vg(params, b))
            times[k].append(time.perf_counter() - t0)
    r = sorted(f / w for f, w in zip(times["full"], times["window"]))
    row.update({f"{k}_s": statistics.median(v) for k, v in times.items()},
               full_over_window=[r[0], statistics.median(r), r[-1]])
    print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)
    return row


if __name__ == "__main__":
    main()
