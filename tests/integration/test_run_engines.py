"""`crl_jax.infra.run.run` dispatches a config to its path: a host-side environment (real MiniHack) runs through the
same run folder, checkpoints and resume as the compiled loop; bad combinations fail with a clear message."""

import json
import os

import pytest

pytest.importorskip("nle")  # the `envs` extra (MiniHack); installed in CI

from _micro import HOST_MICRO as MICRO

from crl_jax import loop
from crl_jax.host import driver as host_loop
from crl_jax.config import ConfigError, load
from crl_jax.infra.run import engine, run


def test_host_env_config_runs_through_the_run_folder_and_resumes(tmp_path, capsys):
    cfg = load(None, [*MICRO, "steps=4", "checkpoint_every=2"])  # eval every 2 steps: at 2 and 4 either way
    rt, init, chunk, run_steps = engine(cfg)
    assert host_loop.is_host(rt) and init is loop.init_state and run_steps is None
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run(cfg, a, progress=False)
    run(load(None, [*MICRO, "steps=2", "checkpoint_every=2"]), b, progress=False)
    run(cfg, b, progress=False)  # resumes from step 2
    with open(os.path.join(a, "metrics.csv")) as f, open(os.path.join(b, "metrics.csv")) as g:
        assert f.read() == g.read()
    assert sorted(os.listdir(os.path.join(a, "checkpoints"))) == ["2", "4"]
    from crl_jax.infra.cli import main

    capsys.readouterr()
    main(["eval", a])  # the host evaluation of the run's path
    res = json.loads(capsys.readouterr().out)
    assert res["step"] == 4 and all(0.0 <= res[k] <= 1.0 for k in loop.EVAL_KEYS)


def test_host_env_with_a_mesh_is_rejected(tmp_path):
    cfg = load(None, [*MICRO, "steps=1", "mesh.data=2"])
    with pytest.raises(ConfigError, match="mesh"):
        run(cfg, str(tmp_path / "m"), progress=False)


def test_formats_of_the_other_path_are_rejected_with_a_clear_message():
    for bad in (["rollout.history=full"], ["rollout.action_format=free_text"],
                ["env.name=minihack-room", "rollout.history=full"]):  # the path fixes them: the keys are gone
        with pytest.raises(ConfigError, match=f"{bad[-1].split('=')[0]}: this key was removed .*LLM path"):
            load(None, bad)
    with pytest.raises(ConfigError, match="host-side"):
        import jax

        loop.train(load(None, MICRO), jax.random.key(0))
