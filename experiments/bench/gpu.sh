#!/usr/bin/env bash
# Every GPU benchmark (docs/PERFORMANCE.md) in one run (<= 8 minutes on one H200), one results file.
#
#   experiments/bench/gpu.sh [RESULTS.json]          # default: $OUT/gpu_results.json, else ./gpu_results.json
#   experiments/bench/gpu.sh --smoke [RESULTS.json]  # tiny sizes on CPU in tens of seconds (CI: tests/integration/test_gpu_script.py)
#   DEADLINE_S=575 experiments/bench/gpu.sh --explore  # also the exploration steps below, inside one 10-min call
#   experiments/bench/gpu.sh --only=sampler,train_mfu [RESULTS.json]  # just those steps (e.g. a lease in two calls)
#   LLM_BUDGET_S=420 experiments/bench/gpu.sh --llm-only [RESULTS.json]  # the [llm] GPU run as its own call
#
# Steps, in this order (each under its own `timeout`, cut to what is left of DEADLINE_S, default 480 s, so one
# slow step cannot eat the others' time; a failed, timed-out or skipped step is recorded with its exit status
# and log tail, and the script goes on; the benchmarks print each row as it is measured, so a step cut short
# still leaves its finished rows in its log tail):
#   gpu_checks     correctness of the backend-dependent paths: cuDNN attention vs einsum (logits, gradients),
#                  the GPU decode plan vs the CPU one (same greedy tokens), the fused decode kernels vs XLA's step
#   sampler        SmolLM2-135M shape (random weights), bf16, decode at batch 256 and batch-1 step time
#   sampler_pallas the same batch-1 step with the fused Pallas / Triton decode kernels (models/experimental/fused_decode.py)
#   train_mfu      Qwen2.5-0.5B shape training step MFU: vocabulary-tiled vs full-logits log-probs, the tiled
#                  one with cuDNN flash attention (attn_impl="cudnn"), and that with the head's gradient taken in
#                  its forward pass (cudnn_fused: train_state.token_loss, the actor / extractor losses' default)
#   iteration      CRL vs GRPO iteration of the embedded default, and 8 vmapped seeds vs 1 (sweep.vmapped_chunk);
#                  on a fresh machine it may first train the tiny prior (cached afterwards; see crl_jax/learner/pretrain.py)
#   decode_cache   the same shape: old sampler vs in-place cache vs live-length attention, each also with the
#                  30 layers unrolled (ratios, one process)
#   logprob_memory compiled temporary memory of the log-prob loss at V 49,152 / T 1,024 and at Qwen's V
#   llm_head       the LLM path's actor and extractor losses at SmolLM2 shape: vocabulary head over every position
#                  vs over the trained tokens only (llm_head.py)
#   (--smoke also runs decode_hlo and gpu_profile at micro size; on the GPU they are explore steps)
# --explore (after those, in the time left): explore_pallas_tiles = the fused batch-1 decode kernels' tile sizes and
#   warps (sampler.py --fused-set); explore_profile_pallas = their batch-1 step kernel by kernel;
#   explore_profile = kernel-by-kernel time of the SmolLM2-shape decode
#   (B 1, 256) and the Qwen-shape training step (gpu_profile.py: jax.profiler, Perfetto JSON summed by name);
#   explore_decode_hlo = the cache-shaped copies / converts / updates
#   in the compiled SmolLM2-shape decode at B 256 (decode_hlo.py: what a B 256 step moves besides the new slot);
#   explore_cmdbuf = the sampler at batch 1 and 256 with XLA's command
#   buffers (CUDA graphs) extended to while loops and conditionals (launch overhead); explore_head_qwen(_big) =
#   the vocabulary-tiled log-prob head alone at the Qwen2.5-0.5B shape (B 8 x T 2048, H 896, V 151,936), default
#   and larger tiles; explore_mfu_noremat = train_mfu's cuDNN variant without remat; explore_mfu_dots = with remat
#   keeping the projection matmuls' outputs (remat_policy="dots"), without and with the fused head;
#   explore_mfu_mlp = the fused head with only the MLPs rematerialised (remat_policy="mlp": cuDNN's attention
#   forward is not run again in the backward);
#   explore_mfu_unroll(_mlp) = the fused head with the 24 layers unrolled (scan_unroll=24: the saved activations
#   are not copied into [L, ...] stacks), without remat (gpu_aot.py's floor: 110 ms, the best) and with the MLPs
#   rematerialised (122 ms); the first also with the causal mask as a dense cuDNN bias, as the library did earlier
#   (cudnn_fused_bias: the before / after of cuDNN's plain causal kernel); explore_mfu_unroll_chunk4k = the first
#   with 4,096-row head chunks, not 1,024 (gpu_aot.py: the [H, V] float32 gradient added to 4 times, not 16:
#   -20 GB in and out of the head's GEMMs, -144 launches, +2.8 GB temporary memory); explore_llm_head_unroll =
#   llm_head with every layer unrolled, the learner's GPU default (gpu_aot.py --what llm: 57% less
#   elementwise traffic than the scan llm_head times);
#   explore_mfu_cublas = the fused-head variant with full remat and every matmul on cuBLAS (XLA's Triton GEMM
#   fusions off)
# Targets: decode >= 100k tok/s at B 256; batch-1 step <= 0.3 ms; MFU >= 40 %; 8 seeds <= 3x one.
# At the end it prints (and stores as "targets") each target's best measured value, its step and whether it is
# met (experiments/bench/gpu_targets.py; also `python experiments/bench/gpu_targets.py RESULTS.json`).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's crl_jax, whatever is installed
SMOKE=0
LLM_ONLY=0
EXPLORE=0
ONLY=""
RES=""
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    --llm-only) LLM_ONLY=1 ;;
    --explore) EXPLORE=1 ;;
    --only=*) ONLY=",${arg#--only=}," ;;
    -h|--help) sed -n 2,40p "$0"; exit 0 ;;
    *) RES="$arg" ;;
  esac
done
RES="${RES:-${OUT:-.}/gpu_results.json}"
mkdir -p "$(dirname "$RES")"
WORK="$(mktemp -d)"
PY="${PYTHON:-python}"
START=$(date +%s)
DEADLINE=$(( START + ${DEADLINE_S:-480} ))

if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"  # compile time dominates tiny runs
fi

# step NAME SECONDS SCRIPT ARGS... : runs `python experiments/bench/SCRIPT ARGS --json WORK/NAME.json`
# (cut to the time left before DEADLINE; skipped, rc 125, when under 20 s are left)
step() {
  local name="$1" limit="$2" script="$3"
  shift 3
  case "$ONLY" in "" | *",$name,"*) ;; *) return ;; esac  # --only: not one of the named steps
  local t0=$(date +%s)
  local left=$(( DEADLINE - t0 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped (${left}s left before the deadline)"
    echo "skipped: ${left}s left before DEADLINE_S" >"$WORK/$name.log"
    echo "125 0" >"$WORK/$name.rc"
    return
  fi
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
  step gpu_checks 150 gpu_checks.py --smoke
  step sampler 150 sampler.py --model tiny --batches 2 --prompt-len 8 --new-tokens 4 --reps 1
  step sampler_pallas 150 sampler.py --model tiny --batches 1 --prompt-len 8 --new-tokens 4 --reps 1 \
    --decode-kernel pallas_interpret
  step decode_cache 150 decode_cache.py --smoke
  step train_mfu 150 train_mfu.py --smoke --variants chunked,full,fused --scan-unroll 2
  step logprob_memory 150 logprob_memory.py --smoke --time 1
  step decode_hlo 150 decode_hlo.py --smoke
  step gpu_profile 150 gpu_profile.py --smoke --what decode,decode_pallas,train
  step llm_head 150 llm_head.py --smoke
  # iteration.py compiles the whole loop (minutes on a CPU): the smoke run only checks that it imports and
  # parses its arguments; tests/integration/test_loop.py runs the loop itself.
  timeout 150 "$PY" experiments/bench/iteration.py --help >"$WORK/iteration.log" 2>&1
  echo "$? 0" >"$WORK/iteration.rc"
else
  step gpu_checks 150 gpu_checks.py
  step sampler 90 sampler.py --model smollm2-shape --batches 1,256 --prompt-len 128 --new-tokens 128 \
    --dtype bfloat16 --reps 3
  step sampler_pallas 100 sampler.py --model smollm2-shape --batches 1 --prompt-len 128 --new-tokens 128 \
    --dtype bfloat16 --reps 3 --decode-kernel pallas
  step train_mfu 130 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 \
    --variants chunked,full,cudnn,cudnn_fused
  step iteration 200 iteration.py --steps 3 --seeds 8 --reps 2 --warmup 6  # warmed up: the extractor trains
  step decode_cache 110 decode_cache.py --model smollm2-shape --batches 1,256 --prompt-len 128 --new-tokens 128 \
    --block 128 --dtype bfloat16 --reps 3 \
    --variants old,inplace,live,inplace_unrolled,live_unrolled,unrolled_reduce,pallas
  step logprob_memory 40 logprob_memory.py --batch 8 --seq 1024 --hidden 576 --vocab 49152 --dtype bfloat16 \
    --time 3 --model
  step llm_head 90 llm_head.py --loss extractor,actor --batch 8 --prompt-len 768 --reply-len 16 --turns 8 \
    --dtype bfloat16 --reps 3
  if [ "$EXPLORE" = 1 ]; then
    # first: the MFU target's best candidates by gpu_aot.py's count
    # cudnn_fused_bias: the same step with the causal mask as a dense cuDNN bias (the library's old path)
    step explore_mfu_unroll 200 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --remat 0 \
      --scan-unroll 24 --variants cudnn_fused,cudnn_fused_bias
    step explore_mfu_unroll_mlp 150 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 \
      --remat-policy mlp --scan-unroll 24 --variants cudnn_fused
    step explore_mfu_unroll_chunk4k 150 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --remat 0 \
      --scan-unroll 24 --head-chunk 4096 --variants cudnn_fused
    # the LLM losses with every layer unrolled: the runs' GPU default (llm_head times the scan)
    step explore_llm_head_unroll 120 llm_head.py --loss extractor,actor --batch 8 --prompt-len 768 --reply-len 16 \
      --turns 8 --dtype bfloat16 --reps 3 --scan-unroll 0
    step explore_pallas_tiles 150 sampler.py --model smollm2-shape --batches 1 --prompt-len 128 --new-tokens 128 \
      --dtype bfloat16 --reps 3 --decode-kernel pallas \
      --fused-set "UNROLL=0;UNROLL=1;MLP_COLS=64;NUM_WARPS=2;NUM_WARPS=8;NUM_STAGES=1"
    step explore_profile_pallas 60 gpu_profile.py --what decode_pallas --dump-dir "$(dirname "$RES")"
    step explore_profile 120 gpu_profile.py --dump-dir "$(dirname "$RES")"  # + the compiled HLO texts (gzip)
    step explore_decode_hlo 60 decode_hlo.py --model smollm2-shape --batch 256 --dtype bfloat16
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE \
--xla_gpu_graph_min_graph_size=1" step explore_cmdbuf 90 sampler.py --model smollm2-shape --batches 1,256 \
      --prompt-len 128 --new-tokens 128 --dtype bfloat16 --reps 3
    step explore_head_qwen 45 logprob_memory.py --batch 8 --seq 2048 --hidden 896 --vocab 151936 --dtype bfloat16 \
      --time 3
    step explore_head_qwen_big 45 logprob_memory.py --batch 8 --seq 2048 --hidden 896 --vocab 151936 \
      --dtype bfloat16 --time 3 --token-chunk 4096 --vocab-chunk 32768
    step explore_mfu_noremat 70 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --remat 0 \
      --variants cudnn
    step explore_mfu_dots 100 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --remat-policy dots \
      --variants cudnn,cudnn_fused
    step explore_mfu_mlp 70 train_mfu.py --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --remat-policy mlp \
      --variants cudnn_fused
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false" step explore_mfu_cublas 70 train_mfu.py \
      --preset qwen2.5-0.5b --batch 8 --seq 2048 --reps 4 --variants cudnn_fused
  fi
  # [llm]: SmolLM2 CRL vs GRPO on the lit room (experiments/llm_gpu_run.sh), only when
  # LLM_BUDGET_S > 0 — the benchmarks above take most of the 8 minutes, so on a 10-minute device call
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
sys.path.insert(0, os.path.join(os.getcwd(), "experiments", "bench"))
try:  # the GPU targets' verdicts (gpu_targets.py), also in the file
    import gpu_targets
    out["targets"] = gpu_targets.targets(out["steps"])
    print(gpu_targets.table(out["targets"]))
except Exception as e:  # noqa: BLE001  (a read-out bug must not lose the results)
    out["targets_error"] = f"{type(e).__name__}: {e}"
    print("targets: " + out["targets_error"])
with open(res, "w") as f:
    json.dump(out, f, indent=1)
bad = [n for n, e in out["steps"].items() if e["rc"] != 0]
print(f"wrote {res} ({len(out['steps'])} steps, {out['total_s']} s); failed: {bad or 'none'}")
sys.exit(1 if bad else 0)
EOF
