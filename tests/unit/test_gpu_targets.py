"""experiments/bench/gpu_targets.py: the GPU targets' verdicts read out of gpu.sh results files, checked on the
files the H200 leases wrote (experiments/bench/gpu_runs/, numbers quoted in docs/PERFORMANCE.md) and on literal steps."""

import importlib.util
import json
import os

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench")
_spec = importlib.util.spec_from_file_location("gpu_targets", os.path.join(BENCH, "gpu_targets.py"))
G = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(G)


def _steps(name, key=None):
    with open(os.path.join(BENCH, "gpu_runs", name)) as f:
        d = json.load(f)
    return (d[key] if key else d)["steps"]


def test_second_lease_decode_met_batch1_missed_seeds_met():
    # The second H200 lease: 120.0k tok/s at B 256 (met), 1.06 ms per B 1 step (missed), 8 seeds x1.57 (met)
    tg = G.targets(_steps("2026-12-04_h200_s16_call2.json", "gpu_sh"))
    assert tg["decode_b256_tok_s"]["value"] == pytest.approx(120.0e3, rel=1e-3) and tg["decode_b256_tok_s"]["met"]
    assert tg["b1_step_ms"]["value"] == pytest.approx(1.061, abs=1e-3) and tg["b1_step_ms"]["met"] is False
    assert tg["vmap8_over_1"]["value"] == pytest.approx(1.571, abs=1e-3) and tg["vmap8_over_1"]["met"]
    assert tg["mfu"]["value"] is None and tg["mfu"]["met"] is None  # no training step in that call


def test_first_lease_best_mfu_is_cudnn_and_missed():
    # The first H200 lease: MFU 29.4% with cuDNN attention, the best of four variants and the no-remat step
    tg = G.targets(_steps("2026-12-04_h200_call3.json"))
    assert tg["mfu"]["value"] == pytest.approx(0.2937, abs=1e-4) and tg["mfu"]["met"] is False
    assert tg["mfu"]["source"] == "train_mfu variant=cudnn"
    assert tg["b1_step_ms"]["source"] == "sampler"  # the faster of sampler and explore_cmdbuf (1.12 vs 1.52 ms)


def test_best_of_kernels_and_settings_names_its_source():
    row = dict(batch=1, decode_tok_s=1.0, decode_kernel="xla", fused_set="")
    steps = {
        "sampler": {"rc": 0, "result": {"rows": [dict(row, decode_step_ms=1.0)]}},
        "explore_pallas_tiles": {"rc": 0, "result": {"rows": [
            dict(row, decode_step_ms=0.31, decode_kernel="pallas", fused_set="UNROLL=0"),
            dict(row, decode_step_ms=0.29, decode_kernel="pallas", fused_set="NUM_WARPS=2")]}},
        "train_mfu": {"rc": 124, "log_tail": "timed out"},  # no result: not measured, no error
    }
    tg = G.targets(steps)
    assert tg["b1_step_ms"]["value"] == 0.29 and tg["b1_step_ms"]["met"] is True
    assert tg["b1_step_ms"]["source"] == "explore_pallas_tiles decode_kernel=pallas fused_set=NUM_WARPS=2"
    assert tg["mfu"]["met"] is None
    text = G.table(tg)
    assert "| batch-1 decode step, ms <= 0.3 | 0.29 |" in text and "not measured" in text


def test_cli_rejects_a_file_that_is_not_gpu_sh_results(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a gpu.sh results file"):
        G.main([str(p)])


def test_nan_or_negative_timings_of_a_smoke_run_are_not_measurements():
    rows = [dict(batch=256, decode_tok_s=float("nan"), decode_step_ms=1.0),
            dict(batch=1, decode_tok_s=-5.0, decode_step_ms=-0.2)]  # t_gen - t_one < 0: noise won
    tg = G.targets({"sampler": {"rc": 0, "result": {"rows": rows}}})
    assert tg["decode_b256_tok_s"]["value"] is None and tg["b1_step_ms"]["value"] is None
