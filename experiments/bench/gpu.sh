#!/usr/bin/env bash
# Every GPU benchmark of issue #16 in one run (<= 8 minutes on one H200), one results file.
#
#   experiments/bench/gpu.sh [RESULTS.json]          # default: $OUT/gpu_results.json, else ./gpu_results.json
#   experiments/bench/gpu.sh --smoke [RESULTS.json]  # tiny sizes on CPU in tens of seconds (CI: tests/integration/test_gpu_script.py)
#   LLM_BUDGET_S=420 experiments/bench/gpu.sh --llm-only [RESULTS.json]  # the [llm] GPU run as its own call
#
# Steps (each under its own `timeout`, so one slow step cannot eat the others' time; a failed or timed-out
# step is recorded with its exit status and log tail, and the script goes on):
#   sampler        SmolLM2-135M shape (random weights), bf16, decode at batch 256 and batch-1 step time
#   decode_cache   the same shape: old sampler vs in-place cache vs live-length attention (ratios, one process)
#   train_mfu      Qwen2.5-0.5B shape training step MFU, vocabulary-tiled vs full-logits log-probs
#   iteration      CRL vs GRPO iteration of the embedded default, and 8 vmapped seeds vs 1 (sweep.vmapped_chunk);
#                  on a fresh machine it may first train the tiny prior (cached afterwards; see crl_jax/learner/pretrain.py)
#   logprob_memory compiled temporary memory of the log-prob loss at V 49,152 / T 1,024 and at Qwen's V
# Targets (issue #16): decode >= 100k tok/s at B 256; batch-1 step <= 0.3 ms; MFU >= 40 %; 8 seeds <= 3x one.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's crl_jax, whatever is installed
SMOKE=0
LLM_ONLY=0
RES=""
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    --llm-only) LLM_ONLY=1 ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) RES="$arg" ;;
  esac
done
RES="${RES:-${OUT:-.}/gpu_results.json}"
mkdir -p "$(dirname "$RES")"
WORK="$(mktemp -d)"
PY="${PYTHON:-python}"
START=$(date +%s)

if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"  # compile time dominates tiny runs
fi

# step NAME SECONDS SCRIPT ARGS... : runs `python experiments/bench/SCRIPT ARGS --json WORK/NAME.json`
step() {
  local name="$1" limit="$2" script="$3"
  shift 3
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $script $*"
  timeout "$limit" "$PY" "experiments/bench/$script" "$@" --json "$WORK/$name.json" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$rc $(( $(date +%s) - t0 ))" >"$WORK/$name.rc"
  tail -n 15 "$WORK/$name.log"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
}

if [ "$LLM_ONLY" = 1 ]; then
  :  # only the [llm] run below
elif [ "$SMOKE" = 1 ]; then  # generous limits: they only catch hangs (a loaded 2-core CI runner is slow)
  step sampler 150 sampler.py --model tiny --batches 2 --prompt-len 8 --new-tokens 4 --reps 1
  step decode_cache 150 decode_cache.py --smoke
  step train_mfu 150 train_mfu.py --smoke --variants chunked,full
  step logprob_memory 150 logprob_memory.py --smoke --time 1
  # iteration.py compiles the whole loop (minutes on a CPU): the smoke run only checks that it imports and
  # parses its arguments; tests/integration/test_loop.py runs the loop itself.
  timeout 150 "$PY" experiments/bench/iteration.py --help >"$WORK/iteration.log" 2>&1
  echo "$? 0" >"$WORK/iteration.rc"
else
  step sampler 70 sampler.py --model smollm2-shape --batches 1,256 --prompt-len 128 --new-tokens 128 \
    --dtype bfloat16 --reps 3
  step decode_cache 80 decode_cache.py --model smollm2-shape --batches 1,256 --prompt-len 128 --new-tokens 128 \
    --block 128 --dtype bfloat16 --reps 3
  step train_mfu 100 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --variants chunked,full
  step iteration 150 iteration.py --steps 3 --seeds 8 --reps 2
  step logprob_memory 45 logprob_memory.py --batch 8 --seq 1024 --hidden 576 --vocab 49152 --dtype bfloat16 \
    --time 3 --model
  # [llm] (issue #17): SmolLM2 CRL vs GRPO on the lit room (experiments/llm_gpu_run.sh), only when
  # LLM_BUDGET_S > 0 — the benchmarks above already take ~7.4 min of the 8, so on a 10-minute device call
  # run it as its own call: LLM_BUDGET_S=420 bash experiments/bench/gpu.sh --llm-only
  :
fi
if [ "${LLM_BUDGET_S:-0}" -gt 0 ]; then
  t0=$(date +%s)
  echo "== llm (budget ${LLM_BUDGET_S}s): experiments/llm_gpu_run.sh"
  BUDGET_S="$LLM_BUDGET_S" timeout $(( LLM_BUDGET_S + 90 )) bash experiments/llm_gpu_run.sh "$WORK/llm" \
    >"$WORK/llm.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - t0 ))" >"$WORK/llm.rc"
  [ -f "$WORK/llm/llm_gpu_summary.json" ] && cp "$WORK/llm/llm_gpu_summary.json" "$WORK/llm.json"
  [ -n "${OUT:-}" ] && [ -d "$WORK/llm" ] && cp -r "$WORK/llm" "$OUT/llm_run" 2>/dev/null
  tail -n 15 "$WORK/llm.log"
  echo "== llm: rc=$rc in $(( $(date +%s) - t0 ))s"
fi

"$PY" - "$WORK" "$RES" "$SMOKE" "$START" <<'EOF'
import glob, json, os, platform, subprocess, sys, time
work, res, smoke, start = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
out = {"smoke": smoke, "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
       "total_s": int(time.time()) - start, "host": platform.node(), "steps": {}}
try:
    out["load"] = open("/proc/loadavg").read().split()[:3]
except OSError:
    pass
try:
    out["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                        "--format=csv,noheader"], capture_output=True, text=True,
                                       timeout=10).stdout.strip()
except (OSError, subprocess.SubprocessError):
    out["nvidia_smi"] = None
for rc_file in sorted(glob.glob(os.path.join(work, "*.rc"))):
    name = os.path.basename(rc_file)[:-3]
    rc, secs = open(rc_file).read().split()
    entry = {"rc": int(rc), "seconds": int(secs), "timed_out": int(rc) in (124, 137)}
    js = os.path.join(work, name + ".json")
    if os.path.exists(js):
        with open(js) as f:
            entry["result"] = json.load(f)
    log = os.path.join(work, name + ".log")
    if os.path.exists(log):
        entry["log_tail"] = open(log).read()[-3000:]
    out["steps"][name] = entry
with open(res, "w") as f:
    json.dump(out, f, indent=1)
bad = [n for n, e in out["steps"].items() if e["rc"] != 0]
print(f"wrote {res} ({len(out['steps'])} steps, {out['total_s']} s); failed: {bad or 'none'}")
sys.exit(1 if bad else 0)
EOF
