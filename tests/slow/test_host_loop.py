"""The loop with a host-side environment (real MiniHack through its adapter) on a micro config.

One module-scoped Runtime: every test shares the compiled pieces (compile time dominates; marked slow).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("nle")  # the `envs` extra (MiniHack); installed in CI

from crl_jax import loop
from crl_jax.actor.rollout import build_prompt
from crl_jax.host import driver as host_loop
from crl_jax.host import play as host_play
from crl_jax.backends.host.env import HostRenderer
from crl_jax.config import ConfigError, load
from crl_jax.infra.metrics import ALL_COLUMNS
from crl_jax.loop.runtime import build

from _micro import HOST_MICRO as MICRO  # tests/_micro.py

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rt():
    old = host_play.TRACE_GUARD
    host_play.TRACE_GUARD = True  # every compiled piece raises if traced more than MAX_TRACES times
    chex.clear_trace_counter()
    host_loop.compiled.cache_clear()
    r = build(load(None, MICRO))
    yield r
    host_loop.compiled.cache_clear()
    host_play.TRACE_GUARD = old


@pytest.fixture(scope="module")
def two_steps(rt):
    """Two steps (step 2 evaluates: eval.every=2) twice from the same seed, and 1 + 1 steps resumed."""
    init = loop.init_state(rt, jax.random.key(0), rt.cfg)
    a = host_loop.run_steps(rt, init, 2, 2)
    b = host_loop.run_steps(rt, init, 2, 2)
    mid, m1 = host_loop.run_steps(rt, init, 1, 2)
    c, m2 = host_loop.run_steps(rt, mid, 1, 2)
    return a, b, (c, {k: np.concatenate([m1[k], m2[k]]) for k in m1})


def test_runtime_is_host(rt):
    assert host_loop.is_host(rt) and rt.env.is_host and isinstance(rt.renderer, HostRenderer)
    assert rt.env.action_names[:4] == ("north", "east", "south", "west") and rt.num_turns == 3
    assert rt.env.pool == "train" and rt.eval_env.pool == "eval"


def test_metrics_contract_finite_and_eval_schedule(rt, two_steps):
    (state, m), _, _ = two_steps
    # every metric the run folder's writer reads (metrics.csv columns) plus the 4 evaluation keys
    need = (set(ALL_COLUMNS) - {"step", "actor_loss", "extractor_loss"}) | set(loop.EVAL_KEYS) | {"actor/loss"}
    assert need <= set(m), need - set(m)
    assert all(v.shape == (2,) and v.dtype == np.float32 for v in m.values())
    assert int(state.step) == 2
    for k in ("success_all", "success_free", "actor/loss", "bank_size", "episode_turns", "env_steps"):
        assert np.all(np.isfinite(m[k])), k
    # 4 episodes x <= 3 turns per step; every episode plays >= 1 turn
    assert 4 <= m["env_steps"][0] <= 12 and m["env_steps"][0] < m["env_steps"][1] <= 24
    for k in loop.EVAL_KEYS:  # evaluation at step 2 only
        assert np.isnan(m[k][0]) and 0.0 <= m[k][1] <= 1.0, k
    assert m["bank_size"][-1] > 0  # the extractor distilled the episodes


def test_deterministic_and_resumable(two_steps):
    (sa, ma), (_sb, mb), (sc, mc) = two_steps
    for k in ma:
        np.testing.assert_array_equal(ma[k], mb[k], err_msg=k)
        np.testing.assert_array_equal(ma[k], mc[k], err_msg=k)  # 1 step + 1 resumed == 2 straight
    for x, y in zip(jax.tree.leaves(sa.actor.params), jax.tree.leaves(sc.actor.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_compiled_once(rt, two_steps):
    """Retrace guard: after 4 runs (3 evaluations) each piece compiled once (the turn function once per
    temperature, the evaluation query once per pool); TRACE_GUARD would have raised otherwise."""
    fns = host_loop.compiled(rt)
    for f in (fns.begin, fns.prepare, fns.finish, fns.turn(1.0), fns.turn(0.0), fns.eval_query(False),
              fns.eval_query(True)):
        assert f._cache_size() == 1


class RecordingGames(host_loop.Games):
    """Games that remember the observation tokens of every turn."""

    def reset(self, seeds, tasks):
        obs, ol = super().reset(seeds, tasks)
        self.seen = [(obs, ol, list(self.texts))]
        return obs, ol

    def step(self, actions):
        obs, ol, active = super().step(actions)
        self.seen.append((obs, ol, list(self.texts)))
        return obs, ol, active


def test_host_prompts_equal_build_prompt_and_free_rows_see_no_bank(rt, two_steps):
    (state, _), _, _ = two_steps  # after 2 steps: the bank holds entries, retrieval is on
    assert int(np.asarray(state.bank.lengths > 0).sum()) > 0
    fns = host_loop.compiled(rt)
    games = RecordingGames(rt.env, rt.renderer, 4)
    tasks, kd, k_play = fns.begin(state)
    obs, ol = games.reset(host_loop.seeds_from_key_data(kd), np.asarray(tasks))
    p = fns.prepare(state, obs, ol)
    assert list(np.asarray(p.guided)) == [True, False, True, False]  # K/2 guided, K/2 free per group
    assert np.asarray(p.has_exp)[0] and not np.asarray(p.has_exp)[[1, 3]].any()
    ep = host_loop.play_host(rt, fns.turn(1.0), games, state.actor.params, k_play, task_tokens=p.task_tokens,
                             task_len=p.task_len, exp=p.exp, exp_len=p.exp_len, has_exp=p.has_exp, obs=obs, obs_len=ol)
    tok = rt.tokenizer
    T = rt.num_turns
    obs_nt = np.stack([games.seen[min(t, len(games.seen) - 1)][0] for t in range(T)], 1)  # [N, T, Lo]
    len_nt = np.stack([games.seen[min(t, len(games.seen) - 1)][1] for t in range(T)], 1)  # [N, T]

    @jax.jit
    def expected(has_exp):  # build_prompt for every (episode, turn), one compiled call
        per_turn = lambda a, b, c, d, e, o, ol: jax.vmap(
            lambda t, oo, ll: build_prompt(a, b, c, d, e, rt.tiny.seg, t, oo, ll, turn_marker=True))(jnp.arange(T), o, ol)
        return jax.vmap(per_turn)(p.task_tokens, p.task_len, p.exp, p.exp_len, has_exp, obs_nt, len_nt)

    want, wl = expected(p.has_exp)
    bare, _ = expected(jnp.zeros_like(p.has_exp))
    for n in range(4):
        for t in range(int(ep.turns[n])):
            o, olen, texts = games.seen[t]
            assert tok.decode(o[n, : olen[n]].tolist()) == texts[n]  # the adapter's own text, tokenised
            assert int(ep.prompt_len[n, t]) == int(wl[n, t])
            np.testing.assert_array_equal(np.asarray(ep.prompts[n, t]), np.asarray(want[n, t]))
            text = tok.decode(np.asarray(ep.prompts[n, t, : int(wl[n, t])]).tolist())
            assert ("Tip: " in text) == bool(p.has_exp[n]), text  # free rows: no experience segment
            if not p.guided[n]:  # the free prompt is exactly the prompt without any experience
                np.testing.assert_array_equal(np.asarray(ep.prompts[n, t]), np.asarray(bare[n, t]))
    # absorbing: turns after the end are inactive with zero log-prob
    assert np.all(np.asarray(ep.logp)[~np.asarray(ep.active)] == 0.0)
    assert np.all(np.asarray(ep.active).sum(1) == np.asarray(ep.turns))


def test_host_turns_in_blocks_play_what_the_one_batch_turns_play(rt, two_steps):
    """`rollout.turn_block=2` on the host driver (the turn's forward over the unfinished games, 2 rows at a time,
    each block as wide as its longest prompt) plays the same games as the one-batch turn: same prompts, turns and
    played actions under one key at temperature 1, behaviour log-probs equal to ~1e-6."""
    (state, _), _, _ = two_steps
    fns = host_loop.compiled(rt)
    blocked = host_loop.compiled(build(load(None, MICRO + ["rollout.turn_block=2"])))
    tasks, kd, k_play = fns.begin(state)
    eps = []
    for turn in (fns.turn(1.0), blocked.turn(1.0)):
        games = host_loop.Games(rt.env, rt.renderer, 4)
        obs, ol = games.reset(host_loop.seeds_from_key_data(kd), np.asarray(tasks))
        p = fns.prepare(state, obs, ol)
        eps.append(host_loop.play_host(rt, turn, games, state.actor.params, k_play, task_tokens=p.task_tokens,
                                       task_len=p.task_len, exp=p.exp, exp_len=p.exp_len, has_exp=p.has_exp,
                                       obs=obs, obs_len=ol))
    whole, blocks = eps
    for f in ("prompts", "prompt_len", "active", "turns", "reward", "success"):
        np.testing.assert_array_equal(getattr(whole, f), getattr(blocks, f), err_msg=f)
    act = np.asarray(whole.active)
    np.testing.assert_array_equal(np.asarray(blocks.actions)[act], np.asarray(whole.actions)[act])
    np.testing.assert_allclose(blocks.logp, whole.logp, atol=1e-5)
    assert int(np.asarray(whole.prompt_len).max()) < whole.prompts.shape[2]  # blocks narrower than the packed width


def test_text_adapters_rejected_with_a_clear_message():
    with pytest.raises(ConfigError, match="env.name='textworld'"):
        build(load(None, ["env.name=textworld", "env.params={}"]))


def test_host_renderer_truncates_and_drops_legend():
    from crl_jax.text.tokenizers import ByteTokenizer

    r = HostRenderer(ByteTokenizer(), max_len=6, legend=False)
    toks, n = r("ab\n.@.\nLegend: @: you")
    assert int(n) == 6 and ByteTokenizer().decode(toks[:6].tolist()) == "ab\n.@." and r.truncated == 0
    toks, n = r("abcdefgh")
    assert int(n) == 6 and r.truncated == 1
