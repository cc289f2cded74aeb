"""room with families=True: the family's goal depends on (pool seed, pool, family) only, every episode key
draws its own layout, evaluation layouts never occur among the layouts the training loop's keys draw, stone
bumps on a hand-built layout, vmapped == unbatched episodes, and the scripted solver that knows the goal."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.actor.evaluate import pool_episodes
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.config_checks import check_env_params
from crl_jax.envs import make
from crl_jax.envs.base import G_WALL
from crl_jax.envs.families import FamilyRoom, goal_cells, goal_solver
from crl_jax.envs.room import Room
from crl_jax.loop.iteration import sample_tasks, step_keys

F = 16
PARAMS = dict(dark=True, crop=0, legend=False, families=True, obstacles=3)


@pytest.fixture(scope="module")
def env():
    return make("room", num_tasks=F, **PARAMS)


@pytest.fixture(scope="module")
def reset(env):
    return jax.jit(jax.vmap(env.reset))


@pytest.fixture(scope="module")
def step(env):
    return jax.jit(env.step)


@pytest.fixture(scope="module")
def eval_reset(env):
    return jax.jit(jax.vmap(env.for_evaluation().reset))


def layouts(states):
    """[N, 2 + 2 + S*S] int: goal, start and stone cells of a batch of states."""
    lv = states.level
    return np.concatenate([np.asarray(lv.stairs), np.asarray(lv.start),
                           np.asarray(lv.stone).reshape(lv.stone.shape[0], -1)], 1)


def test_make_dispatch_and_config_check():
    assert type(make("room")) is Room and type(make("room", families=True)) is FamilyRoom
    check_env_params("room", PARAMS)  # families / obstacles are room parameters of the right types
    with pytest.raises(ValueError):
        make("room", families=True, traps=True)
    with pytest.raises(ValueError):
        make("room", families=True, obstacles=4)
    assert not make("room").episode_layouts and make("room", families=True).episode_layouts
    assert not make("room", families=True).query_observation


def test_goal_is_a_function_of_seed_pool_and_family_only(env, reset):
    keys = jax.random.split(jax.random.key(3), 8)
    goals = np.stack([np.asarray(reset(keys, jnp.full((8,), f, jnp.int32))[0].level.stairs) for f in range(4)])
    assert (goals == goals[:, :1]).all()  # one goal per family whatever the episode key
    other = make("room", num_tasks=F + 8, max_steps=20, **{**PARAMS, "obstacles": 1})  # pool size, steps, layout
    fams = jnp.arange(F)
    np.testing.assert_array_equal(jax.vmap(env.family_goal)(fams), jax.vmap(other.family_goal)(fams))
    np.testing.assert_array_equal(goals[:, 0], np.asarray(jax.vmap(env.family_goal)(jnp.arange(4))))
    reseeded = make("room", num_tasks=F, pool_seed=1, **PARAMS)
    held_out = make("room", pool="eval", num_tasks=F, **PARAMS)
    g = np.asarray(jax.vmap(env.family_goal)(fams))
    assert (g != np.asarray(jax.vmap(reseeded.family_goal)(fams))).any(1).sum() >= F // 2
    assert (g != np.asarray(jax.vmap(held_out.family_goal)(fams))).any(1).sum() >= F // 2
    assert np.asarray(goal_cells(5))[g[:, 0], g[:, 1]].all()  # never a corner
    assert len({tuple(x) for x in g}) >= 8  # the families spread over the room


def test_layouts_differ_across_episode_keys(reset):
    n = 64
    st, _ = reset(jax.random.split(jax.random.key(0), n), jnp.zeros((n,), jnp.int32))
    lay = layouts(st)
    assert len({tuple(r) for r in lay}) >= 48
    assert len({tuple(r) for r in lay[:, 2:4]}) >= 15  # start cells
    stone = np.asarray(st.level.stone)
    assert (stone.sum((1, 2)) == 3).all() and not stone[:, 0].any() and not stone[:, :, 0].any()
    assert not stone[:, 4].any() and not stone[:, :, 4].any()  # interior only
    idx = np.arange(n)
    start, goal = np.asarray(st.level.start), np.asarray(st.level.stairs)
    assert not stone[idx, start[:, 0], start[:, 1]].any() and not stone[idx, goal[:, 0], goal[:, 1]].any()
    assert (start != goal).any(1).all()


def test_heldin_eval_layouts_never_occur_in_training(env, reset, eval_reset):
    """Over the keys the loop uses: 2 seeds x 80 steps of the default 4 x 8 rollouts, against both pools'
    evaluation episodes (64 each), as `actor.evaluate` draws them."""
    rt = SimpleNamespace(cfg=SimpleNamespace(rollout=SimpleNamespace(groups=4, group_size=8)), env=env)
    tr_keys, tr_tasks = [], []
    for seed in (0, 1):
        run_key = jax.random.split(jax.random.key(seed), 3)[0]  # `init_state`'s k_run
        for step in range(80):
            state = SimpleNamespace(key=run_key, step=jnp.int32(step))
            tr_keys.append(episode_reset_keys(step_keys(state).roll, 32))
            tr_tasks.append(sample_tasks(rt, state))
    tr_keys, tr_tasks = jnp.concatenate(tr_keys), jnp.concatenate(tr_tasks)
    train = {tuple(r) for r in layouts(reset(tr_keys, tr_tasks)[0])}
    ev_env, tasks, key = pool_episodes(env, 64, heldout=False)
    assert ev_env.layouts == "eval" and (np.asarray(tasks) == np.arange(64) % F).all()
    ev_keys = episode_reset_keys(key, 64)
    heldin = {tuple(r) for r in layouts(eval_reset(ev_keys, tasks)[0])}
    assert len(heldin) >= 60 and not heldin & train
    # the key streams are disjoint too, and a training env never draws an evaluation layout, even at them
    kd = lambda k: {tuple(r) for r in np.asarray(jax.random.key_data(k))}  # noqa: E731
    assert not kd(ev_keys) & kd(tr_keys)
    at_eval_keys = {tuple(r) for r in layouts(reset(ev_keys, tasks)[0])}
    assert not at_eval_keys & heldin
    held_out_env, _, ho_key = pool_episodes(make("room", pool="eval", num_tasks=F, **PARAMS), 64, heldout=True)
    assert held_out_env.layouts == "eval" and held_out_env.pool == "eval"
    assert not kd(episode_reset_keys(ho_key, 64)) & kd(tr_keys)


def test_stone_bump_on_a_hand_built_layout(env, step):
    stone = jnp.zeros((5, 5), bool).at[1, 2].set(True)
    lv = env.layout_level(jnp.array([0, 2], jnp.int32), jnp.array([2, 2], jnp.int32), stone)
    st0 = env.init_state(lv, jax.random.key(0))
    assert int(env.observe(st0).grid[1, 2]) == G_WALL  # adjacent, so seen
    st, obs, r, done, _ = step(st0, 0)  # north: into the stone
    np.testing.assert_array_equal(st.pos, [2, 2])
    assert float(r) == 0.0 and not bool(done) and int(obs.message[0]) == env.msg_id("It's solid stone.")
    st, *_ = step(st, 4)  # northeast
    np.testing.assert_array_equal(st.pos, [1, 3])
    st, _, r, done, info = step(st, 7)  # northwest: the stairs
    assert float(r) == 1.0 and bool(done) and int(info["success"]) == 1 and int(st.t) == 3
    with jax.disable_jit():  # the same bump, eager
        eager, obs, *_ = env.step(st0, 0)
    np.testing.assert_array_equal(eager.pos, [2, 2])
    assert int(obs.message[0]) == env.msg_id("It's solid stone.")


def test_vmapped_equals_single_and_the_goal_solver(env, reset, step):
    n = 64
    keys = jax.random.split(jax.random.key(5), n)
    tasks = jnp.arange(n, dtype=jnp.int32) % F
    st, obs = reset(keys, tasks)
    st1, obs1 = env.reset(keys[3], tasks[3])
    np.testing.assert_array_equal(obs.grid[3], obs1.grid)
    np.testing.assert_array_equal(st.level.stone[3], st1.level.stone)

    @jax.jit
    def solve(st):
        def body(s, t):
            a = jax.vmap(lambda x, k: goal_solver(env, x, k))(s, jax.random.split(jax.random.fold_in(keys[0], t), n))
            return jax.vmap(env.step)(s, a)[0], a
        return jax.lax.scan(body, st, jnp.arange(20))

    end, acts = solve(st)
    assert float(end.success.mean()) >= 0.9
    one = st1
    for t in range(20):  # episode 3 alone (unbatched reset and steps) with the same moves
        one = step(one, acts[t, 3])[0]
    np.testing.assert_array_equal(one.pos, end.pos[3])
    assert bool(one.success) == bool(end.success[3])


def test_demo_preset_is_the_families_config():
    """`crl-jax demo --preset families` runs experiments/configs/families.yaml; the default preset changes nothing."""
    import os

    from crl_jax.config import load
    from crl_jax.infra.demo import preset

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ov, methods, seeds = preset("families")
    assert load(None, list(ov)) == load(os.path.join(root, "experiments", "configs", "families.yaml"))
    assert methods == ("crl", "grpo", "archive", "static_online") and seeds == 3
    assert preset("default") == ((), ("crl", "grpo"), 5)
    cfg = load(None, list(ov))
    assert cfg.env.params["families"] and cfg.env.num_train_tasks == 16 and cfg.eval.tasks == 64


def test_bank_replay_on_fresh_layouts_of_the_entry_family():
    """`bank_replay_success` on families: each entry's moves on `REPLAY_LAYOUTS` evaluation layouts of the family its
    key names. Family 0's entry is the goal solver's plan on the first replay layout (so it works there); family
    1's entry is family 0's plan too (keyed to family 1, whose goal differs); the share is their replays' mean."""
    from crl_jax import bank as bank_lib
    from crl_jax.actor.experience import query_from_observation
    from crl_jax.actor.replay import REPLAY_KEY, REPLAY_LAYOUTS, bank_replay_success, replay_plan
    from crl_jax.envs.actions import action_token_ids, tiny_tokenizer
    from crl_jax.envs.compact import compact_vocabulary, make_compact_renderer
    from crl_jax.models.embed import HashedNgramEmbedder

    env2 = make("room", num_tasks=2, **PARAMS)
    tok = tiny_tokenizer(env2.action_names, extra=compact_vocabulary(2, 2, 20, (5, 5)))
    ids = jnp.asarray(action_token_ids(env2, tok), jnp.int32)
    task_tok = jnp.array([[tok.extra_id("<L0>")], [tok.extra_id("<L1>")]], jnp.int32)
    rt = SimpleNamespace(env=env2, embedder=HashedNgramEmbedder(dim=16), renderer=make_compact_renderer(env2, tok),
                         train_task_tokens=task_tok, train_task_len=jnp.ones((2,), jnp.int32),
                         tiny=SimpleNamespace(action_ids=ids, row_ids=None))
    ev = env2.for_evaluation()
    layout_keys = [episode_reset_keys(jax.random.fold_in(jax.random.key(REPLAY_KEY), i), 2)
                   for i in range(REPLAY_LAYOUTS)]
    st, _ = ev.reset(layout_keys[0][0], 0)
    assert bool(ev.is_eval_layout(st.level))
    moves = []
    for t in range(20):  # the solver's plan on family 0's first replay layout
        if bool(st.done):
            break
        a = goal_solver(ev, st, jax.random.key(t))
        moves.append(int(ids[a]))
        st = ev.step(st, a)[0]
    assert bool(st.success)
    plan = jnp.zeros((20,), jnp.int32).at[: len(moves)].set(jnp.array(moves, jnp.int32))
    keys = query_from_observation(rt.embedder, task_tok, rt.train_task_len, None, None, with_obs=False)
    b = bank_lib.init(4, 20, 16)
    for f in (0, 1):
        b, _ = bank_lib.add(b, plan, len(moves), keys[f], 0, 0, -1)
    share = float(jax.jit(lambda bb: bank_replay_success(rt, bb))(b))
    ok = jax.jit(lambda t, k: replay_plan(ev, ids, t, plan, len(moves), k))
    expect = np.mean([[bool(ok(f, k[f])) for k in layout_keys] for f in (0, 1)])
    assert bool(ok(0, layout_keys[0][0])) and share == pytest.approx(expect) and share < 1.0
    assert float(keys[0] @ keys[1]) < 0.95  # the two families' queries are told apart


def test_a_fact_entry_replays_when_it_names_its_family_goal():
    """With the entry forms a FACT entry (`<r> <c>`) replays to success on every layout when it names its family's
    goal, and never otherwise: family 0's entry names family 0's goal (1.0), family 1's names family 0's goal too
    (0.0, the goals differ), a MOVES entry of invalid moves fails (0.0) -> share 1/3."""
    from crl_jax import bank as bank_lib
    from crl_jax.actor.experience import query_from_observation
    from crl_jax.actor.replay import bank_replay_success
    from crl_jax.envs.actions import action_token_ids, tiny_tokenizer
    from crl_jax.envs.compact import compact_vocabulary, make_compact_renderer
    from crl_jax.models.embed import HashedNgramEmbedder

    env2 = make("room", num_tasks=2, **PARAMS)
    tok = tiny_tokenizer(env2.action_names, extra=compact_vocabulary(2, 2, 20, (5, 5), forms=True))
    ren = make_compact_renderer(env2, tok)
    task_tok = jnp.array([[tok.extra_id("<L0>")], [tok.extra_id("<L1>")]], jnp.int32)
    rt = SimpleNamespace(env=env2, embedder=HashedNgramEmbedder(dim=16), renderer=ren,
                         train_task_tokens=task_tok, train_task_len=jnp.ones((2,), jnp.int32),
                         tiny=SimpleNamespace(action_ids=jnp.asarray(action_token_ids(env2, tok), jnp.int32),
                                              row_ids=jnp.asarray(ren.row_ids)))
    g0, g1 = (np.asarray(env2.family_goal(f)) for f in (0, 1))
    assert tuple(g0) != tuple(g1)
    fact0 = jnp.zeros((20,), jnp.int32).at[:2].set(jnp.array([ren.row_ids[g0[0]], ren.col_ids[g0[1]]], jnp.int32))
    keys = query_from_observation(rt.embedder, task_tok, rt.train_task_len, None, None, with_obs=False)
    b = bank_lib.init(4, 20, 16)
    for f in (0, 1):
        b, _ = bank_lib.add(b, fact0, 2, keys[f], 0, 0, -1)
    b, _ = bank_lib.add(b, jnp.full((20,), tok.eos_id, jnp.int32), 3, keys[0], 0, 0, -1)
    share = float(jax.jit(lambda bb: bank_replay_success(rt, bb))(b))
    assert share == pytest.approx(1 / 3)


def test_family_queries_tell_the_families_apart():
    """The family's query (its task token, no observation) at the config's key width: no two of 16 training
    families, nor a training and a held-out one, reach the similarity floor."""
    from crl_jax.actor.experience import query_from_observation
    from crl_jax.envs.actions import tiny_tokenizer
    from crl_jax.envs.compact import compact_vocabulary
    from crl_jax.loop.runtime import OPS
    from crl_jax.models.embed import HashedNgramEmbedder

    tok = tiny_tokenizer(make("room").action_names, extra=OPS + compact_vocabulary(F, F, 20, (5, 5)))
    ids = [tok.extra_id(f"<L{i}>") for i in range(F)] + [tok.extra_id(f"<E{i}>") for i in range(F)]
    k = np.asarray(query_from_observation(HashedNgramEmbedder(dim=64), jnp.array(ids)[:, None],
                                          jnp.ones((2 * F,), jnp.int32), None, None, with_obs=False))
    sim = k @ k.T
    np.testing.assert_allclose(np.diag(sim), 1.0, rtol=1e-5)
    assert (sim - 2 * np.eye(2 * F)).max() < 0.95
