"""experiments/bench/mesh_collectives.py in a subprocess of 4 simulated CPU devices: the measurement behind
`ModelConfig.pack_mlp`'s default. On a mesh that shards parameters (fsdp 4, tensor 4, fsdp 2 x tensor 2), the
packed gate / up matmul's gradient program holds more all-reduces than two matmuls' (XLA's partitioner splits the
packed matmul over the hidden axis); if a jax release stops doing that, this fails and the default can change."""

import json
import os
import subprocess
import sys

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench", "mesh_collectives.py")


def test_packed_gate_up_adds_all_reduces_on_parameter_sharding_meshes(tmp_path):
    out = tmp_path / "rows.json"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, _PATH, "--hidden", "64", "--seq", "32", "--json", str(out)], check=True, env=env,
                   capture_output=True, timeout=600)
    rows = json.loads(out.read_text())
    assert [r["mesh"] for r in rows] == ["1x4x1", "1x1x4", "1x2x2"]
    for r in rows:
        assert r["packed"]["all-reduce"] > r["two_matmuls"]["all-reduce"], r
        assert r["packed_extra_all_reduces"], r
