"""Sweeps: vmapped (method, seed) members write the same run folders as single runs; summary rows; programs
split by Runtime; resume. One vmapped and one single-run compile of the micro config in the whole file."""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from _micro import MICRO, micro

from crl_jax.config import ConfigError
from crl_jax.infra import sweep
from crl_jax.infra.metrics import read_csv
from crl_jax.infra.run import run
from crl_jax.infra.sweep import plan, run_sweep
from crl_jax.infra.sweep_spec import SweepSpec, _flat_overrides, expand, load_spec

pytestmark = pytest.mark.slow

BASE = {**_flat_overrides(MICRO), "steps": 2}
SPEC = SweepSpec(overrides=BASE, grid={"method": ["crl", "grpo"]}, seeds=(0, 1), vmap_seeds=True)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sweep"))
    logs = []
    rows = run_sweep(SPEC, out, chunk=2, progress=False, log=logs.append)
    return out, rows, logs


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    """crl_jax.infra.run.run of each (method, seed): the reference run folders."""
    base = tmp_path_factory.mktemp("single")
    dirs = {}
    for m in ("crl", "grpo"):
        for s in (0, 1):
            d = str(base / f"{m}{s}")
            run(micro(f"method={m}", f"seed={s}", "steps=2"), d, progress=False, label=m)
            dirs[m, s] = d
    return dirs


def _read(path):
    with open(path) as f:
        return f.read()


def _assert_csv_close(a, b, msg):
    ra, rb = read_csv(a), read_csv(b)
    assert [list(r) for r in ra] == [list(r) for r in rb], msg
    for x, y in zip(ra, rb):
        for k in x:
            if x[k] == "" or y[k] == "":
                assert x[k] == y[k], (msg, k)
            else:
                assert float(x[k]) == pytest.approx(float(y[k]), rel=1e-5, abs=1e-6), (msg, k)


def test_members_equal_single_runs(swept, singles):
    out, _, _ = swept
    for (m, s), d in singles.items():
        mine = os.path.join(out, m, f"seed{s}")
        # a vmapped member is another XLA program than the single run: equal up to float rounding
        _assert_csv_close(os.path.join(mine, "metrics.csv"), os.path.join(d, "metrics.csv"), (m, s))
        assert json.loads(_read(os.path.join(mine, "config.json"))) == json.loads(_read(os.path.join(d, "config.json")))
        a, b = (json.loads(_read(os.path.join(x, "summary.json"))) for x in (mine, d))
        for k in ("eval_heldin_without_exp", "success_all_last10", "steps", "seed", "method"):
            assert a[k] == b[k], k
        assert os.path.isdir(os.path.join(mine, "checkpoints", "2"))  # crl-jax eval reads the last checkpoint
    seeds = {s: _read(os.path.join(out, "crl", f"seed{s}", "metrics.csv")) for s in (0, 1)}
    assert seeds[0] != seeds[1]  # the members really are different seeds


def test_one_program_one_trace_and_summary(swept):
    out, rows, logs = swept
    info = json.loads(_read(os.path.join(out, "sweep.json")))
    assert info["programs"] == [["crl/seed0", "crl/seed1", "grpo/seed0", "grpo/seed1"]]
    assert "sweep: 4 runs in 1 program(s)" in logs[0]
    rt = plan(expand(SPEC, out), vmap_seeds=True)[0].rt
    assert sweep.TRACES[(id(rt), 2, True)] == 1  # both methods and both seeds through one trace
    assert [r["point"] for r in rows] == ["crl", "grpo"] and [r["seeds"] for r in rows] == [2, 2]
    # crl row: mean and 95% half-width (t_{0.975,1} = 12.71) of the two seeds' final held-in eval
    vals = [json.loads(_read(os.path.join(out, "crl", f"seed{s}", "summary.json")))["eval_heldin_without_exp"]
            for s in (0, 1)]
    assert rows[0]["eval_heldin_without_exp"] == pytest.approx(np.mean(vals))
    assert rows[0]["eval_heldin_without_exp_ci95"] == pytest.approx(12.71 * np.std(vals, ddof=1) / np.sqrt(2))
    assert np.isnan(rows[1]["eval_heldout_with_exp"])  # GRPO has no bank: no with-experience evaluation
    with open(os.path.join(out, "summary.csv")) as f:
        table = list(csv.DictReader(f))
    assert [r["point"] for r in table] == ["crl", "grpo"] and table[1]["eval_heldout_with_exp"] == ""
    md = _read(os.path.join(out, "summary.md")).splitlines()
    assert len(md) == 4 and md[3].startswith("| grpo | 2 |") and "n/a" in md[3] and "±" in md[2]
    assert os.path.getsize(os.path.join(out, "curves.png")) > 1000


@pytest.mark.heavy  # 4 more vmapped steps + a 4-step single run; resume itself is tested in test_loop.py
def test_resume(swept, singles, tmp_path):
    out, _, _ = swept
    n_traces = dict(sweep.TRACES)
    # finished folders are skipped (nothing compiled, nothing rewritten)
    before = os.path.getmtime(os.path.join(out, "crl", "seed0", "metrics.csv"))
    logs = []
    run_sweep(SPEC, out, chunk=2, progress=False, plot=False, log=logs.append)
    assert os.path.getmtime(os.path.join(out, "crl", "seed0", "metrics.csv")) == before
    # a longer run in a copy continues from the step-2 checkpoints == a straight 4-step single run
    cont = str(tmp_path / "cont")
    shutil.copytree(out, cont)
    longer = SweepSpec(overrides={**BASE, "steps": 4}, grid=SPEC.grid, seeds=SPEC.seeds, vmap_seeds=True)
    logs = []
    run_sweep(longer, cont, chunk=2, progress=False, plot=False, log=logs.append)
    assert "resumed 4 runs from step 2" in logs
    ref = str(tmp_path / "ref")  # the single run resumed to 4 steps (== uninterrupted, tests/integration/test_loop.py)
    shutil.copytree(singles["crl", 0], ref)
    run(micro("method=crl", "seed=0", "steps=4"), ref, progress=False, label="crl")
    assert _read(os.path.join(cont, "crl", "seed0", "metrics.csv")) == _read(os.path.join(ref, "metrics.csv"))
    assert sweep.TRACES == n_traces  # same chunk length, same Runtime: no new compile


def test_an_interrupt_between_member_saves_resumes(swept, tmp_path):
    """Killed after crl/seed0 saved its step-2 checkpoint, before the other members saved theirs (the vmapped
    members save in turn): the rerun resumes every member from their common step (0 here), moving crl/seed0's
    newer checkpoint aside, instead of failing to save over it on every rerun. Same program: no new compile."""
    out, _, _ = swept
    cont = str(tmp_path / "cont")
    shutil.copytree(out, cont)
    dirs = {(m, s): os.path.join(cont, m, f"seed{s}") for m in ("crl", "grpo") for s in (0, 1)}
    for key, d in dirs.items():
        os.remove(os.path.join(d, "summary.json"))
        if key != ("crl", 0):
            shutil.rmtree(os.path.join(d, "checkpoints", "2"))
            os.remove(os.path.join(d, "metrics.csv"))
    n_traces, logs = dict(sweep.TRACES), []
    run_sweep(SPEC, cont, chunk=2, progress=False, plot=False, log=logs.append)
    assert sweep.TRACES == n_traces
    assert os.listdir(os.path.join(dirs["crl", 0], "superseded_checkpoints")) == ["2"]
    assert any("superseded_checkpoints" in line for line in logs), logs
    for (m, s), d in dirs.items():
        assert os.listdir(os.path.join(d, "checkpoints")) == ["2"]
        assert _read(os.path.join(d, "metrics.csv")) == _read(os.path.join(out, m, f"seed{s}", "metrics.csv"))
        assert json.loads(_read(os.path.join(d, "summary.json")))["steps"] == 2


def test_runtime_changing_hyperparameter_makes_two_programs(tmp_path):
    spec = SweepSpec(overrides=BASE, grid={"actor.lr": [3e-4, 1e-3], "method": ["crl", "grpo"],
                                           "loss.advantage": ["split", "cross_group"]}, seeds=(0, 1))
    programs = plan(expand(spec, str(tmp_path)), vmap_seeds=True)
    assert len(programs) == 2 and programs[0].rt is not programs[1].rt
    assert [len(p.members) for p in programs] == [8, 8]  # 2 methods x 2 advantages x 2 seeds, vmapped
    assert {m.cfg.actor.lr for m in programs[1].members} == {1e-3}
    names = {m.point for m in programs[0].members}
    assert "actor.lr=0.0003,crl,loss.advantage=cross_group" in names
    assert os.path.basename(os.path.dirname(programs[0].members[0].run_dir)) == "actor.lr=0.0003__crl__loss.advantage=split"


def test_load_spec_and_cli_dry_run(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text("steps: 7\n")
    f = tmp_path / "sweep.yaml"
    f.write_text("config: base.yaml\noverrides: [" + ", ".join(f'"{o}"' for o in MICRO) + "]\nseeds: [3, 5]\n"
                 "grid:\n  method: [crl, grpo]\n  env.params.dark: [true, false]\nvmap_seeds: true\n")
    spec = load_spec(str(f))
    assert spec.seeds == (3, 5) and spec.config == str(base)
    ms = expand(spec, str(tmp_path / "o"))
    assert len(ms) == 8 and {m.cfg.steps for m in ms} == {7} and {m.seed for m in ms} == {3, 5}
    assert {m.cfg.env.params["dark"] for m in ms} == {True, False}
    assert load_spec(str(f), seeds=2, steps=3).seeds == (0, 1)
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "sweep.py")
    mod = importlib.util.spec_from_file_location("sweep_cli", path)
    cli = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(cli)
    assert cli.main(["--config", str(f), "--out", str(tmp_path / "o"), "--steps", "3", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("program 1: 4 runs x 3 steps: crl,env.params.dark=True/seed3")
    assert len(plan(ms, vmap_seeds=False)) == 8 and not plan(ms, vmap_seeds=False)[0].vmapped
    # the default, "auto": vmapped on accelerators, one run after another on CPUs
    f.write_text(f.read_text().replace("vmap_seeds: true", "vmap_seeds: auto"))
    assert load_spec(str(f)).vmap_seeds is None and SweepSpec().vmap_seeds is None
    assert sweep.vmap_by_backend("gpu") and sweep.vmap_by_backend("tpu") and not sweep.vmap_by_backend("cpu")
    auto = plan(ms)
    assert [p.vmapped for p in auto] == [sweep.vmap_by_backend()] * len(auto)
    assert len(auto) == (2 if sweep.vmap_by_backend() else 8)
    bad = tmp_path / "bad.yaml"
    bad.write_text("vmap_seeds: 2\n")
    with pytest.raises(Exception, match="vmap_seeds"):
        load_spec(str(bad))
    bad.write_text("grid: {method: crl}\n")
    with pytest.raises(Exception, match="grid.method"):
        load_spec(str(bad))


def test_demo_runs_every_run_alone_and_equals_single_runs(singles, tmp_path, capsys):
    """`crl-jax demo` (the README's main job) on the micro config: every run alone with the single-run
    program (no vmapped program), run folders identical to single runs, table and plot."""
    from crl_jax.infra.cli import main

    out = str(tmp_path / "demo")
    before = dict(sweep.TRACES)
    main(["demo", "--seeds", "2", "--steps", "2", "--out", out, *MICRO])
    assert sweep.TRACES == before  # no vmapped program traced
    for (m, s), d in singles.items():
        assert _read(os.path.join(out, m, f"seed{s}", "metrics.csv")) == _read(os.path.join(d, "metrics.csv")), (m, s)
    table = _read(os.path.join(out, "comparison.txt"))
    assert "held-in, with exp" in table and "n/a" in table  # grpo has no with-experience evaluation
    assert os.path.getsize(os.path.join(out, "comparison.png")) > 0
    assert "plot:" in capsys.readouterr().out
    # asking for fewer steps than the runs have is refused with one line, every run folder left as it is (before:
    # metrics.csv cut to the new length, the save refused, summary.json still saying 2 steps)
    files = [os.path.join(out, m, f"seed{s}", n) for m in ("crl", "grpo") for s in (0, 1)
             for n in ("metrics.csv", "summary.json", "config.json")]
    before = {f: _read(f) for f in files}
    with pytest.raises(SystemExit) as e:
        main(["demo", "--seeds", "2", "--steps", "1", "--out", out, *MICRO])
    err = [line for line in capsys.readouterr().err.splitlines() if "crl-jax:" in line]
    assert e.value.code == 2 and len(err) == 1 and "already has 2 steps" in err[0] and "--steps >= 2" in err[0], err
    assert {f: _read(f) for f in files} == before


def test_a_member_folder_saved_with_removed_keys_is_still_the_same_run(tmp_path):
    """config.json of a sweep member written before keys were removed from the config: no mismatch."""
    m = sweep.Member("p", 0, micro("steps=2"), str(tmp_path / "p" / "seed0"))
    sweep._write_config(m)
    path = os.path.join(m.run_dir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["bank"]["top_k"] = 1
    saved["rollout"]["history"] = "current"
    with open(path, "w") as f:
        json.dump(saved, f)
    with pytest.warns(UserWarning, match=r"ignoring rollout\.history, bank\.top_k"):
        sweep._write_config(m)
    with pytest.raises(ConfigError, match="different config"):
        sweep._write_config(sweep.Member("p", 0, micro("steps=2", "actor.lr=2e-3"), m.run_dir))


def test_sigterm_stops_a_sweep_after_its_chunk_and_a_cut_member_summary_is_computed_again(swept, tmp_path,
                                                                                          monkeypatch):
    """SIGTERM while a sweep (resumed from step 2 to 6, chunks of 2) writes step 4: it stops once every member
    has saved step 4 (`preempt.Stopped`); the rerun finishes from there (that a resumed sweep equals an
    uninterrupted one: `test_resume`). A member summary.json cut mid-write is computed again on the next rerun
    instead of failing. Same program: no new compile."""
    import signal

    from crl_jax.infra import metrics, preempt

    out, _, _ = swept
    longer = SweepSpec(overrides={**BASE, "steps": 6}, grid=SPEC.grid, seeds=SPEC.seeds, vmap_seeds=True)
    cont = str(tmp_path / "cont")
    shutil.copytree(out, cont)
    quiet = dict(chunk=2, progress=False, plot=False, log=lambda *_: None)
    real, sent = metrics.MetricsWriter.write, []

    def write(self, rows):
        real(self, rows)
        if rows[-1]["step"] == 4 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))

    monkeypatch.setattr(metrics.MetricsWriter, "write", write)
    with pytest.raises(preempt.Stopped, match=r"stopped at step 4 \(SIGTERM\), checkpoint saved") as e:
        run_sweep(longer, cont, **quiet)
    assert e.value.exit_code == 143
    monkeypatch.undo()
    members = [(m, f"seed{s}") for m in ("crl", "grpo") for s in (0, 1)]
    assert all(max(map(int, os.listdir(os.path.join(cont, m, s, "checkpoints")))) == 4 for m, s in members)
    run_sweep(longer, cont, **quiet)
    for m, s in members:
        assert [r["step"] for r in read_csv(os.path.join(cont, m, s, "metrics.csv"))] == list("123456")
    p = os.path.join(cont, "crl", "seed0", "summary.json")
    whole = json.loads(_read(p))
    with open(p, "w") as f:
        f.write(_read(p)[:50])
    run_sweep(longer, cont, **quiet)
    again = json.loads(_read(p))
    assert {k: v for k, v in again.items() if k != "wall_seconds"} == {
        k: v for k, v in whole.items() if k != "wall_seconds"}


def test_a_sharded_sweep_runs_train_engine_and_equals_unsharded_runs(singles, tmp_path):
    """`crl-jax sweep` with `mesh.data=2` (x fsdp 4 on the 8 simulated devices): no vmapped program, each member
    run by train's engine on its mesh, metrics equal to the unsharded single runs up to float rounding."""
    from crl_jax.infra.cli import main

    f = tmp_path / "sweep.yaml"
    f.write_text("overrides: [" + ", ".join(f'"{o}"' for o in MICRO + ["steps=2", "mesh.data=2", "mesh.fsdp=4"])
                 + "]\nseeds: 2\ngrid:\n  method: [crl]\n")
    out = str(tmp_path / "o")
    before = dict(sweep.TRACES)
    main(["sweep", "--config", str(f), "--out", out, "--no-plot", "--quiet"])
    assert sweep.TRACES == before
    plan_ = json.loads(_read(os.path.join(out, "sweep.json")))
    assert plan_["programs"] == [] and plan_["sequential"] == ["crl/seed0", "crl/seed1"]
    assert os.path.exists(os.path.join(out, ".lock"))  # the sweep folder was locked (the OS lock is gone)
    for s in (0, 1):
        mine = os.path.join(out, "crl", f"seed{s}")
        _assert_csv_close(os.path.join(mine, "metrics.csv"), os.path.join(singles["crl", s], "metrics.csv"), s)
        assert json.loads(_read(os.path.join(mine, "config.json")))["mesh"]["data"] == 2
        assert os.path.isdir(os.path.join(mine, "checkpoints", "2"))
    assert "| crl | 2 |" in _read(os.path.join(out, "summary.md"))


def test_a_data_parallel_sweep_on_two_devices_equals_unsharded_runs(singles, tmp_path):
    """`crl-jax sweep` with `mesh.data=2` in a process that sees 2 simulated CPU devices (data parallelism alone,
    the smallest real mesh): members equal the unsharded single runs up to float rounding."""
    import subprocess
    import sys

    f = tmp_path / "sweep.yaml"
    f.write_text("overrides: [" + ", ".join(f'"{o}"' for o in MICRO + ["steps=2", "mesh.data=2"])
                 + "]\nseeds: 2\ngrid:\n  method: [crl]\n")
    out = str(tmp_path / "o")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2 " + os.environ["CRL_JAX_TEST_COMPILE_FLAGS"]}
    subprocess.run([sys.executable, "-m", "crl_jax", "sweep", "--config", str(f), "--out", out, "--no-plot",
                    "--quiet"], check=True, env=env, capture_output=True, timeout=900)
    assert json.loads(_read(os.path.join(out, "sweep.json")))["sequential"] == ["crl/seed0", "crl/seed1"]
    for s in (0, 1):
        mine = os.path.join(out, "crl", f"seed{s}")
        _assert_csv_close(os.path.join(mine, "metrics.csv"), os.path.join(singles["crl", s], "metrics.csv"), s)
        assert json.loads(_read(os.path.join(mine, "config.json")))["mesh"]["data"] == 2
