"""maze, keyroom, sokoban, frozen_lake: exact transitions on hand-built levels."""

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs import make
from crl_jax.envs.keyroom import KeyLevel
from crl_jax.envs.maze import MazeLevel
from crl_jax.envs.frozen_lake import LakeLevel
from crl_jax.envs.sokoban import SokoLevel, bfs_solve

N, E, S, W, NE, SE, SW, NW = range(8)


def run(env, st, actions):
    """Jitted steps; returns the list of (state, reward, done, message-0 text)."""
    step = jax.jit(env.step)
    out = []
    for a in actions:
        st, obs, r, d, info = step(st, a)
        out.append((st, float(r), bool(d), env.messages[int(obs.message[0])]))
    return out


def test_maze_moves_walls_diagonals_stairs():
    env = make("maze")
    walls = np.ones((9, 9), bool)
    for r, c in [(1, 1), (1, 2), (1, 3), (2, 3), (3, 3), (2, 4)]:
        walls[r, c] = False
    lv = MazeLevel(walls=jnp.asarray(walls), start=jnp.array([1, 1]), stairs=jnp.array([3, 3]))
    st = env.init_state(lv, jax.random.key(0))
    steps = run(env, st, [N, E, SE, E, NE, SW, S])
    pos = [tuple(np.asarray(s.pos).tolist()) for s, *_ in steps]
    assert pos == [(1, 1), (1, 2), (2, 3), (2, 4), (2, 4), (3, 3), (3, 3)]
    assert steps[0][3] == "It's a wall." and steps[4][3] == "It's a wall."
    assert steps[5][1:] == (1.0, True, "There is a staircase down here.")
    assert steps[6][1:3] == (0.0, True)  # absorbing
    text = env.render(steps[1][0])
    assert text.split("\n")[2] == "#<@.#####" and "Legend: @: you, .: floor, >: stairs down, <: stairs up, #: wall" in text


def test_keyroom_key_door_and_stairs():
    env = make("keyroom")
    walls = np.zeros((7, 7), bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    for r, c in [(3, 1), (3, 3), (1, 3), (2, 3)]:  # the sub-room's walls; (3, 2) is the door
        walls[r, c] = True
    lv = KeyLevel(walls=jnp.asarray(walls), door=jnp.array([3, 2]), stairs=jnp.array([1, 1]),
                  key_pos=jnp.array([4, 4]), start=jnp.array([4, 3]))
    st = env.init_state(lv, jax.random.key(0))
    acts = [9, 8, E, 8, 9, W, W, N, 9, NW, N, NW, N, NW]
    steps = run(env, st, acts)
    msgs = [m for *_, m in steps]
    assert msgs == ["You don't have anything to apply.", "There is nothing here to pick up.", "You see here a key.",
                    "You pick up the key.", "There is no locked door next to you.", "", "", "This door is locked.",
                    "You unlock and open the door.", "It's a wall.", "",
                    "You can't move diagonally out of a doorway.", "", "There is a staircase down here."]
    pos = [tuple(np.asarray(s.pos).tolist()) for s, *_ in steps]
    assert pos[7] == (4, 2) and pos[10] == (3, 2) and pos[12] == (2, 2) and pos[13] == (1, 1)
    assert [r for _, r, _, _ in steps] == [0.0] * 13 + [1.0] and steps[-1][2]
    assert bool(steps[3][0].has_key) and not bool(steps[7][0].door_open) and bool(steps[8][0].door_open)
    # Diagonally into the open doorway is refused too.
    st2 = steps[8][0].replace(pos=jnp.array([4, 3]))
    (s, _, _, m), = run(env, st2, [NW])
    assert m == "You can't move diagonally into a doorway." and tuple(np.asarray(s.pos).tolist()) == (4, 3)
    text = env.render(steps[8][0])
    assert "|" in text and "|: open door" in text and "(" not in text.split("\n", 1)[1].split("Legend")[0]


def test_sokoban_pushes():
    env = make("sokoban")
    walls = np.zeros((8, 8), bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    lv = SokoLevel(walls=jnp.asarray(walls), targets=jnp.array([[3, 4], [5, 5]]), boxes=jnp.array([[3, 3], [5, 5]]),
                   start=jnp.array([3, 2]))
    st = env.init_state(lv, jax.random.key(0))
    assert bfs_solve(walls, lv.boxes, lv.targets, lv.start) == 1
    (s, r, d, m), = run(env, st, [E])
    assert (r, d, m) == (1.0, True, "Both boulders are on their targets!")
    np.testing.assert_array_equal(s.boxes, [[3, 4], [5, 5]])
    np.testing.assert_array_equal(s.pos, [3, 3])
    # A boulder against the wall or against another boulder does not move; a free push does.
    lv2 = lv.replace(boxes=jnp.array([[1, 3], [3, 4]]), start=jnp.array([2, 3]))
    st2 = env.init_state(lv2, jax.random.key(0))
    steps = run(env, st2, [N, S, E, E])
    assert [m for *_, m in steps] == ["You try to move the boulder, but in vain.", "",
                                      "With great effort you move the boulder.", "With great effort you move the boulder."]
    np.testing.assert_array_equal(steps[0][0].pos, [2, 3])
    np.testing.assert_array_equal(steps[2][0].boxes, [[1, 3], [3, 5]])
    np.testing.assert_array_equal(steps[3][0].boxes, [[1, 3], [3, 6]])  # pushed again, up to the wall
    np.testing.assert_array_equal(steps[3][0].pos, [3, 5])
    assert "0: boulder" in env.render(steps[3][0]) and steps[3][1] == 0.0
    (s, r, d, m), = run(env, steps[3][0], [E])
    assert m == "You try to move the boulder, but in vain." and tuple(np.asarray(s.pos).tolist()) == (3, 5)
    lv3 = lv.replace(boxes=jnp.array([[3, 3], [3, 4]]))
    (s, r, d, m), = run(env, env.init_state(lv3, jax.random.key(0)), [E])
    assert m == "You try to move the boulder, but in vain." and not d


def test_frozen_lake_exact_and_slippery():
    holes = np.zeros((6, 6), bool)
    holes[0, 2] = holes[1, 1] = True
    lv = LakeLevel(holes=jnp.asarray(holes))
    env = make("frozen_lake")
    st = env.init_state(lv, jax.random.key(0))
    steps = run(env, st, [N, W, E, S])
    assert [tuple(np.asarray(s.pos).tolist()) for s, *_ in steps] == [(0, 0), (0, 0), (0, 1), (1, 1)]
    assert steps[0][3] == "You cannot go that way." and steps[3][1:] == (0.0, True, "You fall through a hole in the ice!")
    (s, r, d, m), = run(env, st.replace(pos=jnp.array([5, 4])), [E])
    assert (r, d, m) == (1.0, True, "You reach the goal!")
    # Slippery: the direction is the intended one rotated by floor(3u) - 1, u drawn from the step key.
    slip = make("frozen_lake", slippery=True)
    keys = jax.random.split(jax.random.key(5), 48)
    start = slip.init_state(lv, jax.random.key(0)).replace(pos=jnp.array([3, 3]))
    sts = jax.jit(jax.vmap(slip.step, in_axes=(0, None)))(jax.vmap(lambda k: start.replace(key=k))(keys), E)[0]
    u = jax.vmap(lambda k: jax.random.uniform(jax.random.split(k)[1]))(keys)
    rot = np.minimum(np.floor(np.asarray(u) * 3).astype(int), 2) - 1
    want = np.array([[3, 3]]) + np.array([[-1, 0], [0, 1], [1, 0]])[rot + 1]  # north / east / south
    np.testing.assert_array_equal(np.asarray(sts.pos), want)
    assert set(rot.tolist()) == {-1, 0, 1}
