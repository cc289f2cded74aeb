"""Multi-turn episodes of the actor in a built-in JAX environment, fully compiled.

One call plays N episodes in lock-step for `T` turns (`lax.scan` over turns, environments vmapped).
Finished episodes are absorbing, so every episode has the same shape; `active[n, t]` marks the turns
actually played.

Prompt of one turn ("current" history, the tiny default), packed right-padded into `[P]` tokens:

    <task text> [<exp prefix> <entry> <exp suffix>] [t=<turn>] <observation> <action prompt>

With `rollout.tip_window` = W > 0 (the default) the tip moves next to the action prompt and shows the
plan from the current turn on (`build_prompt`):

    <task> [t=<turn>] <observation> [<tip marker> entry[t : t+W]] <action prompt>

In the compact view (`crl_jax.envs.compact`) the task is one level token, the turn one token and the
observation 11 tokens (row, column, 3x3 neighbourhood).

The experience segment is present only for guided episodes that retrieved an entry; free episodes and
the GRPO baseline see exactly the same text minus that segment (a test asserts it on the built prompts).
The action is one constrained token (the sampler's allowed-token mask restricted to the action tokens),
so the log-prob stored with it is that of the distribution actually sampled from.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from crl_jax.envs.actions import action_allowed_mask, token_to_action
from crl_jax.envs.compact import is_fact
from crl_jax.models import transformer as tr
from crl_jax.models.row_blocks import last_hidden_in_blocks
from crl_jax.models.shared_prefix import encode_unique_prefixes
from crl_jax.token_draw import sample_logits
from crl_jax.text.packing import pack_segments


class Segments(NamedTuple):
    """Fixed token pieces of the actor prompt, built once on the host by the runtime."""

    exp_prefix: jax.Array  # [Lp] int32, e.g. "Tip: "
    exp_prefix_len: jax.Array  # []
    exp_suffix: jax.Array  # [Ls]
    exp_suffix_len: jax.Array
    turn: jax.Array  # [T, Lm] "t=3\n" per turn
    turn_len: jax.Array  # [T]
    act: jax.Array  # [La] e.g. "Action: "
    act_len: jax.Array
    tip_window: int = 0  # >0: show entry[t : t + tip_window] at turn t, right before the action prompt
    # `extraction.forms`: the row tokens [H] a FACT entry (`<r{i}> <c{j}>`) starts with; such a tip shows the
    # cell at every turn (None: every entry is a plan of moves)
    fact_rows: jax.Array | None = None


class Episodes(NamedTuple):
    prompts: jax.Array  # [N, T, P] int32 per-turn prompts (right-padded)
    prompt_len: jax.Array  # [N, T] int32
    action_tokens: jax.Array  # [N, T] int32 token chosen at each turn
    actions: jax.Array  # [N, T] int32 env action (-1: invalid)
    logp: jax.Array  # [N, T] float32 behaviour log-prob of the action token
    active: jax.Array  # [N, T] bool: the turn was played
    reward: jax.Array  # [N] float32 return of the episode
    success: jax.Array  # [N] bool
    turns: jax.Array  # [N] int32 turns played
    end_cell: jax.Array | None = None  # [N, 2] int32 the compact view's <r> <c> tokens of the last state (forms)


def last_logits(graphdef, params, tokens, lengths):
    """Logits [N, V] of the next token after each right-padded prompt tokens[N, P] of length lengths[N]."""
    chex.assert_rank([tokens, lengths], [2, 1])
    model = tr.merge(graphdef, params)
    return model.unembed(model.last_hidden(tokens, lengths)[:, None])[:, 0]  # last layer: one query row


def graphdef_vocab(graphdef, params) -> int:
    """Vocabulary size of a split model (static)."""
    return tr.merge(graphdef, params).cfg.vocab_size


def build_prompt(task, task_len, exp, exp_len, has_exp, seg: Segments, turn, obs, obs_len, *, turn_marker):
    """One episode's prompt for one turn -> (tokens [P], length). All inputs unbatched.

    `seg.tip_window` = 0: the whole entry after the task text. W > 0: the plan from the current turn on,
    entry[turn : turn + W], right before the action prompt (nothing once the plan is used up), so the
    move to play now is always the token after the tip marker. With `seg.fact_rows` a FACT entry (a cell,
    `crl_jax.extractor.forms`) is shown whole at every turn: `<TIP> <r{i}> <c{j}>`.
    """
    z = jnp.int32(0)
    W = seg.tip_window
    if W > 0:
        L = exp.shape[0]
        shown = jnp.take(exp, jnp.clip(turn + jnp.arange(W), 0, L - 1))
        shown_len = jnp.clip(exp_len - turn, 0, W).astype(jnp.int32)
        if seg.fact_rows is not None:
            fact = is_fact(exp, exp_len, seg.fact_rows)
            shown = jnp.where(fact, jnp.take(exp, jnp.clip(jnp.arange(W), 0, L - 1)), shown)
            shown_len = jnp.where(fact, 2, shown_len).astype(jnp.int32)
        use = has_exp & (shown_len > 0)
        tip = [(seg.exp_prefix, jnp.where(use, seg.exp_prefix_len, z)), (shown, jnp.where(use, shown_len, z)),
               (seg.exp_suffix, jnp.where(use, seg.exp_suffix_len, z))]
        parts = [(task, task_len)]
    else:
        use = has_exp & (exp_len > 0)
        tip = [(seg.exp_prefix, jnp.where(use, seg.exp_prefix_len, z)), (exp, jnp.where(use, exp_len, z)),
               (seg.exp_suffix, jnp.where(use, seg.exp_suffix_len, z))]
        parts = [(task, task_len)] + tip
    if turn_marker:
        parts.append((seg.turn[turn], seg.turn_len[turn]))
    parts.append((obs, obs_len))
    if W > 0:
        parts += tip
    parts.append((seg.act, seg.act_len))
    return pack_segments(parts)


# `rollout.turn_block`: a block's forward runs over a multiple of this many prompt slots (one compiled forward
# per multiple up to the packed width; 16 keeps the text view's ~140-slot turns to 9 widths)
TURN_WIDTH_STEP = 16


def sample_turn(graphdef, params, seg: Segments, allowed, action_ids, k_play, t, task_tokens, task_len, exp, exp_len,
                has_exp, obs, obs_len, *, temperature: float, turn_marker: bool, prefix=None, turn_block: int = 0,
                live=None):
    """One turn of N episodes: build the prompts, sample one allowed action token each (key `fold_in(k_play,
    t)`) -> (prompts [N, P], lengths [N], tokens [N], log-probs [N], env actions [N]). Shared by `play` and
    the host driver (`crl_jax.host.play`), so both paths build and sample turns identically.

    `prefix`: the task texts' keys and values (`Transformer.encode_prefix(task_tokens, task_len)`); the model
    then runs only the rest of each prompt (the returned prompts are still the whole ones).

    `turn_block` > 0 (`rollout.turn_block`): the forward runs over the `live` [N] rows only (default all),
    `turn_block` rows at a time, each block over its longest prompt rounded up to `TURN_WIDTH_STEP` slots
    (`last_hidden_in_blocks`); the other rows' logits are those of a zero hidden state (their tokens are junk:
    the rollout marks those turns inactive)."""
    build = jax.vmap(lambda a, b, c, d, e, o, ol: build_prompt(a, b, c, d, e, seg, t, o, ol, turn_marker=turn_marker))
    prompts, plen = build(task_tokens, task_len, exp, exp_len, has_exp, obs, obs_len)
    if prefix is None and turn_block <= 0:
        logits = last_logits(graphdef, params, prompts, plen)
    else:
        toks, lens = prompts, plen
        if prefix is not None:  # the same prompts without their task text (a zero-width task segment)
            toks, lens = build(task_tokens[:, :0], jnp.zeros_like(task_len), exp, exp_len, has_exp, obs, obs_len)
        model = tr.merge(graphdef, params)
        if turn_block > 0:
            h = last_hidden_in_blocks(model, toks, lens, block=turn_block, width_step=TURN_WIDTH_STEP, live=live,
                                      prefix=prefix)
        else:
            h = model.last_hidden(toks, lens, prefix=prefix)
        logits = model.unembed(h[:, None])[:, 0]
    tok, lp = sample_logits(logits, jax.random.fold_in(k_play, t), temperature=temperature, allowed=allowed)
    return prompts, plen, tok, lp, token_to_action(tok, action_ids)


def play(graphdef, params, env, renderer, seg: Segments, action_ids, key, *, tasks,
         task_tokens, task_len, exp, exp_len, has_exp, num_turns: int, temperature: float,
         turn_marker: bool = True, reset_keys=None, share_prefix: bool = False,
         prefix_block: int | None = None, turn_block: int = 0, end_cell: bool = False) -> Episodes:
    """Play N episodes. tasks [N] int32 (pool indices), task_tokens [N, Lt], exp [N, L], has_exp [N].

    action_ids [A]: the token of each action (the constrained action vocabulary).
    reset_keys [N]: per-episode env keys (default `episode_reset_keys(key, N)`, as `first_observation`).
    share_prefix: encode the task texts once (`encode_unique_prefixes`) and run only the rest of every turn's
    prompt (`rollout.share_prefix`). It pays where the task text is a large part of the prompt (the
    text view's task line is a third of the agentic benchmark's prompts; the compact view's task is one token).
    The behaviour log-probs then equal the learner's recomputation over the whole prompt up to float32 order
    (~1e-6), not bit for bit. Each distinct task text is encoded once (a group's K rollouts share one encoding),
    `prefix_block` rows per encoding (default N; the loop passes its group count).
    turn_block > 0 (`rollout.turn_block`): each turn's forward skips the episodes that have ended and runs the
    others this many rows at a time, each block only as wide as its longest prompt (`sample_turn`); the played
    turns' log-probs equal the one-batch forward's up to float32 order.
    end_cell: also return each episode's last cell as the compact renderer's `<r> <c>` tokens (`Episodes.end_cell`,
    what a FACT entry holds; `extraction.forms`).
    Returns `Episodes` with T = num_turns turns.
    """
    chex.assert_rank([tasks, task_tokens, exp, has_exp], [1, 2, 2, 1])
    N = tasks.shape[0]
    V = graphdef_vocab(graphdef, params)
    allowed = action_allowed_mask(action_ids, V)
    k_play = jax.random.fold_in(key, 1)
    reset_keys = episode_reset_keys(key, N) if reset_keys is None else reset_keys
    states, _ = jax.vmap(env.reset)(reset_keys, tasks)
    prefix = None
    if share_prefix:
        prefix = encode_unique_prefixes(tr.merge(graphdef, params), task_tokens, task_len, prefix_block or N)

    def turn_fn(carry, t):
        states, done, ret, succ = carry
        obs_tok, obs_len = jax.vmap(renderer)(states)
        prompts, plen, tok, lp, act = sample_turn(graphdef, params, seg, allowed, action_ids, k_play, t, task_tokens,
                                                  task_len, exp, exp_len, has_exp, obs_tok, obs_len,
                                                  temperature=temperature, turn_marker=turn_marker, prefix=prefix,
                                                  turn_block=turn_block, live=~done)
        new_states, _, r, d, info = jax.vmap(env.step)(states, act)
        active = ~done
        ret = ret + jnp.where(active, r, 0.0)
        succ = succ | (active & info["success"].astype(bool))
        done = done | d.astype(bool)
        out = (prompts, plen, tok, act, jnp.where(active, lp, 0.0), active)
        return (new_states, done, ret, succ), out

    init = (states, jnp.zeros((N,), bool), jnp.zeros((N,), jnp.float32), jnp.zeros((N,), bool))
    (last, _, ret, succ), (pr, pl, tok, act, lp, active) = jax.lax.scan(turn_fn, init, jnp.arange(num_turns))
    sw = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  [T, N, ...] -> [N, T, ...]
    return Episodes(prompts=sw(pr), prompt_len=sw(pl), action_tokens=sw(tok), actions=sw(act), logp=sw(lp),
                    active=sw(active), reward=ret, success=succ, turns=active.sum(0).astype(jnp.int32),
                    end_cell=end_cells(renderer, last) if end_cell else None)


def end_cells(renderer, states):
    """[N, 2] int32: the `<r{i}> <c{j}>` tokens of states [N] (the first two of the compact view; finished
    episodes are absorbing, so the final states hold where each episode ended)."""
    return jax.vmap(renderer)(states)[0][:, :2]


def episode_reset_keys(key, n: int):
    """The env reset keys [n] of the episodes played from `key`."""
    return jax.random.split(jax.random.fold_in(key, 0), n)


def first_observation(env, renderer, key, tasks):
    """Rendered first observation tokens [N, Lo] and lengths [N] (the same reset keys `play` uses)."""
    states, _ = jax.vmap(env.reset)(episode_reset_keys(key, tasks.shape[0]), tasks)
    return jax.vmap(renderer)(states)
