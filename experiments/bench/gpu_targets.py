"""The GPU targets (docs/PERFORMANCE.md) read out of a `gpu.sh` results file: one verdict table per lease.

    python experiments/bench/gpu_targets.py RESULTS.json      # the table (gpu.sh prints it when it ends)

`targets(steps)` takes the results' `steps` dict and returns, per target, the best value any step measured, the
step and configuration it came from, and whether it meets the target (None where no step measured it). Best,
not default: an explore step's configuration (a flag, an opt-in kernel) counts, and `source` names it, so a met
target can say which setting to make the default. The rules, per target:
- decode_b256_tok_s: `sampler.py` rows (any step whose rows carry `decode_tok_s`) at batch 256;
- b1_step_ms: `sampler.py` rows at batch 1 (`decode_step_ms`), any decode kernel or fused-kernel setting;
- mfu: `train_mfu.py` rows (`mfu`), any step and variant;
- vmap8_over_1: `iteration.py`'s 8 vmapped seeds over one seed.
Pure (no jax): `tests/unit/test_gpu_targets.py` reads the H200 leases' files in `gpu_runs/`.
"""

from __future__ import annotations

import json
import math
import sys

# (key, comparison, threshold, what)
TARGETS = (
    ("decode_b256_tok_s", ">=", 100e3, "SmolLM2-135M-shape decode at batch 256, tok/s"),
    ("b1_step_ms", "<=", 0.3, "batch-1 decode step, ms"),
    ("mfu", ">=", 0.40, "Qwen2.5-0.5B-shape training step, MFU"),
    ("vmap8_over_1", "<=", 3.0, "8 vmapped seeds' step / one seed's"),
)


def _num(x) -> bool:
    """A finite positive number. `sampler.py`'s decode rate and step time are differences of two timings, nan or
    negative when noise wins (smoke sizes): not measurements."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _rows(step: dict) -> list[dict]:
    res = step.get("result")
    rows = res.get("rows") if isinstance(res, dict) else res
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _label(name: str, row: dict, *keys: str) -> str:
    extra = [f"{k}={row[k]}" for k in keys if row.get(k) not in (None, "", "xla")]
    return " ".join([name] + extra)


def _candidates(steps: dict) -> dict[str, list[tuple[float, str]]]:
    found: dict[str, list[tuple[float, str]]] = {key: [] for key, *_ in TARGETS}
    for name, step in steps.items():
        for r in _rows(step):
            if r.get("batch") == 256 and _num(r.get("decode_tok_s")):
                found["decode_b256_tok_s"].append((r["decode_tok_s"], _label(name, r, "dtype")))
            if r.get("batch") == 1 and _num(r.get("decode_step_ms")) and "decode_tok_s" in r:
                found["b1_step_ms"].append((r["decode_step_ms"], _label(name, r, "decode_kernel", "fused_set")))
            if _num(r.get("mfu")):
                found["mfu"].append((r["mfu"], _label(name, r, "variant")))
        res = step.get("result")
        if isinstance(res, dict) and _num(res.get("vmap8_over_1")):
            found["vmap8_over_1"].append((res["vmap8_over_1"], name))
    return found


def targets(steps: dict) -> dict:
    """{key: {"what", "target" (e.g. ">= 100000"), "value", "source", "met"}} from gpu.sh's `steps`."""
    found = _candidates(steps)
    out = {}
    for key, cmp, thr, what in TARGETS:
        cands = found[key]
        best = (max if cmp == ">=" else min)(cands, default=None, key=lambda c: c[0])
        value, source = best if best else (None, None)
        met = None if value is None else (value >= thr if cmp == ">=" else value <= thr)
        out[key] = dict(what=what, target=f"{cmp} {thr:g}", value=value, source=source, met=met)
    return out


def table(tg: dict) -> str:
    """The verdicts as a markdown table."""
    lines = ["| target | measured (best) | from | met? |", "|---|---|---|---|"]
    for t in tg.values():
        v = t["value"]
        v = "not measured" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}")
        met = "-" if t["met"] is None else ("**yes**" if t["met"] else "no")
        lines.append(f"| {t['what']} {t['target']} | {v} | {t['source'] or '-'} | {met} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python experiments/bench/gpu_targets.py RESULTS.json")
    with open(argv[0]) as f:
        results = json.load(f)
    if "steps" not in results:
        raise SystemExit(f"{argv[0]}: not a gpu.sh results file (no 'steps')")
    print(table(targets(results["steps"])))


if __name__ == "__main__":
    main()
