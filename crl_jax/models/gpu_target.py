"""Lowering the Pallas GPU kernels for a GPU that is not on this machine.

Pallas' Triton lowering asks which GPU it compiles for. jax 0.10 falls back to sm_90 when no GPU is present;
jax 0.11 instead reads the device from the abstract mesh in context and, finding none, refuses ("No supported
GPU devices found"). So an ahead-of-time lowering or compile of `fused_decode` / `fused_sample` on a CPU-only
machine (the tests, `experiments/bench/gpu_aot.py`, `triton_ptx.py`) runs inside `abstract_gpu()`. On a machine
with the GPU, nothing is needed: the lowering reads the real device.
"""

from __future__ import annotations

import jax

H200 = "NVIDIA H200"  # a device kind Pallas maps to its compute capability (9.0)


def abstract_gpu(device_kind: str = H200, num_cores: int = 132, axis: str = "x"):
    """A context in which Pallas lowers its Triton kernels for `device_kind` (default: an H200, 132 SMs), on
    any backend: a one-device abstract mesh over axis `axis` carrying that device. The axis is Auto, as a
    `jax.make_mesh` / topology mesh's is, so arguments placed on such a mesh match it."""
    dev = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), (axis,), (jax.sharding.AxisType.Auto,), abstract_device=dev)
    return jax.sharding.use_abstract_mesh(mesh)
