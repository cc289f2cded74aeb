"""`crl-jax sweep` sends each member to its engine: LLM configs, meshes and multi-process jobs through train's
engine (`run.run`, member after member, each in its own folder with its own config); no model is built here."""

import os

import pytest

from crl_jax.config import ConfigError
from crl_jax.infra import distributed, sweep
from crl_jax.infra.sweep_cmd import plan_lines
from crl_jax.infra.sweep_spec import SweepSpec, expand

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOL = os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml")
TWO_BLOCKS = {"actor.truncate_layers": 2, "extractor.truncate_layers": 2, "steps": 1}


def test_llm_members_run_through_train_engine_one_after_another(tmp_path, monkeypatch):
    from crl_jax.config import load

    calls = []
    monkeypatch.setattr(sweep, "run", lambda cfg, run_dir, **kw: calls.append((cfg, run_dir, kw["label"])))
    monkeypatch.setattr(sweep, "summarize", lambda members: [])
    spec = SweepSpec(config=SMOL, overrides=TWO_BLOCKS, seeds=(0, 1))
    programs = sweep.plan(expand(spec, str(tmp_path)))
    assert [p.sequential and p.rt is None for p in programs] == [True, True]  # nothing built by the plan
    assert plan_lines(programs)[0] == "program 1: 1 runs x 1 steps (train's engine): base/seed0"
    sweep.run_sweep(spec, str(tmp_path), progress=False, plot=False, log=lambda *a: None)
    for s, (cfg, run_dir, label) in enumerate(calls):  # what `crl-jax train --config F k=v seed=s` would run
        assert cfg == load(SMOL, [f"{k}={v}" for k, v in TWO_BLOCKS.items()] + [f"seed={s}"])
        assert run_dir == os.path.join(str(tmp_path), "base", f"seed{s}") and label == "base"
    assert len(calls) == 2


def test_mesh_and_distributed_settings_pick_train_engine_or_are_refused(tmp_path):
    from crl_jax.config import load

    assert not sweep.sequential(load(None, []))
    assert sweep.sequential(load(None, ["mesh.data=2", "mesh.fsdp=4"]))  # 8 simulated devices (tests/conftest.py)
    assert sweep.sequential(load(None, ["distributed.num_processes=2", "distributed.coordinator=h:1",
                                        "distributed.process_id=0"]))
    auto = load(None, ["distributed.coordinator=auto"])  # a TPU pod: jax.distributed.initialize() finds the job
    assert distributed.settings(auto.distributed) == {} and sweep.sequential(auto)
    spec = SweepSpec(overrides={"steps": 1}, grid={"distributed.num_processes": [1, 2]})
    with pytest.raises(ConfigError, match="distributed"):
        sweep.run_sweep(spec, str(tmp_path), progress=False, plot=False)
