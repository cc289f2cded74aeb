#!/usr/bin/env bash
# Create a SEPARATE virtual environment with google-tunix 0.1.7 for the Tunix comparison benchmarks
# (experiments/bench/tunix_sampler.py, tunix_agentic.py). Never install tunix into the project's
# interpreter: its pins downgrade transformers and other packages.
#
#   bash experiments/bench/tunix_setup.sh                 # -> /work/venvs/tunix (or $TUNIX_VENV)
#   bash experiments/bench/tunix_setup.sh /tmp/tunix-venv # explicit path
#
# Extra pip arguments can be passed in $TUNIX_PIP_ARGS (e.g. a CUDA jax: TUNIX_PIP_ARGS='jax[cuda12]').
# Idempotent: an existing venv with tunix 0.1.7 importable is left as it is.
set -euo pipefail
VENV="${1:-${TUNIX_VENV:-/work/venvs/tunix}}"
PY="${TUNIX_BASE_PYTHON:-python3}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('google-tunix') != '0.1.7')" 2>/dev/null; then
  echo "tunix venv ready: $VENV"; exit 0
fi
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q "google-tunix==0.1.7" ${TUNIX_PIP_ARGS:-}
"$VENV/bin/python" -c "import tunix, jax, flax; print('tunix venv ready:', '$VENV', 'jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
