"""The transformer's configuration: `TransformerConfig` (one field per architecture choice of the Llama / Qwen2 /
Qwen3 families), `tiny_config` (the embedded default's model) and `as_dtype`. Re-exported by
`crl_jax.models.transformer`, where the model lives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from crl_jax.models.attention import ATTN_IMPLS

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(name: Any):
    if isinstance(name, str):
        try:
            return _DTYPES[name]
        except KeyError:
            raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}") from None
    return jnp.dtype(name)


REMAT_POLICIES = ("nothing", "dots", "mlp")


def checkpoint_policy(name: str):
    """The `jax.checkpoint` policy of a whole rematerialised block (`TransformerConfig.remat_policy`): None (save
    nothing) or `dots_with_no_batch_dims_saveable`, which keeps every projection matmul's output (their einsums
    have no dot_general batch dimensions; attention's score and value products do, and are recomputed). "mlp"
    rematerialises only each block's MLP (`remat_block`, `remat_mlp`): the attention half keeps its residuals,
    so a fused attention kernel's forward is not run again in the backward pass."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat_policy {name!r}: choose one of {REMAT_POLICIES}")
    return None if name in ("nothing", "mlp") else jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def remat_block(block, cfg):
    """A layer-scan body under `cfg.remat` / `cfg.remat_policy` (whole-block policies; "mlp": unchanged here)."""
    if not cfg.remat or cfg.remat_policy == "mlp":
        return block
    return jax.checkpoint(block, policy=checkpoint_policy(cfg.remat_policy))


def remat_mlp(mlp, cfg):
    """The MLP of a block: rematerialised on its own under remat_policy "mlp", else as it is."""
    return jax.checkpoint(mlp) if cfg.remat and cfg.remat_policy == "mlp" else mlp


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int  # number of token ids (embedding rows)
    hidden_size: int  # model width H
    intermediate_size: int  # SwiGLU hidden width I
    num_layers: int  # decoder blocks L
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention when < num_heads)
    head_dim: int | None = None  # per-head width D; default hidden_size // num_heads
    rope_theta: float = 10000.0  # RoPE base frequency
    rope_scaling: tuple | None = None  # sorted (key, value) items of the HF rope_scaling dict, or None
    rms_norm_eps: float = 1e-6  # epsilon inside every RMSNorm
    tie_embeddings: bool = True  # lm_head shares the embedding matrix
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2 family)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3 family)
    max_position_embeddings: int = 2048  # longest position the RoPE tables are built for
    param_dtype: str = "float32"  # storage dtype of parameters ("float32" | "bfloat16")
    remat: bool = False  # rematerialise each block in the backward pass (saves activation memory)
    remat_policy: str = "nothing"  # what a rematerialised block keeps for the backward pass: "nothing" (recompute
    #                                the whole block; least memory) | "dots" (keep the projection matmuls' outputs,
    #                                recompute the elementwise ops and attention: `checkpoint_policy`) | "mlp"
    #                                (recompute only the MLP; attention keeps its residuals)
    scan_unroll: int = 1  # layers per iteration of the uncached forward's layer scan (training, scoring): 1 = a
    #                       rolled loop; num_layers = straight-line layers, whose saved activations are buffers of
    #                       their own instead of slices written into [L, ...] stacks (Qwen2.5-0.5B-shape step on
    #                       an H200, by experiments/bench/gpu_aot.py's count: -35 GB of copies); compiles longer
    pack_mlp: bool = True  # the uncached forward packs gate / up into one [L, H, 2, I] matmul whose product
    #                        `layers.swiglu` differentiates in one pass (5 [B, T, I] tensors per layer, not 7; at
    #                        the Qwen2.5-0.5B shape 7-62 GB and 94-240 launches fewer per step).
    #                        On a mesh that shards parameters it all-reduces as many bytes as two matmuls or fewer
    #                        (bench/mesh_collectives.py)
    merge_gate_up: bool = False  # the packed matmul over its weight viewed as [H, 2I] (one output axis), not
    #                              [H, 2, I]: XLA:CPU then keeps `swiglu`'s backward out of the transpose that feeds
    #                              the weight's gradient (SmolLM2-shape extractor update on a 2-core CPU 5.24 ->
    #                              4.02-4.15 s). Off on a mesh with a 'tensor' axis: a
    #                              merged axis cannot keep I's tensor sharding (it all-reduces the whole product)
    family: str = "llama"  # informational: llama | qwen2 | qwen3 | tiny
    attn_impl: str = "auto"  # uncached attention: "einsum" (float32 softmax, any backend) | "xla" | "cudnn"
    #                          (jax.nn.dot_product_attention; cudnn = fused flash attention, CUDA + bf16/fp16) |
    #                          "blocked" (plain causal forward in blocks, its own backward: blocked_attention.py) |
    #                          "auto" (cudnn on a GPU, blocked on a CPU from 256 tokens, where they apply; else
    #                          einsum: attention.attention_impl)

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def replace(self, **kw) -> "TransformerConfig":
        return dataclasses.replace(self, **kw)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TransformerConfig.{name} must be > 0, got {getattr(self, name)}")
        as_dtype(self.param_dtype)
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"TransformerConfig.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if self.scan_unroll < 1:
            raise ValueError(f"TransformerConfig.scan_unroll must be >= 1, got {self.scan_unroll}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"TransformerConfig.attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None


def tiny_config(vocab_size: int, **overrides) -> TransformerConfig:
    """The tiny model of the embedded default and of most tests (a few hundred K parameters)."""
    base = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                max_position_embeddings=1024, family="tiny")
    base.update(overrides)
    return TransformerConfig(**base)
