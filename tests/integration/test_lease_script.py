"""experiments/bench/lease.sh, the one command of a GPU lease: its default plan names only steps that gpu.sh
runs on a GPU (a renamed or removed step would otherwise be skipped silently, costing a lease its result), and it
installs the carried wheels the way the device's README prescribes."""

import os
import re
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "experiments", "bench")


def _gpu_steps() -> set[str]:
    """Names of gpu.sh's steps outside its --smoke branch (the steps a GPU run can execute)."""
    text = open(os.path.join(BENCH, "gpu.sh")).read()
    gpu_part = text.split('elif [ "$SMOKE" = 1 ]; then', 1)[1].split("else\n", 1)[1]
    return set(re.findall(r"\bstep (\w+) \d+ ", gpu_part))


def test_lease_plan_names_only_gpu_steps():
    env = dict(os.environ)
    env.pop("OUT", None)
    p = subprocess.run(["bash", os.path.join(BENCH, "lease.sh"), "--dry-run"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    install = next(line for line in p.stdout.splitlines() if line.startswith("install: "))
    run = next(line for line in p.stdout.splitlines() if line.startswith("run: "))
    assert "--no-index --no-deps" in install and "--target /tmp/site" in install and install.endswith(".whl/*.whl")
    assert "PYTHON=python3" in run and "bash experiments/bench/gpu.sh --explore" in run
    only = re.search(r"--only=(\S+)", run).group(1).split(",")
    steps = _gpu_steps()
    assert {"gpu_checks", "sampler_pallas", "train_mfu", "explore_mfu_unroll"} <= steps  # the parser found them
    assert only[:4] == ["gpu_checks", "sampler", "sampler_pallas", "train_mfu"]  # the open targets first
    assert set(only) <= steps, set(only) - steps


def test_lease_passes_other_arguments_to_gpu_sh():
    p = subprocess.run(["bash", os.path.join(BENCH, "lease.sh"), "--dry-run", "--only=sampler"],
                       capture_output=True, text=True, env=dict(os.environ, OUT="/tmp/x"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert "gpu.sh --only=sampler /tmp/x/gpu_results.json" in p.stdout


def test_mfu_peak_by_device_kind():
    """train_mfu's MFU divides by the leased GPU's own peak: an H100 PCIe is not an H200."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_mfu", os.path.join(BENCH, "train_mfu.py"))
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    assert tm.peak_flops("NVIDIA H200") == 989e12
    assert tm.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert tm.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert tm.peak_flops("NVIDIA H100 NVL") == 835e12
    assert tm.peak_flops("cpu") is None
