"""The demo's comparison table (paired CRL - GRPO differences with 95% intervals) for a sweep's run folders
OUT/<method>/seed<s>/summary.json, e.g. after experiments/configs/confirm_8seeds.yaml:

    python experiments/paired_table.py runs/confirm_8seeds 10-17
"""
import json
import os
import sys

from crl_jax.infra.demo import comparison_table

out = sys.argv[1]
lo, hi = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "10-17").split("-"))
res = {}
for m in ("crl", "grpo", "static_online"):
    if not os.path.isdir(os.path.join(out, m)):
        continue
    res[m] = [json.load(open(os.path.join(out, m, f"seed{s}", "summary.json"))) for s in range(lo, hi + 1)]
t = comparison_table(res)
with open(os.path.join(out, "comparison.txt"), "w") as f:
    f.write(t + "\n")
print(t)
