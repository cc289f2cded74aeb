"""Multi-process (multi-host) start-up and per-process data helpers.

`initialize(dist_cfg)` wraps `jax.distributed.initialize` and must run before anything touches a device.
Sources, in order: the config (`coordinator`, `num_processes`, `process_id`), then the environment
(`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`). One process and no coordinator: no-op.
`coordinator: auto`: `jax.distributed.initialize()` with no arguments, which finds the job itself on a Cloud TPU
pod (and under SLURM / Open MPI / Kubernetes, which JAX detects): one process per host, the same command on each.
On CPU the cross-process collectives use gloo (`jax_cpu_collectives_implementation`; without it a
multi-process CPU program has no collectives).

After start-up `jax.devices()` lists every process's devices and `sharding.make_mesh` spans them all; each
process feeds and reads only its addressable shards. The loop generates its data on device from the run
key, so no per-process input pipeline is needed: `global_array` covers host data that must enter a
sharded program (every process passes the same host value), and `fetch` brings a (possibly
non-addressable) result back to every host. Orbax checkpoints are collective: every process calls
`Checkpointer.save` / `restore` with the same step (process 0 writes metadata, each writes its shards).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from crl_jax.config import ConfigError


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    try:
        return int(v) if v.strip() else default
    except ValueError:
        raise ConfigError(f"environment variable {name}={v!r} is not an integer") from None


def settings(dist_cfg) -> dict | None:
    """(coordinator_address, num_processes, process_id) from the config, else the environment; {} for
    `coordinator: auto` (JAX detects them); None when the job is a single process; incomplete or inconsistent
    settings are a ConfigError naming the keys."""
    coord = dist_cfg.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    if coord == "auto":  # the cluster tells JAX the rest (TPU pod metadata, SLURM, ...)
        return {}
    n = dist_cfg.num_processes if dist_cfg.num_processes > 1 else _env_int("JAX_NUM_PROCESSES", 1)
    pid = dist_cfg.process_id if dist_cfg.process_id >= 0 else _env_int("JAX_PROCESS_ID", -1)
    if n <= 1 and not coord:
        return None
    if not coord or n <= 1 or pid < 0:
        missing = [k for k, bad in (("distributed.coordinator", not coord), ("distributed.num_processes", n <= 1),
                                    ("distributed.process_id", pid < 0)) if bad]
        raise ConfigError(f"{', '.join(missing)}: a multi-process job needs coordinator, num_processes > 1 and "
                          f"process_id >= 0 (got {coord!r}, {n}, {pid}); set them in the config or "
                          "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID")
    if not 0 <= pid < n:
        raise ConfigError(f"distributed.process_id: {pid} not in [0, {n}) (distributed.num_processes = {n})")
    return {"coordinator_address": coord, "num_processes": n, "process_id": pid}


_STARTED = False


def initialize(dist_cfg) -> bool:
    """Join the job described by `dist_cfg` / the environment; returns True when multi-process.

    Idempotent; a no-op for a single process. Call before the first device use."""
    global _STARTED
    kw = settings(dist_cfg)
    if kw is None:
        return False
    if not _STARTED:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU backends only; ignored on GPU/TPU
        jax.distributed.initialize(**kw)
        _STARTED = True
    return True


def is_main() -> bool:
    """Process 0: the one that writes run-folder files other than checkpoints (metrics, summaries)."""
    return jax.process_index() == 0


def global_array(host_value, sharding):
    """A global jax.Array with `sharding` from a host value every process holds in full."""
    x = np.asarray(host_value)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def fetch(tree):
    """Host numpy copy of a tree of (possibly cross-process sharded) arrays, on every process."""
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        if x.sharding.is_fully_replicated:  # every process already holds all of it
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree_util.tree_map(one, tree)
