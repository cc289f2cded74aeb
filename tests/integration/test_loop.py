"""End-to-end on a micro config: every method and ablation runs; determinism, resume, vmapped seeds."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _micro import MICRO, micro

from crl_jax import loop
from crl_jax.config import load
from crl_jax.infra.metrics import COLUMNS, read_csv
from crl_jax.infra.run import run
from crl_jax.loop.runtime import build


def test_cli_run_columns_determinism_and_resume(tmp_path):
    cfg = micro("steps=4")
    a, b, c = (str(tmp_path / n) for n in "abc")
    run(cfg, a, progress=False)
    run(cfg, b, progress=False)
    rows_a = open(os.path.join(a, "metrics.csv")).read()
    assert rows_a == open(os.path.join(b, "metrics.csv")).read()  # same seed -> byte-identical
    rows = read_csv(os.path.join(a, "metrics.csv"))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert set(COLUMNS) <= set(rows[0])
    assert rows[1]["eval_heldin_without_exp"] != "" and rows[0]["eval_heldin_without_exp"] == ""
    assert float(rows[-1]["env_steps"]) > float(rows[0]["env_steps"]) > 0
    # resume: 2 steps, then continue to 4 in the same folder == 4 straight
    run(micro("steps=2"), c, progress=False)
    run(cfg, c, progress=False)
    assert open(os.path.join(c, "metrics.csv")).read() == rows_a
    assert os.path.exists(os.path.join(a, "summary.json"))


def _run_chunk(cfg, steps=2, seed=0):
    """The CLI's compiled chunk program (shared by every method and ablation of the micro config)."""
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(seed), cfg)
    return loop.compiled_chunk(rt, steps)(state, jnp.int32(steps))


def test_oracle_write_reward_credits_each_write_once_at_once():
    """The diagnostic oracle: every write sample is credited when it is written, with its episode's +-1 outcome,
    and never again (entry credit does not reach the buffer), so no reward is dropped."""
    cfg = micro("extraction.oracle_write_reward=true", "extraction.buffer_capacity=64", "extraction.merge=false",
                "extraction.return_samples=0")  # writes only: every buffered sample is a write
    state, m = _run_chunk(cfg)
    buf = state.buffer
    valid = np.asarray(buf.valid)
    assert valid.sum() == int(buf.next_id) == np.asarray(m["ops_add"]).sum() + np.asarray(m["ops_update"]).sum() > 0
    np.testing.assert_array_equal(np.asarray(buf.total_uses)[valid], 1)
    assert int(buf.dropped) == 0
    pending = valid & (np.asarray(buf.reward_count) > 0)  # not yet trained: the reward is the +-1 outcome itself
    assert set(np.asarray(buf.reward_sum)[pending].tolist()) <= {-1.0, 1.0}


def test_vmapped_seeds_equal_single_runs():
    """`jax.vmap(train)` over two keys == each seed run alone (through the CLI's chunk program)."""
    cfg = micro("steps=2")
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    both = jax.jit(jax.vmap(lambda k: loop.train(cfg, k)[1]))(keys)
    for i in range(2):
        _, one = _run_chunk(cfg, seed=i)
        for k in ("success_all", "bank_size", "actor/loss", "eval_heldin_without_exp"):
            np.testing.assert_allclose(np.asarray(both[k][i]), np.asarray(one[k]), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("extra", [["method=grpo"], ["method=static_online"], ["method=exp_only"], ["method=archive"],
                                   ["loss.group_split=false"], ["loss.advantage=cross_group"],
                                   ["extraction.merge=false"]])
def test_methods_and_ablations_share_one_program_and_run(extra):
    cfg = micro(*extra)
    if cfg.extraction.merge:
        assert build(cfg) is build(micro())  # one Runtime, one compiled program for all of them
    else:  # no merges: the sample buffer is only as wide as a distillation, so its own Runtime and program
        assert build(cfg) is not build(micro())
    state, m = _run_chunk(cfg)
    assert int(state.step) == 2
    assert np.all(np.isfinite(np.asarray(m["success_all"])))
    # the buffer's cumulative losses reach the metrics: evicted untrained samples, rewards for evicted samples
    assert float(m["buffer_overflow"][-1]) == int(state.buffer.overflow_count)
    assert float(m["credit_dropped"][-1]) == int(state.buffer.dropped)
    bank_size = np.asarray(m["bank_size"])
    if cfg.method == "grpo":
        assert np.all(np.isnan(np.asarray(m["success_guided"]))) and bank_size[-1] == 0
        assert np.all(np.isnan(np.asarray(m["eval_heldin_with_exp"])))
    elif cfg.method == "archive":  # one entry per successful episode (a micro run may have none), minus pruning
        n = cfg.rollout.groups * cfg.rollout.group_size
        np.testing.assert_array_equal(np.asarray(m["ops_add"]), np.round(np.asarray(m["success_all"]) * n))
        assert bank_size[-1] == np.asarray(m["ops_add"]).sum() - np.asarray(m["pruned_entries"]).sum()
    else:
        assert bank_size[-1] > 0
    if cfg.method == "exp_only":
        a0 = loop.init_state(build(cfg), jax.random.key(0), cfg).actor.params
        for x, y in zip(jax.tree_util.tree_leaves(a0), jax.tree_util.tree_leaves(state.actor.params)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if cfg.method == "archive":  # the successful episodes' moves, no extractor call: no sample, no op entropy
        assert int(state.buffer.next_id) == 0 and not np.asarray(state.buffer.valid).any()
        assert np.all(np.isnan(np.asarray(m["op_entropy"]))) and np.all(np.asarray(m["ops_update"]) == 0)
        np.testing.assert_array_equal(np.asarray(m["ops_add_rate_fail"])[~np.isnan(m["ops_add_rate_fail"])], 0.0)
        assert np.all(np.asarray(m["ops_add_rate_success"])[~np.isnan(m["ops_add_rate_success"])] == 1.0)
    else:
        assert not np.all(np.isnan(np.asarray(m["op_entropy"]))) or cfg.method == "grpo"
    if cfg.method in ("static_online", "archive"):
        e0 = loop.init_state(build(cfg), jax.random.key(0), cfg).extractor.params
        for x, y in zip(jax.tree_util.tree_leaves(e0), jax.tree_util.tree_leaves(state.extractor.params)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if not cfg.loss.group_split:
        assert np.all(np.isnan(np.asarray(m["success_free"])))
    if not cfg.extraction.merge:
        assert np.all(np.asarray(m["merged_entries"]) == 0)
        assert state.buffer.prompt.shape[1] == cfg.extraction.prompt_len
        assert state.buffer.response.shape[1] == cfg.extraction.max_new_tokens


def test_extractor_credit_scripted_scenario():
    """Entry 3 guides three successes, entry 5 one failure; free rollouts earn nothing."""
    success = jnp.array([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    guided = jnp.array([True, True, False, False, True, True, False, False])
    entry_ids = jnp.array([3, 3, -1, -1, 5, 3, -1, -1])
    er = loop.entry_credit("outcome", success, entry_ids, guided, 2, 4, 8)
    np.testing.assert_allclose(np.asarray(er.mean)[[3, 5]], [(1 + 1 + 1) / 3, -1.0])
    assert np.asarray(er.count).tolist() == [0, 0, 0, 3, 0, 1, 0, 0]
    rel = loop.entry_credit("relative_to_free", success, entry_ids, guided, 2, 4, 8)
    # group 0: free mean 0 -> entry 3 gets 1, 1; group 1: free mean 0.5 -> entry 5: -0.5, entry 3: +0.5
    np.testing.assert_allclose(np.asarray(rel.mean)[[3, 5]], [(1 + 1 + 0.5) / 3, -0.5])


def test_free_rollouts_never_see_bank_content():
    """Same level and key: a free rollout handed an entry gets exactly the prompt of one handed nothing."""
    from crl_jax.actor.rollout import play

    cfg = micro()
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    L = cfg.bank.entry_len
    entry = jnp.full((3, L), rt.tiny.action_ids[0]).at[:, 3:].set(0)
    tasks = jnp.zeros((3,), jnp.int32)
    kw = dict(tasks=tasks, task_tokens=rt.train_task_tokens[tasks], task_len=rt.train_task_len[tasks],
              num_turns=rt.num_turns, temperature=0.0, reset_keys=jnp.stack([jax.random.key(5)] * 3))
    ep = jax.jit(lambda p: play(state.actor.graphdef, p, rt.env, rt.renderer, rt.tiny.seg, rt.tiny.action_ids,
                                jax.random.key(1), exp=entry, exp_len=jnp.array([3, 3, 0]),
                                has_exp=jnp.array([True, False, False]), **kw))(state.actor.params)
    p = np.asarray(ep.prompts)
    np.testing.assert_array_equal(p[1], p[2])  # free with an entry offered == free with nothing
    n0, n1 = int(ep.prompt_len[0, 0]), int(ep.prompt_len[1, 0])
    tip = rt.tokenizer.decode([int(t) for t in rt.tiny.seg.exp_prefix[: int(rt.tiny.seg.exp_prefix_len)]])  # the tip marker
    assert tip in rt.tokenizer.decode(p[0, 0, :n0]) and tip not in rt.tokenizer.decode(p[1, 0, :n1])


def test_shared_prefix_rollouts_equal_the_whole_prompt_ones():
    """`play(share_prefix=True)` (each distinct task text encoded once, 2 per encoding, for rollouts in groups
    of 1-3 on a task) plays what the whole-prompt path plays in the text view: the same prompts, action tokens
    and turns under one key at temperature 1, and behaviour log-probs equal to ~1e-6; a host env refuses the
    option by name."""
    from crl_jax.actor.rollout import play
    from crl_jax.config import ConfigError

    cfg = micro("rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false")
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    n = 6
    tasks = jnp.array([0, 0, 1, 2, 2, 2], jnp.int32) % rt.train_task_tokens.shape[0]
    kw = dict(tasks=tasks, task_tokens=rt.train_task_tokens[tasks], task_len=rt.train_task_len[tasks],
              exp=jnp.zeros((n, cfg.bank.entry_len), jnp.int32), exp_len=jnp.zeros((n,), jnp.int32),
              has_exp=jnp.zeros((n,), bool), num_turns=rt.num_turns, temperature=1.0, prefix_block=2)
    assert int(rt.train_task_len.min()) > 5  # the text view's task line: a real prefix
    assert len({tuple(r) for r in np.asarray(rt.train_task_tokens[tasks]).tolist()}) == 3  # 3 distinct task texts
    run = lambda share: jax.jit(lambda p: play(state.actor.graphdef, p, rt.env, rt.renderer, rt.tiny.seg,  # noqa: E731
                                               rt.tiny.action_ids, jax.random.key(3), share_prefix=share, **kw)
                                )(state.actor.params)
    whole, shared = run(False), run(True)
    for f in ("prompts", "prompt_len", "action_tokens", "actions", "active", "turns"):
        np.testing.assert_array_equal(getattr(whole, f), getattr(shared, f), err_msg=f)
    np.testing.assert_allclose(shared.logp, whole.logp, atol=1e-5)
    assert len(set(np.asarray(whole.action_tokens).ravel().tolist())) > 1  # sampled, not one fixed move
    with pytest.raises(ConfigError, match="rollout.share_prefix"):
        build(load(None, ["env.name=minihack-room", "rollout.view=text", "rollout.share_prefix=true"]))


def test_blocked_turns_play_what_the_one_batch_turns_play():
    """`play(turn_block=2)` (each turn over the unfinished episodes only, 2 at a time, each block as wide as
    its longest prompt; after the shared task text, as the agentic benchmark runs it) plays what `turn_block=0` plays in the text
    view under one key at temperature 1: the same prompts, turns and, on the played turns, the same action
    tokens, with behaviour log-probs equal to ~1e-6. FrozenLake's holes end episodes at different turns, so
    later turns skip rows and the blocks shrink."""
    from crl_jax.actor.rollout import play

    lake = [o for o in MICRO if not o.startswith(("env.params.crop", "env.max_turns"))]
    cfg = load(None, lake + ["env.name=frozen_lake", "env.params.legend=false", "env.max_turns=8",
                             "actor.num_layers=2", "rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false"])
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    n = 5
    tasks = jnp.arange(n, dtype=jnp.int32) % rt.train_task_tokens.shape[0]
    kw = dict(tasks=tasks, task_tokens=rt.train_task_tokens[tasks], task_len=rt.train_task_len[tasks],
              exp=jnp.zeros((n, cfg.bank.entry_len), jnp.int32), exp_len=jnp.zeros((n,), jnp.int32),
              has_exp=jnp.zeros((n,), bool), num_turns=rt.num_turns, temperature=1.0, share_prefix=True,
              prefix_block=2)
    run = lambda tb: jax.jit(lambda p: play(state.actor.graphdef, p, rt.env, rt.renderer, rt.tiny.seg,  # noqa: E731
                                            rt.tiny.action_ids, jax.random.key(2), turn_block=tb, **kw)
                             )(state.actor.params)
    whole, blocked = run(0), run(2)
    for f in ("prompts", "prompt_len", "active", "turns", "reward", "success"):
        np.testing.assert_array_equal(getattr(whole, f), getattr(blocked, f), err_msg=f)
    act = np.asarray(whole.active)
    np.testing.assert_array_equal(np.asarray(blocked.action_tokens)[act], np.asarray(whole.action_tokens)[act])
    np.testing.assert_allclose(blocked.logp, whole.logp, atol=1e-5)
    assert len(set(act.sum(1).tolist())) >= 3  # episodes ended at different turns (and some ran to the end)
    plen = np.asarray(whole.prompt_len)
    assert plen.max() < whole.prompts.shape[2]  # the packed width is wider than any prompt: blocks are narrower


# Every extractor-learning option at once (one compiled program): the outcome-last layout (its own prior),
# the reward relative to the free half, trained RETURN decisions, a baseline per outcome, more extractor epochs, the
# op weight, the op entropy bonus and Thompson retrieval with LRU eviction.
LEARN = ["extraction.outcome_last=true", "extraction.reward=relative_to_free", "extraction.return_samples=2",
         "extraction.baseline=outcome_mean", "extraction.epochs=3", "extraction.op_weight=10",
         "extraction.op_entropy=0.01", "bank.select=thompson", "bank.eviction=lru"]


def test_learning_options_same_key_same_metrics():
    """The learning options keep a run a pure function of its key: the same seed twice gives bit-identical
    metrics, the outcome-last layout refits its own prior, and the RETURN decisions reach the buffer."""
    from crl_jax.learner.pretrain import prior_id
    cfg = micro(*LEARN)
    paper_layout = [o for o in LEARN if "outcome" not in o] + ["extraction.outcome_last=false",
                                                                "extraction.baseline=batch_mean"]
    assert prior_id(cfg) != prior_id(micro(*paper_layout))
    (s1, m1), (s2, m2) = _run_chunk(cfg), _run_chunk(cfg)
    assert set(m1) == set(m2)
    for k in m1:
        np.testing.assert_array_equal(np.asarray(m1[k]), np.asarray(m2[k]), err_msg=k)
    for x, y in zip(jax.tree_util.tree_leaves(s1.extractor.params), jax.tree_util.tree_leaves(s2.extractor.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(s1.step) == 2 and np.asarray(m1["ops_return_trained"]).sum() > 0
