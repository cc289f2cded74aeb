"""Multi-turn agentic rollouts, episodes/s: our compiled `crl_jax.actor.rollout.play` vs Tunix's agentic engine.

    bash experiments/bench/tunix_setup.sh                      # once: the separate Tunix venv
    python experiments/bench/tunix_agentic.py --quick
    python experiments/bench/tunix_agentic.py --episodes 16,64 --turns 10 --results bench.md \
        --date YYYY-MM-DD --hardware '2-core CPU'

Both sides: the same Llama-3-shaped model and weights (`tunix_common`), our byte tokenizer's ids (bytes,
PAD 256, action tokens `<north>` .. `<west>`), FrozenLake 6x6 non-slippery with the SAME maps (our
env's levels for tasks 0..n-1 are sent to the Tunix side), `turns` = the env's max_steps, the same
prompt text per turn ("current" history: task line, `t=<turn>`, the rendered lake, `Action: `) and one
constrained action token per turn sampled at temperature 1.
- Ours: one jitted `play` — all episodes in lock-step, `lax.scan` over turns, envs vmapped; the task line's
  keys and values encoded once per distinct task text (`share_prefix`; every episode here has the same task line,
  so, with rows in groups of 8 as the loop's `prefix_block` would have them, it is one encoding of up to 8 rows)
  and a forward over the rest of each turn's prompt
  (`--whole-prompt`: the whole prompt every turn, as before the shared prefix). With `--turn-block B` (default 8, as
  `rollout.turn_block`) that forward runs over the unfinished episodes only, B at a time, each block only as
  wide as its longest prompt (multiples of 16 slots; `crl_jax.models.row_blocks`); `--turn-block 0`: every
  episode at the packed width P every turn, finished ones masked (the old path).
- Tunix: `TrajectoryCollectEngine.collect_multiple` (what its agentic learner runs per group) over
  (agent, env) pairs, asyncio + a thread pool, one vanilla-Sampler call (batch 1, prompt padded to
  the same P, all non-action tokens forbidden) per episode per turn; an episode stops when done.

Timing is interleaved (the machine is shared): per episode count both sides are warmed (first call incl.
compile, reported), then each repeat times one `play` of ours and one `collect_multiple` of Tunix (a
persistent worker, `tunix_common.WorkerSession`); the ratio is taken per repeat and reported as min /
median / max, with the 1-minute load average at the start and end of each row.

Efficiency read-out (why the ratio is what it is): the matmul FLOPs each side computed are counted
analytically (`tunix_common.turn_flops`: ours runs the last layer for the last prompt row only; Tunix
unembeds every prompt row at the padded P, runs one extra decode step per call, and stops an episode when
done; ours under `--turn-block` is counted call by call from the returned episodes with the library's own
ordering and widths, `tunix_common.blocked_turn_flops`), and this machine's float32 matmul rate is measured once in the
same run (`matmul_gflops`). ep/s ratio ~= (FLOPs per episode, Tunix / ours) x (achieved GFLOP/s, ours /
Tunix): the first factor is work one side skips, the second how well each side keeps the cores busy.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import tunix_common as tc  # noqa: E402

from crl_jax import envs  # noqa: E402
from crl_jax.actor.rollout import TURN_WIDTH_STEP, Segments, play  # noqa: E402
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


def ours_fn(gd, env, tok, renderer, a_ids, seg, n, turns, share_prefix=True, turn_block=0):
    """Our jitted `play` of n episodes (tasks 0..n-1) -> fn(params, key) -> Episodes. `share_prefix`: the task
    line is encoded once per distinct text (`rollout.share_prefix`); False: every turn runs the whole prompt.
    `turn_block` (`rollout.turn_block`): > 0 runs each turn over the unfinished episodes only, this many at a time,
    each block only as wide as its longest prompt; 0: every episode at the packed width."""
    task_text = env.task_text + "\n"
    ttok, tlen = _rows(tok, [task_text] * n)
    return jax.jit(lambda params, key: play(
        gd, params, env, renderer, seg, a_ids, key, tasks=jnp.arange(n, dtype=jnp.int32), task_tokens=ttok,
        task_len=tlen, exp=jnp.zeros((n, 1), jnp.int32), exp_len=jnp.zeros((n,), jnp.int32),
        has_exp=jnp.zeros((n,), bool), num_turns=turns, temperature=1.0, share_prefix=share_prefix,
        prefix_block=max(1, n // 8), turn_block=turn_block))


def ours_flops(ep, shape, *, prompt_width, prefix_len, prefix_rows, turn_block, width_step=TURN_WIDTH_STEP) -> float:
    """Matmul FLOPs one `play` computed (read off its Episodes): the prefix encodings (`prefix_rows` rows of
    `prefix_len` tokens), then without `turn_block` every episode's every turn at the packed `prompt_width`;
    with it, each turn's live blocks (`blocked_turn_flops`: the library's ordering, and its widths at
    `width_step`)."""
    n, turns = ep.active.shape
    Lp = prefix_len
    head = prefix_rows * tc.prefix_flops(shape, Lp)
    if not turn_block:
        return head + n * turns * tc.turn_flops(shape, prompt_width, "ours", prefix_len=Lp,
                                                prefix_shared_by=float("inf"))
    rest, active = np.asarray(ep.prompt_len) - Lp, np.asarray(ep.active)
    return head + sum(tc.blocked_turn_flops(shape, rest[:, t], active[:, t], prompt_width - Lp, Lp,
                                            min(turn_block, n), width_step) for t in range(turns))


def ours_call(fn, pa, count, seed) -> dict:
    """One timed `play`; turns = played turns; flop = what the call computed (`count(episodes)`)."""
    t0 = time.perf_counter()
    ep = jax.block_until_ready(fn(pa, jax.random.key(seed)))
    dt = time.perf_counter() - t0
    played = np.asarray(ep.turns)
    return dict(seconds=dt, turns=int(played.sum()), flop=count(ep), mean_turns=float(played.mean()),
                success=float(np.asarray(ep.success).mean()))


def tunix_call(tunix, n, turn_flop, seed) -> dict:
    out = tunix.request(episodes=n, seed=seed)
    return dict(out, flop=out["turns"] * turn_flop)  # Tunix computes exactly the played turns


def matmul_gflops(n: int = 2048, calls: int = 5) -> float:
    """This machine's float32 matmul rate now (GFLOP/s): a jitted [n x n] @ [n x n], median of `calls` calls
    after a warm one. The ceiling that both sides' achieved GFLOP/s are read against."""
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    jax.block_until_ready(f(x, x))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x, x))
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def row_stats(row) -> dict:
    """Per-row read-outs: median ep/s, turns/s, achieved GFLOP/s per side; per-repeat ours / Tunix ratios."""
    n, st = row["episodes"], {}
    for name, runs in row["runs"].items():
        sec = np.array([r["seconds"] for r in runs])
        played, flop = np.array([r["turns"] for r in runs]), np.array([r["flop"] for r in runs], np.float64)
        st[name] = dict(ep_s=float(np.median(n / sec)), turns_s=float(np.median(played / sec)),
                        gflop_s=float(np.median(flop / sec / 1e9)),
                        mean_turns=statistics.mean(r["mean_turns"] for r in runs),
                        success=statistics.mean(r["success"] for r in runs),
                        flop_ep=float(flop.mean()) / n)
    st["ratios"] = tc.speedups(row, "ours", "tunix")
    return st


def table(rows, peak, turns, P) -> str:
    out = ["| episodes | turns (max) | P | ours ep/s | Tunix ep/s | ours / Tunix (min / med / max) | ours turns/s | "
           "Tunix turns/s | mean turns ours / Tunix | success ours / Tunix | GFLOP/s ours / Tunix | "
           "of matmul rate ours / Tunix | load 1 min start / end |", "|" + "---|" * 13]
    for row in rows:
        st = row_stats(row)
        o, t = st["ours"], st["tunix"]
        out.append(f"| {row['episodes']} | {turns} | {P} | {o['ep_s']:,.1f} | {t['ep_s']:,.2f} | "
                   f"x{tc.fmt_spread(st['ratios'], '.1f')} | {o['turns_s']:,.0f} | {t['turns_s']:,.1f} | "
                   f"{o['mean_turns']:.1f} / {t['mean_turns']:.1f} | {o['success']:.2f} / {t['success']:.2f} | "
                   f"{o['gflop_s']:.1f} / {t['gflop_s']:.1f} | {100 * o['gflop_s'] / peak:.0f}% / "
                   f"{100 * t['gflop_s'] / peak:.0f}% | {row['load'][0]} / {row['load'][1]} |")
    return "\n".join(out)


def explain(row) -> str:
    """One line: the median ratio next to its two factors (work per episode, achieved GFLOP/s)."""
    st = row_stats(row)
    o, t = st["ours"], st["tunix"]
    return (f"{row['episodes']} ep: ours / Tunix x{statistics.median(st['ratios']):.1f} ~= FLOP per episode "
            f"Tunix / ours x{t['flop_ep'] / o['flop_ep']:.2f} ({t['flop_ep'] / 1e6:.1f} / {o['flop_ep'] / 1e6:.1f} M)"
            f" * achieved GFLOP/s ours / Tunix x{o['gflop_s'] / t['gflop_s']:.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=tc.DEFAULT_VENV)
    ap.add_argument("--episodes", default="16,64")
    ap.add_argument("--turns", type=int, default=10, help="env max_steps = turns per episode")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats per row (min / median / max)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="8 episodes, 5 turns, 3 reps")
    ap.add_argument("--whole-prompt", action="store_true",
                    help="ours without the shared prefix (every turn runs the whole prompt: the path before the shared prefix)")
    ap.add_argument("--turn-block", type=int, default=8,
                    help="ours: `rollout.turn_block` (each turn over the unfinished episodes only, this many at a "
                         "time, each block as wide as its longest prompt); 0: every episode at the packed width")
    ap.add_argument("--results", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--hardware", default="")
    a = ap.parse_args(argv)
    if a.quick:
        a.episodes, a.turns, a.reps = "8", 5, 3
    counts = [int(x) for x in a.episodes.split(",")]
    env, tok, renderer, a_ids, seg = setup(a.turns)
    shape = tc.bench_shape(tok.vocab_size)
    with tempfile.TemporaryDirectory() as d:
        gd, pa, info = tc.load_shared_weights(a.venv, shape, a.seed, os.path.join(d, "w.npz"))
    print(f"model {shape}, {info['num_params'] / 1e6:.2f}M params; same weights: max |logit diff| = "
          f"{info['logit_max_abs_diff']:.2e}; jax {jax.__version__} {jax.devices()}", flush=True)
    share = not a.whole_prompt
    fns = {n: ours_fn(gd, env, tok, renderer, a_ids, seg, n, a.turns, share, a.turn_block) for n in counts}
    P = int(jax.eval_shape(fns[counts[0]], pa, jax.random.key(0)).prompts.shape[2])  # the packed prompt width
    Lp = len(tok.encode(env.task_text + "\n")) if share else 0  # the task line: every episode has the same one,
    # so `encode_unique_prefixes` runs one block of prefix_block = n // 8 rows
    holes = np.asarray(jax.vmap(env.task_level)(jnp.arange(max(counts), dtype=jnp.int32)).holes)
    msgs = dict(start=env.env_messages[0], blocked=env.env_messages[1], hole=env.env_messages[2],
                goal=env.env_messages[3], invalid="That is not a valid action.")
    assert msgs["invalid"] in env.messages, env.messages
    tunix_turn = tc.turn_flops(shape, P, "tunix")
    ours_turn = tc.turn_flops(shape, P, "ours", prefix_len=Lp, prefix_shared_by=float("inf"))
    peak = matmul_gflops()
    rate = (f"float32 matmul rate (jitted 2048^3, median of 5): {peak:.1f} GFLOP/s; matmul FLOP per turn at P={P}: "
            f"Tunix {tunix_turn / 1e6:.2f} M (per played turn); ours at the packed width {ours_turn / 1e6:.2f} M"
            + (f" after the {Lp}-token task line ({tc.prefix_flops(shape, Lp) / 1e6:.2f} M per encoded row, n // 8 "
               "rows per call)" if Lp else " (whole prompt every turn)")
            + (f"; turn_block {a.turn_block}: only unfinished episodes, each block at the smallest multiple of "
               f"{TURN_WIDTH_STEP} slots covering its longest prompt, counted call by call from the episodes"
               if a.turn_block else "; every episode x every turn (finished ones masked)"))
    print(rate, flush=True)
    worker_setup = dict(kind="agentic", shape=shape, seed=a.seed, max_steps=a.turns, prompt_len=P,
                        holes=holes.reshape(len(holes), -1).astype(int).tolist(), messages=msgs,
                        action_names=list(env.action_names), extras=list(tok.extra_tokens),
                        action_ids=[int(i) for i in a_ids], task_text=env.task_text + "\n")
    rows = []
    with tc.WorkerSession(a.venv, worker_setup) as tunix:
        for n in counts:
            count = partial(ours_flops, shape=shape, prompt_width=P, prefix_len=Lp, prefix_rows=max(1, n // 8) if Lp
                            else 0, turn_block=a.turn_block)
            calls = {"ours": partial(ours_call, fns[n], pa, count), "tunix": partial(tunix_call, tunix, n, tunix_turn)}
            rows.append(tc.interleave(calls, a.reps, episodes=n))
            print(f"{n} ep: load {rows[-1]['load'][0]} -> {rows[-1]['load'][1]}", flush=True)
    tab = table(rows, peak, a.turns, P)
    print(tab)
    why = "\n".join(explain(row) for row in rows)
    print(why)
    comp = ", ".join(f"{o['episodes']} ep: {o['first']['ours']:.1f} / {o['first']['tunix']:.1f}" for o in rows)
    print(f"first call incl. compile, ours / Tunix (s): {comp}")
    if a.results:
        cmd = "python experiments/bench/tunix_agentic.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(a.results, "a") as f:
            f.write(f"\n### Agentic FrozenLake rollouts vs Tunix 0.1.7 ({a.date}, "
                    f"{a.hardware or platform.processor()}, jax {jax.__version__})\n\n`{cmd}`\n\nModel: "
                    f"Llama-3 shape {shape}, {info['num_params'] / 1e6:.2f}M params, float32, weights shared "
                    f"(max |logit diff| {info['logit_max_abs_diff']:.1e}); {a.reps} interleaved repeats per row.\n\n"
                    f"{tab}\n\n{rate}.\n\n{why}\n\nFirst call incl. compile, ours / Tunix (s): {comp}\n")


if __name__ == "__main__":
    main()
