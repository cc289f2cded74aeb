"""Test set-up before jax starts: 8 simulated CPU devices (sharding tests), LLVM backend optimisation
level 0 (tests run many small programs once: compile time dominates, ~40% less of it), float32 matmuls."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_after_each_module():
    """One pytest process compiles hundreds of XLA programs; drop them (and the memory maps of their code)
    after each test module so the process stays within memory and the kernel's map-count limit."""
    yield
    jax.clear_caches()
    gc.collect()
