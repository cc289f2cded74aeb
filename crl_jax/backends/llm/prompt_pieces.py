"""The actor's and the extractor's prompts as token pieces (host) and their packing (jit).

Actor (the LLM path keeps the full history): the prompt of turn t is the whole conversation so far, in the model's chat
format:

    head  = [system: actor_system with the experience block (guided only)] [user: actor_turn up to the
            observation, with the goal]
    turn t = before_obs[t] (end of the previous assistant message + next user message header; empty for
             t = 0) + observation + after_obs[t] (end of user message + assistant header)
    then the model's own reply tokens (kept verbatim, stop token included).

The training row of an episode is head + every turn + every reply; a reply's tokens are the trained
ones. When a reply ended with the end-of-turn token, the next `before_obs` leaves that token out (the
`before_obs_stopped` table), so the conversation holds exactly one.

Variants (`LLMPromptConfig`, measured in docs/RESULTS.md): a worked example turn between the system
message and the first real turn (a made-up board answered by `actor_example_reply.txt`), a one-line or a
think-then-answer instruction, and a prefill (`actor_prefill.txt`) that every assistant message starts
with: it ends the generation prompt and sits before each reply in the history, so the reply tokens are
the model's own continuation after it. The extractor gets the same: one worked example game and a
prefill of its JSON answer.

Extractor distillation prompt: the rendered chat of distill_system / distill_user, with slots GOAL,
OUTCOME, RETRIEVED (the distill_retrieved block, empty when no entry guided the episode) and
TRAJECTORY (distill_step per played turn: turn label, observation, move name). The trajectory is cut
from the LEFT (oldest turns first) to what the budget leaves, so goal, outcome and the entry are
always whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from crl_jax.config import LLMPromptConfig
from crl_jax.extractor.merge_step import MergePieces
from crl_jax.text import prompts
from crl_jax.backends.llm.pieces import (
    Layout,
    chat_text,
    slot,
    split_slots,
    sub_layout,
    token_row,
    token_table,
)
from crl_jax.text.packing import pack_segments, truncate_left

_Z = jnp.int32(0)


@dataclass(frozen=True, eq=False)
class ActorPieces:
    head: Layout  # slots EXP, GOAL
    exp_pre: tuple  # segment
    exp_post: tuple
    before_obs: tuple  # (tokens [T, W], lengths [T]); row 0 empty
    before_obs_stopped: tuple  # the same without the leading end-of-turn text
    after_obs: tuple  # (tokens [T, W], lengths [T])
    goal_cap: int
    obs_cap: int
    entry_cap: int
    action_cap: int
    num_turns: int
    prefill: str = ""  # text every reply starts with (already in the prompt); "" = none

    @property
    def head_cap(self) -> int:
        return (self.head.fixed_capacity() + int(self.exp_pre[0].shape[0]) + self.entry_cap
                + int(self.exp_post[0].shape[0]) + self.goal_cap)

    @property
    def turn_cap(self) -> int:
        """Static room of one turn: user wrapper + observation + reply."""
        return (int(max(self.before_obs[0].shape[1], self.before_obs_stopped[0].shape[1])) + self.obs_cap
                + int(self.after_obs[0].shape[1]) + self.action_cap)

    @property
    def hist_len(self) -> int:
        return self.num_turns * self.turn_cap

    @property
    def prompt_len(self) -> int:
        """P: the static length of every actor prompt and training row."""
        return self.head_cap + self.hist_len


def actor_example(folder: str, think: bool) -> list[tuple[str, str]]:
    """The worked example turn: (user, assistant) messages on a made-up board (no level of any pool)."""
    user = prompts.render("actor_turn", folder, goal=prompts.render("actor_example_goal", folder), turn=1,
                          observation=prompts.render("actor_example_obs", folder))
    reply = prompts.render("actor_example_reply_think" if think else "actor_example_reply", folder)
    return [("user", user), ("assistant", reply)]


def build_actor_pieces(tok, folder: str, action_names, num_turns: int, *, goal_cap: int, obs_cap: int,
                       entry_cap: int, action_cap: int, variant: LLMPromptConfig = LLMPromptConfig()) -> ActorPieces:
    T = num_turns
    instruction = prompts.render("actor_answer_think" if variant.think else "actor_answer_only", folder)
    system = prompts.render("actor_system", folder, max_turns=T, actions=", ".join(action_names),
                            experience=slot("EXP"), instruction=instruction)
    prefill = prompts.render("actor_prefill", folder) if variant.prefill else ""
    msgs = [("system", system)] + (actor_example(folder, variant.think) if variant.example else [])
    msgs += [("user", prompts.render("actor_turn", folder, goal=slot("GOAL"), turn=1, observation=slot("OBS0")))]
    for t in range(1, T):
        msgs += [("assistant", prefill + slot(f"ACT{t - 1}")),
                 ("user", prompts.render("actor_next_turn", folder, turn=t + 1, observation=slot(f"OBS{t}")))]
    parts = split_slots(chat_text(tok, msgs, add_generation_prompt=True) + prefill)
    names = [v for k, v in parts if k == "slot"]
    want = ["OBS0"] + [x for t in range(1, T) for x in (f"ACT{t - 1}", f"OBS{t}")]
    if sorted(names[:2]) != ["EXP", "GOAL"] or names[2:] != want:
        raise ValueError(f"actor prompt templates: unexpected field order {names} (the experience and the goal "
                         "must come before the first observation, every observation once per turn)")
    i_obs0 = next(i for i, (k, v) in enumerate(parts) if v == "OBS0" and k == "slot")
    head_text = "".join(v if k == "text" else slot(v) for k, v in parts[:i_obs0])
    head = Layout.from_text(tok, head_text)

    def between(a: str, b: str | None) -> str:
        """Literal text between slot a and slot b (None: the end)."""
        ia = next(i for i, (k, v) in enumerate(parts) if k == "slot" and v == a)
        ib = len(parts) if b is None else next(i for i, (k, v) in enumerate(parts) if k == "slot" and v == b)
        return "".join(v for k, v in parts[ia + 1: ib] if k == "text")

    before = [""] + [between(f"ACT{t - 1}", f"OBS{t}") for t in range(1, T)]
    after = [between(f"OBS{t}", f"ACT{t}" if t < T - 1 else None) for t in range(T)]
    eot = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
    stopped = [b[len(eot):] if eot and b.startswith(eot) else b for b in before]
    pre, post = sub_layout(tok, "actor_experience", folder, "entry")
    return ActorPieces(head=head, exp_pre=pre, exp_post=post, before_obs=token_table(tok, before),
                       before_obs_stopped=token_table(tok, stopped), after_obs=token_table(tok, after),
                       goal_cap=goal_cap, obs_cap=obs_cap, entry_cap=entry_cap, action_cap=action_cap, num_turns=T,
                       prefill=prefill)


def actor_head(p: ActorPieces, exp, exp_len, has_exp, goal, goal_len):
    """One episode's head -> (tokens [head_cap], length). exp [Le], goal [Lg] (unbatched)."""
    use = has_exp & (exp_len > 0)
    n = lambda seg: (seg[0], jnp.where(use, seg[1], _Z))
    block = pack_segments([n(p.exp_pre), (exp, jnp.where(use, exp_len, _Z)), n(p.exp_post)])
    return p.head.pack({"EXP": block, "GOAL": (goal, goal_len)}, size=p.head_cap)


def user_turn(p: ActorPieces, t, stopped, obs, obs_len):
    """Segments of turn t's user part (before the reply): [before, observation, after]."""
    # The two tables may differ in width: pick one by zeroing the other's length.
    bt, bl = p.before_obs[0][t], p.before_obs[1][t]
    st, sl = p.before_obs_stopped[0][t], p.before_obs_stopped[1][t]
    return [(bt, jnp.where(stopped, _Z, bl)), (st, jnp.where(stopped, sl, _Z)), (obs, obs_len),
            (p.after_obs[0][t], p.after_obs[1][t])]


@dataclass(frozen=True, eq=False)
class DistillPieces:
    layout: Layout  # slots GOAL, OUTCOME, RETRIEVED, TRAJECTORY (any order)
    outcome: tuple  # (tokens [2, W], lengths [2]): row 0 failure, row 1 success
    ret_pre: tuple
    ret_post: tuple
    step_pre: tuple  # (tokens [T, W], lengths [T]): text before the observation of turn t
    step_mid: tuple  # segment between observation and move name
    step_post: tuple  # segment after the move name
    action_names: tuple  # (tokens [A + 1, W], lengths [A + 1]); row A = no valid move
    goal_cap: int
    obs_cap: int
    entry_cap: int
    num_turns: int
    prefill: str = ""  # text every reply starts with (already in the prompt; the parser prepends it)

    @property
    def fixed_capacity(self) -> int:
        """Tokens the prompt needs besides the trajectory (at full buffer sizes)."""
        return (self.layout.fixed_capacity() + self.goal_cap + int(self.outcome[0].shape[1])
                + int(self.ret_pre[0].shape[0]) + self.entry_cap + int(self.ret_post[0].shape[0]))

    @property
    def traj_cap(self) -> int:
        return self.num_turns * (int(self.step_pre[0].shape[1]) + self.obs_cap + int(self.step_mid[0].shape[0])
                                 + int(self.action_names[0].shape[1]) + int(self.step_post[0].shape[0]))


def distill_example(folder: str) -> list[tuple[str, str]]:
    """The extractor's worked example: a one-turn won game on the actor's example board, and its answer."""
    step = prompts.render("distill_step", folder, turn=1, observation=prompts.render("actor_example_obs", folder),
                          action="northeast")
    user = prompts.render("distill_user", folder, goal=prompts.render("actor_example_goal", folder),
                          outcome=prompts.render("outcome_success", folder), retrieved="", trajectory=step)
    return [("user", user), ("assistant", prompts.render("distill_example_reply", folder))]


def build_distill_pieces(tok, folder: str, action_names, num_turns: int, *, goal_cap: int, obs_cap: int,
                         entry_cap: int, variant: LLMPromptConfig = LLMPromptConfig()) -> DistillPieces:
    user = prompts.render("distill_user", folder, goal=slot("GOAL"), outcome=slot("OUTCOME"),
                          retrieved=slot("RETRIEVED"), trajectory=slot("TRAJECTORY"))
    example = distill_example(folder) if variant.extractor_example else []
    prefill = prompts.render("distill_prefill", folder) if variant.extractor_prefill else ""
    text = chat_text(tok, [("system", prompts.render("distill_system", folder))] + example + [("user", user)],
                     add_generation_prompt=True) + prefill
    layout = Layout.from_text(tok, text)
    if sorted(layout.slots) != ["GOAL", "OUTCOME", "RETRIEVED", "TRAJECTORY"]:
        raise ValueError(f"distill prompt templates: fields {layout.slots}, expected each of goal, outcome, "
                         "retrieved, trajectory once")
    outcome = token_table(tok, [prompts.render("outcome_failure", folder), prompts.render("outcome_success", folder)])
    ret_pre, ret_post = sub_layout(tok, "distill_retrieved", folder, "entry")
    step_texts = [prompts.render("distill_step", folder, turn=t + 1, observation=slot("O"), action=slot("A"))
                  for t in range(num_turns)]
    pres, mids, posts = zip(*(_three(s) for s in step_texts))
    if len(set(mids)) != 1 or len(set(posts)) != 1:
        raise ValueError("distill_step.txt: only the text before $observation may depend on $turn")
    names = token_table(tok, list(action_names) + [prompts.render("invalid_action", folder)])
    return DistillPieces(layout=layout, outcome=outcome, ret_pre=ret_pre, ret_post=ret_post,
                         step_pre=token_table(tok, list(pres)), step_mid=token_row(tok, mids[0]),
                         step_post=token_row(tok, posts[0]), action_names=names, goal_cap=goal_cap,
                         obs_cap=obs_cap, entry_cap=entry_cap, num_turns=num_turns, prefill=prefill)


def _three(text: str):
    a, rest = text.split(slot("O"))
    b, c = rest.split(slot("A"))
    return a, b, c


def trajectory(p: DistillPieces, obs, obs_len, actions, active, move=None, move_len=None):
    """One episode's transcript -> (tokens, length). obs [T, Lo], actions/active [T]. `move` [T, Wm] /
    `move_len` [T]: each turn's move as tokens (host text games, whose commands change from state to state
    and so have no fixed name table); a turn without a valid move (action -1) shows the invalid-move text."""
    A = p.action_names[0].shape[0] - 1
    segs = []
    for t in range(p.num_turns):
        on = active[t]
        a = jnp.where((actions[t] >= 0) & (actions[t] < A), actions[t], A)
        m = lambda seg, on=on: (seg[0], jnp.where(on, seg[1], _Z))
        if move is None:
            name = [m((p.action_names[0][a], p.action_names[1][a]))]
        else:  # the command itself, or (row A) the invalid-move text
            own = actions[t] >= 0
            name = [(move[t], jnp.where(on & own, move_len[t], _Z)),
                    (p.action_names[0][A], jnp.where(on & ~own, p.action_names[1][A], _Z))]
        segs += [m((p.step_pre[0][t], p.step_pre[1][t])), m((obs[t], obs_len[t])), m(p.step_mid), *name,
                 m(p.step_post)]
    return pack_segments(segs)


def distill_prompt(p: DistillPieces, budget: int, goal, goal_len, obs, obs_len, actions, active, success, entry,
                   entry_len, has_entry, pad_id: int = 0, move=None, move_len=None):
    """One episode's distillation prompt -> (tokens [budget], length); trajectory cut from the left."""
    use = has_entry & (entry_len > 0)
    n = lambda seg: (seg[0], jnp.where(use, seg[1], _Z))
    ret = pack_segments([n(p.ret_pre), (entry, jnp.where(use, entry_len, _Z)), n(p.ret_post)])
    i = success.astype(jnp.int32)
    out = (p.outcome[0][i], p.outcome[1][i])
    traj, traj_len = trajectory(p, obs, obs_len, actions, active, move, move_len)
    fixed = sum(v[1] for k, v in p.layout.items if k == "text")
    used = fixed + goal_len + out[1] + ret[1]
    traj = truncate_left(traj, traj_len, jnp.maximum(budget - used, 0), pad_id=pad_id)
    return p.layout.pack({"GOAL": (goal, goal_len), "OUTCOME": out, "RETRIEVED": ret, "TRAJECTORY": traj},
                         size=budget, pad_id=pad_id)


def merge_example(folder: str) -> list[tuple[str, str]]:
    """The merge's worked example: the example lessons as a first chunk (nothing carried), and its answer."""
    lessons = prompts.load("merge_example_lessons", folder).splitlines()
    entries = "".join(prompts.render("merge_entry", folder, entry=line) for line in lessons if line.strip())
    user = prompts.render("merge_user", folder, context="", entries=entries)
    return [("user", user), ("assistant", prompts.render("merge_example_reply", folder))]


def merge_prefill(folder: str, variant: LLMPromptConfig = LLMPromptConfig()) -> str:
    """The text every merge reply starts with (the end of the prompt), or "" without `merge_prefill`."""
    return prompts.render("merge_prefill", folder) if variant.merge_prefill else ""


def build_merge_pieces(tok, folder: str, variant: LLMPromptConfig = LLMPromptConfig()) -> MergePieces:
    """Segments of the merge prompt in `crl_jax.extractor.merge.merge_family`'s layout (header, sep, context,
    entries, suffix): the chat of merge_system, the worked example (`variant.merge_example`) and merge_user,
    cut at $context and $entries; `context` is the merge_context label (only present when lessons are
    carried), `sep` the text merge_entry puts before each lesson; the suffix ends with the prefill
    (`variant.merge_prefill`)."""
    user = prompts.render("merge_user", folder, context=slot("CONTEXT"), entries=slot("ENTRIES"))
    example = merge_example(folder) if variant.merge_example else []
    text = chat_text(tok, [("system", prompts.render("merge_system", folder))] + example + [("user", user)],
                     add_generation_prompt=True) + merge_prefill(folder, variant)
    parts = split_slots(text)
    if [v for k, v in parts if k == "slot"] != ["CONTEXT", "ENTRIES"]:
        raise ValueError("merge_user.txt: $context must come before $entries, each once")
    i_c = next(i for i, (k, v) in enumerate(parts) if k == "slot" and v == "CONTEXT")
    i_e = next(i for i, (k, v) in enumerate(parts) if k == "slot" and v == "ENTRIES")
    cat = lambda ps: "".join(v for _, v in ps)  # noqa: E731  (only texts in these ranges)
    sep, post = prompts.render("merge_entry", folder, entry=slot("X")).split(slot("X"))
    if post:
        raise ValueError("merge_entry.txt: nothing may follow $entry (the separator goes before each lesson)")
    texts = {"header": cat(parts[:i_c]), "context": prompts.render("merge_context", folder),
             "entries": cat(parts[i_c + 1: i_e]), "suffix": cat(parts[i_e + 1:]), "sep": sep}
    return MergePieces(**{k: token_row(tok, t) for k, t in texts.items()})
