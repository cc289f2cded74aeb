"""Multi-turn agentic rollouts, episodes/s: our compiled `crl_jax.actor.rollout.play` vs Tunix's agentic engine.

    bash experiments/bench/tunix_setup.sh                      # once: the separate Tunix venv
    python experiments/bench/tunix_agentic.py --quick
    python experiments/bench/tunix_agentic.py --episodes 16,64 --turns 10 --results experiments/bench/RESULTS.md \
        --date 2026-12-01 --hardware '2-core CPU'

Both sides: the same Llama-3-shaped model and weights (`tunix_common`), our byte tokenizer's ids (bytes,
PAD 256, action tokens `<north>` .. `<west>`), FrozenLake 6x6 non-slippery with the SAME maps (our
env's levels for tasks 0..n-1 are sent to the Tunix side), `turns` = the env's max_steps, the same
prompt text per turn ("current" history: task line, `t=<turn>`, the rendered lake, `Action: `) and one
constrained action token per turn sampled at temperature 1.
- Ours: one jitted `play` — all episodes in lock-step, `lax.scan` over turns, envs vmapped, a full
  forward over each turn's packed prompt. Finished episodes keep running (masked) until `turns`.
- Tunix: `TrajectoryCollectEngine.collect_multiple` (what its agentic learner runs per group) over
  (agent, env) pairs, asyncio + a thread pool, one vanilla-Sampler call (batch 1, prompt padded to
  the same P, all non-action tokens forbidden) per episode per turn; an episode stops when done.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_common as tc  # noqa: E402

from crl_jax import envs  # noqa: E402
from crl_jax.actor.rollout import Segments, play  # noqa: E402
from crl_jax.envs.actions import action_token_ids, tiny_tokenizer  # noqa: E402
from crl_jax.envs.render import make_token_renderer  # noqa: E402

EXTRAS = ("<ADD>", "<UPDATE>", "<RETURN>")


def _rows(tok, texts, width=None):
    enc = [tok.encode(t) for t in texts]
    w = width or max(1, max(len(e) for e in enc))
    out = np.zeros((len(enc), w), np.int32)
    for i, e in enumerate(enc):
        out[i, :len(e)] = e
    return jnp.asarray(out), jnp.asarray([len(e) for e in enc], jnp.int32)


def setup(turns: int):
    env = envs.make("frozen_lake", legend=False, max_steps=turns)
    tok = tiny_tokenizer(env.action_names, extra=EXTRAS)
    renderer = make_token_renderer(env, tok)
    a_ids = jnp.asarray(action_token_ids(env, tok), jnp.int32)
    turn, turn_len = _rows(tok, [f"t={t}\n" for t in range(turns)])
    one = lambda s: tuple(x[0] for x in _rows(tok, [s]))  # noqa: E731
    seg = Segments(*one("Tip: "), *one("\n"), turn, turn_len, *one("Action: "))
    return env, tok, renderer, a_ids, seg


def bench_ours(gd, pa, env, tok, renderer, a_ids, seg, n, turns, reps):
    task_text = env.task_text + "\n"
    ttok, tlen = _rows(tok, [task_text] * n)
    fn = jax.jit(lambda params, key: play(
        gd, params, env, renderer, seg, a_ids, key, tasks=jnp.arange(n, dtype=jnp.int32), task_tokens=ttok,
        task_len=tlen, exp=jnp.zeros((n, 1), jnp.int32), exp_len=jnp.zeros((n,), jnp.int32),
        has_exp=jnp.zeros((n,), bool), num_turns=turns, temperature=1.0))
    t0 = time.perf_counter()
    ep = jax.block_until_ready(fn(pa, jax.random.key(0)))
    first = time.perf_counter() - t0
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        ep = jax.block_until_ready(fn(pa, jax.random.key(r + 1)))
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    turns_played = np.asarray(ep.turns)
    return dict(episodes=n, seconds=t, episodes_s=n / t, turns_s=float(turns_played.sum()) / t,
                mean_turns=float(turns_played.mean()), success=float(np.asarray(ep.success).mean()),
                first_s=first, prompt_len=int(ep.prompts.shape[2]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=tc.DEFAULT_VENV)
    ap.add_argument("--episodes", default="16,64")
    ap.add_argument("--turns", type=int, default=10, help="env max_steps = turns per episode")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="8 episodes, 5 turns, 1 rep")
    ap.add_argument("--results", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--hardware", default="")
    a = ap.parse_args(argv)
    if a.quick:
        a.episodes, a.turns, a.reps = "8", 5, 1
    counts = [int(x) for x in a.episodes.split(",")]
    env, tok, renderer, a_ids, seg = setup(a.turns)
    shape = tc.bench_shape(tok.vocab_size)
    with tempfile.TemporaryDirectory() as d:
        gd, pa, info = tc.load_shared_weights(a.venv, shape, a.seed, os.path.join(d, "w.npz"))
    print(f"model {shape}, {info['num_params'] / 1e6:.2f}M params; same weights: max |logit diff| = "
          f"{info['logit_max_abs_diff']:.2e}; jax {jax.__version__} {jax.devices()}", flush=True)
    ours = [bench_ours(gd, pa, env, tok, renderer, a_ids, seg, n, a.turns, a.reps) for n in counts]
    P = ours[0]["prompt_len"]
    holes = np.asarray(jax.vmap(env.task_level)(jnp.arange(max(counts), dtype=jnp.int32)).holes)
    msgs = dict(start=env.env_messages[0], blocked=env.env_messages[1], hole=env.env_messages[2],
                goal=env.env_messages[3], invalid="That is not a valid action.")
    assert msgs["invalid"] in env.messages, env.messages
    theirs = tc.run_worker(a.venv, "agentic", dict(
        shape=shape, seed=a.seed, episodes=counts, reps=a.reps, max_steps=a.turns, prompt_len=P,
        holes=holes.reshape(len(holes), -1).astype(int).tolist(), messages=msgs, action_names=list(env.action_names),
        extras=list(tok.extra_tokens), action_ids=[int(i) for i in a_ids], task_text=env.task_text + "\n"))["rows"]
    out = ["| episodes | turns (max) | P | ours ep/s | Tunix ep/s | ours / Tunix | ours turns/s | Tunix turns/s | "
           "mean turns ours / Tunix | success ours / Tunix |", "|" + "---|" * 10]
    for o, t in zip(ours, theirs):
        out.append(f"| {o['episodes']} | {a.turns} | {P} | {o['episodes_s']:,.1f} | {t['episodes_s']:,.2f} | "
                   f"x{o['episodes_s'] / t['episodes_s']:.1f} | {o['turns_s']:,.0f} | {t['turns_s']:,.1f} | "
                   f"{o['mean_turns']:.1f} / {t['mean_turns']:.1f} | {o['success']:.2f} / {t['success']:.2f} |")
    tab = "\n".join(out)
    print(tab)
    comp = ", ".join(f"{o['episodes']} ep: {o['first_s']:.1f}" for o in ours)
    print(f"our first call incl. compile (s): {comp}")
    if a.results:
        cmd = "python experiments/bench/tunix_agentic.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(a.results, "a") as f:
            f.write(f"\n### Agentic FrozenLake rollouts vs Tunix 0.1.7 ({a.date}, "
                    f"{a.hardware or platform.processor()}, jax {jax.__version__})\n\n`{cmd}`\n\nModel: "
                    f"Llama-3 shape {shape}, {info['num_params'] / 1e6:.2f}M params, float32, weights shared "
                    f"(max |logit diff| {info['logit_max_abs_diff']:.1e}).\n\n{tab}\n\nOur first call incl. "
                    f"compile (s): {comp}\n")


if __name__ == "__main__":
    main()
