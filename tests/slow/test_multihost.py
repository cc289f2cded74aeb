"""2 processes on localhost x 4 CPU devices each (gloo collectives) == the single-process 8-device run."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from _sharding_common import COMPARED, on_mesh

from crl_jax.config import DistributedConfig
from crl_jax.infra import distributed

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the shared helpers and the worker


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_from_config_and_env(monkeypatch):
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.settings(DistributedConfig()) is None
    assert distributed.initialize(DistributedConfig()) is False  # single process: no-op
    assert distributed.settings(DistributedConfig("h:1", 2, 1)) == {"coordinator_address": "h:1", "num_processes": 2,
                                                                  "process_id": 1}
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "c:9")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert distributed.settings(DistributedConfig()) == {"coordinator_address": "c:9", "num_processes": 4,
                                                          "process_id": 3}
    monkeypatch.setenv("JAX_PROCESS_ID", "4")
    with pytest.raises(ValueError, match="not in"):
        distributed.settings(DistributedConfig())
    monkeypatch.delenv("JAX_PROCESS_ID")
    with pytest.raises(ValueError, match="process_id"):
        distributed.settings(DistributedConfig())


@pytest.mark.slow
def test_two_processes_equal_single_process_8_devices(tmp_path):
    coord = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4 " + os.environ["CRL_JAX_TEST_COMPILE_FLAGS"],
               PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS, os.environ.get("PYTHONPATH", "")]))
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable, os.path.join(TESTS, "_multihost_worker.py"), coord, str(i), "2",
                               str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    # the single-process reference compiles while the workers do
    _, state, ref = on_mesh(2, 2, 2)
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"process {i}: ok" in out, out[-3000:]
    got = np.load(tmp_path / "result.npz")
    for k in COMPARED:
        np.testing.assert_allclose(got[k.replace("/", "__")], np.asarray(ref[k]), rtol=1e-4, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(got["wq"], np.asarray(state.actor.params["wq"][...]), rtol=1e-5, atol=1e-7)
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "2")
