"""The LLM format prior (crl_jax/backends/llm/format_prior.py) on a small random model with the real SmolLM2
tokenizer and prompts: synthetic targets are a legal move in the answer format / a JSON list of one add
(random lesson words) or a return, in the loop's own prompt layout; the data do not depend on the level
pools; a fit moves only the adapters; the cache returns the same adapters; the run's starting weights
are base + merged adapters."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _llm_common import small_runtime

from crl_jax.backends.llm import format_prior as fpm
from crl_jax.backends.llm.answer import parse_prefilled_text
from crl_jax.extractor.ops_json import parse_operations
from crl_jax.models import transformer as tr

SMALL = {"rollout": {"groups": 2, "group_size": 2, "max_action_tokens": 8},
         "env": {"max_turns": 2, "num_train_tasks": 4, "num_eval_tasks": 2,
                 "params": {"dark": False, "crop": 0, "legend": True}},
         "extraction": {"max_new_tokens": 48, "prompt_len": 700},
         "bank": {"entry_len": 40, "capacity": 16, "key_dim": 64},
         "format_prior": {"actor_steps": 1, "extractor_steps": 0, "batch": 2}, "lora": {"rank": 2}}


@pytest.fixture(scope="module")
def rt():
    rt_, _ = small_runtime(SMALL)
    host = jax.tree_util.tree_map(np.asarray, tr.split(tr.create(rt_.actor_config, jax.random.key(0)))[1])
    return dataclasses.replace(rt_, llm=dataclasses.replace(rt_.llm, actor_weights=host, extractor_weights=host))  # one base


def _targets(rt, toks, mask):
    return [rt.tokenizer.decode(np.asarray(t)[np.asarray(m)].tolist()) for t, m in zip(toks, mask)]


def test_actor_rows_are_random_legal_moves_in_the_answer_format(rt):
    toks, mask = jax.jit(lambda k: fpm.actor_rows(rt, k, 6))(jax.random.key(0))
    texts = _targets(rt, toks, mask)
    moves = [parse_prefilled_text(t, rt.env.action_names) for t in texts]
    assert all(t == rt.env.action_names[m] + "</answer>" for t, m in zip(texts, moves))
    assert len(set(moves)) > 2  # random moves, not one answer
    first = rt.tokenizer.decode(np.asarray(toks[0])[: int(np.argmax(np.asarray(mask[0])))].tolist())
    assert first.endswith("<|im_start|>assistant\n<answer>") and "Goal: Level" in first  # the loop's layout
    # deterministic from the key
    again, _ = jax.jit(lambda k: fpm.actor_rows(rt, k, 6))(jax.random.key(0))
    np.testing.assert_array_equal(toks, again)


def test_extractor_rows_parse_into_operations_and_ignore_the_level_pools(rt):
    toks, mask = jax.jit(lambda k: fpm.extractor_rows(rt, k, 3))(jax.random.key(1))
    ops = [parse_operations(rt.llm.distill_pieces.prefill + t) for t in _targets(rt, toks, mask)]
    assert all(len(o) == 1 and o[0].op in ("add", "return") for o in ops)
    assert any(o[0].op == "add" and o[0].text.startswith("<title>") for o in ops)
    # another level-pool seed: the same synthetic data (nothing here reads a level)
    other, _ = small_runtime({**SMALL, "env": {**SMALL["env"], "pool_seed": 7}})
    other = dataclasses.replace(other, llm=dataclasses.replace(other.llm, actor_weights=rt.llm.actor_weights,
                                                               extractor_weights=rt.llm.extractor_weights))
    toks2, _ = jax.jit(lambda k: fpm.extractor_rows(other, k, 3))(jax.random.key(1))
    np.testing.assert_array_equal(toks, toks2)


def test_fit_moves_only_adapters_cache_and_starting_weights(rt, tmp_path):
    rt_ = dataclasses.replace(rt, cfg=dataclasses.replace(
        rt.cfg, pretrain=dataclasses.replace(rt.cfg.pretrain, cache_dir=str(tmp_path))))
    before = jax.tree_util.tree_map(np.copy, rt_.llm.actor_weights)
    ad = fpm.format_prior_adapters(rt_)
    assert (tmp_path / f"format-prior-{fpm.format_prior_id(rt_.cfg)}.npz").exists()
    for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(rt_.llm.actor_weights)):
        np.testing.assert_array_equal(x, y)  # the shared base is never written
    assert float(jnp.abs(ad["actor"]["wq"]["b"]).max()) > 0  # the adapters moved (one step here)
    assert float(jnp.abs(ad["extractor"]["wq"]["b"]).max()) == 0  # zero steps: a fresh adapter
    fpm._MEMO.clear()
    cached = fpm.format_prior_adapters(rt_)  # from disk
    for x, y in zip(jax.tree_util.tree_leaves(ad), jax.tree_util.tree_leaves(cached)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    said = []  # `crl-jax pretrain --refit`: fits again past the memo and the cache (the same fit: same seed)
    refit = fpm.format_prior_adapters(rt_, log=said.append, refit=True)
    assert any(m.startswith("training the format prior") for m in said), said
    for x, y in zip(jax.tree_util.tree_leaves(ad), jax.tree_util.tree_leaves(refit)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    w = fpm.starting_weights(rt_)
    assert not np.array_equal(w["actor"]["wq"][...], before["wq"][...])
    np.testing.assert_array_equal(w["actor"]["embed"][...], before["embed"][...])  # not a LoRA target
    # what shapes the prior is in its id; the run seed and the method are not
    c = rt_.cfg
    assert fpm.format_prior_id(dataclasses.replace(c, seed=3, method="grpo")) == fpm.format_prior_id(c)
    assert fpm.format_prior_id(dataclasses.replace(c, lora=dataclasses.replace(c.lora, rank=4))) != \
        fpm.format_prior_id(c)


def test_op_token_is_scored_against_the_data_op_distribution(rt):
    """v2 loss: the extractor's op token (first token where the add and return targets differ) is scored
    by the cross-entropy against (ADD_P, 1 - ADD_P); with the row's own draw as one-hot it is the hard loss."""
    off, ids, probs = fpm.op_target(rt)
    tok = rt.tokenizer
    assert [tok.token_text(int(i)) for i in ids] == ["add", "return"] and off == 4
    np.testing.assert_allclose(probs, [2 / 3, 1 / 3])
    toks, mask = jax.jit(lambda k: fpm.extractor_rows(rt, k, 6))(jax.random.key(1))
    start = np.argmax(np.asarray(mask), 1)
    op = np.asarray(toks)[np.arange(6), start + off]
    assert set(op.tolist()) <= set(ids.tolist())
    gd, p = tr.split(tr.create(rt.extractor_config, jax.random.key(0)))
    cap = fpm.reply_cap(rt, "extractor")
    f = jax.jit(lambda t, m, sp: fpm.nll(gd, p, t, m, cap, (off, ids, sp)))
    for i in range(6):  # one-hot on the row's own op: the hard loss
        t, m = toks[i:i + 1], mask[i:i + 1]
        hard = fpm.nll(gd, p, t, m, cap)
        onehot = jnp.asarray([1.0, 0.0] if op[i] == ids[0] else [0.0, 1.0])
        np.testing.assert_allclose(f(t, m, onehot), hard, rtol=1e-5)
        assert abs(float(f(t, m, 1 - onehot)) - float(hard)) > 1e-4  # the other op: a different loss
