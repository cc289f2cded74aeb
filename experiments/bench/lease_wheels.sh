#!/usr/bin/env bash
# Run HERE (a machine with pip's registry), once before a GPU lease: the wheels `lease.sh` installs there.
#
#   bash experiments/bench/lease_wheels.sh        # -> .whl/ (ignored by git; the lease call carries it)
#
# The lent GPU machines (nvidia-h100-x1, nvidia-h200) have no registry. Their image holds jax 0.11 with CUDA,
# flax, optax, orbax, chex, einops, transformers, safetensors, tokenizers, pyyaml, tqdm, rich and matplotlib
# (as the device machines are set up), but not these two of our core dependencies:
#   gguf          imported by crl_jax.models (the GGUF loader), so by every benchmark
#   tensorboardX  imported by crl_jax.infra.metrics when a run writes TensorBoard logs
# Both are pure Python, and everything they need is in the image (numpy, pyyaml, requests, tqdm; packaging,
# protobuf), so they travel without their dependencies. Versions: the ones installed here, so the lease runs
# what CI tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
pins=$("$PY" - <<'PYEOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("gguf", "tensorboardX")))
PYEOF
)
rm -rf .whl && mkdir -p .whl
# the device's Python is 3.12 (KINDS.md); pure-Python wheels match any platform tag, the tags only let pip resolve
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
ls -l .whl
