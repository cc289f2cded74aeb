"""Test set-up before jax starts: 8 simulated CPU devices (sharding tests), LLVM backend optimisation
level 0 (tests run many small programs once: compile time dominates, ~40% less of it), XLA's older CPU
fusion emitters instead of the MLIR ones where this XLA has the flag (`--xla_cpu_use_fusion_emitters=false`:
the micro loop's 2-step chunk compiles in 23.5 instead of 49.4 CPU seconds), float32 matmuls, and a
persistent XLA compilation cache private to this test session (a fresh folder, removed at the end):
the compiled programs are dropped after every module to bound memory, and modules (and the multi-host
worker processes, which inherit the folder) that compile the same program again load it from disk.

CI runs the suite in 2 processes (`-n 2 --dist loadfile`, pytest-xdist): XLA compiles one program on one core,
so two test files at a time use both cores (~1.6x on the unit tests); `loadfile` keeps each file in one
worker, so module fixtures are built once. The workers inherit the controller's cache folders (made here
only where unset), so every process of a session shares one compilation cache and one prior cache.

Layout: tests/unit (pure functions and small pieces), tests/integration (several pieces together: the loop,
run folders and the CLI, the LLM loop), tests/slow (modules marked `slow` or loading real models / reference
implementations). The shared helpers (`_checkpoints`, `_llm_common`, `_sharding_common`, the multi-host worker)
and the golden files stay here at tests/; this folder is put on sys.path so every sub-folder imports them."""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared helpers (tests/_*.py)


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA defines `flag` (an unknown flag in XLA_FLAGS aborts the process): its name is
    in one of jaxlib's shared libraries. Read without importing jax, which must start after the flags are set."""
    import glob
    import importlib.util
    import mmap

    for lib in sorted(glob.glob(os.path.join(os.path.dirname(importlib.util.find_spec("jaxlib").origin), "*.so"))):
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(flag.encode()) >= 0:
                return True
    return False


# The compile flags, also for the subprocesses that set their own device count (multi-host workers, the mesh
# collectives benchmark); computed once per session, the workers inherit them.
if "CRL_JAX_TEST_COMPILE_FLAGS" not in os.environ:
    os.environ["CRL_JAX_TEST_COMPILE_FLAGS"] = "--xla_backend_optimization_level=0" + (
        " --xla_cpu_use_fusion_emitters=false" if _xla_knows("xla_cpu_use_fusion_emitters") else "")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      + os.environ["CRL_JAX_TEST_COMPILE_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# In the environment, not only in jax.config below: the CLI subprocesses (kill -9 and resume, the one-line errors)
# then lower the same HLO as this process (the precision is part of every dot), so they load its compiled
# programs from the session's cache instead of compiling their own.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
# Made only where unset: pytest-xdist workers (and the multi-host worker processes) inherit the controller's
# folders, so every process of one test session shares one compilation cache and one prior cache.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="crl_jax_test_xla_cache_")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")  # small programs: not worth the I/O
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
_OWN_PRIORS = "CRL_JAX_CACHE" not in os.environ
if _OWN_PRIORS:  # priors (§6) of this session
    os.environ["CRL_JAX_CACHE"] = tempfile.mkdtemp(prefix="crl_jax_test_priors_")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# the same settings again in case a plugin imported jax before this file ran
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_after_each_module():
    """One pytest process compiles hundreds of XLA programs; drop them (and the memory maps of their code)
    after each test module so the process stays within memory and the kernel's map-count limit."""
    yield
    jax.clear_caches()
    gc.collect()


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if _OWN_PRIORS:
        shutil.rmtree(os.environ["CRL_JAX_CACHE"], ignore_errors=True)
