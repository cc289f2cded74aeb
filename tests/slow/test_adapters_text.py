"""Text adapters: TextWorld games generated offline, ALFWorld-style PDDL tasks solved by scripted plans."""

import os

import pytest

from crl_jax.envs.adapters import make_adapter, names
from crl_jax.envs.adapters.alfworld import (
    DATA_DIR,
    AlfworldPddl,
    pretty_name,
    read_problem,
)
from crl_jax.envs.adapters.common import INVALID_MESSAGE
from crl_jax.envs.adapters.textworld import TextWorldGames


def test_registry():
    assert names() == ("minihack-room", "textworld", "alfworld")
    with pytest.raises(ValueError, match="unknown adapter"):
        make_adapter("nope")


# ---- TextWorld ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tw(tmp_path_factory):
    env = TextWorldGames("tw-simple", num_tasks=2, cache_dir=str(tmp_path_factory.mktemp("tw")), max_steps=20)
    yield env
    env.close()


@pytest.mark.slow  # generating + compiling one game with Inform 7 takes a few seconds
def test_textworld_generated_game_played_to_completion(tw):
    state, text = tw.reset(0, 0)
    assert os.path.exists(tw.game_file(0)) and tw.game_file(0).endswith(".z8")
    assert "Actions: " in text and state.admissible == tuple(sorted(state.admissible))
    assert tw.is_host and tw.action_names == state.admissible and "TextWorld" in tw.task_text
    walk = tw.walkthrough(0)
    assert 3 <= len(walk) <= 20
    state, _ = tw.reset(1, 0)
    rewards = []
    for cmd in walk:
        assert cmd in state.admissible, (cmd, state.admissible)
        state, _, r, done, info = tw.step(state, state.admissible.index(cmd))
        rewards.append(r)
    assert rewards == [0.0] * (len(walk) - 1) + [1.0]
    assert done and state.won and info["won"] == 1 and state.score == state.max_score
    # Deterministic: the same task gives the same opening text.
    assert tw.reset(5, 0)[1] == tw.reset(6, 0)[1]


@pytest.mark.slow
def test_textworld_invalid_truncation_stale_and_cache(tw):
    state, _ = tw.reset(0, 0)
    new, text, r, done, info = tw.step(state, len(state.admissible) + 3)
    assert info["invalid"] == 1 and new.t == 1 and text.startswith(INVALID_MESSAGE) and r == 0.0 and not done
    with pytest.raises(ValueError, match="stale"):
        tw.step(state, 0)
    path = tw.game_file(0)
    mtime = os.path.getmtime(path)
    short = TextWorldGames("tw-simple", num_tasks=2, cache_dir=tw.cache_dir, max_steps=2, reward="score")
    try:
        assert short.game_file(0) == path and os.path.getmtime(path) == mtime  # reused, not regenerated
        s, _ = short.reset(0, 0)
        walk = short.walkthrough(0)
        s, _, r1, d1, _ = short.step(s, walk[0])  # a command string works too; dense score reward
        s, _, r2, d2, info = short.step(s, walk[1])
        assert r1 == 1.0 and r2 == 1.0 and not d1 and d2 and info["truncated"] == 1 and not s.won
    finally:
        short.close()
    assert TextWorldGames("tw-simple", pool="eval", cache_dir=tw.cache_dir).game_seed(0) != tw.game_seed(0)


# ---- ALFWorld-style PDDL -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def alf():
    env = AlfworldPddl(max_steps=30)
    yield env
    env.close()


def test_problem_headers_and_names():
    assert pretty_name("soapbar_bar_2") == "soapbar 2"
    files = sorted(f for f in os.listdir(DATA_DIR) if f.endswith(".pddl"))
    assert len(files) == 6
    for f in files:
        prob = read_problem(os.path.join(DATA_DIR, f))
        assert prob["goal"].endswith(".") and len(prob["plan"]) >= 4 and "(define (problem" in prob["pddl"]


@pytest.mark.slow  # loading each problem runs Fast Downward's translator (~1 s each)
def test_every_alfworld_task_solved_by_its_scripted_plan(alf):
    assert alf.num_tasks == 6
    for task in range(alf.num_tasks):
        state, text = alf.reset(0, task)
        assert text.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert f"Your task is to: {state.goal}" in text and alf.task_text == f"Your task is to: {state.goal}"
        plan = alf.plan(task)
        rewards = []
        for cmd in plan:
            assert cmd in state.admissible, (task, cmd, state.admissible)
            state, text, r, done, info = alf.step(state, state.admissible.index(cmd))
            rewards.append(r)
        assert rewards == [0.0] * (len(plan) - 1) + [1.0], task
        assert done and state.won and info["won"] == 1


@pytest.mark.slow
def test_alfworld_invalid_nonadmissible_and_fail_reward(alf):
    state, text = alf.reset(0, 1)  # pick_and_place_simple: the apple is on countertop 1
    assert "go to countertop 1" in state.admissible and "take apple 1 from countertop 1" not in state.admissible
    s, text, r, done, info = alf.step(state, "take apple 1 from countertop 1")  # not possible from here
    assert s.feedback == "Nothing happens." and info["admissible"] == 0 and r == 0.0 and not done
    assert text.startswith("Nothing happens.\nActions: ")
    s, _, r, done, info = alf.step(s, -1)
    assert info["invalid"] == 1 and s.feedback == INVALID_MESSAGE and s.t == 2
    s, _, _, _, _ = alf.step(s, "go to countertop 1")
    assert "On the countertop 1, you see a apple 1." in s.feedback
    # The planner's plan (Fast Downward) solves it too.
    assert alf.planner_plan(1)[-1] == "move apple 1 to fridge 1"
    short = AlfworldPddl([alf.problem_files[1]], max_steps=2, fail_reward=-1.0)
    s, _ = short.reset(0, 0)
    s, _, r1, _, _ = short.step(s, "look")
    s, _, r2, done, info = short.step(s, "inventory")
    assert (r1, r2, done, info["truncated"]) == (0.0, -1.0, True, 1)
