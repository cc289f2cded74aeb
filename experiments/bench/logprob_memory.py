"""Compiled temporary memory of the learner's log-prob loss: full [B, T, V] logits vs vocabulary tiles.

    python experiments/bench/logprob_memory.py                       # V 49,152, T 1,024, B 4, H 576
    python experiments/bench/logprob_memory.py --batch 8 --hidden 896 --vocab 151936 --json OUT
    python experiments/bench/logprob_memory.py --smoke               # tiny sizes (CI)
    python experiments/bench/logprob_memory.py --loss sequence --time 5   # a GSPO-style loss (ratio "sequence")

For each variant, `jax.jit(value_and_grad(loss)).lower(...).compile().memory_analysis()` of
loss = -sum_t logp_t over random hidden states h [B, T, H] and an unembedding w [H, V] (the head of the
loss, where the [B, T, V] buffers live), and of the fused head (`head_loss.fused_token_loss`: the gradient
taken in the forward pass, three vocabulary matmuls instead of four); `--loss sequence` makes the loss a
sequence-level PPO numerator (`losses.ppo_sequence_terms`: every term depends on its whole row), which the fused
head takes with `group=T` (whole rows per chunk). All variants are compiled in this process,
nothing is run unless --time is given. `--model` also compiles a whole `train_state.token_logprobs` gradient of a
2-layer transformer with the same V and T, library (chunked) vs the old full-logits function below.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax import losses
from crl_jax.learner import train_state as ts
from crl_jax.models import head_loss as HL
from crl_jax.models import logprobs as LP
from crl_jax.models import transformer as tr


def old_token_logprobs(graphdef, params, tokens, mask):
    """The learner's old function (full float32 logits), kept here only as the baseline."""
    logits = nnx.merge(graphdef, params)(tokens)[:, :-1].astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    valid = mask[:, 1:]
    return jnp.where(valid, picked - lse, 0.0)


def mem(compiled) -> dict:
    m = compiled.memory_analysis()
    if m is None:
        return {"temp_bytes": None}
    return {k: int(getattr(m, k + "_size_in_bytes", 0) or 0) for k in ("temp", "argument", "output")}


def sequence_terms(lp, valid, vocab: int):
    """A sequence-level PPO numerator on [B, T] (ratio "sequence", behaviour log-probs a uniform policy's)."""
    one = jnp.ones(lp.shape, jnp.float32)
    return losses.ppo_sequence_terms(lp, jnp.log(one / vocab), one, one / lp.shape[-1], valid)


def head_variants(B, T, H, V, dtype, token_chunk, vocab_chunk, loss="token", head_chunk=1024):
    h = jax.ShapeDtypeStruct((B, T, H), dtype)
    w = jax.ShapeDtypeStruct((H, V), dtype)
    tgt = jax.ShapeDtypeStruct((B, T), jnp.int32)
    seq = loss == "sequence"
    of_logp = (lambda lp: sequence_terms(lp, jnp.ones(lp.shape, bool), V).sum()) if seq else (lambda lp: -lp.sum())

    def loss_full(h, w, t):
        return of_logp(LP.full_logprobs(h, w, t)[0])

    def loss_chunk(h, w, t):
        return of_logp(LP.chunked_logprobs(h, w, t, token_chunk=token_chunk, vocab_chunk=vocab_chunk)[0])

    def loss_fused(h, w, t):  # the head's gradient in its forward pass (the learner's default, head_loss.py)
        hf, tf = h.reshape(-1, h.shape[-1]), t.reshape(-1)
        if seq:  # whole rows per chunk
            terms = lambda lp, aux, v: sequence_terms(lp, v, V)  # noqa: E731
            return HL.fused_token_loss(hf, w, tf, jnp.ones(tf.shape, bool), terms, {}, group=T,
                                       token_chunk=head_chunk)[0]
        return HL.fused_token_loss(hf, w, tf, jnp.ones(tf.shape, bool), lambda lp, aux: -lp, {},
                                   token_chunk=head_chunk)[0]

    out = {}
    for name, f in (("full", loss_full), ("chunked", loss_chunk), ("fused", loss_fused)):
        fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        t0 = time.perf_counter()
        comp = fn.lower(h, w, tgt).compile()
        out[name] = dict(mem(comp), compile_s=time.perf_counter() - t0, fn=fn)
    return out, (h, w, tgt)


def model_variants(B, T, V, dtype):
    cfg = tr.tiny_config(V, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                         max_position_embeddings=T, param_dtype=dtype)
    gd, pa = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    toks = jax.ShapeDtypeStruct((B, T), jnp.int32)
    mask = jax.ShapeDtypeStruct((B, T), bool)
    out = {}
    for name, f in (("full", lambda p, t, m: -old_token_logprobs(gd, p, t, m).sum()),
                    ("chunked", lambda p, t, m: -ts.token_logprobs(gd, p, t, m)[0].sum())):
        comp = jax.jit(jax.value_and_grad(f)).lower(pa, toks, mask).compile()
        out[name] = mem(comp)
    return out


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1]
    except OSError:
        return "n/a"


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=576)  # SmolLM2-135M width
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--token-chunk", type=int, default=2048)
    p.add_argument("--vocab-chunk", type=int, default=8192)
    p.add_argument("--head-chunk", type=int, default=1024,
                   help="the fused head's rows per chunk (train_state.token_loss's head_chunk, the learner's default)")
    p.add_argument("--loss", default="token", choices=("token", "sequence"), help="per-token or sequence-level")
    p.add_argument("--model", action="store_true", help="also the whole token_logprobs gradient of a 2-layer model")
    p.add_argument("--time", type=int, default=0, help="also run each variant this many times (median s)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        a.batch, a.seq, a.hidden, a.vocab, a.token_chunk, a.vocab_chunk = 2, 64, 32, 1024, 64, 128
    dt = tr.as_dtype(a.dtype)
    print(f"load average:{load()}  device: {jax.devices()[0].device_kind}  jax {jax.__version__}")
    head, args = head_variants(a.batch, a.seq, a.hidden, a.vocab, dt, a.token_chunk, a.vocab_chunk, a.loss,
                               a.head_chunk)
    full_logits_bytes = a.batch * a.seq * a.vocab * 4
    row = dict(loss=a.loss, batch=a.batch, seq=a.seq, hidden=a.hidden, vocab=a.vocab, dtype=a.dtype,
               token_chunk=a.token_chunk, head_chunk=a.head_chunk,
               vocab_chunk=a.vocab_chunk, one_f32_logits_buffer_bytes=full_logits_bytes,
               device=str(jax.devices()[0].device_kind))
    for k in ("full", "chunked", "fused"):
        row[f"head_{k}"] = {kk: v for kk, v in head[k].items() if kk != "fn"}
    tf, tc, tu = head["full"]["temp"], head["chunked"]["temp"], head["fused"]["temp"]
    row["head_temp_ratio"] = tc / tf if tf else None
    row["fused_temp_ratio"] = tu / tf if tf else None
    print("| variant | temp MiB | args MiB | out MiB | compile s |\n|---|---|---|---|---|")
    for k in ("full", "chunked", "fused"):
        r = head[k]
        print(f"| head {k} | {r['temp'] / 2**20:,.1f} | {r['argument'] / 2**20:,.1f} | {r['output'] / 2**20:,.1f} "
              f"| {r['compile_s']:.1f} |")
    verdict = lambda r: "met" if r <= 0.125 else "MISSED"  # noqa: E731
    # the fused head holds one [head_chunk, V] float32 chunk and the [H, V] float32 gradient, whatever B x T is, so
    # its ratio to the full logits falls as B x T grows: (head_chunk + H) / (2 B T) for float32 inputs
    print(f"one [B, T, V] float32 buffer: {full_logits_bytes / 2**20:,.1f} MiB; temp / full: chunked "
          f"{row['head_temp_ratio']:.4f} (target <= 0.125: {verdict(row['head_temp_ratio'])}), fused "
          f"{row['fused_temp_ratio']:.4f} ({verdict(row['fused_temp_ratio'])}; the LLM losses' default)")
    if a.time:
        key = jax.random.split(jax.random.key(0), 3)
        h = jax.random.normal(key[0], args[0].shape, dt)
        w = (0.02 * jax.random.normal(key[1], args[1].shape)).astype(dt)
        t = jax.random.randint(key[2], args[2].shape, 0, a.vocab)
        times = {k: [] for k in ("full", "chunked", "fused")}
        for k in times:
            jax.block_until_ready(head[k]["fn"](h, w, t))
        for _ in range(a.time):  # interleaved, so load changes hit both variants alike
            for k in times:
                t0 = time.perf_counter()
                jax.block_until_ready(head[k]["fn"](h, w, t))
                times[k].append(time.perf_counter() - t0)
        ratios = sorted(c / f for c, f in zip(times["chunked"], times["full"]))
        row["time_s"] = {k: statistics.median(v) for k, v in times.items()}
        row["time_ratio_min_med_max"] = [ratios[0], statistics.median(ratios), ratios[-1]]
        fr = sorted(x / c for x, c in zip(times["fused"], times["chunked"]))
        row["fused_over_chunked_time_min_med_max"] = [fr[0], statistics.median(fr), fr[-1]]
        print(f"value+grad s: full {row['time_s']['full']:.3f}, chunked {row['time_s']['chunked']:.3f}, fused "
              f"{row['time_s']['fused']:.3f}; chunked/full min/median/max {ratios[0]:.2f} / "
              f"{statistics.median(ratios):.2f} / {ratios[-1]:.2f}; fused/chunked {fr[0]:.2f} / "
              f"{statistics.median(fr):.2f} / {fr[-1]:.2f}")
    if a.model:
        mv = model_variants(a.batch, a.seq, a.vocab, dt)
        row["model"] = mv
        ratio = mv["chunked"]["temp"] / mv["full"]["temp"] if mv["full"]["temp"] else None
        row["model_temp_ratio"] = ratio
        print(f"2-layer model token_logprobs gradient: temp full {mv['full']['temp'] / 2**20:,.1f} MiB, chunked "
              f"{mv['chunked']['temp'] / 2**20:,.1f} MiB, ratio {ratio:.4f}")
    row["load"] = load()
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(row, f, indent=2)
    return row


if __name__ == "__main__":
    main()
