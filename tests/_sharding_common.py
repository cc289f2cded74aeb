"""Shared runs for the sharding tests (module-level caches: each compiled program is built once per
pytest process). The micro config of test_loop (_micro.MICRO), 2 steps (one of them with evaluation)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from _micro import MICRO

from crl_jax import loop
from crl_jax.config import MeshConfig, load
from crl_jax.infra import sharding
from crl_jax.loop.runtime import build

STEPS = 2
COMPARED = ("success_all", "success_guided", "success_free", "bank_size", "episode_turns", "actor/loss",
            "extractor_ready", "ops_add", "env_steps", "eval_heldin_without_exp", "eval_heldout_with_exp")


def micro_cfg():
    return load(None, MICRO + [f"steps={STEPS}"])


@functools.cache
def one_device():
    """(state, metrics) of the plain `loop.compiled_chunk` on one device (same program as test_loop's)."""
    cfg = micro_cfg()
    rt = build(cfg)
    state = loop.init_state(rt, jax.random.key(cfg.seed), cfg)
    state, m = loop.compiled_chunk(rt, STEPS)(state, jnp.int32(STEPS))
    return state, jax.device_get(m)


@functools.cache
def on_mesh(data, fsdp, tensor, extractor_devices=0.0, bank="replicated"):
    """(placement, state, metrics) of the sharded chunk on an 8-device mesh."""
    mcfg = MeshConfig(data=data, fsdp=fsdp, tensor=tensor, extractor_devices=extractor_devices, bank=bank)
    cfg = dataclasses.replace(micro_cfg(), mesh=mcfg)
    rt = build(cfg)  # as the run driver builds it: of the mesh, the Runtime keeps mesh.tensor (merge_gate_up)
    state = loop.init_state(rt, jax.random.key(cfg.seed), cfg)
    placement = sharding.state_shardings(state, mcfg, actor_cfg=rt.actor_config, extractor_cfg=rt.extractor_config)
    state = sharding.shard_state(state, placement)
    state, m = sharding.sharded_chunk(rt, STEPS, placement)(state, jnp.int32(STEPS))
    return placement, state, jax.device_get(m)


def assert_metrics_close(a, b):
    for k in COMPARED:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-4, atol=1e-5, err_msg=k)
