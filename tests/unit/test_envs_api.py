"""API invariants of every env (vmap over 256 keys, retrace guard, same key -> same episode, absorbing
done, eager == jit, disjoint pools, solvable / reachable levels) and rendering to tokens on device
(decode(tokens) == render(state) for the byte tokenizer and a trained byte-level BPE)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from crl_jax.envs import make
from crl_jax.envs.base import Obs
from crl_jax.envs.render import make_token_renderer
from crl_jax.envs.sokoban import bfs_solve
from crl_jax.text.tokenizers import ByteTokenizer, HFTokenizer

ENVS = {
    "room": dict(dark=True, traps=True, monster=True),
    "maze": {},
    "keyroom": {},
    "sokoban": {},
    "frozen_lake": dict(slippery=True),
}
B = 256


def _rollout_fn(env):
    def rollout(key, task):
        k0, k1 = jax.random.split(key)
        st, obs = env.reset(k0, task)

        def body(st, k):
            a = jax.random.randint(k, (), -1, env.num_actions)
            st, obs, r, d, info = env.step(st, a)
            return st, (obs, r, d, info)

        st_end, (obs_t, r, d, info) = jax.lax.scan(body, st, jax.random.split(k1, env.max_steps))
        return st_end, obs, obs_t, r, d, info

    @jax.jit
    @chex.assert_max_traces(n=1)
    def vrollout(keys, tasks):
        return jax.vmap(rollout)(keys, tasks)

    return vrollout


@pytest.fixture(scope="module", params=list(ENVS))
def case(request):
    name = request.param
    env = make(name, num_tasks=B, **ENVS[name])
    chex.clear_trace_counter()
    vrollout = _rollout_fn(env)
    keys = jax.random.split(jax.random.key(11), B)
    out = vrollout(keys, jnp.arange(B))
    return name, env, vrollout, keys, out


def test_vmap_absorbing_same_key(case):
    name, env, vrollout, keys, (st, obs0, obs_t, r, d, info) = case
    t = env.max_steps
    chex.assert_shape(r, (B, t))
    assert np.all(np.asarray(d[:, -1])) and np.all(np.asarray(st.t) <= t)
    ret = np.asarray(r.sum(1))
    assert set(np.unique(ret)) <= {0.0, 1.0}
    np.testing.assert_array_equal(ret, np.asarray(info["success"][:, -1]))
    # Once done, always done, and no reward afterwards.
    dd = np.asarray(d)
    assert np.all(dd[:, 1:] >= dd[:, :-1])
    first = dd.argmax(1)
    assert np.all(np.asarray(r)[np.arange(t)[None, :] > first[:, None]] == 0)
    # Invalid actions were counted only while the episode was live.
    inv = np.asarray(info["invalid"])
    assert inv.sum() > 0 and np.all(inv[np.arange(t)[None, :] > first[:, None]] == 0)
    # Same key and task -> same episode whatever the batch position; no retrace.
    perm = jnp.arange(B)[::-1]
    st2, *_ = vrollout(keys[perm], perm)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[perm], st), st2)


@pytest.mark.parametrize("name", [n for n in ENVS if n != "room"])  # room: see test_envs_room.py
def test_eager_equals_jit(name):
    env = make(name, **ENVS[name])
    s, _ = jax.jit(env.reset)(jax.random.key(3), 5)
    chex.assert_trees_all_equal(env.step(s, 1), jax.jit(env.step)(s, 1))


def test_pools_disjoint_and_levels_valid(case):
    name, env, *_ = case
    ev = make(name, pool="eval", num_tasks=B, **ENVS[name])

    @jax.jit
    def levels(tasks):
        return jax.vmap(env.task_level)(tasks), jax.vmap(ev.task_level)(tasks)

    lt, le = levels(jnp.arange(200))
    ct = {tuple(c) for c in np.asarray(jax.vmap(env.level_code)(lt))}
    ce = {tuple(c) for c in np.asarray(jax.vmap(ev.level_code)(le))}
    assert len(ct) > 150 and len(ce) > 150, (len(ct), len(ce))  # different tasks -> different levels
    assert not ct & ce
    if name == "sokoban":  # every generated level is solvable (BFS), none is solved already
        for i in range(200):
            lv = jax.tree.map(lambda x: np.asarray(x[i]), lt)
            n = bfs_solve(lv.walls, lv.boxes, lv.targets, lv.start)
            assert n is not None and n > 0, i
    if name == "room":  # an open room: the stairs are reachable iff they are in it, away from the start
        st_, sd = np.asarray(lt.start), np.asarray(lt.stairs)
        assert np.all((sd >= 0) & (sd < 5)) and np.all(np.any(st_ != sd, axis=1))
    if name == "maze":  # the stairs are reachable from the start
        for i in range(200):
            walls, s, g = (np.asarray(x[i]) for x in (lt.walls, lt.start, lt.stairs))
            seen, todo = {tuple(s)}, [tuple(s)]
            while todo:
                p = todo.pop()
                for dr in (-1, 0, 1):
                    for dc in (-1, 0, 1):
                        q = (p[0] + dr, p[1] + dc)
                        if 0 <= q[0] < 9 and 0 <= q[1] < 9 and not walls[q] and q not in seen:
                            seen.add(q)
                            todo.append(q)
            assert tuple(g) in seen and tuple(g) != tuple(s)


def _bpe(texts, vocab=500):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok, eos_id=0, pad_id=0)


def test_token_rendering_decodes_to_render(case):
    name, env, _, _, (st, obs0, obs_t, r, d, info) = case
    # A few observations: first, after 3 turns, and the last one of some episodes.
    pick = [0, 1, 2, 3]
    obs_list = [jax.tree.map(lambda x: x[i], obs0) for i in pick]
    obs_list += [jax.tree.map(lambda x: x[i, j], obs_t) for i in pick for j in (2, env.max_steps - 1)]
    texts = [env.render(o) for o in obs_list]
    assert env.render(jax.tree.map(lambda x: x[0], st)) == env.render(jax.tree.map(lambda x: x[0, -1], obs_t))
    batch = jax.tree.map(lambda *xs: jnp.stack(xs), *obs_list)
    bpe = _bpe(texts * 4)
    assert len(bpe.encode(texts[0])) < len(texts[0]) // 2  # merges span several map cells
    for tok in (ByteTokenizer(), bpe):
        rend = make_token_renderer(env, tok)
        toks, lens = jax.jit(jax.vmap(rend))(batch)
        chex.assert_shape(toks, (len(obs_list), rend.max_len))
        for k, text in enumerate(texts):
            n = int(lens[k])
            assert tok.decode(np.asarray(toks[k, :n]).tolist()) == text
            assert np.all(np.asarray(toks[k, n:]) == tok.pad_id)
            if isinstance(tok, ByteTokenizer):
                assert n == len(text.encode())
    assert isinstance(obs_list[0], Obs) and texts[0].split("\n")[-1].startswith("Legend: @: you")
