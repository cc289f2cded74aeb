"""Dry run of an LLM config without weights: parameter, master and AdamW-state shapes via `jax.eval_shape`.

`dry_run(cfg)` builds each model's `TransformerConfig` from its preset (a `crl_jax.models.presets` name, or a
checkpoint folder's config.json: the file only, never the weights; `truncate_layers` applied), then the abstract
parameters (`nnx.eval_shape`) and the optimizer state (`jax.eval_shape(tx.init)`) over the trained weights (the
float32 masters when `param_dtype` differs from `dtype`: `crl_jax.learner.precision`): nothing is allocated, so a
laptop can validate a 7B + 4B config in seconds. Returns a dict per model: config, parameter count, the dtypes of
weights / masters / optimizer state, bytes of parameters, masters and optimizer state (full fine-tuning), the
LoRA adapters' count and bytes with the bytes of their optimizer state, and the per-device bytes on the config's
mesh (`per_device`: weights, masters + optimizer state as `crl_jax.infra.sharding.param_specs` shards them, and
an activation estimate of one learner micro-batch); plus the config's batch sizes, `devices_needed` and
`state_bytes`: parameters (+ masters) + optimizer state of both models as the loop state holds them with full
fine-tuning (`full`) and with RL through adapters (`lora`: one base when both models are one checkpoint,
`shared_base`); `lora.train` picks which one a run uses (`used`).
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh

from crl_jax.backends.llm.runtime import model_config, truncate_layers
from crl_jax.config import Config
from crl_jax.infra import sharding
from crl_jax.infra.errors import read_json
from crl_jax.learner import precision
from crl_jax.learner import train_state as ts
from crl_jax.models import lora
from crl_jax.models import presets
from crl_jax.models import transformer as tr
from crl_jax.models.loading import config_from_hf


def _bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def _dtypes(tree) -> list[str]:
    return sorted({str(np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree) if x.ndim > 0})


def shape_config(m) -> tr.TransformerConfig:
    """The model's TransformerConfig without reading weights: a preset name, a Hugging Face folder's config.json
    (a .gguf file or `pkg:` spec is opened by the loader), then `truncate_layers`."""
    spec = m.preset
    folder_cfg = os.path.join(spec, "config.json")
    if spec not in presets.PRESETS and os.path.isfile(folder_cfg):
        mcfg = config_from_hf(read_json(folder_cfg), dtype=m.dtype, source=folder_cfg)
    else:
        mcfg = model_config(m, shapes_only=True)
    return truncate_layers(mcfg, None, m.truncate_layers)[0]


def _per_device(tree, mesh, mcfg) -> int:
    """Bytes one device holds of `tree` sharded by `sharding.param_specs` on `mesh` (the largest shard)."""
    specs = jax.tree_util.tree_leaves(sharding.param_specs(tree, mesh, mcfg),
                                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    total = 0
    for x, spec in zip(jax.tree_util.tree_leaves(tree), specs):
        split = math.prod(mesh.shape[a] for part in spec if part for a in ((part,) if isinstance(part, str) else part))
        total += int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize // split
    return total


def activation_bytes(mcfg, rows: int, length: int, itemsize: int) -> int:
    """Estimate of the activations one learner micro-batch keeps for its backward pass (no rematerialisation):
    ~(6 H + 4 I) values per token per layer (norms, q/k/v, attention output, the packed gate/up, their product)
    in the compute dtype, plus one [rows, length, H] float32 residual stream."""
    per_token = mcfg.num_layers * (6 * mcfg.hidden_size + 4 * mcfg.intermediate_size) * itemsize
    return int(rows * length * (per_token + 4 * mcfg.hidden_size))


def model_shapes(m, lc=None) -> dict:
    """Shapes of one model (`m`: a ModelConfig); `lc` (a LoRAConfig) adds its adapters' shapes."""
    mcfg = shape_config(m)
    abstract = nnx.eval_shape(lambda: tr.create(mcfg, jax.random.key(0)))
    _, params = nnx.split(abstract, nnx.Param)
    tx = ts.make_optimizer(lr=m.lr, weight_decay=m.weight_decay, grad_clip=m.grad_clip)
    master = jax.eval_shape(lambda p: precision.make_master(p, precision.master_dtype(m)), params)
    opt = jax.eval_shape(tx.init, params if master is None else master)
    n = int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
    out = {"config": mcfg, "params": params, "master": master, "opt_state": opt, "num_params": n,
           "param_bytes": _bytes(params), "master_bytes": _bytes(master), "opt_bytes": _bytes(opt),
           "dtypes": {"weights": _dtypes(params), "master": _dtypes(master) if master is not None else ["(none)"],
                      "opt_state": _dtypes(opt)}}
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


def mesh_of(cfg: Config) -> AbstractMesh:
    """The config's mesh as sizes only (an axis of -1 counts as 1: the dry run knows no device count)."""
    sizes = tuple(max(1, getattr(cfg.mesh, a)) for a in sharding.AXES)
    return AbstractMesh(sizes, sharding.AXES)


def _device_memory(cfg: Config, m: dict, mcfg, rows: int, length: int, mesh, trained: bool) -> dict:
    """Per-device bytes of one model: weights, masters + optimizer state (trained in full; with LoRA the adapters
    and their optimizer state, replicated), activations."""
    if trained:
        trained_bytes = _per_device((m["master"], m["opt_state"]), mesh, mcfg)
    else:
        trained_bytes = m.get("adapter_bytes", 0) + m.get("adapter_opt_bytes", 0)
    batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
    rows_dev = max(1, math.ceil(rows / max(1, cfg.loss.microbatches) / batch_split))
    itemsize = np.dtype(jax.tree_util.tree_leaves(m["params"])[0].dtype).itemsize
    return {"weights": _per_device(m["params"], mesh, mcfg), "optimizer": trained_bytes,
            "activations": activation_bytes(mcfg, rows_dev, length, itemsize), "rows": rows_dev, "length": length}


def dry_run(cfg: Config) -> dict:
    a, e = model_shapes(cfg.actor, cfg.lora), model_shapes(cfg.extractor, cfg.lora)
    out = {"actor": a, "extractor": e}
    shared = shares_base(cfg)
    full = sum(m["param_bytes"] + m["master_bytes"] + m["opt_bytes"] for m in (a, e))
    lora_bytes = (e["param_bytes"] + (0 if shared else a["param_bytes"])
                  + sum(m["adapter_bytes"] + m["adapter_opt_bytes"] for m in (a, e)))
    out["state_bytes"] = {"full": full, "lora": lora_bytes, "shared_base": shared,
                          "used": "lora" if cfg.lora.train else "full"}
    rows = cfg.rollout.groups * cfg.rollout.group_size
    out["rollouts_per_step"] = rows
    out["devices_needed"] = max(1, cfg.mesh.data) * max(1, cfg.mesh.fsdp) * max(1, cfg.mesh.tensor)
    mesh = mesh_of(cfg)
    # the actor trains on whole conversations: at least every turn's reply tokens (the observations add theirs);
    # the extractor on its prompt + generation
    a_len = cfg.env.max_turns * cfg.rollout.max_action_tokens
    e_len = cfg.extraction.prompt_len + cfg.extraction.max_new_tokens
    full_ft = not cfg.lora.train
    out["per_device"] = {
        "actor": _device_memory(cfg, a, a["config"], rows, a_len, mesh, full_ft),
        "extractor": _device_memory(cfg, e, e["config"], cfg.extraction.batch, e_len, mesh, full_ft)}
    return out
