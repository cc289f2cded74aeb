"""Dry run of an LLM config without weights: parameter and AdamW-state shapes via `jax.eval_shape`.

`dry_run(cfg)` builds each model's `TransformerConfig` from its preset (a `crl_jax.models.presets` name,
or a checkpoint folder's config.json when the path exists), then the abstract parameters
(`nnx.eval_shape`) and the optimizer state (`jax.eval_shape(tx.init)`): nothing is allocated, so a
laptop can validate a 7B + 4B config. Returns a dict per model: config, parameter count, bytes of
parameters and of optimizer state (full fine-tuning), and the LoRA adapters' count and bytes with the
bytes of their optimizer state; plus the config's batch sizes and `state_bytes`: parameters + optimizer
state of both models as the loop state holds them with full fine-tuning (`full`) and with RL through
adapters (`lora`: one base when both models are one checkpoint, `shared_base`); `lora.train` picks which
one a run uses (`used`).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from crl_jax.backends.llm.runtime import model_config
from crl_jax.config import Config
from crl_jax.learner import train_state as ts
from crl_jax.models import lora
from crl_jax.models import transformer as tr


def _bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def model_shapes(m, lc=None) -> dict:
    """Shapes of one model (`m`: a ModelConfig); `lc` (a LoRAConfig) adds its adapters' shapes."""
    mcfg = model_config(m, shapes_only=True)
    abstract = nnx.eval_shape(lambda: tr.create(mcfg, jax.random.key(0)))
    _, params = nnx.split(abstract, nnx.Param)
    tx = ts.make_optimizer(lr=m.lr, weight_decay=m.weight_decay, grad_clip=m.grad_clip)
    opt = jax.eval_shape(tx.init, params)
    n = int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
    out = {"config": mcfg, "params": params, "opt_state": opt, "num_params": n, "param_bytes": _bytes(params),
           "opt_bytes": _bytes(opt)}
    if lc is not None:
        ad = jax.eval_shape(lambda p: lora.init(p, jax.random.key(0), rank=lc.rank,
                                                targets=lora.parse_targets(lc.targets)), params)
        ad_opt = jax.eval_shape(tx.init, ad)
        out.update(adapters=ad, adapter_params=int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(ad))),
                   adapter_bytes=_bytes(ad), adapter_opt_bytes=_bytes(ad_opt))
    return out


def shares_base(cfg: Config) -> bool:
    """Would actor and extractor load one checkpoint (same preset, weights, dtype and truncation)?"""
    key = lambda m: (m.preset, m.weights, m.dtype, m.truncate_layers)  # noqa: E731
    return bool(cfg.actor.weights) and key(cfg.actor) == key(cfg.extractor)


def dry_run(cfg: Config) -> dict:
    a, e = model_shapes(cfg.actor, cfg.lora), model_shapes(cfg.extractor, cfg.lora)
    out = {"actor": a, "extractor": e}
    shared = shares_base(cfg)
    full = sum(m["param_bytes"] + m["opt_bytes"] for m in (a, e))
    lora_bytes = (e["param_bytes"] + (0 if shared else a["param_bytes"])
                  + sum(m["adapter_bytes"] + m["adapter_opt_bytes"] for m in (a, e)))
    out["state_bytes"] = {"full": full, "lora": lora_bytes, "shared_base": shared,
                          "used": "lora" if cfg.lora.train else "full"}
    out["rollouts_per_step"] = cfg.rollout.groups * cfg.rollout.group_size
    out["devices_needed"] = max(1, cfg.mesh.data) * max(1, cfg.mesh.fsdp) * max(1, cfg.mesh.tensor)
    return out
