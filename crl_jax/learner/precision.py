"""Mixed precision: float32 master weights beside bfloat16 compute weights.

A model stored in bfloat16 and updated in bfloat16 does not learn at the paper's learning rate: a weight of
magnitude ~0.02 has a bfloat16 spacing of ~1.2e-4 (8 bits of mantissa), and Adam's first steps move each weight
by about lr = 1e-6, so the sum rounds back to the old weight (98% of 0.02-scale weights unchanged after 10 steps at
lr 1e-6: tests/unit/test_precision.py). With masters (`TrainState.master`, `ModelConfig.param_dtype`
"float32") the forward and backward still run in bfloat16 on `params`, while the optimizer state and the update
live on float32 copies, and `params` is re-rounded from them after each step. Cost: 4 bytes per trained
parameter more than the float32 Adam moments already take (bf16 weights 2 + masters 4 + moments 8 = 14 bytes
per parameter, against 6 with bfloat16 moments). LoRA adapters are float32 already and get no masters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def master_dtype(model_cfg):
    """The masters' dtype of a `ModelConfig` (its `param_dtype`), or None when the weights are their own
    masters (`param_dtype` equal to `dtype`: the update in the weights' dtype)."""
    return None if model_cfg.param_dtype == model_cfg.dtype else jnp.dtype(model_cfg.param_dtype)


def make_master(trainable, dtype=None):
    """The master copy of the trainable weights in `dtype`, or None when no master is needed: `dtype` None, or
    every trainable leaf already in it (float32 weights, LoRA adapters)."""
    if dtype is None:
        return None
    dt = jnp.dtype(dtype)
    if all(jnp.dtype(x.dtype) == dt for x in jax.tree_util.tree_leaves(trainable)):
        return None
    return jax.tree_util.tree_map(lambda x: x.astype(dt), trainable)
