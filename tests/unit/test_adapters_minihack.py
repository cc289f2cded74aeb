"""Real MiniHack adapter: text view, deterministic levels per task, action mapping, rewards, truncation."""

import jax
import numpy as np
import pytest

from crl_jax.envs.adapters.common import DIR_NAMES, INVALID_MESSAGE, seed_to_int
from crl_jax.envs.adapters.minihack import MiniHackRoom

# (row, col) delta of each action name, written out by hand.
DELTAS = {"north": (-1, 0), "east": (0, 1), "south": (1, 0), "west": (0, -1),
          "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1)}


@pytest.fixture(scope="module")
def lit():
    env = MiniHackRoom("random", num_tasks=50)
    yield env
    env.close()


def test_action_names_match_jax_envs():
    from crl_jax.envs.base import DIR_NAMES as JAX_DIR_NAMES

    assert DIR_NAMES == JAX_DIR_NAMES
    assert MiniHackRoom.action_names == JAX_DIR_NAMES
    assert MiniHackRoom.is_host is True


def test_seed_to_int_accepts_ints_and_keys():
    assert seed_to_int(7) == 7
    a, b = seed_to_int(jax.random.key(1)), seed_to_int(jax.random.key(2))
    assert a != b and a == seed_to_int(jax.random.key(1))
    assert seed_to_int(jax.random.PRNGKey(1)) == a  # raw uint32 key, same data


def test_reset_text_view(lit):
    state, text = lit.reset(0, 3)
    lines = text.split("\n")
    assert lines[0].startswith("Hello Agent, welcome to NetHack!")
    assert len(lines) == 1 + 9 + 1 and lines[-1].startswith("Legend: @: you")
    assert state.chars.shape == (9, 9) and chr(state.chars[4, 4]) == "@"
    # A lit 5x5 room: 25 cells drawn (floor, the stairs down, the agent standing on the up stairs).
    drawn = "".join(lines[1:10]).replace(" ", "")
    assert len(drawn) == 25 and drawn.count(">") == 1 and drawn.count("@") == 1
    assert "., floor" not in text and ".: floor" in text and ">: stairs down" in text
    assert lit.render(state) == text and state.t == 0 and not state.done


def test_level_fixed_by_task_not_by_seed(lit):
    views = {}
    for task in range(6):
        a, _ = lit.reset(11, task)
        b, _ = lit.reset(jax.random.key(99), task)
        np.testing.assert_array_equal(a.chars, b.chars)
        assert a.pos == b.pos
        views[task] = (a.chars.tobytes(), a.pos)
    assert len(set(views.values())) > 1  # different tasks, different levels
    assert lit.level_seed(3) != MiniHackRoom("random", pool="eval").level_seed(3)


def test_monster_kind_fixed_by_task():
    env = MiniHackRoom("monster", num_tasks=20)
    try:
        for task in range(4):
            views = [env.reset(seed, task)[0] for seed in (0, 1)]
            letters = [sorted(set(bytes(v.chars.reshape(-1)).decode()) - set(" .@<>")) for v in views]
            assert letters[0] == letters[1] and len(letters[0]) >= 1
    finally:
        env.close()


def test_every_action_moves_as_named(lit):
    """From the view, each compass move either lands on the cell it names or bumps into stone."""
    checked_move = checked_bump = 0
    for task in range(8):
        for a, name in enumerate(lit.action_names):
            state, _ = lit.reset(0, task)
            dr, dc = DELTAS[name]
            target = chr(state.chars[4 + dr, 4 + dc])
            new, _, reward, done, info = lit.step(state, a)
            if target in ".<":
                assert new.pos == (state.pos[0] + dr, state.pos[1] + dc) and reward == 0.0 and not done
                checked_move += 1
            elif target == ">":
                assert reward == 1.0 and done and info["success"] == 1 and new.success
            else:
                assert target == " " and new.pos == state.pos and new.message == "It's solid stone."
                checked_bump += 1
            assert new.t == 1
    assert checked_move >= 8 and checked_bump >= 1


def test_walk_to_stairs_gives_reward_one(lit):
    state, _ = lit.reset(5, 7)
    total, steps = 0.0, 0
    while not state.done:
        rows, cols = np.nonzero(state.chars == ord(">"))
        dr, dc = int(np.sign(rows[0] - 4)), int(np.sign(cols[0] - 4))
        a = [DELTAS[n] for n in lit.action_names].index((dr, dc))
        state, _, r, done, info = lit.step(state, a)
        total, steps = total + r, steps + 1
    assert total == 1.0 and state.success and info["success"] == 1 and steps <= 4
    assert state.message == "There is a staircase down here."
    # Absorbing after done: no more reward.
    same, _, r, done, _ = lit.step(state, 0)
    assert same is state and r == 0.0 and done


def test_invalid_action_and_truncation():
    env = MiniHackRoom("dark", max_steps=3, num_tasks=10)
    try:
        state, _ = env.reset(0, 0)
        new, text, r, done, info = env.step(state, -1)
        assert info["invalid"] == 1 and new.t == 1 and new.pos == state.pos and text.startswith(INVALID_MESSAGE)
        new, _, _, done, info = env.step(new, 99)
        assert info["invalid"] == 1 and not done
        new, _, r, done, info = env.step(new, -1)
        assert done and info["truncated"] == 1 and r == 0.0 and not new.success
        with pytest.raises(ValueError, match="stale"):
            env.step(state, 0)
    finally:
        env.close()


def test_dark_room_shows_only_neighbours():
    env = MiniHackRoom("dark", num_tasks=10)
    try:
        state, _ = env.reset(0, 2)
        ys, xs = np.nonzero(state.chars != ord(" "))
        assert ys.min() >= 3 and ys.max() <= 5 and xs.min() >= 3 and xs.max() <= 5
    finally:
        env.close()
