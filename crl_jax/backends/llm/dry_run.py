"""Dry run of an LLM config without weights: parameter and AdamW-state shapes via `jax.eval_shape`.

`dry_run(cfg)` builds each model's `TransformerConfig` from its preset (a `crl_jax.models.presets` name,
or a checkpoint folder's config.json when the path exists), then the abstract parameters
(`nnx.eval_shape`) and the optimizer state (`jax.eval_shape(tx.init)`): nothing is allocated, so a
laptop can validate a 7B + 4B config. Returns a dict per model: config, parameter count, bytes of
parameters and of optimizer state, plus the config's batch sizes.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from crl_jax.backends.llm.runtime import model_config
from crl_jax.config import Config
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tr


def _bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def model_shapes(m) -> dict:
    mcfg = model_config(m, shapes_only=True)
    abstract = nnx.eval_shape(lambda: tr.create(mcfg, jax.random.key(0)))
    _, params = nnx.split(abstract, nnx.Param)
    tx = ts.make_optimizer(lr=m.lr, weight_decay=m.weight_decay, grad_clip=m.grad_clip)
    opt = jax.eval_shape(tx.init, params)
    n = int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
    return {"config": mcfg, "params": params, "opt_state": opt, "num_params": n, "param_bytes": _bytes(params),
            "opt_bytes": _bytes(opt)}


def dry_run(cfg: Config) -> dict:
    out = {"actor": model_shapes(cfg.actor), "extractor": model_shapes(cfg.extractor)}
    out["rollouts_per_step"] = cfg.rollout.groups * cfg.rollout.group_size
    out["devices_needed"] = max(1, cfg.mesh.data) * max(1, cfg.mesh.fsdp) * max(1, cfg.mesh.tensor)
    return out
