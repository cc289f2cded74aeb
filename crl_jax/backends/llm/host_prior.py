"""The format prior's synthetic rows on host environments (TextWorld, ALFWorld-PDDL, real MiniHack).

The built-in grids' prior (`crl_jax.backends.llm.format_prior`) renders random boards; a host game has no board
to draw at random, and a text game's moves are its state's admissible commands, not a fixed table. Here the
rows are built from states of the environment itself, under the same rule (formats only, never a task's
answer):

- states: `format_prior.host_states` observation texts with their admissible commands (MiniHack: its fixed
  compass moves), visited by playing **uniformly random** commands from the start of the training pool's games
  (`WALK` per game, games in turn, seeds from `format_prior.seed`). No walkthrough, planner or reward is read;
  the evaluation pool is never opened;
- actor rows: the loop's head (half with a random lesson as experience) and first turn on one of those
  states; target = one of **that state's** commands drawn uniformly, in the answer format. Every listed
  command is as likely as any other: the rows teach "answer with one command of the list", not which one;
- extractor rows: a distillation prompt of 1..2 turns on random states with a random command each and a
  random outcome; target = the grid prior's: one `add` of random lesson words or a `return`
  (`prior_rows.op_reply`).

The states are collected once per Runtime on the host (a few resets and steps); the rows are then a pure
function of the key, as the grid prior's.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.backends.llm.prior_rows import MAX_PRIOR_TURNS, actor_row, answer_affixes, distill_budget, op_reply, \
    reply_width, teacher_forced
from crl_jax.backends.llm.prompt_pieces import distill_prompt

HOST_PRIOR_VERSION = 1  # bump when the host rows change: old caches then miss
WALK = 3  # random commands played from each game's start: states 0..WALK of every game are collected


def is_host(rt) -> bool:
    """True when the Runtime's games run on the host (`crl_jax.backends.host.env.HostEnv`)."""
    return bool(getattr(rt.env, "is_host", False))


def collect_states(env, num_states: int, seed: int) -> list[tuple[str, tuple]]:
    """`num_states` (observation text, admissible commands) of the train pool `env`'s games: game g is task
    g mod num_tasks reset with seed `seed + g`, then up to `WALK` uniformly random commands (a numpy generator
    seeded by `seed`); a state without commands is skipped."""
    rng = np.random.default_rng(seed)
    game, out, g = env.make(), [], 0
    try:
        while len(out) < num_states:
            state, text = game.reset(seed + g, g % env.num_tasks)
            for _ in range(WALK + 1):
                cmds = tuple(game.action_names)
                if not cmds:
                    break
                out.append((text, cmds))
                if len(out) == num_states:
                    break
                state, text, _, done, _ = game.step(state, int(rng.integers(len(cmds))))
                if done:
                    break
            g += 1
    finally:
        close = getattr(game, "close", None)
        if close is not None:
            close()
    return out


@dataclass(frozen=True, eq=False)
class HostSamples:
    """The collected states as token tables (numpy, the actor's tokens)."""

    obs: np.ndarray  # [M, Lo] int32: each state's observation as the run renders it
    obs_len: np.ndarray  # [M]
    replies: np.ndarray  # [M, C, Wr]: each of the state's commands as a whole actor reply (answer format)
    reply_len: np.ndarray  # [M, C]
    moves: np.ndarray  # [M, C, Wm]: each command's own tokens (the distillation transcript's move)
    move_len: np.ndarray  # [M, C]
    index: np.ndarray  # [M, C]: each command's index in the state's action set (the played action)
    count: np.ndarray  # [M]: commands of the state (>= 1)


def _table(rows: list[list[list[int]]], pad: int):
    """Ragged token lists [M][C_i][L] -> (tokens [M, C, W], lengths [M, C]) padded with `pad`."""
    C = max(len(r) for r in rows)
    W = max(1, max(len(ids) for r in rows for ids in r))
    tokens, lengths = np.full((len(rows), C, W), pad, np.int32), np.zeros((len(rows), C), np.int32)
    for i, r in enumerate(rows):
        for j, ids in enumerate(r):
            tokens[i, j, : len(ids)], lengths[i, j] = ids, len(ids)
    return tokens, lengths


def build_samples(rt) -> HostSamples:
    """The Runtime's `HostSamples`: states from `collect_states`, commands whose reply does not fit
    `rollout.max_action_tokens` left out (the actor could not write them whole), states left without
    commands dropped."""
    fp, tok, p = rt.cfg.format_prior, rt.tokenizer, rt.llm.actor_pieces
    open_, close = answer_affixes(rt, tok)
    kept = []
    for text, cmds in collect_states(rt.env, fp.host_states, fp.seed):
        pairs = [(list(tok.encode(open_ + c + close)), list(tok.encode(c)), j) for j, c in enumerate(cmds)]
        pairs = [pr for pr in pairs if len(pr[0]) <= p.action_cap]
        if pairs:
            kept.append((text, pairs))
    if not kept:
        raise ValueError(f"format_prior: no command of {rt.cfg.env.name!r}'s states fits rollout.max_action_tokens="
                         f"{p.action_cap} tokens as a reply; raise it")
    obs, obs_len = rt.renderer.batch([t for t, _ in kept])
    replies, reply_len = _table([[r for r, _, _ in pairs] for _, pairs in kept], tok.pad_id)
    moves, move_len = _table([[m for _, m, _ in pairs] for _, pairs in kept], tok.pad_id)
    index = _table([[[j] for _, _, j in pairs] for _, pairs in kept], 0)[0][..., 0]
    return HostSamples(obs=obs, obs_len=obs_len, replies=replies, reply_len=reply_len, moves=moves,
                       move_len=move_len, index=index, count=np.array([len(pairs) for _, pairs in kept], np.int32))


_SAMPLES: dict[int, tuple] = {}


def host_samples(rt) -> HostSamples:
    """`build_samples(rt)`, built once per Runtime (the games are played on the host)."""
    if id(rt) not in _SAMPLES or _SAMPLES[id(rt)][0] is not rt:
        _SAMPLES[id(rt)] = (rt, build_samples(rt))
    return _SAMPLES[id(rt)][1]


def _tasks(rt):
    return (jnp.concatenate([rt.train_task_tokens, rt.eval_task_tokens]),
            jnp.concatenate([rt.train_task_len, rt.eval_task_len]))


def actor_rows(rt, key, n: int):
    """`n` one-turn actor rows on collected states; target = one of the state's commands, uniformly
    -> (tokens [n, W], mask [n, W])."""
    s = host_samples(rt)
    tt, tl = _tasks(rt)
    obs, obs_len, rep, rep_len, count = (jnp.asarray(x) for x in (s.obs, s.obs_len, s.replies, s.reply_len, s.count))

    def one(k):
        ks = jax.random.split(k, 5)
        i = jax.random.randint(ks[3], (), 0, obs.shape[0])
        c = jax.random.randint(ks[4], (), 0, count[i])
        return actor_row(rt, ks, tt, tl, obs[i], obs_len[i], rep[i, c], rep_len[i, c])

    return jax.vmap(one)(jax.random.split(key, n))


def extractor_rows(rt, key, n: int):
    """`n` distillation rows: 1..2 turns on random collected states, a random command of each, random outcome,
    no retrieved entry; target = `prior_rows.op_reply` -> (tokens [n, W], mask [n, W])."""
    dp, s = rt.llm.distill_pieces, host_samples(rt)
    T, budget, fixed = dp.num_turns, distill_budget(rt), rt.env.fixed_actions
    tt, tl = _tasks(rt)
    obs, obs_len, mv, mv_len, index, count = (jnp.asarray(x) for x in (s.obs, s.obs_len, s.moves, s.move_len,
                                                                         s.index, s.count))
    seg = rt.llm.extractor_segment  # the actor's goal, observations and commands in the extractor's tokens

    def one(k):
        ks = jax.random.split(k, 7)
        task = jax.random.randint(ks[0], (), 0, tt.shape[0])
        i = jax.random.randint(ks[1], (T,), 0, obs.shape[0])
        turns = jax.random.randint(ks[2], (), 1, min(MAX_PRIOR_TURNS, T) + 1)
        c = jax.random.randint(ks[3], (T,), 0, count[i])
        acts = index[i, c]  # MiniHack: the move's index in its fixed names
        (goal, goal_len), (o, ol) = seg(tt[task], tl[task]), jax.vmap(seg)(obs[i], obs_len[i])
        move = move_len = None
        if not fixed:  # text games: the transcript shows the command itself
            move, move_len = jax.vmap(seg)(mv[i, c], mv_len[i, c])
        prompt, plen = distill_prompt(dp, budget, goal, goal_len, o, ol, acts, jnp.arange(T) < turns,
                                      jax.random.uniform(ks[4]) < 0.5, jnp.zeros((rt.cfg.bank.entry_len,), jnp.int32),
                                      jnp.int32(0), jnp.bool_(False), rt.extractor_tokenizer.pad_id, move, move_len)
        reply, rlen = op_reply(rt, ks[5], ks[6])
        return teacher_forced(prompt, plen, reply, rlen, budget + reply_width(rt))

    return jax.vmap(one)(jax.random.split(key, n))
