"""Device mesh and shardings of the whole Complementary-RL loop state (both models).

Mesh axes `('data', 'fsdp', 'tensor')` from `MeshConfig` (-1 = auto: whatever the other sizes leave).

Logical axes -> mesh axes (`RULES`):

| logical   | where                                            | mesh axis            |
|-----------|--------------------------------------------------|----------------------|
| vocab     | embed [V, H] rows, lm_head [H, V] columns        | tensor               |
| embed     | hidden dim H of every matrix                     | fsdp                 |
| heads     | wq [L, H, Nq*D] out, wo [L, Nq*D, H] in, bq      | tensor               |
| kv_heads  | wk / wv [L, H, Nkv*D] out, bk / bv               | tensor               |
| mlp       | w_gate / w_up [L, H, I] out, w_down [L, I, H] in | tensor               |
| layers    | leading L of stacked layers (the scan axis)      | — (replicated)       |
| norm      | RMSNorm scales [L, H] / [H], q/k norms [L, D]    | — (replicated)       |
| batch     | activations [B, ...]                             | (data, fsdp)         |
| length    | activations [B, T, ...]                          | — (replicated)       |
| entries   | bank arrays [capacity, ...] (`mesh.bank=entries`)| (data, fsdp, tensor) |

A dimension is only sharded when its size divides by the mesh axes' product (heads / kv_heads also need
the head *count* to divide, so shards hold whole heads); otherwise it is replicated — tiny models have odd
sizes (vocab 270). Layers stay replicated because the stacked layers are consumed by `lax.scan`, which
would otherwise gather one layer per step. Optimizer moments (`mu`, `nu`) follow their parameter; every
other leaf (counts, buffer, key, step, flags) is replicated.

`sharded_chunk(rt, n, shardings)` is `loop.compiled_chunk` with `in_shardings`/`out_shardings`: the whole
scanned chunk stays ONE jitted program; XLA's SPMD partitioner inserts the collectives.

Disjoint sub-meshes (`extractor_devices` > 0): one jitted program runs on exactly one device set (jit
raises "incompatible devices" otherwise; running different programs on disjoint subsets means separate
jit calls). The loop's iteration interleaves both models inside one program, so here the extractor's
state is *resident* on its own sub-mesh (checkpointed and restored there) and is moved with
`jax.device_put` onto the full mesh for each chunk and back after it. Results equal the shared mesh;
there is no concurrency gain until the iteration is split into an actor phase and an extractor phase
(two programs with explicit transfers of the episodes) — see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from crl_jax import loop
from crl_jax.config import ConfigError
from crl_jax.infra.distributed import fetch

AXES = ("data", "fsdp", "tensor")

RULES: dict[str, tuple[str, ...] | None] = {
    "vocab": ("tensor",), "embed": ("fsdp",), "heads": ("tensor",), "kv_heads": ("tensor",),
    "mlp": ("tensor",), "layers": None, "norm": None, "head_dim": None,
    "batch": ("data", "fsdp"), "length": None, "entries": ("data", "fsdp", "tensor"),
}

# Logical axes of every transformer parameter (crl_jax/models/transformer.py), by name.
PARAM_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"), "lm_head": ("embed", "vocab"), "final_norm": ("norm",),
    "attn_norm": ("layers", "norm"), "mlp_norm": ("layers", "norm"),
    "wq": ("layers", "embed", "heads"), "wk": ("layers", "embed", "kv_heads"),
    "wv": ("layers", "embed", "kv_heads"), "wo": ("layers", "heads", "embed"),
    "bq": ("layers", "heads"), "bk": ("layers", "kv_heads"), "bv": ("layers", "kv_heads"),
    "q_norm": ("layers", "head_dim"), "k_norm": ("layers", "head_dim"),
    "w_gate": ("layers", "embed", "mlp"), "w_up": ("layers", "embed", "mlp"), "w_down": ("layers", "mlp", "embed"),
}


# ----------------------------------------------------------------------------------------------
# Mesh


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with at most one -1 resolved; ValueError when they do not fill `num_devices`."""
    sizes = [mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor]
    auto = [i for i, s in enumerate(sizes) if s == -1]
    if len(auto) > 1:
        raise ValueError(f"mesh: at most one axis may be -1 (auto), got data/fsdp/tensor = {sizes}")
    fixed = math.prod(s for s in sizes if s != -1)
    if auto:
        if num_devices % fixed:
            raise ValueError(f"mesh: {num_devices} devices do not divide by the fixed axes' product {fixed} "
                             f"(data/fsdp/tensor = {sizes})")
        sizes[auto[0]] = num_devices // fixed
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh: data*fsdp*tensor = {math.prod(sizes)} ({sizes}) must equal the "
                         f"{num_devices} devices it is built on")
    return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
    """Mesh with axes ('data', 'fsdp', 'tensor') over `devices` (default: all, every process)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), AXES, axis_types=(AxisType.Auto,) * 3)


def split_devices(mesh_cfg, devices=None) -> tuple[list, list]:
    """(actor devices, extractor devices): the last round(fraction * n) devices go to the extractor."""
    devices = list(jax.devices() if devices is None else devices)
    f = mesh_cfg.extractor_devices
    if f <= 0:
        return devices, devices
    n_e = round(f * len(devices))
    if not 0 < n_e < len(devices):
        raise ValueError(f"mesh.extractor_devices={f} of {len(devices)} devices leaves an empty sub-mesh")
    return devices[:-n_e], devices[-n_e:]


def sub_mesh(devices) -> Mesh:
    """A sub-mesh for the extractor: every device on 'fsdp' (its sizes rarely match the actor's axes)."""
    return Mesh(np.asarray(devices, dtype=object).reshape(1, len(devices), 1), AXES, axis_types=(AxisType.Auto,) * 3)


# ----------------------------------------------------------------------------------------------
# Partition specs


def logical_to_spec(logical, shape, mesh: Mesh, counts: dict | None = None) -> P:
    """PartitionSpec for logical axis names; a dim is replicated unless its size (and, for heads, the
    head count in `counts`) divides by the product of its mesh axes. A mesh axis is used at most once."""
    used, out = set(), []
    for name, size in zip(logical, shape):
        axes = tuple(a for a in (RULES.get(name) or ()) if a not in used and mesh.shape[a] > 1)
        n = math.prod(mesh.shape[a] for a in axes)
        ok = axes and size % n == 0 and (counts or {}).get(name, n) % n == 0
        out.append((axes[0] if len(axes) == 1 else axes) if ok else None)
        used.update(axes if ok else ())
    return P(*out)


def _param_name(path) -> str | None:
    if path and getattr(path[-1], "key", None) in ("a", "b"):  # LoRA adapter factors {target: {"a", "b"}}
        return None  #  (crl_jax.models.lora) and their moments: small, replicated; the base is sharded by name
    for k in reversed(path):
        key = getattr(k, "key", None)
        if isinstance(key, str) and key in PARAM_AXES:
            return key
    return None


def param_specs(params, mesh: Mesh, model_cfg=None):
    """PartitionSpec tree for a parameter tree (or any tree holding params by name, e.g. optimizer
    moments): leaves are matched by their parameter name and rank; others are replicated.
    `model_cfg` (a TransformerConfig) adds the head counts so head shards hold whole heads."""
    counts = {} if model_cfg is None else {"heads": model_cfg.num_heads, "kv_heads": model_cfg.num_kv_heads}

    def spec(path, x):
        name = _param_name(path)
        if name is None or len(PARAM_AXES[name]) != len(x.shape):
            return P()
        return logical_to_spec(PARAM_AXES[name], x.shape, mesh, counts)

    return jax.tree_util.tree_map_with_path(spec, params)


def batch_spec(ndim: int, mesh: Mesh, batch_size: int) -> P:
    """[B, T, ...] activations: batch over (data, fsdp) where it divides, the rest replicated."""
    return logical_to_spec(("batch",) + ("length",) * (ndim - 1), (batch_size,) + (1,) * (ndim - 1), mesh)


# ----------------------------------------------------------------------------------------------
# The loop state


@dataclass(frozen=True, eq=False)
class Placement:
    """Where a run's state lives: `state` = NamedSharding tree of the LoopState as stored between chunks;
    `compute` = the same tree on the one mesh the compiled chunk runs on (== state without sub-meshes)."""

    mesh: Mesh  # the compute mesh (all devices of the run)
    state: Any
    compute: Any
    key: tuple = ()  # what `compute` depends on besides the Runtime: the compiled-chunk cache key

    @property
    def disjoint(self) -> bool:
        return self.state is not self.compute


def _tree_shardings(tree, mesh, model_cfg=None):
    specs = param_specs(tree, mesh, model_cfg)
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def _bank_shardings(bank, mesh, mode: str):
    cap = bank.valid.shape[0]

    def one(x):
        if mode == "entries" and x.ndim >= 1 and x.shape[0] == cap:
            return NamedSharding(mesh, logical_to_spec(("entries",) + ("norm",) * (x.ndim - 1), x.shape, mesh))
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map(one, bank)


def _on_mesh(state, mesh, mesh_cfg, actor_cfg, extractor_cfg, extractor_mesh):
    rep = NamedSharding(mesh, P())
    return state.replace(
        flags=jax.tree_util.tree_map(lambda _: rep, state.flags),
        actor=_tree_shardings(state.actor, mesh, actor_cfg),
        extractor=_tree_shardings(state.extractor, extractor_mesh, extractor_cfg),
        bank=_bank_shardings(state.bank, mesh, mesh_cfg.bank),
        buffer=jax.tree_util.tree_map(lambda _: rep, state.buffer),
        key=rep, step=rep, env_steps=rep)


def state_shardings(state, mesh_cfg, devices=None, *, actor_cfg=None, extractor_cfg=None) -> Placement:
    """Shardings of a whole LoopState (or its `jax.eval_shape`) for `mesh_cfg` over `devices`.

    Params and optimizer moments by `RULES`; bank replicated or along entries (`mesh_cfg.bank`); buffer,
    key, step, flags replicated. With `extractor_devices` > 0 the actor lives on a mesh of the first
    devices and the extractor on a disjoint sub-mesh of the rest (`Placement.state`), while the chunk
    computes on the full mesh (`Placement.compute`)."""
    devices = list(jax.devices() if devices is None else devices)
    full = make_mesh(mesh_cfg, devices)
    compute = _on_mesh(state, full, mesh_cfg, actor_cfg, extractor_cfg, full)
    key = (full.devices.shape, tuple(d.id for d in devices), mesh_cfg.bank)
    if mesh_cfg.extractor_devices <= 0:
        return Placement(full, compute, compute, key)
    a_dev, e_dev = split_devices(mesh_cfg, devices)
    a_mesh, e_mesh = sub_mesh(a_dev), sub_mesh(e_dev)
    resident = _on_mesh(state, a_mesh, mesh_cfg, actor_cfg, extractor_cfg, e_mesh)
    return Placement(full, resident, compute, key)


def for_runtime(rt, state, mesh_cfg, devices=None) -> Placement:
    """`state_shardings` with the run's mesh config (`cfg.mesh`; the Runtime itself is mesh-agnostic, so one
    compiled-program cache serves every placement) and the Runtime's model configs."""
    return state_shardings(state, mesh_cfg, devices, actor_cfg=rt.actor_config, extractor_cfg=rt.extractor_config)


def shard_state(state, shardings):
    """Place a state (host or device arrays) on a sharding tree (`Placement.state` or any tree)."""
    if isinstance(shardings, Placement):
        shardings = shardings.state
    return jax.device_put(state, shardings)


def init_sharded(rt, key, cfg, placement: Placement):
    """`loop.init_state` compiled with `out_shardings`: each device (each process, multi-host) creates only
    its own shards — the multi-process way to place a fresh state (no host array spans processes)."""
    state = jax.jit(lambda k: loop.init_state(rt, k, cfg), out_shardings=placement.compute)(key)
    return jax.device_put(state, placement.state) if placement.disjoint else state  # one jit, one device set


def check_fits(mesh_cfg, num_devices: int | None = None) -> None:
    """ConfigError (naming mesh.*) unless the mesh asks for no sharding (every axis 1, no sub-mesh) or fills
    the visible devices: a mesh larger than them would otherwise train unsharded on one device."""
    if mesh_cfg.data == mesh_cfg.fsdp == mesh_cfg.tensor == 1 and mesh_cfg.extractor_devices <= 0:
        return
    n = jax.device_count() if num_devices is None else num_devices
    try:
        mesh_shape(mesh_cfg, n)
        split_devices(mesh_cfg, list(range(n)))
    except ValueError as e:
        raise ConfigError(f"{e} ({n} device(s) visible; set mesh.* to 1 for one device)") from None


def is_trivial(mesh_cfg, num_devices: int | None = None) -> bool:
    """True when a config asks for no sharding: one device in total, or every axis 1 and no sub-mesh."""
    n = jax.device_count() if num_devices is None else num_devices
    return n == 1 or (mesh_cfg.data == mesh_cfg.fsdp == mesh_cfg.tensor == 1 and mesh_cfg.extractor_devices <= 0)


# ----------------------------------------------------------------------------------------------
# Compiled chunk


_CHUNKS: dict = {}  # (Runtime, num_steps, placement key) -> jitted chunk; a sub-mesh run shares the full one's


def _jitted(rt, num_steps: int, placement: Placement, run_steps=None):
    run_steps = run_steps or loop.run_steps
    k = (rt, num_steps, placement.key, run_steps)
    if k not in _CHUNKS:
        rep = NamedSharding(placement.mesh, P())
        _CHUNKS[k] = jax.jit(lambda s, last: run_steps(rt, s, num_steps, last),
                             in_shardings=(placement.compute, rep), out_shardings=(placement.compute, rep))
    return _CHUNKS[k]


def sharded_chunk(rt, num_steps: int, placement: Placement, run_steps=None):
    """`(state, last_step) -> (state, metrics)` like `loop.compiled_chunk`, as one jitted program with
    in/out shardings on `placement.mesh`. The state comes and goes in `placement.state` (with disjoint
    sub-meshes the extractor is transferred onto the compute mesh and back around the program). With
    several processes the metrics come back as host numpy arrays (every process holds them all)."""
    fn = _jitted(rt, num_steps, placement, run_steps)  # run_steps: loop.run_steps, or the LLM path's
    if not placement.disjoint and jax.process_count() == 1:
        return fn

    def run(state, last_step):
        if placement.disjoint:
            state = jax.device_put(state, placement.compute)
        state, metrics = fn(state, last_step)
        if placement.disjoint:
            state = jax.device_put(state, placement.state)
        if jax.process_count() > 1:  # replicated over processes: hand every host its numpy copy
            metrics = fetch(metrics)
        return state, metrics

    return run
