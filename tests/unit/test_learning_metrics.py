"""The metrics that show whether the extractor learns, and the `archive` method's bank writes, on literal data."""

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as bank_lib
from crl_jax.actor.replay import entry_levels, replay_plan, replay_share
from crl_jax.config import ConfigError, load
from crl_jax.extractor.archive import archive, archive_entries
from crl_jax.extractor.distill import op_entropy, return_logprob
from crl_jax.loop import MethodFlags
from crl_jax.loop.diagnostics import op_rates, positive_credit_share
from crl_jax.token_draw import sample_logits

JIT = [False, True]


def _maybe_jit(fn, jit):
    return jax.jit(fn) if jit else fn


@pytest.mark.parametrize("jit", JIT)
def test_op_rates_split_by_outcome_literal_counts(jit):
    # episodes 0-2 succeed, 3-6 fail, 7 succeeds but is not distilled
    success = jnp.array([1, 1, 1, 0, 0, 0, 0, 1])
    mask = jnp.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
    adds = jnp.array([1, 0, 1, 1, 1, 0, 0, 1])
    updates = jnp.array([0, 1, 0, 0, 0, 1, 0, 0])
    r = _maybe_jit(op_rates, jit)(adds, updates, success, mask)
    assert float(r["ops_add_rate_success"]) == pytest.approx(2 / 3)
    assert float(r["ops_update_rate_success"]) == pytest.approx(1 / 3)
    assert float(r["ops_add_rate_fail"]) == pytest.approx(2 / 4)
    assert float(r["ops_update_rate_fail"]) == pytest.approx(1 / 4)
    none_failed = _maybe_jit(op_rates, jit)(adds, updates, jnp.ones(8, int), mask)
    assert np.isnan(float(none_failed["ops_add_rate_fail"]))
    assert float(none_failed["ops_add_rate_success"]) == pytest.approx(4 / 7)


@pytest.mark.parametrize("jit", JIT)
def test_positive_credit_share_literal(jit):
    bank = bank_lib.init(4, 2, 2).replace(total_credit_sum=jnp.array([2.0, -1.0, 0.0, 1.0]))
    slots = jnp.array([0, 1, 2, 3, -1, 0])
    has = jnp.array([1, 1, 1, 1, 0, 0], bool)
    assert float(_maybe_jit(positive_credit_share, jit)(bank, slots, has)) == 0.5
    assert np.isnan(float(positive_credit_share(bank, slots, jnp.zeros(6, bool))))


@pytest.mark.parametrize("jit", JIT)
def test_op_entropy_literal(jit):
    op_ids = jnp.array([3, 4, 5])
    logits = jnp.array([[9.0, 9.0, 9.0, 1.0, 1.0, 1.0],  # uniform over the ops: log 3
                        [0.0, 0.0, 0.0, 50.0, 0.0, 0.0]])  # one op: 0
    fn = _maybe_jit(lambda lg, m: op_entropy(lg, op_ids, 1.0, m), jit)
    assert float(fn(logits, jnp.array([True, False]))) == pytest.approx(np.log(3), abs=1e-6)
    assert float(fn(logits, jnp.array([False, True]))) == pytest.approx(0.0, abs=1e-6)
    assert float(fn(logits, jnp.array([True, True]))) == pytest.approx(np.log(3) / 2, abs=1e-6)
    assert np.isnan(float(fn(logits, jnp.array([False, False]))))


@pytest.mark.parametrize("jit", JIT)
def test_return_logprob_literal_and_the_samplers(jit):
    """The op tokens 1, 2, 3 allowed with weights 1, 2, 3: <RETURN> (token 3) has 3/6 at temperature 1,
    0.7 * 0.5 + 0.3 / 3 = 0.45 mixed with the uniform by 0.3, sqrt(3) / (1 + sqrt(2) + sqrt(3)) at temperature 2;
    token 4 (disallowed) does not count. Where the sampler draws <RETURN>, its log-prob is this one."""
    allowed = jnp.array([False, True, True, True, False])
    logits = jnp.log(jnp.array([[5.0, 1.0, 2.0, 3.0, 100.0]]))
    fn = lambda lg, t, m: _maybe_jit(lambda x: return_logprob(x, allowed, 3, t, m), jit)(lg)  # noqa: E731
    assert float(fn(logits, 1.0, 0.0)[0]) == pytest.approx(np.log(0.5), abs=1e-6)
    assert float(fn(logits, 1.0, 0.3)[0]) == pytest.approx(np.log(0.45), abs=1e-6)
    r = np.sqrt([1.0, 2.0, 3.0])
    assert float(fn(logits, 2.0, 0.0)[0]) == pytest.approx(np.log(r[2] / r.sum()), abs=1e-6)
    assert float(fn(logits, 0.0, 0.0)[0]) == pytest.approx(np.log(0.5), abs=1e-6)  # greedy: measured at 1
    many = jnp.broadcast_to(logits, (64, 5))
    for temperature, mix in ((1.0, 0.0), (2.0, 0.3)):
        tok, lp = sample_logits(many, jax.random.key(0), temperature=temperature, allowed=allowed,
                                mix=jnp.float32(mix) if mix else None)
        drew = np.asarray(tok) == 3
        assert drew.any()
        np.testing.assert_allclose(np.asarray(lp)[drew], float(fn(logits, temperature, mix)[0]), atol=1e-6)


class _Pos(NamedTuple):
    pos: jax.Array
    goal: jax.Array
    success: jax.Array


class _Corridor:
    """Level t: start at 0, the goal at t + 2; action 1 steps right, 0 left; absorbing once at the goal."""

    def reset(self, key, task):
        return _Pos(jnp.int32(0), jnp.asarray(task, jnp.int32) + 2, jnp.bool_(False)), None

    def step(self, s, a):
        pos = jnp.where(s.success, s.pos, s.pos + jnp.where(a == 1, 1, -1))
        out = _Pos(pos, s.goal, s.success | (pos >= s.goal))
        return out, None, jnp.float32(0), out.success, {"success": out.success.astype(jnp.int32)}


ACTION_IDS = jnp.array([10, 11])  # token 10 = action 0 (left), 11 = action 1 (right)


def test_bank_replay_share_on_a_literal_bank():  # jitted only: the eager scan of env steps costs ~20 s
    env = _Corridor()
    b = bank_lib.init(4, 4, 2)
    # a working plan for level 0 (goal 2), a failing one for level 1 (goal 3: its length cuts the third move),
    # and a working plan in a slot freed again (invalid: not counted)
    b, _ = bank_lib.add(b, jnp.array([11, 11, 0, 0]), 2, jnp.array([0.9, 0.1]), 0, 0, -1)
    b, _ = bank_lib.add(b, jnp.array([11, 11, 11, 0]), 2, jnp.array([0.1, 0.9]), 0, 0, -1)
    b, _ = bank_lib.add(b, jnp.array([11, 11, 11, 11]), 4, jnp.array([0.0, 1.0]), 0, 0, -1)
    b = b.replace(valid=b.valid.at[2].set(False))
    queries = jnp.eye(2)
    tasks = jnp.array([0, 1])
    keys = jax.random.split(jax.random.key(0), 2)
    assert entry_levels(b.keys[:2], queries).tolist() == [0, 1]
    plan = jax.jit(lambda t, e, k: replay_plan(env, ACTION_IDS, t, e, 2, k))
    assert bool(plan(0, b.tokens[0], keys[0]))
    assert not bool(plan(1, b.tokens[1], keys[1]))
    assert not bool(plan(1, b.tokens[0], keys[1]))  # level 0's plan fails on level 1
    share = jax.jit(lambda bb: replay_share(env, ACTION_IDS, bb, queries, tasks, keys))
    assert float(share(b)) == 0.5
    assert np.isnan(float(share(bank_lib.init(4, 4, 2))))


def test_archive_entries_literal():
    tok = jnp.array([[11, 10, 11, 10, 11], [11, 11, 7, 7, 7]])
    e, n = archive_entries(tok, jnp.array([5, 2]), 4)
    assert e.tolist() == [[11, 10, 11, 10], [11, 11, 0, 0]] and n.tolist() == [4, 2]
    e, n = archive_entries(tok[:, :2], jnp.array([2, 1]), 4)  # shorter episodes than entries: zero-padded
    assert e.tolist() == [[11, 10, 0, 0], [11, 0, 0, 0]] and n.tolist() == [2, 1]


@pytest.mark.parametrize("jit", JIT)
def test_archive_adds_exactly_the_successful_episodes_moves(jit):
    """Literal episodes in, literal bank out; the runtime has no extractor at all, so none is called."""
    rt = SimpleNamespace(cfg=SimpleNamespace(bank=SimpleNamespace(entry_len=4)),
                         bank_ops=bank_lib.make_bank_ops(capacity=4, entry_len=4, key_dim=2))
    ep = SimpleNamespace(success=jnp.array([1, 0, 1]), turns=jnp.array([5, 5, 2]),
                         action_tokens=jnp.array([[11, 10, 11, 10, 11], [10, 10, 10, 10, 10], [11, 11, 0, 0, 0]]))
    keys = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    buffer = jnp.arange(3)  # stands for the sample buffer: archive never writes to it

    def run(bank, buf):
        return archive(rt, bank, buf, jax.random.key(0), jnp.int32(7), episodes=ep, keys=keys,
                       slots=jnp.array([-1, -1, -1]))

    out = _maybe_jit(run, jit)(rt.bank_ops.init(), buffer)
    b = out.bank
    assert b.valid.tolist() == [True, True, False, False]
    assert b.tokens[:2].tolist() == [[11, 10, 11, 10], [11, 11, 0, 0]] and b.lengths[:2].tolist() == [4, 2]
    np.testing.assert_allclose(np.asarray(b.keys[:2]), [[1.0, 0.0], [0.6, 0.8]], atol=1e-6)
    assert b.source[:2].tolist() == [-1, -1] and b.created_step[:2].tolist() == [7, 7]
    assert out.buffer.tolist() == [0, 1, 2]
    assert int(out.n_add) == 2 and int(out.n_update) == 0 and out.adds.tolist() == [1, 0, 1]
    assert op_rates(out.adds, out.updates, ep.success, jnp.ones(3, bool))["ops_add_rate_fail"] == 0.0


def test_archive_method_flags_and_config():
    cfg = load(None, ["method=archive"])
    f = MethodFlags.from_config(cfg)
    assert bool(f.archive) and bool(f.edits_bank) and bool(f.uses_bank) and bool(f.trains_actor)
    assert not bool(f.trains_extractor)
    assert not bool(MethodFlags.from_config(load(None, ["method=crl"])).archive)
    with pytest.raises(ConfigError, match="method: archive"):
        load(None, ["method=archive", "actor.preset=smollm2-135m", "extractor.preset=smollm2-135m"])


def test_reward_signal_windows_literal():
    """experiments/reward_signal.py's table on two literal steps of 4 rollouts (2 guided, 2 free)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "reward_signal.py")
    spec = importlib.util.spec_from_file_location("reward_signal", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    b = lambda *v: np.asarray(v, bool)  # noqa: E731
    rows = [dict(ok=b(1, 0, 0, 0), used=b(1, 1, 0, 0), success=b(1, 0, 1, 0), guided=b(1, 1, 0, 0),
                 tried=b(0, 0, 0, 0)),
            dict(ok=b(1, 0, 0, 0), used=b(1, 1, 0, 0), success=b(1, 1, 0, 0), guided=b(1, 1, 0, 0),
                 tried=b(1, 0, 0, 0))]
    # works: 2 of 2 succeed; broken: 1 of 2; free: 1 of 4; used entries broken 2/4, tried before 1/4
    assert mod.windows(rows) == ["steps 1-2: P(success | entry works) 1.00 (n=2), P(success | entry broken) 0.50 "
                                 "(n=2), free 0.25 (n=4), used entries broken 0.50, tried before 0.25"]
    assert len(mod.windows(rows, width=1)) == 2
