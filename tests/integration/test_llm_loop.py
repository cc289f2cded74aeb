"""The LLM path on CPU with small random models and the SmolLM2 tokenizer: free-text actions in the
compiled rollout (invalid replies count and leave the env unchanged), the training row, JSON operations
through the loop's own parser entry (>= 10,000 fuzz strings), one compiled chunk with the loop's metric
keys and a retrace guard, and the qwen_paper dry run."""

import dataclasses
import os
import random
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _llm_common import small_runtime

from crl_jax import loop as tiny
from crl_jax.backends.llm.distill import parse_responses
from crl_jax.infra.dry_run import dry_run
from crl_jax.backends.llm.rollout import play
from crl_jax.backends.llm.runtime import is_llm_config
from crl_jax.config import load
from crl_jax.infra import cli
from crl_jax.extractor.ops_json import parse_operations_with_stats
from crl_jax.models import transformer as tr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = {"rollout": {"groups": 2, "group_size": 2, "max_action_tokens": 8},
         "env": {"max_turns": 3, "num_train_tasks": 4, "num_eval_tasks": 4},
         "extraction": {"max_new_tokens": 16, "prompt_len": 640, "batch": 2, "buffer_capacity": 8},
         "bank": {"entry_len": 24, "capacity": 16, "key_dim": 64},
         "eval": {"every": 0, "tasks": 1}}


@pytest.fixture(scope="module")
def rt():
    return small_runtime(SMALL)


def test_is_llm_config():
    assert not is_llm_config(load(None, {}))
    assert is_llm_config(load(None, {"actor": {"preset": "smollm2-135m"}}))


@pytest.mark.parametrize("reply,action", [
    ("I go <answer>east</answer>", 1), ("<answer> North </answer>", 0), ("<ANSWER>south</ANSWER>", 2),
    ("<answer>west</answer> or <answer>east</answer>", 1), ("<answer>west</answer> <answer>up</answer>", 3),
    ("east", 1),  # a bare first move: the prompt ends with the prefilled <answer> (llm_prompt.prefill default)
    ("northeastward", -1), ("<answer>up</answer>", -1), ("<answer>northeastward</answer>", -1), ("", -1),
    ("<answer>northwest", 7)])
def test_free_text_actions_through_the_loops_parser(rt, reply, action):
    r, _ = rt
    ids = r.tokenizer.encode(reply)
    toks = jnp.asarray(ids + [0] * (24 - len(ids)), jnp.int32)
    assert int(r.llm.answer_parser(toks, jnp.int32(len(ids)))) == action


def test_rollout_invalid_replies_count_and_leave_env_unchanged(rt):
    r, cfg = rt
    params = tr.split(tr.create(r.actor_config, jax.random.key(1)))[1]
    N, T = 4, r.num_turns
    tasks = jnp.arange(N, dtype=jnp.int32) % 4
    exp = jnp.zeros((N, cfg.bank.entry_len), jnp.int32)
    f = jax.jit(chex.assert_max_traces(lambda p, k: play(
        r, p, k, env=r.env, renderer=r.renderer, tasks=tasks, task_tokens=r.train_task_tokens[tasks],
        task_len=r.train_task_len[tasks], exp=exp, exp_len=jnp.zeros((N,), jnp.int32),
        has_exp=jnp.zeros((N,), bool), temperature=1.0), n=1))
    ep = f(params, jax.random.key(0))
    ep = f(params, jax.random.key(0))  # no retrace
    # A random model never writes a valid answer: every played turn is invalid and changes nothing.
    assert (np.asarray(ep.invalid) == np.asarray(ep.turns)).all() and (np.asarray(ep.turns) == T).all()
    assert (np.asarray(ep.actions) == -1).all() and not np.asarray(ep.success).any()
    dec = lambda n, t: r.tokenizer.decode(np.asarray(ep.obs[n, t, : int(ep.obs_len[n, t])]).tolist())
    for n in range(N):
        for t in range(T - 1):  # same map (the message line may change: it reports the wasted turn)
            assert dec(n, t).split("\n", 1)[1] == dec(n, t + 1).split("\n", 1)[1]
    # The training row: head + turns + replies, replies masked for the loss with their behaviour log-probs.
    m = np.asarray(ep.loss_mask)
    assert 0 < m.sum(1).min() and m.sum(1).max() <= T * cfg.rollout.max_action_tokens
    assert (np.asarray(ep.logp)[~m] == 0).all() and (np.asarray(ep.logp)[m] <= 0).all()
    assert (np.asarray(ep.length) <= ep.tokens.shape[1]).all()
    text = r.tokenizer.decode(np.asarray(ep.tokens[0, : int(ep.length[0])]).tolist())
    assert text.startswith("<|im_start|>system\n") and text.count("Turn 3. What you see now:") == 1
    assert "A lesson written from earlier games" not in text  # free rollouts: no experience block


def test_carried_conversation_rollouts_equal_the_whole_prompt_ones(rt):
    """`rollout.share_prefix`: the conversation's keys and values carried from turn to turn (the head encoded
    once per distinct head, each turn prefilling only its new user part) play what the whole-prompt path plays
    (greedy): the same replies, actions and training rows, log-probs equal to float32 order. Timed on this
    2-block model."""
    r, cfg = rt
    shared = dataclasses.replace(r, cfg=dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout,
                                                                                            share_prefix=True)))
    params = tr.split(tr.create(r.actor_config, jax.random.key(2)))[1]
    N = 4
    tasks = jnp.array([0, 0, 1, 2], jnp.int32)  # two rollouts share a head: encoded once
    kw = dict(tasks=tasks, task_tokens=r.train_task_tokens[tasks], task_len=r.train_task_len[tasks],
              exp=jnp.zeros((N, cfg.bank.entry_len), jnp.int32), exp_len=jnp.zeros((N,), jnp.int32),
              has_exp=jnp.zeros((N,), bool), temperature=0.0)
    eps = {}
    for name, runtime in (("whole", r), ("shared", shared)):
        f = jax.jit(lambda p, k, runtime=runtime: play(runtime, p, k, env=runtime.env, renderer=runtime.renderer,
                                                       prefix_block=2, **kw))
        jax.block_until_ready(f(params, jax.random.key(0)))
        t0 = time.perf_counter()
        eps[name] = jax.block_until_ready(f(params, jax.random.key(0)))
        print(f"{name}: {time.perf_counter() - t0:.3f} s per call")
    a, b = eps["whole"], eps["shared"]
    for field in ("tokens", "length", "loss_mask", "actions", "active", "turns", "invalid", "obs"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    np.testing.assert_allclose(b.logp, a.logp, atol=1e-4)


def _fuzz_strings(rng, n):
    atoms = ['<answer>', '</answer>', '[', ']', '{', '}', '"op"', '"add"', '"update"', '"return"', '"text"', ':',
             ',', '"<title>a</title><content>b</content>"', ' ', '\n', 'x', 'é', '🙂', '```', "'", '\\']
    good = '<answer>[{"op": "add", "text": "<title>t</title><content>go east</content>"}]</answer>'
    for i in range(n):
        k = i % 4
        if k == 0:
            yield good[: rng.randint(0, len(good))]
        elif k == 1:
            j = rng.randint(0, len(good))
            yield good[:j] + rng.choice(atoms) + good[j + rng.randint(0, 3):]
        elif k == 2:
            yield "".join(rng.choice(atoms) for _ in range(rng.randint(0, 40)))
        else:
            yield "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 30))) + rng.choice(["", good])


def test_json_fuzz_through_the_loops_callback(rt):
    """10,240 strings, tokenised as a generation would be, through `crl_jax.backends.llm.distill.parse_responses`."""
    r, cfg = rt
    tok = r.tokenizer
    R, B = 96, 1024
    f = jax.jit(lambda t, n: parse_responses(r, t, n))
    rng = random.Random(7)
    texts = list(_fuzz_strings(rng, 10 * B))
    n_valid, host_s = 0, 0.0
    for b in range(10):
        rows = [tok.encode(s)[:R] for s in texts[b * B:(b + 1) * B]]
        toks = np.zeros((B, R), np.int32)
        for i, ids in enumerate(rows):
            toks[i, : len(ids)] = ids
        t0 = time.perf_counter()
        out = jax.device_get(f(jnp.asarray(toks), jnp.asarray([len(x) for x in rows], jnp.int32)))
        host_s += time.perf_counter() - t0
        assert set(np.unique(out["op"])) <= {0, 1, 2}
        assert (out["entry_len"][out["mask"]] > 0).all() and (out["entry_len"] <= cfg.bank.entry_len).all()
        assert not out["mask"][~out["valid"]].any()
        for i in range(0, B, 97):  # spot-check against the host parser on the decoded text
            # the reply continues the prompt's prefill ('<answer>[' by default): the parser reads both
            text = r.llm.distill_pieces.prefill + tok.decode(rows[i])
            assert out["valid"][i] == parse_operations_with_stats(text)[1].valid
        n_valid += int(out["valid"].sum())
    assert 0 < n_valid < 10 * B
    print(f"json callback: {1e3 * host_s / 10:.1f} ms per batch of {B} responses of {R} tokens")


@pytest.mark.slow
@pytest.mark.heavy  # 2 compiled steps of random models; CI runs the same compiled chunk in test_llm_smoke.py
def test_compiled_chunk_has_the_loop_metrics(rt):
    r, cfg = rt
    st = tiny.init_state(r, jax.random.key(0), cfg)
    fn = tiny.compiled_chunk(r, 2)
    st2, m = fn(st, jnp.int32(2))
    m = jax.device_get(m)
    keys = {"success_guided", "success_free", "success_all", "retrieved_frac", "episode_turns", "bank_size",
            "extractor_reward_mean", "extractor_ready", "ops_add", "ops_update", "ops_return", "ops_invalid",
            "merged_entries", "buffer_overflow", "env_steps", "adv_abs_mean", "actor/loss", "extractor/loss",
            "invalid_action_frac", *tiny.EVAL_KEYS}
    assert keys <= set(m) and all(v.shape == (2,) for v in m.values())
    assert int(st2.step) == 2 and float(m["env_steps"][-1]) == 2 * 4 * r.num_turns
    assert np.isnan(m["eval_heldin_with_exp"][0]) and not np.isnan(m["eval_heldin_without_exp"][1])
    # random extractors write no valid JSON: every distillation counted invalid, bank untouched
    assert m["ops_invalid"].sum() + m["ops_return"].sum() + m["ops_add"].sum() + m["ops_update"].sum() >= 8
    assert jax.tree_util.tree_structure(st2) == jax.tree_util.tree_structure(st)
    st3, _ = fn(st2, jnp.int32(4))  # a second chunk: same compiled program, donated state accepted
    assert int(st3.step) == 4 and fn._cache_size() == 1


def test_qwen_paper_dry_run(capsys):
    """`crl-jax dry-run` of the paper's config: shapes, float32 masters and optimizer state beside bfloat16
    weights, their memory per device, in seconds and without weights (the weights paths do not exist here)."""
    path = os.path.join(ROOT, "experiments", "configs", "qwen_paper.yaml")
    cfg = load(path)
    out = dry_run(cfg)
    a, e = out["actor"], out["extractor"]
    assert 7.6e9 < a["num_params"] < 7.7e9 and 4.0e9 < e["num_params"] < 4.1e9
    for m in (a, e):  # bfloat16 weights, float32 masters, float32 Adam moments: 2 + 4 + 8 bytes per parameter
        assert m["dtypes"] == {"weights": ["bfloat16"], "master": ["float32"], "opt_state": ["float32"]}
        assert (m["param_bytes"], m["master_bytes"]) == (2 * m["num_params"], 4 * m["num_params"])
        assert 8 * m["num_params"] <= m["opt_bytes"] < 8 * m["num_params"] + 1024
    # mesh data 4 x fsdp 4: weights, masters and moments are sharded 4 ways (fsdp), replicated over data
    assert 4 * out["per_device"]["actor"]["weights"] >= a["param_bytes"] > 3.9 * out["per_device"]["actor"]["weights"]
    assert out["devices_needed"] == 16 and out["rollouts_per_step"] == cfg.rollout.groups * cfg.rollout.group_size
    t = time.perf_counter()
    cli.main(["dry-run", "--config", path])
    text = capsys.readouterr().out
    assert time.perf_counter() - t < 30
    assert "masters float32, optimizer state float32" in text and "masters 28.37 GiB" in text
    assert "16 devices needed" in text and "tokenizer.json: missing" in text
    bf16 = dry_run(dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, param_dtype="bfloat16")))["actor"]
    assert bf16["master"] is None and bf16["dtypes"]["opt_state"] == ["bfloat16"]  # the update in bfloat16
