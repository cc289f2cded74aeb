"""experiments/bench/mesh_collectives.py in a subprocess of 4 simulated CPU devices: the measurement behind
`ModelConfig.pack_mlp`'s default (on for every mesh). On a mesh that shards parameters (fsdp 4, tensor 4, fsdp 2 x
tensor 2) the packed gate / up matmul's gradient program has as many collective ops as two matmuls' and
all-reduces as many bytes or fewer, and computes the same loss and gradients. The parser counts the buffers of
combined (tuple) collectives: an earlier count missed them and made packing look like it added all-reduces."""

import importlib.util
import json
import os
import subprocess
import sys

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench", "mesh_collectives.py")


def _module():
    spec = importlib.util.spec_from_file_location("mesh_collectives", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_combined_collectives_count_every_buffer():
    hlo = """
  %all-reduce.1 = (f32[4,256]{1,0}, bf16[8]{0}) all-reduce(%a, %b), channel_id=1, to_apply=%add
  %all-reduce.2 = f32[2,3]{1,0} all-reduce(%c), channel_id=2, to_apply=%add
  %all-gather-start = (f32[4]{0}, f32[16]{0}) all-gather-start(%d), dimensions={0}
  %all-gather-done = f32[16]{0} all-gather-done(%all-gather-start)
  %add.3 = f32[2,3]{1,0} add(%all-reduce.2, %all-reduce.2)
"""
    mc = _module()
    ops = mc.collective_ops(hlo)
    assert ops == [("all-reduce", ["f32[4,256]", "bf16[8]"]), ("all-reduce", ["f32[2,3]"]),
                   ("all-gather", ["f32[4]", "f32[16]"])]
    t = mc.totals(ops)
    assert t["all-reduce"] == dict(ops=2, buffers=3, bytes=4 * 4 * 256 + 2 * 8 + 4 * 6)
    assert t["all-gather"]["ops"] == 1


def test_packed_gate_up_all_reduces_no_more_than_two_matmuls(tmp_path):
    out = tmp_path / "rows.json"
    # compile flags as in conftest.py: the collectives are placed by XLA's HLO passes, before code generation
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4 " + os.environ["CRL_JAX_TEST_COMPILE_FLAGS"]}
    subprocess.run([sys.executable, _PATH, "--hidden", "64", "--seq", "32", "--json", str(out)], check=True, env=env,
                   capture_output=True, timeout=600)
    rows = json.loads(out.read_text())
    assert [r["mesh"] for r in rows] == ["1x4x1", "1x1x4", "1x2x2"]
    for r in rows:
        p, t = r["packed"], r["two_matmuls"]
        assert set(p) == set(t), r
        for kind in p:
            assert p[kind]["ops"] == t[kind]["ops"], r
        assert p["all-reduce"]["bytes"] <= t["all-reduce"]["bytes"], r
        assert r["loss_diff"] < 1e-6 and r["grad_max_rel_diff"] < 1e-5, r  # the same gradient, sharded
        # what only the packed program all-reduces is its packed [B T, 2, I] product (`layers.dense` flattens the
        # rows), where two matmuls have two; merged (no tensor axis, as a run on the CPU does) it is [B T, 2I]
        want = (lambda s: s.count(",") == 1 and s.endswith(",256]")) if r["merged"] else (
            lambda s: s.count(",") == 2 and ",2," in s)
        assert all(want(s) for s in r["all_reduced_only_packed"]), r
    assert [r["merged"] for r in rows] == [True, False, False]
    assert rows[1]["packed"]["all-reduce"]["bytes"] < rows[1]["two_matmuls"]["all-reduce"]["bytes"]  # tensor 4
