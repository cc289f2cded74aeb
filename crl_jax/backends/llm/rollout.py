"""Multi-turn episodes of an LLM actor with the whole conversation in context, fully compiled.

`play(rt, params, key, ...)` plays N episodes in lock-step for T turns (`lax.scan` over turns, envs
vmapped). Each turn the actor's prompt is head + history (see `crl_jax.backends.llm.prompt_pieces`), packed into
a static [N, P] buffer; the sampler generates up to `rollout.max_action_tokens` tokens (stopping at the
end-of-turn token, or with a prefilled `<answer>` after its `</answer>`); the move is parsed on device
(`crl_jax.backends.llm.answer`: `<answer>NAME</answer>`, or a bare first move after the prefill); a reply with
no valid move is the invalid action -1, which consumes the turn and leaves the env unchanged. The
reply tokens, their behaviour log-probs and a loss mask are appended to the history, so the final
history *is* the training row: every reply is trained in the context it was generated in.

With `rollout.share_prefix` (on in the LLM configs) the prompt is not re-packed and re-prefilled each turn: one KV
cache per episode is carried through the scan (the head encoded once per distinct head, then each turn's user
part and reply written after what came before), and it plays what the packed prompt plays.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.backends.llm.prompt_pieces import actor_head, user_turn
from crl_jax.models import transformer as tr
from crl_jax.models.shared_prefix import encode_unique_prefixes
from crl_jax.sampling import SamplerConfig, continue_tokens, sample_tokens
from crl_jax.text.packing import pack_segments


class LLMEpisodes(NamedTuple):
    tokens: jax.Array  # [N, P] int32 training row: head + every turn + every reply (right-padded)
    length: jax.Array  # [N] int32
    loss_mask: jax.Array  # [N, P] bool: reply tokens
    logp: jax.Array  # [N, P] float32 behaviour log-probs of the reply tokens (0 elsewhere)
    obs: jax.Array  # [N, T, Lo] int32 observation of each turn
    obs_len: jax.Array  # [N, T]
    actions: jax.Array  # [N, T] int32 env action (-1: no valid answer)
    active: jax.Array  # [N, T] bool: the turn was played
    reward: jax.Array  # [N] float32
    success: jax.Array  # [N] bool
    turns: jax.Array  # [N] int32
    invalid: jax.Array  # [N] int32 played turns without a valid move
    # host text games (`crl_jax.host.llm_play`): each turn's command as tokens [N, T, Wm] and lengths
    # [N, T] (their commands change per state: `actions` index the state's own list); None: fixed action names
    move: jax.Array | None = None
    move_len: jax.Array | None = None


def _place(x, offset, size: int, fill):
    """x [H] written at offset.. of a [size] buffer filled with `fill` (overflow dropped)."""
    out = jnp.full((size,), fill, x.dtype)
    return out.at[offset + jnp.arange(x.shape[0])].set(x, mode="drop")


def _append(buf, n, x, xn):
    """Append x[:xn] to buf[:n] (all [H]-shaped; x shorter) -> (buf, n + xn)."""
    i = jnp.arange(x.shape[0])
    pos = jnp.where(i < xn, n + i, buf.shape[0])
    return buf.at[pos].set(x, mode="drop"), n + xn


def play(rt, params, key, *, env, renderer, tasks, task_tokens, task_len, exp, exp_len, has_exp,
         temperature: float, reset_keys=None, prefix_block: int | None = None) -> LLMEpisodes:
    """Play N episodes. tasks [N], task_tokens [N, Lt], exp [N, Le], has_exp [N]. `prefix_block`: with
    `rollout.share_prefix`, each distinct head is encoded once, this many heads per encoding (default N)."""
    chex.assert_rank([tasks, task_tokens, exp, has_exp], [1, 2, 2, 1])
    cfg = rt.cfg
    p = rt.llm.actor_pieces
    N, T = tasks.shape[0], rt.num_turns
    P, H, A = p.prompt_len, p.hist_len, cfg.rollout.max_action_tokens
    eos = rt.tokenizer.eos_id
    pad = rt.tokenizer.pad_id
    scfg = SamplerConfig(max_new_tokens=A, temperature=temperature, stop_tokens=rt.llm.actor_stop_tokens or (eos,),
                         pad_id=pad)
    reset_keys = episode_reset_keys(key, N) if reset_keys is None else reset_keys
    k_play = jax.random.fold_in(key, 1)
    states, _ = jax.vmap(env.reset)(reset_keys, tasks)
    head, head_len = jax.vmap(lambda e, el, he, g, gl: actor_head(p, e, el, he, g, gl))(
        exp, exp_len, has_exp, task_tokens, task_len)
    # rollout.share_prefix: the conversation's keys and values are carried from turn to turn (every turn's prompt
    # starts with the last turn's prompt and reply), so each token of an episode is encoded once: the head when
    # the episode starts, then per turn only the new user part and the reply. Turn t owns the cache slots
    # head_cap + t * (U + A) ..: its user part (U slots, left-aligned) and its reply (A slots); unused ones are
    # masked and positions count only real tokens, so it plays what the packed whole-prompt path plays.
    carried = cfg.rollout.share_prefix
    user_part = lambda t, st, o, ol: pack_segments(user_turn(p, t, st, o, ol))  # noqa: E731
    if carried:
        one = jax.tree_util.tree_map(lambda x: x[0], states)
        U = jax.eval_shape(lambda s: user_part(0, False, *renderer(s)), one)[0].shape[0]
        model = tr.merge(rt.actor_graphdef, params)
        pk = encode_unique_prefixes(model, head, head_len, prefix_block or N)  # a group's equal heads: one encoding
        cache = tr.init_cache(model.cfg, N, p.head_cap + T * (U + A), prefix=pk)
    else:
        U, cache = 0, None

    def turn_fn(carry, t):
        states, done, ret, succ, hist, hmask, hlogp, hlen, stopped, cache = carry
        active = ~done
        obs, obs_len = jax.vmap(renderer)(states)
        u, ul = jax.vmap(lambda st, o, ol: user_part(t, st, o, ol))(stopped, obs, obs_len)
        ul = jnp.where(active, ul, 0)
        hist, hlen_u = jax.vmap(lambda h, n, x, xn: _append(h, n, x, xn))(hist, hlen, u, ul)
        k_t = jax.random.fold_in(k_play, t)
        # Finished episodes generate nothing (live=active): the decode loop ends once every playing reply stopped.
        if carried:
            gen, lp, glen, cache = continue_tokens(rt.actor_graphdef, params, cache, p.head_cap + t * (U + A),
                                                   head_len + hlen, u, ul, k_t, scfg, live=active)
        else:
            prompt, plen = jax.vmap(lambda a, al, b, bl: pack_segments([(a, al), (b, bl)], size=P, pad_id=pad))(
                head, head_len, hist, hlen_u)
            gen, lp, glen = sample_tokens(rt.actor_graphdef, params, prompt, plen, k_t, scfg, live=active)
        act = jax.vmap(rt.llm.answer_parser)(gen, glen)
        act = jnp.where(active, act, -1)
        new_states, _, r, d, info = jax.vmap(env.step)(states, act)
        hist2, hlen2 = jax.vmap(lambda h, n, g, gl: _append(h, n, g, gl))(hist, hlen_u, gen, glen)
        hmask, _ = jax.vmap(lambda h, n, gl: _append(h, n, jnp.ones((A,), bool), gl))(hmask, hlen_u, glen)
        hlogp, _ = jax.vmap(lambda h, n, x, gl: _append(h, n, x, gl))(hlogp, hlen_u, lp, glen)
        last = jnp.take_along_axis(gen, jnp.maximum(glen - 1, 0)[:, None], axis=1)[:, 0]
        stopped = jnp.where(active, (glen > 0) & (last == eos), stopped)
        ret = ret + jnp.where(active, r, 0.0)
        succ = succ | (active & info["success"].astype(bool))
        done = done | d.astype(bool)
        carry = (new_states, done, ret, succ, hist2, hmask, hlogp, hlen2, stopped, cache)
        return carry, (obs, obs_len, act, active)

    zi = jnp.zeros((N,), jnp.int32)
    init = (states, jnp.zeros((N,), bool), jnp.zeros((N,), jnp.float32), jnp.zeros((N,), bool),
            jnp.full((N, H), pad, jnp.int32), jnp.zeros((N, H), bool), jnp.zeros((N, H), jnp.float32), zi,
            jnp.zeros((N,), bool), cache)
    (_, _, ret, succ, hist, hmask, hlogp, hlen, _, _), (obs, obs_len, act, active) = jax.lax.scan(
        turn_fn, init, jnp.arange(T))
    tokens, length = jax.vmap(lambda a, al, b, bl: pack_segments([(a, al), (b, bl)], size=P, pad_id=pad))(
        head, head_len, hist, hlen)
    mask = jax.vmap(lambda m, o: _place(m, o, P, False))(hmask, head_len)
    logp = jax.vmap(lambda x, o: _place(x, o, P, 0.0))(hlogp, head_len)
    sw = lambda x: jnp.swapaxes(x, 0, 1)
    active = sw(active)
    act = sw(act)
    return LLMEpisodes(tokens=tokens, length=length, loss_mask=mask, logp=logp, obs=sw(obs), obs_len=sw(obs_len),
                       actions=act, active=active, reward=ret, success=succ,
                       turns=active.sum(1).astype(jnp.int32),
                       invalid=(active & (act < 0)).sum(1).astype(jnp.int32))
