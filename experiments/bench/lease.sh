#!/usr/bin/env bash
# Run THERE, as the one command of a GPU lease (after `lease_wheels.sh` here):
#
#   run(command="bash experiments/bench/lease.sh", carry=[".whl"], timeout_s=600)
#   bash experiments/bench/lease.sh --dry-run     # here: what it would run (tests/integration/test_lease_script.py)
#   bash experiments/bench/lease.sh ARGS...       # gpu.sh ARGS instead of the default plan below
#
# 1. installs the carried wheels (.whl/*.whl) into /tmp/site (the lent machines have no package registry);
# 2. records the machine (nvidia-smi, python, jax and its devices) in $OUT/env.txt, and stops if crl_jax does not
#    import there;
# 3. runs gpu.sh with the default plan, DEADLINE_S (default 540) seconds in all, results in $OUT/gpu_results.json,
#    ending with the GPU targets' verdict table (gpu_targets.py).
# The plan: the open GPU targets first (the batch-1 step with and without the Pallas kernels, the MFU),
# then the candidates the deviceless counts ranked best, the least important last,
# where the deadline cuts. train_mfu reads the MFU's peak from the device kind (an H100 or an H200).
set -u
cd "$(dirname "$0")/../.."
PLAN=(--explore "--only=gpu_checks,sampler,sampler_pallas,train_mfu,llm_head,explore_mfu_unroll,\
explore_mfu_unroll_mlp,explore_mfu_unroll_chunk4k,explore_llm_head_unroll,explore_mfu_mlp,explore_profile_pallas,\
explore_pallas_tiles")
DRY=0
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *) ARGS+=("$arg") ;;
  esac
done
[ "${#ARGS[@]}" -eq 0 ] && ARGS=("${PLAN[@]}")
OUTDIR="${OUT:-./lease_out}"
INSTALL=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site)
RUN=(bash experiments/bench/gpu.sh "${ARGS[@]}" "$OUTDIR/gpu_results.json")
if [ "$DRY" = 1 ]; then
  echo "install: ${INSTALL[*]} .whl/*.whl"
  echo "run: PYTHON=python3 DEADLINE_S=${DEADLINE_S:-540} ${RUN[*]}"
  exit 0
fi
mkdir -p "$OUTDIR"
if ls .whl/*.whl >/dev/null 2>&1; then
  "${INSTALL[@]}" .whl/*.whl || { echo "lease.sh: installing .whl/*.whl failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "lease.sh: no .whl/*.whl (run experiments/bench/lease_wheels.sh here and carry .whl)" >&2
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  python3 -c "import sys, jax; print(sys.version.split()[0], 'jax', jax.__version__, jax.devices())" 2>&1
} | tee "$OUTDIR/env.txt"
PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 -c "import crl_jax.models, crl_jax.loop" 2>&1 | tee -a "$OUTDIR/env.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "lease.sh: crl_jax does not import on this machine" >&2; exit 1; }
PYTHON=python3 DEADLINE_S="${DEADLINE_S:-540}" "${RUN[@]}"
