"""The mechanisms the embedded default rests on: compact view, tip window, similarity floor, grouped merge,
pruning, the priors' synthetic data, the temperature of training log-probs, the sequence ratio, PPO epochs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as bank_lib
from crl_jax import loop
from crl_jax.actor.rollout import build_prompt, play
from crl_jax.config import load
from crl_jax.envs.actions import action_allowed_mask
from crl_jax.extractor.merge import grouped_order
from crl_jax.learner import batches, pretrain
from crl_jax.learner.loss_fns import TurnBatch, actor_turn_loss
from crl_jax.loop.runtime import build

MICRO = ["rollout.groups=2", "rollout.group_size=4", "env.max_turns=4", "env.num_train_tasks=4",
         "env.num_eval_tasks=4", "extraction.batch=4", "extraction.buffer_capacity=16", "bank.capacity=16",
         "eval.tasks=2", "eval.every=2", "extraction.merge_every=2", "extraction.merge=true", "actor.hidden_size=32", "actor.num_layers=1",
         "actor.intermediate_size=64", "extractor.hidden_size=32", "extractor.num_layers=1",
         "extractor.intermediate_size=64", "extraction.max_new_tokens=5", "bank.entry_len=4",
         "extraction.prompt_len=24", "rollout.tip_window=2", "loss.turn_rows=0", "pretrain.actor_steps=3",
         "pretrain.extractor_steps=3", "pretrain.batch=8", "pretrain.aux_rows=4"]


def micro(*extra):
    return load(None, MICRO + list(extra))


def _decode(rt, toks, n):
    return rt.tokenizer.decode([int(t) for t in toks[: int(n)]])


def test_compact_prompt_layout_and_tip_window():
    rt = build(micro())
    st, _ = rt.env.reset(jax.random.key(0), 1)
    obs, obs_len = rt.renderer(st)
    assert int(obs_len) == 11
    text = _decode(rt, obs, obs_len)
    assert text.startswith("<r") and "@" in text
    a = [int(x) for x in rt.tiny.action_ids]
    exp = jnp.asarray([a[0], a[1], a[2], 0], jnp.int32)
    args = (rt.train_task_tokens[1], rt.train_task_len[1], exp, jnp.int32(3))
    seg = rt.tiny.seg
    # turn 1: the plan from move 1 on, 2 moves at most, right before the action marker
    p, n = build_prompt(*args, jnp.bool_(True), seg, 1, obs, obs_len, turn_marker=True)
    assert _decode(rt, p, n) == "<L1><t1>" + text + "<TIP><east><south><ACT>"
    # turn 2: one move left; turn 3: the plan is used up -> the free prompt
    p, n = build_prompt(*args, jnp.bool_(True), seg, 2, obs, obs_len, turn_marker=True)
    assert _decode(rt, p, n).endswith("<TIP><south><ACT>")
    p3, n3 = build_prompt(*args, jnp.bool_(True), seg, 3, obs, obs_len, turn_marker=True)
    pf, nf = build_prompt(*args, jnp.bool_(False), seg, 3, obs, obs_len, turn_marker=True)
    assert _decode(rt, p3, n3) == _decode(rt, pf, nf) == "<L1><t3>" + text + "<ACT>"


def test_text_view_still_builds():
    rt = build(micro("rollout.view=text", "extraction.prompt_len=120"))
    st, _ = rt.env.reset(jax.random.key(0), 1)
    obs, n = rt.renderer(st)
    assert "." in _decode(rt, obs, n) and rt.train_task_len[0] > 10


def test_similarity_floor_gives_no_entry_to_a_far_query():
    b = bank_lib.init(4, 3, 2)
    b, _ = bank_lib.add(b, jnp.asarray([1, 2, 3]), 3, jnp.asarray([1.0, 0.0]), 0, 0, 0)
    q = jnp.asarray([[1.0, 0.05], [0.0, 1.0]])
    _, slots, found = bank_lib.retrieve(b, q, jnp.zeros((2,), jnp.int32), None, 1, diversity_lambda=0.0,
                                        recent_steps=0, demote_p=0.0, min_similarity=0.9)
    assert found[:, 0].tolist() == [True, False] and slots[:, 0].tolist() == [0, -1]
    _, slots, found = bank_lib.retrieve(b, q, jnp.zeros((2,), jnp.int32), None, 1, diversity_lambda=0.0,
                                        recent_steps=0, demote_p=0.0)  # no floor: plain cosine top-1
    assert found[:, 0].tolist() == [True, True]


def test_grouped_merge_order_never_mixes_levels():
    b = bank_lib.init(8, 2, 2)
    keys = [[1, 0], [0, 1], [1, 0], [1, 0], [0, 1], [0.7071, 0.7071]]  # levels A B A A B C
    for i, k in enumerate(keys):
        b, _ = bank_lib.add(b, jnp.asarray([i, i]), 2, jnp.asarray(k, jnp.float32), 0, 0, i)
    slots, start = grouped_order(b, 0, chunk=2, num_chunks=5, min_similarity=0.95)
    chunks = np.asarray(slots).reshape(5, 2).tolist()
    # A's entries (slots 0, 2) fill chunk 0, B's (1, 4) a fresh chunk; an entry alone in its chunk (A's third,
    # slot 3, and C's only one, slot 5) is not laid out: a merge has nothing to combine it with
    assert chunks == [[0, 2], [1, 4], [-1, -1], [-1, -1], [-1, -1]]
    assert np.asarray(start).tolist() == [True, True, False, False, False]


def test_prune_removes_exactly_the_entries_below_threshold():
    b = bank_lib.init(4, 2, 2)
    for i in range(4):
        b, _ = bank_lib.add(b, jnp.asarray([i, i]), 2, jnp.asarray([1.0, 0.0]), 0, 0, i)
    reward = jnp.asarray([-1.0, -0.5, 0.5, -1.0])
    credited = jnp.asarray([True, True, True, False])
    nb, n = bank_lib.prune(b, reward, credited, 0.0)
    assert nb.valid.tolist() == [False, False, True, True] and int(n) == 2
    assert (nb.tokens == b.tokens).all() and (nb.keys == b.keys).all()
    nb, n = bank_lib.prune(b, reward, credited, -2.0)  # off
    assert nb.valid.all() and int(n) == 0


def test_prior_data_does_not_depend_on_the_level_pools():
    a = build(micro())
    b = build(micro("env.pool_seed=7"))
    starts = lambda rt: np.asarray(jax.vmap(lambda t: rt.env.task_level(t).start)(jnp.arange(4)))  # noqa: E731
    assert not np.array_equal(starts(a), starts(b))  # other levels
    for fn in (pretrain.actor_rows, pretrain.extractor_rows, pretrain.merge_rows):
        ra, rb = fn(a, jax.random.key(3), 16), fn(b, jax.random.key(3), 16)
        for x, y in zip(jax.tree_util.tree_leaves(ra), jax.tree_util.tree_leaves(rb)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert pretrain.prior_id(a.cfg) == pretrain.prior_id(b.cfg)


def test_prior_targets_copy_the_tip_or_stay_uniform():
    rt = build(micro())
    rows = pretrain.actor_rows(rt, jax.random.key(0), 64)
    tgt = np.asarray(rows.target)
    hard = tgt.max(-1) == 1.0
    assert 0 < hard.sum() < 64
    A = rt.tiny.action_ids.shape[0]
    np.testing.assert_allclose(tgt[~hard][:, np.asarray(rt.tiny.action_ids)], 1.0 / A)
    for i in np.where(hard)[0][:8]:  # the target is the token right after the tip marker
        toks = list(np.asarray(rows.tokens[i])[: int(rows.lengths[i])])
        tip = toks.index(rt.tokenizer.extra_id("<TIP>"))
        assert tgt[i, toks[tip + 1]] == 1.0
    er = pretrain.extractor_rows(rt, jax.random.key(1), 16)
    hard_toks = [np.asarray(er.tokens[i])[np.asarray(er.hard[i])] for i in range(16)]
    assert all(int(h[-1]) == rt.tokenizer.eos_id or len(h) == rt.cfg.extraction.max_new_tokens - 1
               for h in hard_toks)


def test_temperature_training_logprobs_equal_sampled_ones():
    """At temperature 0.7 the ratio of the first update is exactly 1 (log-probs under the same scaling)."""
    cfg = micro("actor.temperature=0.7")
    rt = build(cfg)
    st = loop.init_state(rt, jax.random.key(0), cfg)
    p = loop.prepare(rt, st)
    ep = play(st.actor.graphdef, st.actor.params, rt.env, rt.renderer, rt.tiny.seg, rt.tiny.action_ids, jax.random.key(1),
              tasks=p.tasks, task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len,
              has_exp=p.has_exp, num_turns=rt.num_turns, temperature=0.7)
    N, T, P = ep.prompts.shape
    b = TurnBatch(prompts=ep.prompts.reshape(N * T, P), prompt_len=ep.prompt_len.reshape(-1),
                  action_token=ep.action_tokens.reshape(-1), behavior_logp=ep.logp.reshape(-1),
                  advantages=jnp.ones((N * T,)), weight=ep.active.reshape(-1).astype(jnp.float32),
                  episode=jnp.repeat(jnp.arange(N), T))
    allowed = action_allowed_mask(rt.tiny.action_ids, rt.vocab_size)
    for temp, ok in ((0.7, True), (1.0, False)):
        _, (_, m) = actor_turn_loss(allowed, temperature=temp)(st.actor.graphdef, st.actor.params, b)
        assert (abs(float(m["approx_kl"])) < 1e-6) == ok, (temp, m["approx_kl"])


@pytest.mark.parametrize("jit", [False, True])
def test_sequence_ratio_is_shared_by_an_episodes_rows(jit):
    """ratio=sequence: rows of one episode share exp(mean log-ratio); literal values on a 1-param model."""
    from crl_jax.learner.loss_fns import episode_mean

    f = jax.jit(episode_mean) if jit else episode_mean
    x = jnp.asarray([0.2, -0.4, 1.0, 3.0])
    out = f(x, jnp.asarray([0, 0, 1, 1]), jnp.asarray([1.0, 1.0, 1.0, 0.0]))
    np.testing.assert_allclose(np.asarray(out), [-0.1, -0.1, 1.0, 1.0], rtol=1e-6)


def test_loop_with_prior_epochs_and_aux_is_deterministic():
    cfg = micro("pretrain.enabled=true", "pretrain.aux_coef=0.5", "loss.epochs=2", "loss.minibatches=2",
                "extraction.epochs=2", "bank.min_similarity=0.95", "bank.prune_below=0.0", "steps=2")
    rt = build(cfg)
    prior = pretrain.prior_params(rt)
    s0 = loop.init_state(rt, jax.random.key(0), cfg)
    for a, b in zip(jax.tree_util.tree_leaves(s0.actor.params), jax.tree_util.tree_leaves(prior["actor"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # every method starts from the prior
    chunk = loop.compiled_chunk(rt, 2)
    _, m1 = chunk(s0, jnp.int32(2))
    _, m2 = chunk(loop.init_state(rt, jax.random.key(0), cfg), jnp.int32(2))
    for k in m1:
        np.testing.assert_array_equal(np.asarray(m1[k]), np.asarray(m2[k]), err_msg=k)
    assert np.isfinite(np.asarray(m1["actor/prior_loss"])).all() and float(m1["actor/updated"][0]) == 1.0
    # 4 PPO steps per iteration: after the first, the ratio moves off 1
    assert float(m1["actor/approx_kl"][0]) > 0


def test_aux_rows_per_optimizer_step_of_each_model():
    """`pretrain.aux_rows` synthetic rows for each actor step, `pretrain.extractor_aux_rows` for each extractor
    step; the extractor's rows and batch carry their response width (the loss scores that window only)."""
    cfg = micro("pretrain.aux_rows=6", "pretrain.extractor_aux_rows=3", "extraction.epochs=2", "loss.epochs=2",
                "loss.minibatches=2")
    rt = build(cfg)
    a = pretrain.aux_actor_rows(rt, jax.random.key(0), 4)
    assert a.tokens.shape[:2] == (4, 6)
    buf = rt.buffer_ops.init()
    _, eb = batches.extractor_batch(rt, buf, jnp.int32(0), jnp.asarray(False), jax.random.key(1), epochs=2)
    R = cfg.extraction.max_new_tokens
    assert eb.prior.tokens.shape == (2, 3, cfg.extraction.prompt_len + R)
    assert eb.prior.response_width == R and eb.response_width == buf.response.shape[1]


def test_eval_retrieval_breaks_ties_toward_the_most_used_entry():
    b = bank_lib.init(4, 2, 2)
    for i in range(3):
        b, _ = bank_lib.add(b, jnp.asarray([i, i]), 2, jnp.asarray([1.0, 0.0]), 0, 0, i)
    b = b.replace(times_retrieved=jnp.asarray([0, 5, 2, 0], jnp.int32))
    q = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    slots, found = bank_lib.retrieve_best(b, q, jnp.zeros((2,), jnp.int32), min_similarity=0.9, used_bonus=1e-4)
    assert slots.tolist() == [1, -1] and found.tolist() == [True, False]
    slots, _ = bank_lib.retrieve_best(b, q, jnp.zeros((2,), jnp.int32))  # no bonus: the lowest slot
    assert int(slots[0]) == 0


def test_eval_retrieval_prefers_the_best_credited_entry_then_the_most_used():
    b = bank_lib.init(4, 2, 2)
    for i in range(4):
        b, _ = bank_lib.add(b, jnp.asarray([i, i]), 2, jnp.asarray([1.0, 0.0]), 0, 0, i)
    # slot 0: used 9 times, mean credit -1/3; slot 1: never credited; slot 2: used once, credit +1;
    # slot 3: used 4 times, credit +1 (same mean as slot 2, more uses)
    b = b.replace(times_retrieved=jnp.asarray([9, 0, 1, 4], jnp.int32),
                  total_credit_sum=jnp.asarray([-1.0, 0.0, 1.0, 4.0]), total_credit_count=jnp.asarray([3, 0, 1, 4]))
    q = jnp.asarray([[1.0, 0.0]])
    t = jnp.zeros((1,), jnp.int32)
    assert int(bank_lib.retrieve_best(b, q, t, used_bonus=1e-6, credit_bonus=1e-4)[0][0]) == 3
    assert int(bank_lib.retrieve_best(b, q, t, used_bonus=1e-4)[0][0]) == 0  # uses alone: the most used
    b2 = b.replace(total_credit_sum=jnp.asarray([-1.0, 0.0, 1.0, 0.0]), total_credit_count=jnp.asarray([3, 0, 1, 4]))
    assert int(bank_lib.retrieve_best(b2, q, t, used_bonus=1e-6, credit_bonus=1e-4)[0][0]) == 2  # credit first


def test_shared_tie_ranks_rotate_training_retrieval_through_one_levels_entries():
    b = bank_lib.init(4, 2, 2)
    for i in range(3):
        b, _ = bank_lib.add(b, jnp.asarray([i, i]), 2, jnp.asarray([1.0, 0.0]), 0, 0, i)
    b, _ = bank_lib.add(b, jnp.asarray([9, 9]), 2, jnp.asarray([0.8, 0.6]), 0, 0, 3)  # another level
    b = b.replace(times_retrieved=jnp.asarray([3, 0, 1, 0], jnp.int32))
    q, t = jnp.asarray([[1.0, 0.0]]), jnp.zeros((1,), jnp.int32)
    kw = dict(top_k=1, candidates=4, diversity_lambda=0.4, recent_steps=0, demote_p=0.0)
    # slot ranks 0, 1, 2, 3: slot 0 scores -0.4*log(4) = -0.55 > slot 1's -1
    _, slots, _ = bank_lib.retrieve(b, q, t, None, 5, **kw)
    assert int(slots[0, 0]) == 0
    # shared ranks 0, 0, 0, 3: the least used of the three equal entries (slot 1) wins
    b2, slots, _ = bank_lib.retrieve(b, q, t, None, 5, shared_ties=True, **kw)
    assert int(slots[0, 0]) == 1
    # slot 1 now used twice: the least used of the three is slot 2 (once)
    b2 = b2.replace(times_retrieved=b2.times_retrieved.at[1].set(2))
    _, slots, _ = bank_lib.retrieve(b2, q, t, None, 6, shared_ties=True, **kw)
    assert int(slots[0, 0]) == 2


@pytest.mark.parametrize("outcome_last", [True, False])
def test_compact_distill_prompt_puts_moves_then_the_outcome_and_the_answer(outcome_last):
    """The default layout ends with the outcome, after the answer label; the paper's rules put it before."""
    from crl_jax.extractor.distill import distill_prompts
    from crl_jax.learner.pretrain import _Moves

    rt = build(micro() if outcome_last else micro("extraction.outcome_last=false", "extraction.baseline=batch_mean"))
    a = [int(x) for x in rt.tiny.action_ids]
    ep = _Moves(action_tokens=jnp.asarray([[a[0], a[3], 0, 0]]), turns=jnp.asarray([2]))
    p, n = distill_prompts(rt, rt.train_task_tokens[:1], rt.train_task_len[:1], ep, jnp.asarray([True]),
                           jnp.asarray([[a[1], 0, 0, 0]]), jnp.asarray([1]), jnp.asarray([True]))
    pad = rt.tokenizer.decode([rt.tokenizer.pad_id])
    tail = "<OP><SUCC>" if outcome_last else "<SUCC><OP>"
    assert _decode(rt, p[0], n[0]) == f"<DISTIL><L0><OLD><east><MOVES><north><west>{pad}{pad}{tail}"


def test_the_default_prior_ships_with_the_package(tmp_path, monkeypatch):
    """The embedded default's prior is shipped (crl_jax/learner/priors), so a fresh machine skips the fit: its
    id is the default config's (a change to what shapes the prior fails here: refit with
    `crl-jax pretrain --refit` and ship the new file), and an empty cache loads it without training."""
    cfg = load(None, [f"pretrain.cache_dir={tmp_path}"])
    pid = pretrain.prior_id(cfg)
    shipped = pretrain.shipped_path(pid)
    assert os.path.exists(shipped), f"no shipped prior for the default's id {pid} in {pretrain.SHIPPED_DIR}"
    with open(shipped[:-4] + ".json") as f:
        assert json.load(f)["prior_id"] == pid
    rt = build(cfg)
    monkeypatch.setattr(pretrain, "train_prior", lambda rt: pytest.fail("the shipped prior should be loaded"))
    monkeypatch.setattr(pretrain, "_MEMO", {})
    params = pretrain.prior_params(rt)
    leaves = jax.tree_util.tree_leaves(params)
    assert leaves and all(np.isfinite(np.asarray(x)).all() for x in leaves)
    assert pretrain.prior_meta_path(cfg) == shipped[:-4] + ".json"
    assert not os.listdir(tmp_path)  # nothing written to the cache


@pytest.mark.parametrize("name", ["families", "paper"])
def test_the_demo_presets_priors_ship_with_the_package(name):
    """The priors of `crl-jax demo --preset families` (3000 actor steps: minutes to fit) and `--preset paper` (the
    distillation prompt with the outcome before the answer label) ship too, so the presets skip the fit; each id is
    its preset's config's (a change to what shapes it fails here: refit with `crl-jax pretrain --refit` and ship the
    new file)."""
    from crl_jax.infra.demo import preset

    pid = pretrain.prior_id(load(None, list(preset(name)[0])))
    shipped = pretrain.shipped_path(pid)
    assert os.path.exists(shipped), f"no shipped prior for preset {name}'s id {pid} in {pretrain.SHIPPED_DIR}"
    with open(shipped[:-4] + ".json") as f:
        assert json.load(f)["prior_id"] == pid
