"""An LLM actor on host games: the chat rollouts of `crl_jax.backends.llm.rollout.play`, one jitted turn at a time.

The conversation is the LLM path's (`backends.llm.prompt_pieces`: head with the experience block and the goal,
then per turn the observation and the model's own reply); what differs is where the game runs. Each turn:

    [jit]  append the turn's user part to every history, pack head + history, sample up to
           `rollout.max_action_tokens` reply tokens, append the reply (tokens, behaviour log-probs, loss mask)
    [host] decode the replies, read each one's action against the game's current action set
           (`parse_reply`), step the unfinished games, render their next observations to tokens

Actions: MiniHack's fixed compass moves are read by the LLM path's own rule (the host reference of the device
parser); text games (TextWorld, ALFWorld) change their admissible commands from state to state, and the
observation lists them (`Actions: a | b | ...`), so a reply must name one of the current state's commands
(case and surrounding whitespace ignored). A reply naming none is the invalid action -1: the game consumes the
turn and changes nothing else. The chosen command's tokens go into the episode (`LLMEpisodes.move`), so the
extractor's transcript shows it (`prompt_pieces.trajectory`).

Every prompt is packed whole each turn (`rollout.share_prefix` is for episode-long compiled programs).
Determinism: the sampling keys are `fold_in(k_play, t)` as in the compiled rollouts, the host parsing and the
games are deterministic, so a step is a pure function of the `LoopState`.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.host.play import _Clock, Games
from crl_jax.backends.llm.adapters import actor_params
from crl_jax.backends.llm.answer import parse_prefilled_text
from crl_jax.backends.llm.prompt_pieces import actor_head, user_turn
from crl_jax.backends.llm.rollout import LLMEpisodes, _append, _place
from crl_jax.envs.actions import parse_answer_text
from crl_jax.sampling import SamplerConfig, sample_tokens
from crl_jax.text.packing import pack_segments

MOVE_TOKENS = 24  # tokens kept of a played command in the extractor's transcript (ALFWorld's longest: ~12)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def parse_command(text: str, commands, prefill: str) -> int:
    """Index of the admissible command a reply names (-1: none). With a prefill (the prompt ends with
    `<answer>`) the reply's text up to its first `<` (the closing tag) or line end is the command; otherwise,
    or when that names none, the text of the first `<answer>...</answer>`. Case, runs of whitespace and a
    trailing full stop are ignored."""
    cmds = [_norm(c) for c in commands]
    tries = []
    if prefill:
        tries.append(re.split(r"[<\n]", text, maxsplit=1)[0])
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    if m:
        tries.append(m.group(1))
    for t in tries:
        t = _norm(t).rstrip(".")
        if t in cmds:
            return cmds.index(t)
    return -1


def parse_reply(text: str, names, *, fixed: bool, prefill: str) -> int:
    """The action a decoded reply names in the current action set `names` (-1: none)."""
    if fixed:
        return parse_prefilled_text(text, names) if prefill else parse_answer_text(text, names)
    return parse_command(text, names, prefill)


class LLMFns(NamedTuple):
    params: object  # state -> the actor's effective parameters (LoRA adapters applied once per step)
    heads: object  # (exp, exp_len, has_exp, task_tokens, task_len) -> (head [N, H], head_len [N])
    turn: object  # temperature -> jitted turn (see `compiled_llm`)
    rows: object  # (head, head_len, hist, hmask, hlogp, hlen) -> (tokens, length, loss_mask, logp) [N, P]


@functools.lru_cache(maxsize=8)
def compiled_llm(rt) -> LLMFns:
    """The jitted pieces of an LLM turn on host games, built once per Runtime."""
    p, cfg = rt.llm.actor_pieces, rt.cfg
    P, A = p.prompt_len, cfg.rollout.max_action_tokens
    eos, pad = rt.tokenizer.eos_id, rt.tokenizer.pad_id

    def heads(exp, exp_len, has_exp, task_tokens, task_len):
        return jax.vmap(lambda e, el, he, g, gl: actor_head(p, e, el, he, g, gl))(exp, exp_len, has_exp, task_tokens,
                                                                                   task_len)

    def turn_at(temperature):
        scfg = SamplerConfig(max_new_tokens=A, temperature=temperature,
                             stop_tokens=rt.llm.actor_stop_tokens or (eos,), pad_id=pad)

        def turn(params, k_play, t, head, head_len, hist, hmask, hlogp, hlen, stopped, obs, obs_len, live):
            u, ul = jax.vmap(lambda st, o, ol: pack_segments(user_turn(p, t, st, o, ol)))(stopped, obs, obs_len)
            ul = jnp.where(live, ul, 0)
            hist, hlen_u = jax.vmap(_append)(hist, hlen, u, ul)
            prompt, plen = jax.vmap(lambda a, al, b, bl: pack_segments([(a, al), (b, bl)], size=P, pad_id=pad))(
                head, head_len, hist, hlen_u)
            gen, lp, glen = sample_tokens(rt.actor_graphdef, params, prompt, plen, jax.random.fold_in(k_play, t),
                                          scfg, live=live)
            glen = jnp.where(live, glen, 0)
            hist, hlen2 = jax.vmap(_append)(hist, hlen_u, gen, glen)
            hmask, _ = jax.vmap(lambda h, n, gl: _append(h, n, jnp.ones((A,), bool), gl))(hmask, hlen_u, glen)
            hlogp, _ = jax.vmap(_append)(hlogp, hlen_u, lp, glen)
            last = jnp.take_along_axis(gen, jnp.maximum(glen - 1, 0)[:, None], axis=1)[:, 0]
            stopped = jnp.where(live, (glen > 0) & (last == eos), stopped)
            return gen, glen, hist, hmask, hlogp, hlen2, stopped

        return jax.jit(turn)

    def rows(head, head_len, hist, hmask, hlogp, hlen):
        tokens, length = jax.vmap(lambda a, al, b, bl: pack_segments([(a, al), (b, bl)], size=P, pad_id=pad))(
            head, head_len, hist, hlen)
        mask = jax.vmap(lambda m, o: _place(m, o, P, False))(hmask, head_len)
        logp = jax.vmap(lambda x, o: _place(x, o, P, 0.0))(hlogp, head_len)
        return tokens, length, mask, logp

    return LLMFns(params=jax.jit(actor_params), heads=jax.jit(heads), turn=functools.lru_cache(maxsize=None)(turn_at),
                  rows=jax.jit(rows))


def play_llm_host(rt, games: Games, params, k_play, *, temperature: float, task_tokens, task_len, exp, exp_len,
                  has_exp, obs, obs_len, timer=None) -> LLMEpisodes:
    """Play the (already reset) games for up to T turns with the LLM actor; obs/obs_len: first observations."""
    fns, p = compiled_llm(rt), rt.llm.actor_pieces
    turn = fns.turn(float(temperature))
    N, T, H = games.n, rt.num_turns, p.hist_len
    tok, fixed, prefill = rt.tokenizer, rt.env.fixed_actions, p.prefill
    pad = tok.pad_id
    with _Clock(timer, "compiled"):
        head, head_len = fns.heads(exp, exp_len, has_exp, task_tokens, task_len)
    hist, hmask = jnp.full((N, H), pad, jnp.int32), jnp.zeros((N, H), bool)
    hlogp, hlen, stopped = jnp.zeros((N, H), jnp.float32), jnp.zeros((N,), jnp.int32), jnp.zeros((N,), bool)
    Lo = np.asarray(obs).shape[1]
    rec_obs, rec_len = np.zeros((N, T, Lo), np.int32), np.zeros((N, T), np.int32)
    acts, active = np.full((N, T), -1, np.int32), np.zeros((N, T), bool)
    move, move_len = np.full((N, T, MOVE_TOKENS), pad, np.int32), np.zeros((N, T), np.int32)
    for t in range(T):
        if games.done.all():  # the remaining turns stay inactive (nothing played, nothing trained)
            break
        live = ~games.done
        with _Clock(timer, "compiled"):
            gen, glen, hist, hmask, hlogp, hlen, stopped = turn(params, k_play, jnp.int32(t), head, head_len, hist,
                                                                hmask, hlogp, hlen, stopped, jnp.asarray(obs),
                                                                jnp.asarray(obs_len), jnp.asarray(live))
            gen, glen = jax.device_get((gen, glen))
        rec_obs[:, t], rec_len[:, t], active[:, t] = obs, obs_len, live
        for i in np.flatnonzero(live):
            names = games.adapters[i].action_names  # the current state's action set
            a = parse_reply(tok.decode([int(x) for x in gen[i, : glen[i]]]), names, fixed=fixed, prefill=prefill)
            acts[i, t] = a
            if a >= 0 and not fixed:
                ids = list(tok.encode(names[a]))[:MOVE_TOKENS]
                move[i, t, : len(ids)], move_len[i, t] = ids, len(ids)
        with _Clock(timer, "host_env"):
            obs, obs_len, _ = games.step(acts[:, t])
    with _Clock(timer, "compiled"):
        tokens, length, mask, logp = fns.rows(head, head_len, hist, hmask, hlogp, hlen)
    played = active & (acts < 0)
    return LLMEpisodes(tokens=tokens, length=length, loss_mask=mask, logp=logp, obs=jnp.asarray(rec_obs),
                       obs_len=jnp.asarray(rec_len), actions=jnp.asarray(acts), active=jnp.asarray(active),
                       reward=jnp.asarray(games.ret.copy()), success=jnp.asarray(games.succ.copy()),
                       turns=jnp.asarray(active.sum(1).astype(np.int32)),
                       invalid=jnp.asarray(played.sum(1).astype(np.int32)),
                       move=None if fixed else jnp.asarray(move), move_len=None if fixed else jnp.asarray(move_len))
