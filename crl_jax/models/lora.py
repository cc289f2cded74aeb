"""LoRA as a functional parameter transform (Hu et al. 2021): W_eff = W + (alpha / r) * A @ B.

The model code is untouched: `merge(base, adapters, scale)` returns a parameter pytree of the model's own
structure (an `nnx.State`, usable with the same graphdef by `nnx.merge`, the sampler and the losses), so
any function of `(graphdef, params)` runs LoRA-adapted as `fn(graphdef, merge(base, adapters, scale))`.
Training differentiates with respect to `adapters` only; the base enters through `lax.stop_gradient`, is
never in the optimizer and is never written, so one base can serve the actor and the extractor when they
are the same checkpoint (the SmolLM2 preset: half the weight memory).

Adapters are a plain dict `{target: {"a": [L, in, r], "b": [L, r, out]}}` over the stacked-layer
projection matrices of `crl_jax.models.transformer` (attention `wq wk wv wo`, MLP `w_gate w_up w_down`).
`b` starts at zero, so a fresh adapter leaves the model exactly unchanged; `a` is N(0, 1 / in) as in
the reference implementation's Kaiming-style init. Adapter math is float32 whatever the base dtype; the
merged weight is cast back to the base dtype.

RL through adapters (`lora.train`, the LLM path): a train state's `params` is a `LoRAParams` — the trained
`adapters`, the frozen `base` (or None: the base is the other model's, held once in the loop state) and the
static scale. `effective(p, base)` is the model's parameter tree; the optimizer sees `trainable(p)` only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

ALL_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def parse_targets(spec: str) -> tuple[str, ...]:
    """"wq,wv" -> ("wq", "wv"); "all" -> every projection; unknown names are a clear error."""
    names = ALL_TARGETS if spec.strip() == "all" else tuple(t.strip() for t in spec.split(",") if t.strip())
    bad = [t for t in names if t not in ALL_TARGETS]
    if bad or not names:
        raise ValueError(f"lora.targets: {bad or spec!r} not among {list(ALL_TARGETS)} (or 'all')")
    return names


def scale(rank: int, alpha: float) -> float:
    """The LoRA scaling alpha / r."""
    return float(alpha) / float(rank)


def _leaf(base, name):
    x = base[name]
    return x.get_value() if hasattr(x, "get_value") else x


def init(base, key, *, rank: int, targets=ALL_TARGETS) -> dict:
    """Fresh adapters for `targets` of a stacked-layer parameter pytree: a ~ N(0, 1/in), b = 0."""
    out = {}
    for i, name in enumerate(targets):
        w = _leaf(base, name)
        if w.ndim != 3:
            raise ValueError(f"lora.init: {name} has shape {w.shape}, expected stacked [layers, in, out]")
        L, d_in, d_out = w.shape
        a = jax.random.normal(jax.random.fold_in(key, i), (L, d_in, rank), jnp.float32) / jnp.sqrt(d_in)
        out[name] = {"a": a, "b": jnp.zeros((L, rank, d_out), jnp.float32)}
    return out


def delta(adapter: dict, s: float) -> jax.Array:
    """[L, in, out] float32: s * A @ B of one target."""
    return s * jnp.einsum("lir,lro->lio", adapter["a"], adapter["b"])


def merge(base, adapters: dict, s: float):
    """The effective parameters: base with W + s * A @ B at every adapted target (same pytree structure
    and dtypes as `base`; gradients flow to `adapters` only)."""

    def one(path, x):
        name = getattr(path[0], "key", None)
        x = jax.lax.stop_gradient(x)
        if name not in adapters:
            return x
        return (x.astype(jnp.float32) + delta(adapters[name], s)).astype(x.dtype)

    return jax.tree_util.tree_map_with_path(one, base)


def num_params(adapters: dict) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(adapters)))


@struct.dataclass
class LoRAParams:
    """Parameters of a model trained through adapters: `adapters` (trained, float32), `base` (frozen: never
    in the optimizer, never written; None when this model shares another model's base, passed to
    `effective` by whoever holds both), `scale` = alpha / r (static)."""

    adapters: dict
    base: Any = None
    scale: float = struct.field(pytree_node=False, default=1.0)


def is_lora(params) -> bool:
    return isinstance(params, LoRAParams)


def trainable(params):
    """What the optimizer updates: the adapters of a `LoRAParams`, else the whole tree (full fine-tune)."""
    return params.adapters if is_lora(params) else params


def with_trainable(params, new):
    """`params` with its trainable part replaced by `new` (the inverse of `trainable`)."""
    return params.replace(adapters=new) if is_lora(params) else new


def effective(params, base=None):
    """The model's own parameter tree: base + scale * A @ B for a `LoRAParams` (its own base, or `base` when
    it holds none), else `params` unchanged."""
    if not is_lora(params):
        return params
    b = params.base if params.base is not None else base
    if b is None:
        raise ValueError("lora.effective: these adapters share another model's base; pass it as `base`")
    return merge(b, params.adapters, params.scale)
