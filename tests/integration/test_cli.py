"""CLI error handling: bad config keys, types, files and run folders exit 2 with a message naming them."""

import subprocess
import sys

import pytest


def crl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "crl_jax.infra.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["train", "actor.lrr=1"], "actor.lrr"),
    (["train", "rollout.groups=many"], "rollout.groups"),
    (["train", "--config", "does/not/exist.yaml"], "does/not/exist.yaml"),
    (["train", "method=offline"], "bank.offline_path"),
])
def test_train_rejects_bad_config(args, needle, tmp_path):
    r = crl(*args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    assert "crl-jax: error:" in r.stderr and needle in r.stderr


def test_eval_and_bank_reject_a_non_run_folder(tmp_path):
    for args in (["eval", str(tmp_path)], ["bank", "show", str(tmp_path)]):
        r = crl(*args)
        assert r.returncode == 2 and "not a run folder" in r.stderr


def test_plot_rejects_folder_without_metrics(tmp_path):
    r = crl("plot", str(tmp_path))
    assert r.returncode == 2 and "metrics.csv" in r.stderr
