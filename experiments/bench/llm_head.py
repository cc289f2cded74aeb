"""The LLM path's losses: vocabulary head over every position vs over the trained tokens only.

    python experiments/bench/llm_head.py                 # SmolLM2-135M shape, B 2, extractor P 256 + R 128
    python experiments/bench/llm_head.py --loss actor --prompt-len 896 --turns 8 --reply-len 16
    python experiments/bench/llm_head.py --loss actor --ratio sequence   # GSPO: the head's chunks hold whole rows
    python experiments/bench/llm_head.py --lora-rank 8   # rank-8 adapters over a frozen base (`lora.train`)
    python experiments/bench/llm_head.py --attn einsum   # the attention before the blocked one (auto, CPU, T >= 256)
    python experiments/bench/llm_head.py --smoke         # micro model, both losses (CI keeps it running)

- extractor: a row is a prompt (the trajectory to distil) then a response of R tokens
  (`loss_fns.extractor_cispo_loss`, bound `ExtractorBatch.response_width`).
- actor: a row is a whole conversation of T = P + turns * R tokens whose `turns` replies of R tokens each close
  their turn's segment (`loss_fns.actor_ppo_loss`, bound `ActorBatch.trained_width`).
All variants run the same forward pass (`model(tokens, return_hidden=True)`); `full` scores every position
with the vocabulary head, `compact` only the trained tokens (what the losses do when the batch carries its
bound), both with the head's gradient taken in its forward pass (`train_state.token_loss`, the losses'
default); `compact_general` is `compact` through the general path (`fused_head=False`:
`compact_token_logprobs`, four vocabulary matmuls). `--ratio sequence` (actor): the fused head's chunks hold whole
rows (`rowwise`), as a sequence-level ratio needs. Timed: `jit(value_and_grad(loss))`, the variants in turn
per repeat (ratios per repeat, min / median / max: full / compact, general / fused), plus each program's
compiled temporary memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from crl_jax.config import LoRAConfig, ModelConfig
from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import CISPOLossConfig, PPOLossConfig, actor_ppo_loss, extractor_cispo_loss
from crl_jax.models import lora, transformer as tr


def batches(loss: str, B: int, P: int, R: int, turns: int, vocab: int):
    """(full batch, compact batch) with random tokens: extractor prompt + response, or an actor conversation."""
    toks = lambda T: jax.random.randint(jax.random.key(1), (B, T), 1, vocab)  # noqa: E731
    if loss == "extractor":
        T = P + R
        mask = jnp.broadcast_to((jnp.arange(T) >= P)[None], (B, T))
        b = ts.ExtractorBatch(tokens=toks(T), loss_mask=mask, behavior_logp=jnp.where(mask, -5.0, 0.0),
                              advantages=jnp.linspace(-1, 1, B), ready=jnp.asarray(True), response_width=R)
        return b.replace(response_width=None), b
    seg = P // turns + R  # each turn: observation tokens, then the reply
    T = seg * turns
    mask = jnp.broadcast_to(((jnp.arange(T) % seg) >= seg - R)[None], (B, T))
    b = ts.ActorBatch(tokens=toks(T), loss_mask=mask, behavior_logp=jnp.where(mask, -5.0, 0.0),
                      advantages=jnp.linspace(-1, 1, B), weight=jnp.ones(B), trained_width=turns * R)
    return b.replace(trained_width=None), b


def measure(loss: str, cfg, a) -> dict:
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    # the differentiated argument and the fixed one: the parameters (full fine-tuning), or the adapters over a
    # frozen base (`--lora-rank`, the LLM path's default: `lora.train`)
    rank = a.lora_rank
    train, fixed, s = (params, None, None) if not rank else (
        lora.init(params, jax.random.key(2), rank=rank), params, lora.scale(rank, LoRAConfig.alpha))
    full, compact = batches(loss, a.batch, a.prompt_len, a.reply_len, a.turns, cfg.vocab_size)

    def value_and_grad(fused: bool):
        fn = (extractor_cispo_loss(CISPOLossConfig(fused_head=fused)) if loss == "extractor"
              else actor_ppo_loss(PPOLossConfig(fused_head=fused, ratio=a.ratio)))

        def value(t, base, b):
            num, (den, _) = fn(gd, t if base is None else lora.merge(base, t, s), b)
            return num / den

        return jax.jit(jax.value_and_grad(value))

    vg, vg_general = value_and_grad(True), value_and_grad(False)
    variants = {"full": (vg, full), "compact": (vg, compact), "compact_general": (vg_general, compact)}
    row = dict(loss=loss, ratio=a.ratio if loss == "actor" else "token", batch=a.batch,
               seq=int(full.tokens.shape[1]), trained=int(full.loss_mask[0].sum()),
               dtype=a.dtype, scan_unroll=cfg.scan_unroll, merge_gate_up=cfg.merge_gate_up, lora_rank=a.lora_rank,
               attn_impl=cfg.attn_impl,
               device=str(jax.devices()[0].device_kind))
    for k, (f, b) in variants.items():
        row[f"{k}_temp_mib"] = f.lower(train, fixed, b).compile().memory_analysis().temp_size_in_bytes / 2**20
    vals = {k: float(jax.block_until_ready(f(train, fixed, b))[0]) for k, (f, b) in variants.items()}  # + warm
    row["loss_rel_diff"] = max(abs(vals[k] - vals["full"]) for k in vals) / max(abs(vals["full"]), 1e-12)
    times = {k: [] for k in variants}
    for _ in range(a.reps):
        for k, (f, b) in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(train, fixed, b))
            times[k].append(time.perf_counter() - t0)
    r = sorted(f / c for f, c in zip(times["full"], times["compact"]))
    g = sorted(x / c for x, c in zip(times["compact_general"], times["compact"]))
    row.update({f"{k}_s": statistics.median(v) for k, v in times.items()},
               full_over_compact=[r[0], statistics.median(r), r[-1]],
               general_over_fused=[g[0], statistics.median(g), g[-1]])
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--loss", default="extractor", help="comma list of extractor, actor")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=256, help="prompt (extractor) / observation tokens (actor)")
    p.add_argument("--reply-len", type=int, default=128, help="the response (extractor) / each reply (actor)")
    p.add_argument("--turns", type=int, default=8, help="actor: replies per conversation")
    p.add_argument("--ratio", default="token", choices=("token", "sequence"), help="actor: PPOLossConfig.ratio")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--scan-unroll", type=int, default=1, help="TransformerConfig.scan_unroll (0 = every layer)")
    p.add_argument("--merge-gate-up", type=int, default=-1,
                   help="TransformerConfig.merge_gate_up (1 / 0); -1: as a run without a tensor axis (1 on the CPU)")
    p.add_argument("--lora-rank", type=int, default=0, help="train rank-r adapters over a frozen base (0: full)")
    p.add_argument("--attn", default="auto", help="TransformerConfig.attn_impl (einsum: the path before the "
                   "blocked attention, which auto picks on a CPU from 256 tokens)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        cfg = tr.tiny_config(512, hidden_size=32, intermediate_size=64, num_layers=2)
        a.loss, a.batch, a.prompt_len, a.reply_len, a.turns, a.reps = "extractor,actor", 2, 24, 4, 2, 1
    else:
        from crl_jax.models.presets import preset_config

        cfg = preset_config("smollm2-135m", param_dtype=a.dtype)
    merge = (ModelConfig().forward_options(cfg.num_layers)["merge_gate_up"] if a.merge_gate_up < 0
             else bool(a.merge_gate_up))
    cfg = cfg.replace(scan_unroll=a.scan_unroll or cfg.num_layers, merge_gate_up=merge, attn_impl=a.attn)
    rows = [measure(loss, cfg, a) for loss in a.loss.split(",")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
