"""`loop.finish` end to end on scripted episodes, with literal values: outcomes -> entry credit -> buffer
rewards, pruning and metrics -> the actor batch (split-GRPO advantages and weights per turn row) -> the
extractor batch (CISPO advantages of the credited samples).

One group of K = 4: rollouts 0, 1 guided by bank entries 0 and 1 (written by buffer samples 0 and 1),
rollouts 2, 3 free. Scripted outcomes: [success, failure, success, failure]."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import bank as bank_lib
from crl_jax import loop
from crl_jax.actor.rollout import play
from crl_jax.config import load
from crl_jax.config_rules import paper_overrides
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.loop.runtime import build
from crl_jax.models import transformer as tr

# The paper's write rules (its +-1 reward, batch-mean baseline, writes only), whose literal values these tests
# check; the list's own batch and buffer follow them, so they win.
OVERRIDES = [*paper_overrides(), "rollout.groups=1", "rollout.group_size=4", "env.max_turns=3", "env.num_train_tasks=4",
             "env.num_eval_tasks=4", "extraction.batch=8", "extraction.buffer_capacity=12", "bank.capacity=8",
             "bank.entry_len=8", "extraction.max_new_tokens=6", "extraction.prompt_len=120",
             "extraction.merge=false", "bank.prune_below=0.0", "loss.epochs=1", "loss.minibatches=1",
             "loss.turn_rows=0", "pretrain.enabled=false", "actor.hidden_size=32", "actor.num_layers=1",
             "actor.intermediate_size=64", "extractor.hidden_size=32", "extractor.num_layers=1",
             "extractor.intermediate_size=64"]
SUCCESS = np.array([True, False, True, False])


def _scripted():
    cfg = load(None, OVERRIDES)
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(0), cfg)
    L, D = cfg.bank.entry_len, cfg.bank.key_dim
    P, R = state.buffer.prompt.shape[1], state.buffer.response.shape[1]
    # two extractor samples (ids 0, 1) and the two entries they wrote (slots 0, 1)
    buffer, ids = buffer_lib.add_many(state.buffer, jnp.ones((2, P), jnp.int32), jnp.array([3, 3]),
                                      jnp.ones((2, R), jnp.int32), jnp.array([2, 2]), jnp.full((2, R), -0.5),
                                      0, jnp.array([True, True]))
    assert ids.tolist() == [0, 1]
    entry = jnp.broadcast_to(rt.tiny.action_ids[0], (2, L))
    keys = jax.random.normal(jax.random.key(1), (2, D))
    bank, slots = bank_lib.add_many(state.bank, entry, jnp.array([3, 3]), keys, jnp.zeros((2,), jnp.int32), 0,
                                    ids, jnp.array([True, True]))
    assert slots.tolist() == [0, 1]
    state = state.replace(bank=bank, buffer=buffer)
    tasks = jnp.zeros((4,), jnp.int32)
    has = jnp.array([True, True, False, False])
    slot = jnp.array([0, 1, -1, -1])
    exp = jnp.where(has[:, None], bank.tokens[jnp.maximum(slot, 0)], 0)
    exp_len = jnp.where(has, bank.lengths[jnp.maximum(slot, 0)], 0)
    p = loop.Prepared(tasks=tasks, task_tokens=rt.train_task_tokens[tasks], task_len=rt.train_task_len[tasks],
                      guided=has, q=jnp.concatenate([keys, keys]), bank=bank, slots=slot, exp=exp, exp_len=exp_len,
                      has_exp=has)
    ep = play(state.actor.graphdef, state.actor.params, rt.env, rt.renderer, rt.tiny.seg, rt.tiny.action_ids,
              jax.random.key(2), tasks=tasks, task_tokens=p.task_tokens, task_len=p.task_len, exp=exp,
              exp_len=exp_len, has_exp=has, num_turns=rt.num_turns, temperature=1.0)
    ep = ep._replace(success=jnp.asarray(SUCCESS), reward=jnp.asarray(SUCCESS, jnp.float32))  # the script
    return rt, state, p, ep


def test_finish_credit_buffer_pruning_and_metrics_literal():
    rt, state, p, ep = _scripted()
    new, m = jax.jit(lambda s, p, e: loop.finish(rt, s, p, e))(state, p, ep)
    # entry 0 guided a success (+1), entry 1 a failure (-1): each writer sample gets its entry's mean
    buf = new.buffer
    by_id = {int(i): (float(r), int(c)) for i, r, c, v in
             zip(buf.sample_id, buf.reward_sum, buf.reward_count, buf.valid) if v and i in (0, 1)}
    assert by_id == {0: (1.0, 1), 1: (-1.0, 1)}  # 2 pending < batch 8: not trained yet, rewards kept
    assert float(m["extractor_reward_mean"]) == 0.0  # mean over credited entries of (+1, -1)
    assert float(m["pruned_entries"]) == 1.0  # entry 1's credit -1 < prune_below 0
    assert float(m["success_guided"]) == 0.5 and float(m["success_free"]) == 0.5
    assert float(m["success_all"]) == 0.5 and float(m["retrieved_frac"]) == 1.0
    assert float(m["env_steps"]) == float(ep.turns.sum())
    assert int(new.step) == 1
    # lifetime credit of entry 0 (slot 0 is neither pruned nor free, so no ADD of this step lands on it)
    assert float(new.bank.total_credit_sum[0]) in (1.0, 0.0)  # 0.0 only if an UPDATE rewrote it


def test_actor_and_extractor_batches_literal():
    rt, state, p, ep = _scripted()
    guided = p.guided.reshape(1, 4)
    ab, am = rt.backend.actor_batch(rt, ep, guided, jnp.asarray(True), jax.random.key(3))
    T = rt.num_turns
    # split GRPO: guided [1, 0] and free [1, 0] normalised apart -> +-1 (/ (std 0.5 + 1e-6) * 0.5)
    a = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(np.asarray(ab.advantages).reshape(4, T), np.repeat([[a], [-a], [a], [-a]], T, 1),
                               rtol=1e-6)
    # each subgroup weighs 1/2 of the group, its 2 members 1/4 each, spread over their played turns
    turns = np.asarray(ep.turns, np.float32)
    want_w = (0.25 / turns)[:, None] * np.asarray(ep.active)
    np.testing.assert_allclose(np.asarray(ab.weight).reshape(4, T), want_w, rtol=1e-6)
    assert float(am["adv_abs_mean"]) == np.float32(a)
    # the credited samples feed the extractor batch: rewards +1 / -1 around their mean 0, repeat weight 1
    new, _ = jax.jit(lambda s, p, e: loop.finish(rt, s, p, e))(state, p, ep)
    _, eb = rt.backend.extractor_batch(rt, new.buffer, new.step, jnp.asarray(True), jax.random.key(4))
    adv = np.asarray(eb.advantages)
    adv = adv[0] if adv.ndim == 2 else adv  # epochs stack the same batch
    got = sorted(float(x) for x in adv if x != 0.0)
    assert got == [-1.0, 1.0]


def test_finish_trains_return_decisions_with_the_free_value():
    """extraction.return_samples > 0: RETURN decisions enter the buffer as op-token-only samples credited with
    the group's free value ((+1 - 1) / 2 = 0 for the scripted outcomes); 0 (the paper) stores none."""
    rt, state, p, ep = _scripted()
    new0, m0 = jax.jit(lambda s, p, e: loop.finish(rt, s, p, e))(state, p, ep)
    assert float(m0["ops_return_trained"]) == 0.0
    cfg = rt.cfg
    rt4 = build(dataclasses.replace(cfg, extraction=dataclasses.replace(cfg.extraction, return_samples=4)))
    new, m = jax.jit(lambda s, p, e: loop.finish(rt4, s, p, e))(state, p, ep)
    n = int(m["ops_return_trained"])
    assert n == min(4, int(m["ops_return"])) and n >= 1  # ops_return counts the valid no-write decisions
    buf = new.buffer
    extra = np.asarray(buf.valid & (buf.sample_id >= 2) & (buf.response_len == 1))
    assert int(extra.sum()) == n
    np.testing.assert_array_equal(np.asarray(buf.reward_sum)[extra], 0.0)
    np.testing.assert_array_equal(np.asarray(buf.reward_count)[extra], 1)
    # the op token of each stored sample writes nothing: <RETURN> (an <UPDATE> with no retrieved entry is
    # written as an ADD by default, extraction.update_unretrieved)
    assert set(np.asarray(buf.response)[extra, 0].tolist()) == {int(rt.tiny.op_ids[2])}
    # writes and their ids are the same as without it (RETURN samples are added after them)
    np.testing.assert_array_equal(new.bank.tokens, new0.bank.tokens)


def _distill_scripted_update(rt, state, p, ep, monkeypatch, reply=None, **kw):
    """The tiny distillation with the sampler scripted to answer `reply` (default `<UPDATE> a0 a0 <EOS>`) on
    every episode."""
    from crl_jax.extractor import distill as distill_mod

    a0, upd, eos = int(rt.tiny.action_ids[0]), int(rt.tiny.op_ids[1]), rt.tokenizer.eos_id
    reply = [upd, a0, a0, eos] if reply is None else reply

    def scripted(graphdef, params, prompt, plen, key, scfg, allowed=None):
        B, n = prompt.shape[0], scfg.max_new_tokens
        row = jnp.asarray(reply + [rt.tokenizer.pad_id] * (n - len(reply)), jnp.int32)
        return jnp.broadcast_to(row, (B, n)), jnp.full((B, n), -1.0), jnp.full((B,), len(reply), jnp.int32)

    monkeypatch.setattr(distill_mod, "sample_tokens", scripted)
    return distill_mod.distill(rt, p.bank, state.buffer, state.extractor.params, jax.random.key(5), state.step,
                               task_tokens=p.task_tokens, task_len=p.task_len, episodes=ep, keys=p.q, exp=p.exp,
                               exp_len=p.exp_len, has_exp=p.has_exp, slots=p.slots, mask=jnp.ones((4,), bool), **kw)


def test_update_with_nothing_retrieved_is_written_as_an_add(monkeypatch):
    """Rollouts 0, 1 retrieved entries 0, 1; rollouts 2, 3 nothing. Every reply is `<UPDATE> a0 a0`: 0 and 1
    rewrite their entries; 2 and 3 have nothing to rewrite: with `update_unretrieved="add"` (default) they
    add two new entries, with "ignore" they write nothing (and every write is a buffer sample)."""
    rt, state, p, ep = _scripted()
    a0 = int(rt.tiny.action_ids[0])
    d = _distill_scripted_update(rt, state, p, ep, monkeypatch)
    assert (int(d.n_add), int(d.n_update), int(d.n_return), int(d.n_update_unretrieved)) == (2, 2, 0, 2)
    assert int(bank_lib.size(d.bank)) == 4 and int(d.buffer.valid.sum()) == 2 + 4
    new = np.asarray(d.bank.valid) & (np.arange(d.bank.valid.shape[0]) >= 2)
    assert int(new.sum()) == 2
    np.testing.assert_array_equal(np.asarray(d.bank.tokens)[new][:, :2], a0)
    np.testing.assert_array_equal(np.asarray(d.bank.lengths)[new], 2)
    np.testing.assert_array_equal(np.asarray(d.bank.lengths)[:2], 2)  # entries 0, 1 rewritten (were 3 long)

    cfg = rt.cfg
    rt_ign = build(dataclasses.replace(cfg, extraction=dataclasses.replace(cfg.extraction,
                                                                           update_unretrieved="ignore")))
    d = _distill_scripted_update(rt_ign, state, p, ep, monkeypatch)
    assert (int(d.n_add), int(d.n_update), int(d.n_return), int(d.n_update_unretrieved)) == (0, 2, 2, 2)
    assert int(bank_lib.size(d.bank)) == 2 and int(d.buffer.valid.sum()) == 2 + 2


def test_update_of_an_entry_pruned_this_step_is_resolved_like_an_unretrieved_one(monkeypatch):
    """Entry 1 (rollout 1's) pruned before distillation, as `finish` prunes an entry whose guided episodes
    failed: its `<UPDATE>` has nothing to rewrite, so it is written as an ADD by default, and with "ignore"
    it writes nothing and stores no buffer sample (before: counted as an update, stored, written nowhere)."""
    rt, state, p, ep = _scripted()
    p = p._replace(bank=p.bank.replace(valid=p.bank.valid.at[1].set(False)))
    d = _distill_scripted_update(rt, state, p, ep, monkeypatch)
    assert (int(d.n_add), int(d.n_update), int(d.n_return), int(d.n_update_unretrieved)) == (3, 1, 0, 2)
    assert int(bank_lib.size(d.bank)) == 4 and int(d.buffer.valid.sum()) == 2 + 4
    assert sorted(np.asarray(d.bank.source)[np.asarray(d.bank.valid)].tolist()) == [2, 3, 4, 5]  # every sample
    cfg = rt.cfg
    rt_ign = build(dataclasses.replace(cfg, extraction=dataclasses.replace(cfg.extraction,
                                                                           update_unretrieved="ignore")))
    d = _distill_scripted_update(rt_ign, state, p, ep, monkeypatch)
    assert (int(d.n_add), int(d.n_update), int(d.n_return)) == (0, 1, 3)
    assert int(bank_lib.size(d.bank)) == 1 and int(d.buffer.valid.sum()) == 2 + 1


def test_an_update_whose_entry_an_earlier_add_evicted_falls_back_to_an_add():
    """A full 2-slot bank: op 0 ADDs (FIFO-evicting slot 0), op 1 UPDATEs slot 0 as retrieved. The update
    must not rewrite the new entry (the `expect_order` pin); with `fallback_add` it is written as an add."""
    from crl_jax.extractor.distill import ADD, UPDATE, apply_operations

    ops = bank_lib.make_bank_ops(capacity=2, entry_len=2, key_dim=2)
    b, _ = ops.add_many(ops.init(), jnp.array([[1, 1], [2, 2]]), jnp.array([2, 2]), jnp.eye(2),
                        jnp.zeros(2, jnp.int32), 0, jnp.array([10, 11]), jnp.ones(2, bool))
    args = (jnp.array([True, True]), jnp.array([ADD, UPDATE]), jnp.array([[7, 7], [8, 8]]), jnp.array([2, 2]),
            jnp.eye(2), jnp.array([-1, 0]), jnp.array([20, 21]), jax.random.key(0), 1)
    nb = apply_operations(ops, b, *args)
    assert np.asarray(nb.tokens).tolist() == [[7, 7], [2, 2]] and np.asarray(nb.source).tolist() == [20, 11]
    nb = apply_operations(ops, b, *args, fallback_add=True)
    assert np.asarray(nb.tokens).tolist() == [[7, 7], [8, 8]] and np.asarray(nb.source).tolist() == [20, 21]


def test_malformed_replies_are_trained_with_the_invalid_reward_when_asked(monkeypatch):
    """Every reply `<ADD> <EOS>` (an empty add: malformed). By default (invalid_samples 0, the reference code)
    nothing is written or stored; with invalid_samples=3 three of the four enter the buffer as whole-reply
    samples credited once with invalid_reward (-1), and the bank is unchanged."""
    rt, state, p, ep = _scripted()
    reply = [int(rt.tiny.op_ids[0]), rt.tokenizer.eos_id]
    d = _distill_scripted_update(rt, state, p, ep, monkeypatch, reply)
    assert (int(d.n_invalid), int(d.n_invalid_trained), int(d.buffer.valid.sum())) == (4, 0, 2)
    cfg = rt.cfg
    rt3 = build(dataclasses.replace(cfg, extraction=dataclasses.replace(cfg.extraction, invalid_samples=3)))
    d = _distill_scripted_update(rt3, state, p, ep, monkeypatch, reply)
    assert (int(d.n_invalid), int(d.n_invalid_trained), int(d.n_add)) == (4, 3, 0)
    buf = d.buffer
    new = np.asarray(buf.valid & (buf.sample_id >= 2))
    assert int(new.sum()) == 3 and int(bank_lib.size(d.bank)) == 2
    np.testing.assert_array_equal(np.asarray(buf.reward_sum)[new], -1.0)
    np.testing.assert_array_equal(np.asarray(buf.reward_count)[new], 1)
    np.testing.assert_array_equal(np.asarray(buf.response_len)[new], 2)
    assert np.asarray(buf.response)[new][:, :2].tolist() == [reply] * 3


def test_counterfactual_returns_are_stored_where_the_extractor_wrote(monkeypatch):
    """Every reply `<ADD> a0 a0 <EOS>`. Without extraction.return_counterfactual (the paper's rules here) only sampled
    RETURNs are stored, and there are none. With it, 3 of the 4 episodes also yield a `<RETURN>` sample, op token alone,
    credited once with the free value (0 here), its behaviour log-prob the op token's under the extractor; the
    writes are the same."""
    from crl_jax.extractor.distill import return_logprob

    rt, state, p, ep = _scripted()
    a0, add, ret = int(rt.tiny.action_ids[0]), int(rt.tiny.op_ids[0]), int(rt.tiny.op_ids[2])
    reply = [add, a0, a0, rt.tokenizer.eos_id]
    cfg = dataclasses.replace(rt.cfg, extraction=dataclasses.replace(rt.cfg.extraction, return_samples=3))
    kw = dict(return_value=jnp.zeros((4,)), return_ok=jnp.ones((4,), bool))
    d0 = _distill_scripted_update(build(cfg), state, p, ep, monkeypatch, reply, **kw)
    assert (int(d0.n_add), int(d0.n_return_trained)) == (4, 0)
    rtc = build(dataclasses.replace(cfg, extraction=dataclasses.replace(cfg.extraction, return_counterfactual=True)))
    d = _distill_scripted_update(rtc, state, p, ep, monkeypatch, reply, **kw)
    assert (int(d.n_add), int(d.n_return_trained)) == (4, 3)
    np.testing.assert_array_equal(d.bank.tokens, d0.bank.tokens)
    buf = d.buffer
    new = np.asarray(buf.valid & (buf.response_len == 1))
    assert int(new.sum()) == 3
    assert np.asarray(buf.response)[new][:, 0].tolist() == [ret] * 3
    np.testing.assert_array_equal(np.asarray(buf.reward_sum)[new], 0.0)
    np.testing.assert_array_equal(np.asarray(buf.reward_count)[new], 1)
    model = tr.merge(rtc.extractor_graphdef, state.extractor.params)
    prompts = np.asarray(buf.prompt)[new]
    plen = np.asarray(buf.prompt_len)[new]
    first = model.unembed(model.last_hidden(jnp.asarray(prompts), jnp.asarray(plen))[:, None])
    want = return_logprob(first[:, 0], rtc.tiny.response_allowed(1)[0], ret, 1.0, 0.0)
    np.testing.assert_allclose(np.asarray(buf.behavior_logp)[new][:, 0], np.asarray(want), rtol=1e-5, atol=1e-6)


def test_guided_only_distils_the_guided_subgroup_even_where_nothing_was_retrieved():
    """extraction.distill: "guided_only" is the guided subgroup (rollouts 0, 1 here), not the rollouts that
    found an entry: on an empty bank none has, and with that mask the bank never got its first entry."""
    from crl_jax.loop.iteration import distill_mask

    guided = jnp.array([True, True, False, False])
    assert distill_mask("guided_only", guided).tolist() == [True, True, False, False]
    assert distill_mask("all", guided).tolist() == [True] * 4
    assert jax.jit(lambda g: distill_mask("guided_only", g))(guided).tolist() == [True, True, False, False]


def test_resolve_ops_literal():
    """`resolve_ops` on the LLM path's [episodes, ops per reply] layout (has_exp broadcast per episode)."""
    from crl_jax.extractor.distill import ADD, RETURN, UPDATE, resolve_ops

    op = jnp.array([[UPDATE, ADD], [UPDATE, RETURN]])
    has = jnp.array([[True], [False]])
    assert resolve_ops(op, has, "add").tolist() == [[UPDATE, ADD], [ADD, RETURN]]
    assert resolve_ops(op, has, "ignore").tolist() == op.tolist()
    assert jax.jit(lambda o, h: resolve_ops(o, h, "add"))(op, has).tolist() == [[UPDATE, ADD], [ADD, RETURN]]
