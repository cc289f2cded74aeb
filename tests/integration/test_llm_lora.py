"""RL through LoRA adapters on the LLM path (`lora.train`, crl_jax/backends/llm/adapters.py), on the small
random-init runtime of tests/_llm_common.py with ONE set of host weights given to both models (as SmolLM2 is
both): the base is held once in the loop state and stays bit-identical through a co-update, only adapter
leaves move, the optimizer state covers the adapters only, zero-init adapters play the same first rollouts
as the full weights, the format prior's adapters start both modes at the same weights, and a run resumed
from an Orbax checkpoint equals the uninterrupted one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _llm_common import small_runtime

from crl_jax import loop
from crl_jax.backends.llm import adapters
from crl_jax.backends.llm import format_prior as fpm
from crl_jax.infra.dry_run import dry_run
from crl_jax.backends.llm.rollout import play
from crl_jax.config import load
from crl_jax.infra.checkpoint import Checkpointer
from crl_jax.learner import train_state as ts
from crl_jax.models import lora
from crl_jax.models import transformer as tr

SMALL = {"rollout": {"groups": 2, "group_size": 2, "max_action_tokens": 4},
         "env": {"max_turns": 2, "num_train_tasks": 4, "num_eval_tasks": 4},
         "extraction": {"max_new_tokens": 8, "prompt_len": 640, "batch": 2, "buffer_capacity": 8, "merge_every": 2},
         "bank": {"entry_len": 16, "capacity": 16, "key_dim": 64, "warmup_steps": 1},
         "eval": {"every": 0, "tasks": 1}, "lora": {"rank": 2, "alpha": 4.0},
         "actor": {"lr": 1e-2}, "extractor": {"lr": 1e-2}}


@pytest.fixture(scope="module")
def shared():
    """(runtime whose two models load the same host weights, config)."""
    rt, cfg = small_runtime(SMALL)
    host = jax.tree_util.tree_map(np.asarray, tr.split(tr.create(rt.actor_config, jax.random.key(5)))[1])
    return dataclasses.replace(rt, llm=dataclasses.replace(rt.llm, actor_weights=host, extractor_weights=host)), cfg


def _with(cfg, **lora_kw):
    return dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, **lora_kw))


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def test_shared_base_is_one_array_and_the_optimizer_sees_only_adapters(shared):
    rt, cfg = shared
    st = loop.init_state(rt, jax.random.key(0), cfg)
    a, e = st.actor.params, st.extractor.params
    assert lora.is_lora(a) and lora.is_lora(e) and a.base is None and e.base is not None
    # the one base is the checkpoint's weights
    for x, y in zip(_leaves(e.base), _leaves(rt.llm.extractor_weights)):
        np.testing.assert_array_equal(x, y)
    base_leaves = {id(x) for x in jax.tree_util.tree_leaves(e.base)}
    all_leaves = jax.tree_util.tree_leaves(st)
    assert sum(id(x) in base_leaves for x in all_leaves) == len(base_leaves)  # each base array once
    assert len({x.unsafe_buffer_pointer() for x in all_leaves if x.size > 1}) == sum(x.size > 1 for x in all_leaves)
    # parameter memory: one base + two adapter sets; optimizer moments shaped like the adapters only
    ad_bytes = _nbytes(a.adapters) + _nbytes(e.adapters)
    assert _nbytes((a, e)) == _nbytes(rt.llm.extractor_weights) + ad_bytes
    for s in (st.actor, st.extractor):
        mu = s.opt_state[1][0].mu
        assert jax.tree_util.tree_structure(mu) == jax.tree_util.tree_structure(s.params.adapters)
    full = loop.init_state(rt, jax.random.key(0), _with(cfg, train=False))
    assert _nbytes((full.actor.params, full.extractor.params)) == 2 * _nbytes(rt.llm.extractor_weights)
    assert _nbytes((st.actor, st.extractor)) < _nbytes((full.actor, full.extractor)) / 2
    # without a shared checkpoint (random init, different keys) each model holds its own base
    no_weights = dataclasses.replace(rt, llm=dataclasses.replace(rt.llm, actor_weights=None, extractor_weights=None))
    own = loop.init_state(no_weights, jax.random.key(0), cfg)
    assert own.actor.params.base is not None and own.extractor.params.base is not None


def _batches(rt, st, key):
    """A synthetic actor and (ready) extractor batch whose behaviour log-probs are the current policies'."""
    B, T = 4, 12
    k1, k2, k3 = jax.random.split(key, 3)
    tokens = jax.random.randint(k1, (B, T), 3, rt.vocab_size)
    mask = jnp.broadcast_to(jnp.arange(T) >= 6, (B, T))
    a_lp = ts.token_logprobs(rt.actor_graphdef, adapters.actor_params(st), tokens, mask)[0]
    e_lp = ts.token_logprobs(rt.extractor_graphdef, adapters.extractor_params(st.extractor.params), tokens, mask)[0]
    ab = ts.ActorBatch(tokens=tokens, loss_mask=mask, behavior_logp=a_lp,
                       advantages=jax.random.normal(k2, (B,)), weight=jnp.ones((B,)))
    eb = ts.ExtractorBatch(tokens=tokens, loss_mask=mask, behavior_logp=e_lp,
                           advantages=jax.random.normal(k3, (B,)), ready=jnp.asarray(True))
    return ab, eb


def test_co_update_moves_only_adapters_and_keeps_the_base_bit_identical(shared):
    rt, cfg = shared
    st = loop.init_state(rt, jax.random.key(0), cfg)
    before = jax.device_get((st.actor, st.extractor))
    ab, eb = _batches(rt, st, jax.random.key(1))
    a2, e2, m = rt.co_update(st.actor, st.extractor, ab, eb)
    assert float(m["actor/updated"]) == 1.0 and float(m["extractor/updated"]) == 1.0
    assert int(a2.step) == 1 and int(e2.step) == 1 and a2.params.base is None
    for x, y in zip(_leaves(e2.params.base), _leaves(before[1].params.base)):
        np.testing.assert_array_equal(x, y)  # frozen: bit-identical
    for new, old in ((a2, before[0]), (e2, before[1])):
        for t, v in new.params.adapters.items():
            # from b = 0 the gradient reaches b only (d loss / d a = s x^T g b^T = 0): every b moved, every a kept
            assert not np.array_equal(np.asarray(v["b"]), np.asarray(old.params.adapters[t]["b"])), t
            np.testing.assert_array_equal(np.asarray(v["a"]), np.asarray(old.params.adapters[t]["a"]))
    a3, e3, _ = rt.co_update(a2, e2, ab, eb)  # the second step moves a too (b != 0 now)
    for new, old in ((a3, a2), (e3, e2)):
        assert all(not np.array_equal(np.asarray(v["a"]), np.asarray(old.params.adapters[t]["a"]))
                   for t, v in new.params.adapters.items())
    # the effective weights moved only at the adapted projections
    eff0 = adapters.extractor_params(before[1].params)
    eff1 = adapters.extractor_params(e2.params)
    for name in eff0:
        same = np.array_equal(np.asarray(eff0[name][...]), np.asarray(eff1[name][...]))
        assert same == (name not in lora.ALL_TARGETS), name


def test_zero_init_adapters_play_the_full_weights_first_rollouts(shared):
    rt, cfg = shared
    st_l = loop.init_state(rt, jax.random.key(0), cfg)
    st_f = loop.init_state(rt, jax.random.key(0), _with(cfg, train=False))
    assert all(float(jnp.abs(v["b"]).max()) == 0 for v in st_l.actor.params.adapters.values())
    p = loop.prepare(rt, st_f)
    key = loop.step_keys(st_f).roll
    f = jax.jit(lambda params: play(rt, params, key, env=rt.env, renderer=rt.renderer, tasks=p.tasks,
                                    task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len,
                                    has_exp=p.has_exp, temperature=1.0))
    ep_l, ep_f = f(jax.jit(adapters.actor_params)(st_l)), f(adapters.actor_params(st_f))
    for x, y in zip(_leaves(ep_l), _leaves(ep_f)):
        np.testing.assert_array_equal(x, y)
    assert int(jnp.sum(ep_l.turns)) > 0


def test_format_prior_adapters_start_both_modes_at_the_same_weights(shared):
    rt, cfg = shared
    cfg = dataclasses.replace(cfg, format_prior=dataclasses.replace(cfg.format_prior, enabled=True))
    tmpl = fpm.adapter_template(rt)
    prior = {n: {t: {"a": v["a"], "b": 0.1 * jax.random.normal(jax.random.key(i), v["b"].shape)}
                 for i, (t, v) in enumerate(ad.items())} for n, ad in tmpl.items()}
    pid = fpm.format_prior_id(rt.cfg)
    fpm._MEMO[pid] = prior
    try:
        st_l = loop.init_state(rt, jax.random.key(0), cfg)
        st_f = loop.init_state(rt, jax.random.key(0), _with(cfg, train=False))
    finally:
        del fpm._MEMO[pid]
    assert st_l.actor.params.base is None  # the prior lives in the adapters: the base stays shared
    for x, y in zip(_leaves(st_l.extractor.params.adapters), _leaves(prior["extractor"])):
        np.testing.assert_array_equal(x, y)
    for got, want in ((jax.jit(adapters.actor_params)(st_l), st_f.actor.params),
                      (jax.jit(adapters.extractor_params)(st_l.extractor.params), st_f.extractor.params)):
        for x, y in zip(_leaves(got), _leaves(want)):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)


@pytest.mark.slow  # one compiled LLM chunk: ~3.5 min on 2 shared CPU cores
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(shared, tmp_path):
    rt, cfg = shared
    chunk = loop.compiled_chunk(rt, 1)
    fresh = lambda: loop.init_state(rt, jax.random.key(3), cfg)  # noqa: E731  (chunks donate their input)
    st, m1 = chunk(fresh(), jnp.int32(2))
    ck = Checkpointer(str(tmp_path), keep=2, writer=True)
    ck.save(1, st)
    st, m2 = chunk(st, jnp.int32(2))
    want = jax.device_get((st, m1, m2))
    restored, step = ck.restore(fresh())
    assert step == 1 and restored.actor.params.base is None
    st_r, m2_r = chunk(restored, jnp.int32(2))
    ck.close()
    got = jax.device_get((st_r, m2_r))
    assert jax.tree_util.tree_structure(got[0]) == jax.tree_util.tree_structure(want[0])
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves((want[0], want[2]))):
        x, y = np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x), \
            np.asarray(jax.random.key_data(y) if jnp.issubdtype(y.dtype, jax.dtypes.prng_key) else y)
        np.testing.assert_array_equal(x, y)
    # two steps of RL moved the adapters, not the shared base
    for x, y in zip(_leaves(got[0].extractor.params.base), _leaves(rt.llm.extractor_weights)):
        np.testing.assert_array_equal(x, y)
    assert float(want[2]["actor/updated"][0]) == 1.0


def test_dry_run_reports_the_state_memory_of_both_modes():
    d = dry_run(load("experiments/configs/smollm2_room.yaml"))
    sb = d["state_bytes"]
    a = d["actor"]
    assert sb["shared_base"] and sb["used"] == "lora"
    assert sb["full"] == 2 * (a["param_bytes"] + a["master_bytes"] + a["opt_bytes"])  # bf16 weights, f32 masters
    assert sb["lora"] == a["param_bytes"] + 2 * (a["adapter_bytes"] + a["adapter_opt_bytes"])
    assert sb["lora"] < sb["full"] / 4
