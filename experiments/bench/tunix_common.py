"""Shared pieces of the Tunix comparison benchmarks (`tunix_sampler.py`, `tunix_agentic.py`).

Tunix (`google-tunix` 0.1.7) lives in its own virtual environment (`tunix_setup.sh`; its pins would
downgrade this project's packages), so its side runs as a subprocess (`_tunix_worker.py`: the export
mode prints one JSON line; `WorkerSession` keeps one worker alive and asks it for one timed call at a
time, so the benchmarks interleave ours and Tunix call by call) and ours in this interpreter. Both
sides use the SAME weights: the worker builds the Tunix Llama3 model with `create_dummy_model(...,
scale=0.1)`, writes its parameters to an `.npz` (`'/'`-joined Tunix paths), and `tunix_to_crl` turns
them into this project's stacked layout.

Pure helpers here (`bench_shape`, `tunix_to_crl`, `crl_config`, `spread`, `turn_flops`, `blocked_turn_flops`)
import neither
tunix nor the venv and are unit-tested in `tests/unit/test_bench_tunix.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_tunix_worker.py")
DEFAULT_VENV = os.environ.get("TUNIX_VENV", "/work/venvs/tunix")


def bench_shape(vocab_size: int) -> dict:
    """The model shape both sides run: a small Llama-3-like decoder (tied embeddings, GQA 4:2).

    rope_theta is 1e6 because Tunix 0.1.7's Llama3 attention calls `apply_rope` without the config's
    theta (its default is 1e6), so that is the theta its model actually uses.
    """
    return dict(vocab_size=int(vocab_size), embed_dim=256, hidden_dim=768, num_layers=4, num_heads=4,
                num_kv_heads=2, head_dim=64, rope_theta=1_000_000, norm_eps=1e-5)


def crl_config(shape: dict, param_dtype: str = "float32"):
    """Our `TransformerConfig` for a `bench_shape` dict."""
    from crl_jax.models import transformer as tr

    return tr.TransformerConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["embed_dim"], intermediate_size=shape["hidden_dim"],
        num_layers=shape["num_layers"], num_heads=shape["num_heads"], num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], rope_theta=float(shape["rope_theta"]), rms_norm_eps=shape["norm_eps"],
        tie_embeddings=True, max_position_embeddings=4096, param_dtype=param_dtype, family="llama")


def tunix_to_crl(flat: dict, num_layers: int) -> dict:
    """Tunix Llama3 parameters {'/'-joined path: array} -> our pure param dict (stacked layers).

    Tunix: embedder/input_embedding [V, H]; layers/i/attn/q_proj/w [H, Nq, D], k_proj/v_proj [H, Nkv, D],
    o_proj/w [Nq, D, H]; layers/i/mlp/{gate,up,down}_proj/kernel [in, out]; layers/i/input_layernorm/w,
    post_attention_layernorm/w [H]; final_norm/w [H]; lm_head/w [H, V] when untied.
    Ours: embed [V, H]; wq [L, H, Nq*D] (head-major, same GQA grouping q-head = kv*G + g); wk/wv
    [L, H, Nkv*D]; wo [L, Nq*D, H]; w_gate/w_up [L, H, I]; w_down [L, I, H]; attn_norm/mlp_norm [L, H];
    final_norm [H]; lm_head [H, V] when untied.
    """
    def layer(i, name):
        for prefix in (f"layers/{i}/", f"layers/layers/{i}/"):
            if prefix + name in flat:
                return np.asarray(flat[prefix + name])
        raise KeyError(f"tunix_to_crl: no parameter layers/{i}/{name}; have e.g. {sorted(flat)[:6]}")

    def stack(name, fn=lambda a: a):
        return np.stack([fn(layer(i, name)) for i in range(num_layers)])

    flat2 = lambda a: a.reshape(a.shape[0], -1)  # noqa: E731  [H, N, D] -> [H, N*D]
    out = {
        "embed": np.asarray(flat["embedder/input_embedding"]),
        "attn_norm": stack("input_layernorm/w"),
        "wq": stack("attn/q_proj/w", flat2),
        "wk": stack("attn/k_proj/w", flat2),
        "wv": stack("attn/v_proj/w", flat2),
        "wo": stack("attn/o_proj/w", lambda a: a.reshape(-1, a.shape[-1])),  # [Nq, D, H] -> [Nq*D, H]
        "mlp_norm": stack("post_attention_layernorm/w"),
        "w_gate": stack("mlp/gate_proj/kernel"),
        "w_up": stack("mlp/up_proj/kernel"),
        "w_down": stack("mlp/down_proj/kernel"),
        "final_norm": np.asarray(flat["final_norm/w"]),
    }
    if "lm_head/w" in flat:
        out["lm_head"] = np.asarray(flat["lm_head/w"])
    return out


def venv_python(venv: str) -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        raise SystemExit(f"no Tunix venv at {venv}: run `bash experiments/bench/tunix_setup.sh {venv}` first")
    return py


def _worker_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # keep this project's site-packages out of the venv
    env.setdefault("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", ""))
    return env


def run_worker(venv: str, mode: str, args: dict, timeout: float = 3600) -> dict:
    """Run `_tunix_worker.py MODE JSON` in the Tunix venv; return its last stdout line as JSON."""
    p = subprocess.run([venv_python(venv), WORKER, mode, json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout, env=_worker_env(), cwd=HERE)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise RuntimeError(f"tunix worker {mode} failed (rc {p.returncode})")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


class WorkerSession:
    """`_tunix_worker.py serve SETUP` kept alive: `request(**req)` -> the worker's answer to one timed call.

    One worker per benchmark, so Tunix builds and compiles once and the caller can time one call of ours,
    then one of Tunix, in the same minute (the machine is shared). stderr goes to a temporary file, not a
    pipe: JAX / absl warnings could fill an unread pipe and block the worker. A request that takes longer
    than `timeout` seconds kills the worker (and raises), so a hung Tunix call cannot hang the benchmark.

        with WorkerSession(venv, dict(kind="sampler", ...)) as tunix:
            tunix.request(batch=8, seed=1)["seconds"]
    """

    def __init__(self, venv: str, setup: dict, timeout: float = 3600):
        self.venv, self.setup, self.timeout = venv, setup, timeout
        self.proc = self.ready = None

    def __enter__(self):
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([venv_python(self.venv), WORKER, "serve", json.dumps(self.setup)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env=_worker_env(), cwd=HERE)
        self.ready = self._read()
        return self

    def request(self, **req) -> dict:
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._died()
        return self._read()

    def _read(self) -> dict:
        """The next stdout line that starts with "{" (other output is Tunix's, skipped)."""
        timer = threading.Timer(self.timeout, self.proc.kill)
        timer.start()
        try:
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    self._died()
                if line.startswith("{"):
                    return json.loads(line)
        finally:
            timer.cancel()

    def _died(self):
        rc = self.proc.wait()
        self._err.seek(0)
        tail = self._err.read()[-4000:]
        sys.stderr.write(tail)
        raise RuntimeError(f"tunix worker session ({self.setup.get('kind')}) died (rc {rc}); stderr tail above")

    def close(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._err.close()
        self.proc = None

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# Read-outs


def spread(xs) -> tuple[float, float, float]:
    """(min, median, max) of repeated measurements: the shared machine's noise stays visible."""
    xs = [float(x) for x in xs]
    return min(xs), statistics.median(xs), max(xs)


def fmt_spread(xs, fmt: str = ".2f") -> str:
    """'min / median / max' of xs, each with `fmt`."""
    return " / ".join(format(v, fmt) for v in spread(xs))


def loadavg() -> str:
    """The 1-minute load average now (the machine is shared; printed at the start and end of each row)."""
    return f"{os.getloadavg()[0]:.2f}"


def interleave(calls: dict, reps: int, **row) -> dict:
    """Warm every side (compile; first-call seconds kept), then `reps` rounds of one call per side in turn, so
    the calls of one round see about the same load. calls: {name: fn(seed) -> dict with "seconds"}.
    Returns dict(**row, first={name: s}, runs={name: [dict per repeat]}, load=(1-min load at start, at end))."""
    load0 = loadavg()
    first = {name: fn(0)["seconds"] for name, fn in calls.items()}
    runs = {name: [] for name in calls}
    for r in range(reps):
        for name, fn in calls.items():
            runs[name].append(fn(r + 1))
    return dict(row, first=first, runs=runs, load=(load0, loadavg()))


def speedups(row, num: str, den: str) -> list[float]:
    """Per-repeat throughput ratio num / den of an `interleave` row (den's seconds / num's, same round)."""
    return [d["seconds"] / n["seconds"] for n, d in zip(row["runs"][num], row["runs"][den])]


def _block_costs(shape: dict):
    """(q/k/v weights, o weights, MLP weights, attention FLOP fn(queries, keys)) of one decoder block."""
    H, I = shape["embed_dim"], shape["hidden_dim"]
    Nq, Nkv, D = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]

    def att(q, k):  # scores q.k and the weighted sum of values, per query / key pair and head
        return 4 * Nq * D * q * k

    return H * (Nq + 2 * Nkv) * D, Nq * D * H, 3 * H * I, att


def prefix_flops(shape: dict, prefix_len: int) -> float:
    """Matmul FLOPs of encoding one row's `prefix_len`-token prefix (`Transformer.encode_prefix`: all layers)."""
    qkv, o, mlp, att = _block_costs(shape)
    Lp = int(prefix_len)
    return shape["num_layers"] * (2 * Lp * (qkv + o + mlp) + att(Lp, Lp))


def turn_flops(shape: dict, prompt_len: int, side: str, prefix_len: int = 0, turns: int = 1,
               prefix_shared_by: float = 1) -> float:
    """Matmul FLOPs (2 per multiply-add) of one played agentic turn: one action token after a prompt of
    P = prompt_len slots (both sides run the padded P; softmax, norms and RoPE are not counted).

    - "ours" (`Transformer.last_hidden`): layers 0..L-2 over all P rows (scores P x P); the last layer
      projects q/k/v for all P rows but runs attention, o_proj and the MLP for the last row only; the
      unembedding of that one row. With `prefix_len` = Lp > 0 (`play(share_prefix=True)`), the task text's Lp
      rows are encoded once per `prefix_shared_by` episodes (all L layers, counted here as
      1 / (`turns` x `prefix_shared_by`) of it per turn) and every turn runs the other P - Lp rows only, their
      queries attending over all P keys.
    - "tunix" (vanilla `Sampler`, max_generation_steps=1, cache of P + 1 slots): a prefill of all L layers
      over P rows attending over the P + 1 cache slots, the unembedding of all P rows (Llama3 has no
      decode_only_last_token), then ONE decode step (its while loop runs while step < P + 1: a 1-row
      forward of all layers plus unembedding whose token is dropped).
    """
    H, L, V = shape["embed_dim"], shape["num_layers"], shape["vocab_size"]
    P = int(prompt_len)
    qkv, o, mlp, att = _block_costs(shape)

    if side == "ours":
        Lp = int(prefix_len)
        R = P - Lp  # rows run every turn
        per_episode = prefix_flops(shape, Lp)
        return ((L - 1) * (2 * R * (qkv + o + mlp) + att(R, P)) + 2 * R * qkv + 2 * (o + mlp) + att(1, P)
                + 2 * H * V + per_episode / (int(turns) * prefix_shared_by))
    if side == "tunix":
        S = P + 1
        prefill = L * (2 * P * (qkv + o + mlp) + att(P, S)) + 2 * P * H * V
        decode = L * (2 * (qkv + o + mlp) + att(1, S)) + 2 * H * V
        return prefill + decode
    raise ValueError(f"turn_flops: side must be 'ours' or 'tunix', got {side!r}")


def blocked_turn_flops(shape: dict, rest_len, live, rest_width: int, prefix_len: int, block: int, step: int) -> float:
    """Matmul FLOPs of one turn of ours under `rollout.turn_block` (`crl_jax.models.row_blocks`), without the
    prefix encoding (`prefix_flops`): the live rows (rest_len [N] slots after the Lp-token prefix, live [N]),
    longest first, `block` rows at a time (a last partial block is computed whole), each block at the smallest
    of the widths step, 2 step, ..., rest_width that covers its longest row; a row at width w costs
    `turn_flops(shape, prefix_len + w, "ours", prefix_len=prefix_len)` less its prefix share."""
    lens = sorted((int(n) for n, ok in zip(rest_len, live) if ok), reverse=True)
    widths = list(range(int(step), int(rest_width), int(step))) + [int(rest_width)]
    Lp, total = int(prefix_len), 0.0
    for i in range(0, len(lens), int(block)):
        w = next(x for x in widths if x >= lens[i])  # the block's longest row is its first
        total += block * turn_flops(shape, Lp + w, "ours", prefix_len=Lp, prefix_shared_by=float("inf"))
    return total


def load_shared_weights(venv: str, shape: dict, seed: int, path: str, param_dtype: str = "float32"):
    """Export the Tunix dummy model's weights (worker) and load them into our model.

    Returns (graphdef, params, max |logit difference| of the two models on a fixed batch).
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from crl_jax.models import transformer as tr

    info = run_worker(venv, "export", dict(shape=shape, seed=seed, out=path))
    data = np.load(path)
    flat = {k: data[k] for k in data.files if not k.startswith("__")}
    pure = tunix_to_crl(flat, shape["num_layers"])
    cfg = crl_config(shape, param_dtype)
    model = nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0)))
    gd, abstract = tr.split(model)
    pure = {k: jnp.asarray(v, dtype=abstract[k].value.dtype) for k, v in pure.items()}
    nnx.replace_by_pure_dict(abstract, pure)
    params = abstract
    ref_tokens, ref_logits = data["__tokens"], data["__logits"]
    ours = np.asarray(tr.apply(gd, params, jnp.asarray(ref_tokens)))
    diff = float(np.max(np.abs(ours - ref_logits)))
    info["logit_max_abs_diff"] = diff
    return gd, params, info
