"""Prompt templates of the LLM path, as data: one text file per message part, `$name` placeholders.

Files (this folder, or any folder with the same names given as `Config.prompts`):

- `actor_system.txt` ($max_turns, $actions, $experience, $instruction: `actor_answer_only.txt` or, with
  `llm_prompt.think`, `actor_answer_think.txt`), `actor_experience.txt` ($entry: the retrieved
  entry; the whole block is left out for free rollouts), `actor_turn.txt` ($goal, $turn, $observation:
  the first user message), `actor_next_turn.txt` ($turn, $observation: later user messages);
- the actor's worked example turn (`llm_prompt.example`): `actor_example_goal.txt` and `actor_example_obs.txt`
  (a made-up board, no level of any pool) shown through `actor_turn.txt`, answered by `actor_example_reply.txt` (or
  `actor_example_reply_think.txt`); `actor_prefill.txt`: the text every reply starts with
  (`llm_prompt.prefill`);
- the extractor's worked example (`llm_prompt.extractor_example`): a one-turn game on the example board
  through `distill_user.txt`, answered by `distill_example_reply.txt`; `distill_prefill.txt`: the text its
  replies start with (`llm_prompt.extractor_prefill`);
- `distill_system.txt`, `distill_user.txt` ($goal, $outcome, $retrieved, $trajectory),
  `distill_retrieved.txt` ($entry; left out when no entry guided the episode), `distill_step.txt`
  ($turn, $observation, $action: one turn of the trajectory), `outcome_success.txt` / `outcome_failure.txt`
  ($outcome), `invalid_action.txt` (the $action of a turn without a valid move);
- `merge_system.txt`, `merge_user.txt` ($context: the `merge_context.txt` label and the lessons carried
  from the previous chunk, left out for the first chunk; $entries: the lessons to merge), `merge_entry.txt`
  ($entry: one lesson of either list, e.g. a new line and a dash before it; nothing may follow $entry);
- the merge's worked example (`llm_prompt.merge_example`): the lessons of `merge_example_lessons.txt` (one a
  line; general rules, no level of any pool) shown through `merge_user.txt` / `merge_entry.txt`, answered by
  `merge_example_reply.txt`; `merge_prefill.txt`: the text merge replies start with (`llm_prompt.merge_prefill`).

Placeholders use `string.Template` syntax (`$name` / `${name}`, `$$` for a dollar sign), so JSON
examples need no escaping. One trailing newline of a file is dropped, so a file's text ends where its
last visible line ends. `render(name, **fields)` fills every placeholder (a missing one raises
`KeyError`, an unknown one is an error too); the LLM runtime renders them with sentinel strings in
place of the token-valued fields and cuts the result into token pieces (`crl_jax.backends.llm.pieces`).
"""

from __future__ import annotations

import os
import string

FOLDER = os.path.dirname(os.path.abspath(__file__))
NAMES = ("actor_system", "actor_experience", "actor_turn", "actor_next_turn", "distill_system", "distill_user",
         "distill_retrieved", "distill_step", "outcome_success", "outcome_failure", "invalid_action", "merge_system",
         "merge_user", "merge_context", "merge_entry", "actor_answer_only", "actor_answer_think",
         "actor_example_goal", "actor_example_obs", "actor_example_reply", "actor_example_reply_think", "actor_prefill",
         "distill_example_reply", "distill_prefill", "merge_example_lessons", "merge_example_reply", "merge_prefill")


def folder(custom: str = "") -> str:
    """The template folder: `custom` when given, else the packaged one."""
    return custom or FOLDER


def load(name: str, custom: str = "") -> str:
    """Template text of `name` (without the `.txt`), one trailing newline dropped."""
    path = os.path.join(folder(custom), f"{name}.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt template {path!r} not found (expected one of {list(NAMES)})")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text.removesuffix("\n")


def placeholders(text: str) -> set[str]:
    """Names of the `$name` placeholders of a template text."""
    out = set()
    for m in string.Template.pattern.finditer(text):
        name = m.group("named") or m.group("braced")
        if name:
            out.add(name)
    return out


def render(name: str, custom: str = "", **fields) -> str:
    """Fill template `name`; every placeholder must be given and every given field must be used."""
    text = load(name, custom)
    want = placeholders(text)
    extra = set(fields) - want
    if extra:
        raise KeyError(f"prompt {name!r}: unknown fields {sorted(extra)}; placeholders are {sorted(want)}")
    missing = want - set(fields)
    if missing:
        raise KeyError(f"prompt {name!r}: missing fields {sorted(missing)}")
    return string.Template(text).substitute({k: str(v) for k, v in fields.items()})
