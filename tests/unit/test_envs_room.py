"""room: exact transitions on hand-built levels, jit == eager, invalid actions, truncation, and the
scripted explorer (vmap / retrace / pools / rendering for every env: test_envs_api.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.envs import make
from crl_jax.envs.base import DIRS
from crl_jax.envs.room import NM, RoomLevel, _tmsg
from crl_jax.envs.scripted import explorer_policy

def level(start, stairs, trap=(-1, -1), kind=0, mons=(), hp=(1, 1)):
    pos = np.full((NM, 2), -1, np.int32)
    alive = np.zeros(NM, bool)
    for i, m in enumerate(mons):
        pos[i], alive[i] = m, True
    return RoomLevel(start=jnp.array(start, jnp.int32), stairs=jnp.array(stairs, jnp.int32),
                     trap=jnp.array(trap, jnp.int32), mon_kind=jnp.int32(kind), mon_pos=jnp.asarray(pos),
                     mon_alive=jnp.asarray(alive), mon_hp=jnp.where(jnp.asarray(alive), jnp.array(hp), 0))


# One lit env with every feature compiled once for all hand-built layouts (trap at (-1, -1) and no live
# monster make it a plain room).
FULL = make("room", traps=True, monster=True, max_steps=4)
VSTEP = jax.jit(jax.vmap(FULL.step, in_axes=(0, None)))


@pytest.fixture(scope="module")
def lit():
    return FULL


@pytest.fixture(scope="module")
def step():
    return jax.jit(FULL.step)


def batch(st, n, seed):
    """`st` repeated n times with different dynamics keys."""
    return jax.vmap(lambda k: st.replace(key=k))(jax.random.split(jax.random.key(seed), n))


def test_every_direction_and_stone(lit, step):
    st0 = lit.init_state(level((2, 2), (4, 0)), jax.random.key(0))
    for a, d in enumerate(DIRS):
        st, _, r, done, info = step(st0, a)
        np.testing.assert_array_equal(st.pos, np.array([2, 2]) + d)
        assert float(r) == 0.0 and not bool(done) and int(st.t) == 1 and int(info["invalid"]) == 0
    # Corner: north, west and northwest are stone; the agent stays and is told so.
    corner = lit.init_state(level((0, 0), (4, 4)), jax.random.key(0))
    for a in (0, 3, 7):
        st, obs, r, done, _ = step(corner, a)
        np.testing.assert_array_equal(st.pos, [0, 0])
        assert int(obs.message[0]) == lit.msg_id("It's solid stone.")
    st, *_ = step(corner, 5)
    np.testing.assert_array_equal(st.pos, [1, 1])


def test_stairs_reward_and_absorbing(lit, step):
    st = lit.init_state(level((1, 1), (0, 0)), jax.random.key(0))
    st, obs, r, done, info = step(st, 7)  # northwest onto the stairs
    assert float(r) == 1.0 and bool(done) and int(info["success"]) == 1
    assert lit.render(st).startswith("There is a staircase down here.\n")
    st2, _, r2, done2, info2 = step(st, 2)
    chex.assert_trees_all_equal(st, st2)
    assert float(r2) == 0.0 and bool(done2) and int(info2["success"]) == 1 and int(info2["truncated"]) == 0


def test_invalid_action_and_truncation(lit, step):
    st = lit.init_state(level((2, 2), (4, 4)), jax.random.key(0))
    st1, obs, r, done, info = step(st, -1)
    assert int(info["invalid"]) == 1 and int(st1.t) == 1 and not bool(done)
    np.testing.assert_array_equal(st1.pos, st.pos)
    chex.assert_trees_all_equal(st1.key, st.key)
    assert int(obs.message[0]) == 1 and "That is not a valid action." in lit.render(st1)
    for _ in range(2):
        st1, _, r, done, info = step(st1, 0)
    assert not bool(done)
    st1, _, r, done, info = step(st1, 99)  # 4th turn, out-of-range action: invalid, truncates
    assert bool(done) and int(info["truncated"]) == 1 and int(info["invalid"]) == 1 and float(r) == 0.0
    assert int(info["success"]) == 0


def test_teleport_trap():
    env = FULL
    st0 = env.init_state(level((2, 2), (0, 0), trap=(2, 3)), jax.random.key(0))
    sts, obs, r, done, _ = VSTEP(batch(st0, 256, 1), 1)
    pos = np.asarray(sts.pos)
    assert not np.any(np.all(pos == [2, 3], axis=1))  # never back onto the trap
    assert len({tuple(p) for p in pos}) >= 20  # uniform over 24 cells (incl. start and stairs)
    assert np.all(np.asarray(sts.trap_seen))
    hit_stairs = np.all(pos == [0, 0], axis=1)
    np.testing.assert_array_equal(np.asarray(done), hit_stairs)
    np.testing.assert_array_equal(np.asarray(r), hit_stairs.astype(np.float32))
    one = jax.tree.map(lambda x: x[0], sts)
    assert "^" in env.render(one) and "^: teleportation trap" in env.render(one)


def test_monster_attack_and_kill():
    env = FULL
    # A newt (kind 0, hp 1) east of the agent: moving east attacks it.
    st0 = env.init_state(level((2, 2), (0, 0), kind=0, mons=[(2, 3)], hp=(1, 1)), jax.random.key(0))
    sts, obs, *_ = VSTEP(batch(st0, 64, 2), 1)
    killed = ~np.asarray(sts.mon_alive[:, 0])
    assert 0.75 < killed.mean() < 1.0  # hit prob 0.9, any hit kills a 1-hp newt
    np.testing.assert_array_equal(np.asarray(sts.pos), np.tile([2, 2], (64, 1)))  # attacking is not moving
    np.testing.assert_array_equal(np.asarray(obs.message[:, 0]),
                                  np.where(killed, int(_tmsg(2, 0)), int(_tmsg(1, 0))))
    assert env.messages[int(_tmsg(2, 0))] == "You kill the newt!"


def test_lichen_sticks_and_monster_can_kill(step):
    env = FULL
    # Lichen (kind 3) adjacent and already stuck: a move away fails with the NetHack message.
    st = env.init_state(level((2, 2), (0, 0), kind=3, mons=[(2, 3)], hp=(4, 4)), jax.random.key(0))
    st = st.replace(stuck=jnp.bool_(True))
    st1, obs, *_ = step(st, 3)
    np.testing.assert_array_equal(st1.pos, [2, 2])
    assert env.messages[int(obs.message[0])] == "You cannot escape from the lichen!"
    # A jackal next to an agent with 1 hp: over many keys, some episodes end in death (reward 0).
    st = env.init_state(level((2, 2), (0, 0), kind=1, mons=[(3, 3)], hp=(4, 4)), jax.random.key(0))
    st = st.replace(hp=jnp.int32(1))
    sts, obs, r, done, info = VSTEP(batch(st, 128, 3), 1)
    died = np.asarray(sts.hp) <= 0
    assert 0.3 < died.mean() < 0.8  # acts w.p. 0.75, hits w.p. 0.75
    np.testing.assert_array_equal(np.asarray(done), died)
    assert np.all(np.asarray(r) == 0) and np.all(np.asarray(info["success"]) == 0)
    assert {env.messages[int(m)] for m in np.asarray(obs.message[died, 1])} == {"You die..."}


def test_dark_room_visibility():
    env = make("room", dark=True, monster=True, crop=0)
    st = env.init_state(level((0, 0), (4, 4), kind=0, mons=[(2, 2)], hp=(4, 4)), jax.random.key(0))
    text = env.render(st)
    assert text.split("\n")[1:3] == ["@.", ".."]  # only the 8 neighbours (3 in the corner) are seen
    assert ":" not in text.split("Legend")[0]  # the newt two cells away is not drawn
    st = st.replace(pos=jnp.array([1, 1]), seen=st.seen | env._visible(jnp.array([1, 1])))
    rows = env.render(st).split("\n")[1:4]
    assert rows == ["<..", ".@.", "..:"]  # start drawn as `<`, the adjacent newt is drawn
    assert env.render(st).endswith("Legend: @: you, .: floor, <: stairs up, :: newt")


def test_eager_equals_jit(step):
    key = jax.random.key(7)
    s_e, o_e = FULL.reset(key, 7)
    s_j, o_j = jax.jit(FULL.reset)(key, 7)
    chex.assert_trees_all_equal((s_e, o_e), (s_j, o_j))
    for a in (1, -1):
        s_e, o_e, r_e, d_e, i_e = FULL.step(s_e, a)
        s_j, o_j, r_j, d_j, i_j = step(s_j, a)
        chex.assert_trees_all_equal((s_e, o_e, r_e, d_e, i_e), (s_j, o_j, r_j, d_j, i_j))


@pytest.mark.parametrize("dark,min_rate", [(False, 0.97), (True, 0.8)])
def test_scripted_explorer_succeeds(dark, min_rate):
    env = make("room", dark=dark, num_tasks=512)

    def episode(key, task):
        k0, k1 = jax.random.split(key)
        st, obs = env.reset(k0, task)

        def body(c, k):
            st, obs, _, _, _ = env.step(c[0], explorer_policy(c[1], k))
            return (st, obs), None

        (st, _), _ = jax.lax.scan(body, (st, obs), jax.random.split(k1, env.max_steps))
        return st.success

    succ = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(4), 256), jnp.arange(256))
    assert float(succ.mean()) >= min_rate
