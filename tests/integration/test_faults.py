"""Fault injection on run folders: kill -9 and resume, extensions, corrupt checkpoints, locks, failed starts,
bad input files, non-finite updates, interrupts, plots. Every run uses one tiny config (one compiled
program, shared in-process and, through the session's compilation cache, by the subprocesses)."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from crl_jax.config import ConfigError, load
from crl_jax.infra import cli
from crl_jax.infra.checkpoint import Checkpointer, CheckpointError
from crl_jax.infra.metrics import read_csv
from crl_jax.infra.run import RunFolderError, RunLock, run
from crl_jax.loop import EVAL_KEYS, REPLAY_KEYS

TINY = ["rollout.groups=2", "rollout.group_size=4", "env.max_turns=5", "eval.tasks=4", "checkpoint_every=1",
        "env.num_train_tasks=4", "env.num_eval_tasks=4", "extraction.batch=4", "extraction.buffer_capacity=16",
        "bank.capacity=16", "loss.turn_rows=8", "actor.hidden_size=32", "actor.num_layers=1",
        "actor.intermediate_size=64", "extractor.hidden_size=32", "extractor.num_layers=1",
        "extractor.intermediate_size=64", "extraction.max_new_tokens=6", "bank.entry_len=8",
        "extraction.prompt_len=120", "eval.every=2", "extraction.merge_every=2", "extraction.merge=true",
         "pretrain.actor_steps=20", "pretrain.extractor_steps=20", "pretrain.batch=8",
         "loss.epochs=1", "loss.minibatches=1"]  # one actor update per step: the non-finite counts are per step
EVAL_COLS = EVAL_KEYS + REPLAY_KEYS  # measured at evaluation steps


def tiny(*extra):
    return load(None, TINY + list(extra))


def train(d, steps, *extra, **kw):
    return run(tiny(f"steps={steps}", *extra), str(d), progress=False, log=lambda *_: None, **kw)


def training_columns(d):
    """metrics.csv rows without the evaluation columns (an extension adds evaluations at its earlier ends)."""
    return [{k: v for k, v in r.items() if k not in EVAL_COLS} for r in read_csv(os.path.join(d, "metrics.csv"))]


def final_state(d):
    return cli._restore_run(str(d))[2:]


def assert_same_state(a, b):
    (sa, step_a), (sb, step_b) = final_state(a), final_state(b)
    assert step_a == step_b
    for x, y in zip(jax.tree_util.tree_leaves(jax.random.key_data(sa.key)), jax.tree_util.tree_leaves(
            jax.random.key_data(sb.key))):
        assert np.array_equal(x, y)
    for x, y in zip(jax.tree_util.tree_leaves(sa.replace(key=None)), jax.tree_util.tree_leaves(sb.replace(key=None))):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def crl_main(capsys, *args):
    """(exit code, stderr lines) of `crl-jax ARGS` in this process (compiled programs shared)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(list(args))
        raise SystemExit(0)
    return e.value.code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("crl-jax:")]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 8-step run: the reference of the kill and extension tests."""
    d = tmp_path_factory.mktemp("straight") / "run"
    train(d, 8)
    return d


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """A finished 3-step run (checkpoints 1, 2, 3): the damage tests each damage a copy of it (the same folder a
    fresh `train(d, 3)` writes: runs are deterministic, test_loop and the kill test check it byte for byte)."""
    d = tmp_path_factory.mktemp("three") / "run"
    train(d, 3)
    return d


# ------------------------------------------------------------------------------------------------
# kill -9 and resume, extensions


def _checkpoint_tmp_dirs(d):
    ck = os.path.join(d, "checkpoints")
    return [n for n in os.listdir(ck) if "tmp" in n] if os.path.isdir(ck) else []


def _rows(d):
    p = os.path.join(d, "metrics.csv")
    return max(0, open(p).read().count("\n") - 1) if os.path.exists(p) else 0


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_is_byte_identical(straight, tmp_path):
    """Five kills by a seeded killer (while a checkpoint is being written, or a random delay after a new
    row), each followed by a resume with the same command; the finished run equals the uninterrupted one."""
    d = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "crl_jax.infra.cli", "train", "--quiet", "--steps", "8", "--out", d, *TINY]
    rng = random.Random(14)
    kills = []
    for i in range(5):
        start_rows = _rows(d)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        during_save = i % 2 == 0
        delay = rng.uniform(0.0, 0.4)
        t_end = time.time() + 240
        while time.time() < t_end and p.poll() is None:
            if during_save and _checkpoint_tmp_dirs(d):
                break
            if not during_save and _rows(d) > start_rows:
                time.sleep(delay)
                break
            time.sleep(0.002)
        assert p.poll() is None, f"run finished before kill {i}: {p.stderr.read().decode()[-2000:]}"
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills.append((during_save, _rows(d)))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(k[0] for k in kills) and len(kills) == 5
    assert open(os.path.join(d, "metrics.csv")).read() == open(os.path.join(straight, "metrics.csv")).read()
    assert_same_state(d, straight)
    assert not _checkpoint_tmp_dirs(d)


def test_extensions_equal_a_straight_run_in_every_training_column(straight, tmp_path):
    """2 steps, extended to 3 and to 8 (with another checkpoint cadence, and eval cadence, on the way) ==
    8 straight: training columns and final state identical; the extension adds evaluations at steps 3."""
    d = tmp_path / "ext"
    train(d, 2)
    train(d, 3, "checkpoint_every=2")
    train(d, 8, "checkpoint_every=5", "keep_checkpoints=2")
    assert training_columns(d) == training_columns(straight)
    assert_same_state(d, straight)
    rows = read_csv(os.path.join(d, "metrics.csv"))
    assert rows[2]["eval_heldin_without_exp"] != ""  # step 3 was the end of the 3-step run: evaluated
    assert read_csv(os.path.join(straight, "metrics.csv"))[2]["eval_heldin_without_exp"] == ""
    e = tmp_path / "every"
    train(e, 2)
    train(e, 8, "eval.every=4")  # eval cadence may change on a resume: training columns unchanged
    assert training_columns(e) == training_columns(straight)


# ------------------------------------------------------------------------------------------------
# checkpoints: corrupt, truncated, deleted files; refused modes


def _damage(step_dir, how):
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs)
    if how == "corrupt":
        for f in files:
            if f.endswith(("manifest.ocdbt", "_METADATA")):
                with open(f, "r+b") as fh:
                    fh.write(os.urandom(max(16, os.path.getsize(f) // 2)))
    elif how == "flip":  # 64 bytes of the largest array file flipped: Orbax alone restores it without a word
        f = max((f for f in files if "ocdbt.process_0" in f), key=os.path.getsize)
        with open(f, "r+b") as fh:
            fh.seek(os.path.getsize(f) // 2)
            data = fh.read(64)
            fh.seek(os.path.getsize(f) // 2)
            fh.write(bytes(b ^ 0xFF for b in data))
    elif how == "truncate":
        for f in files:
            if "ocdbt.process_0" in f:
                os.truncate(f, os.path.getsize(f) // 3)
    else:
        for f in files:
            if "ocdbt.process_0" in f or f.endswith("manifest.ocdbt"):
                os.remove(f)


@pytest.mark.parametrize("how", ["corrupt", "flip", "truncate", "delete"])
def test_latest_valid_moves_a_damaged_newest_checkpoint_aside(three_steps, tmp_path, capsys, how):
    d = tmp_path / "run"
    shutil.copytree(three_steps, d)
    _damage(d / "checkpoints" / "3", how)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "4", "--out", str(d), *TINY)
    assert code == 2 and len(err) == 1 and "checkpoints/3" in err[0] and "--resume latest_valid" in err[0], err
    assert how != "flip" or "does not match its sha256 checksum" in err[0], err  # what Orbax alone restores
    train(d, 4, resume="latest_valid")
    assert sorted(os.listdir(d / "checkpoints")) == ["2", "3", "4"]  # 3 retrained and written again
    assert os.listdir(d / "corrupt_checkpoints") == ["3"]
    template = final_state(d)[0]
    ck = Checkpointer(str(d))
    for step in ck.steps():
        ck.restore(template, step)  # no unreadable checkpoint is left
    assert [int(r["step"]) for r in read_csv(os.path.join(d, "metrics.csv"))] == [1, 2, 3, 4]
    capsys.readouterr()
    cli.main(["eval", str(d)])
    assert json.loads(capsys.readouterr().out)["step"] == 4


def test_the_cli_says_one_line_for_a_damaged_checkpoint(three_steps, tmp_path):
    """In a process of its own, where no pytest hook takes them: after a failed restore, TensorStore's reads still
    finishing call into Orbax's closed event loop. Their tracebacks ("Event loop is closed", read errors nobody
    retrieved) must not follow the one-line error."""
    d = tmp_path / "run"
    shutil.copytree(three_steps, d)
    _damage(d / "checkpoints" / "3", "truncate")
    cmd = [sys.executable, "-m", "crl_jax.infra.cli", "train", "--quiet", "--steps", "4", "--out", str(d), *TINY]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "checkpoints/3" in lines[0], r.stderr[-3000:]


def test_a_save_that_does_not_happen_raises(tmp_path):
    d = tmp_path / "run"
    train(d, 2)
    ck = Checkpointer(str(d))
    state, _ = ck.restore(final_state(d)[0])
    with pytest.raises(CheckpointError, match="step 1 .*not written"):
        ck.save(1, state)


def test_resume_never_refuses_a_folder_with_a_run_unless_overwrite(tmp_path):
    d = tmp_path / "run"
    train(d, 2)
    with pytest.raises(RunFolderError, match="--overwrite"):
        train(d, 1, resume="never")
    train(d, 1, resume="never", overwrite=True)
    assert sorted(os.listdir(d / "checkpoints")) == ["1"]
    assert [r["step"] for r in read_csv(os.path.join(d, "metrics.csv"))] == ["1"]


# ------------------------------------------------------------------------------------------------
# run folder: lock, failed start, config mismatch


def test_second_writer_is_refused_and_a_stale_lock_does_not_block(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with RunLock(str(d)):  # held as a running process holds it
        with pytest.raises(RunFolderError, match=f"in use by another process \\(pid {os.getpid()}"):
            train(d, 1)
    # a lock file left by a killed process (its pid long gone) does not block
    (d / ".lock").write_text("999999")
    train(d, 1)
    p = subprocess.Popen([sys.executable, "-c", "import sys, time; from crl_jax.infra.run import RunLock; "
                          f"RunLock({str(d)!r}).__enter__(); print('held', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(RunFolderError, match=f"pid {p.pid}"):
        train(d, 2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    train(d, 2)  # the killed holder's lock went with it
    assert [r["step"] for r in read_csv(os.path.join(d, "metrics.csv"))] == ["1", "2"]


def _copy_of(straight, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(straight, d)
    return d


def _snapshot(d):
    """The files of a run folder that a refused command must leave as they are."""
    return {n: (d / n).read_bytes() for n in ("config.json", "metrics.csv", "summary.json")} | {
        "checkpoints": sorted(os.listdir(d / "checkpoints"))}


def test_fewer_steps_than_the_run_has_are_refused_and_the_folder_left_as_it_is(straight, tmp_path, capsys):
    """`--steps 2` on a finished 8-step run: refused with one line (resuming would drop rows 3..8 and could not
    save over the later checkpoints), nothing written; before, config.json said 2 steps, summary.json 8."""
    d = _copy_of(straight, tmp_path)
    before = _snapshot(d)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "2", "--out", str(d), *TINY)
    assert code == 2 and len(err) == 1, err
    assert "already has 8 steps" in err[0] and "--steps >= 8" in err[0] and "--overwrite" in err[0], err
    with pytest.raises(RunFolderError, match="already has 8 steps"):
        train(d, 5, resume="latest_valid")  # (the check after the restore)
    assert _snapshot(d) == before


def test_resume_keeps_the_label_and_warns_of_lost_metrics_rows(straight, tmp_path, capsys):
    d = _copy_of(straight, tmp_path)
    code, _ = crl_main(capsys, "train", "--quiet", "--steps", "8", "--out", str(d), "--label", "crl-lr3", *TINY)
    assert code == 0 and json.loads((d / "config.json").read_text())["label"] == "crl-lr3"
    lines = (d / "metrics.csv").read_text().splitlines(keepends=True)
    (d / "metrics.csv").write_text("".join(lines[:4]))  # the header and steps 1..3: 5 of the 8 rows lost
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "9", "--out", str(d), *TINY)
    assert code == 0 and json.loads((d / "config.json").read_text())["label"] == "crl-lr3"  # no --label: kept
    assert len(err) == 1 and "warning" in err[0] and "lacks the rows of 5 of the 8 steps" in err[0], err
    assert [r["step"] for r in read_csv(os.path.join(d, "metrics.csv"))] == ["1", "2", "3", "9"]


def test_config_json_is_replaced_atomically(straight, tmp_path, monkeypatch):
    """A write of config.json that fails half way (disk full, kill) leaves the previous file whole."""
    d = _copy_of(straight, tmp_path)
    before = (d / "config.json").read_text()
    real = json.dump

    def dump(obj, fp, **kw):
        if "config.json" in str(getattr(fp, "name", "")):
            fp.write(json.dumps(obj)[:20])
            raise OSError(28, "No space left on device")
        return real(obj, fp, **kw)

    monkeypatch.setattr(json, "dump", dump)
    with pytest.raises(OSError, match="No space"):
        train(d, 8)
    monkeypatch.undo()
    assert (d / "config.json").read_text() == before and not (d / "config.json.tmp").exists()


def test_failed_start_then_corrected_command_and_mismatch_names_keys(tmp_path):
    d = tmp_path / "run"
    with pytest.raises(ConfigError, match="rooom"):
        train(d, 1, "env.name=rooom")
    assert not (d / "config.json").exists()
    train(d, 1)
    with pytest.raises(RunFolderError, match=r"actor\.lr \(saved 0\.001, now 0\.002\).*rollout\.groups"):
        train(d, 2, "actor.lr=2e-3", "rollout.groups=3")


OLD_KEYS = {"rollout": {"history": "current", "action_format": "constrained"}, "extraction": {"format": "constrained"},
            "bank": {"top_k": 1}}  # removed keys (fixed by the path or single-valued)


def _add_old_keys(d):
    p = d / "config.json"
    saved = json.loads(p.read_text())
    for section, kv in OLD_KEYS.items():
        saved[section].update(kv)
    p.write_text(json.dumps(saved))


def test_a_run_saved_with_removed_keys_resumes_and_restores_with_a_warning(tmp_path):
    d = tmp_path / "run"
    train(d, 1)
    _add_old_keys(d)
    with pytest.warns(UserWarning, match=r"ignoring rollout\.history, rollout\.action_format, extraction\.format, "
                                         r"bank\.top_k"):
        train(d, 2)
    assert [r["step"] for r in read_csv(os.path.join(d, "metrics.csv"))] == ["1", "2"]
    assert "history" not in json.loads((d / "config.json").read_text())["rollout"]  # rewritten without them
    _add_old_keys(d)
    with pytest.warns(UserWarning, match="bank.top_k"):  # the restore of `crl-jax eval` and `crl-jax bank`
        cfg, _, _, step = cli._restore_run(str(d))
    assert step == 2 and cfg == tiny("steps=2")


# ------------------------------------------------------------------------------------------------
# bad files: one line naming the file (and line), exit 2


KEY = "[" + ",".join(["0.1"] * 64) + "]"


@pytest.mark.parametrize("content,needle", [
    (b'{"text": "go north", "key": ' + KEY.encode() + b'}\n{"text": oops}\n', r"bank.jsonl:2: not valid JSON"),
    (b'{"text": "a", "task": 1.5, "key": ' + KEY.encode() + b'}\n', r"bank.jsonl:1: `task` must be"),
    (b'{"text": "a", "key": ' + KEY.encode() + b'}\n{"text": "\xff\xfe"}\n', r"bank.jsonl:2: not UTF-8"),
    (b'{"text": "a", "key": [NaN' + b", 0.1" * 63 + b"]}\n", r"bank.jsonl:1: key holds NaN"),
    (b'{"text": "no key here"}\n', r"bank.jsonl:1: no `key`"),
    (b'{"text": "a", "task": 4, "key": ' + KEY.encode() + b'}\n', r"bank.jsonl:1: `task` 4 is not a task of this run"),
    (b'{"crl_jax_bank_export": 1, "entries": 2}\n{"text": "a", "key": ' + KEY.encode() + b'}\n',
     r"bank.jsonl: holds 1 entries, its header announces 2"),
])
def test_bad_bank_files_exit_2_with_one_line(tmp_path, capsys, content, needle):
    f = tmp_path / "bank.jsonl"
    f.write_bytes(content)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "1", "--out", str(tmp_path / "r"), "--method",
                         "offline", f"bank.offline_path={f}", *TINY)
    assert code == 2 and len(err) == 1, err
    import re

    assert re.search(needle, err[0]), err


def test_bank_file_warnings_count_empty_and_truncated(tmp_path):
    from crl_jax import bank as B
    from crl_jax.bank.io import BankFileWarning, load_jsonl
    from crl_jax.text.tokenizers import ByteTokenizer

    f = tmp_path / "b.jsonl"
    f.write_text("\n")
    with pytest.warns(BankFileWarning, match="no entries"):
        load_jsonl(B.init(2, 4, 2), ByteTokenizer(), str(f))
    f.write_text("".join(json.dumps({"text": t, "key": [1.0, 0.0]}) + "\n" for t in ("ab", "long text", "xyzxyz")))
    with pytest.warns(BankFileWarning) as w:
        bank = load_jsonl(B.init(2, 4, 2), ByteTokenizer(), str(f))
    msgs = " | ".join(str(x.message) for x in w)
    assert "2 of 3 entries cut to bank.entry_len=4" in msgs and "3 entries for bank.capacity=2" in msgs
    assert int(bank.valid.sum()) == 2


@pytest.mark.parametrize("name,data,needle", [
    ("model.gguf", b"GGUF\x03\x00\x00\x00garbage", "cannot read GGUF file"),
    ("notes.txt", b"hello", "not a GGUF file"),
])
def test_bad_model_files_exit_2_with_one_line(tmp_path, capsys, name, data, needle):
    f = tmp_path / name
    f.write_bytes(data)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "1", "--out", str(tmp_path / "r"),
                         f"actor.preset={f}", f"extractor.preset={f}")
    assert code == 2 and len(err) == 1 and needle in err[0] and str(f) in err[0], err


def test_preset_typo_names_the_preset_and_lists_known_ones(capsys, tmp_path):
    code, err = crl_main(capsys, "train", "--out", str(tmp_path / "r"), "actor.preset=smollm-135m")
    assert code == 2 and len(err) == 1 and "actor.preset" in err[0] and "'smollm-135m'" in err[0]
    assert "smollm2-135m" in err[0]


@pytest.mark.parametrize("ov,needle", [("actor.lr=inf", "actor.lr: must be a finite"),
                                       ("bank.diversity_lambda=.nan", "bank.diversity_lambda"),
                                       ("keep_checkpoints=0", "keep_checkpoints: must be >= 1")])
def test_non_finite_and_zero_keep_are_rejected(ov, needle):
    with pytest.raises(ConfigError, match=needle):
        load(None, [ov])


# ------------------------------------------------------------------------------------------------
# non-finite updates, interrupts, messages


def _poison(d):
    """NaN actor parameters in the newest checkpoint: every later actor loss is non-finite."""
    ck = Checkpointer(str(d))
    state, step = ck.restore(final_state(d)[0])
    params = jax.tree_util.tree_map(lambda x: x * np.nan, state.actor.params)
    ck.close()
    shutil.rmtree(d / "checkpoints" / str(step))
    ck = Checkpointer(str(d))
    ck.save(step, state.replace(actor=state.actor.replace(params=params)))
    ck.close()


def test_nonfinite_updates_warn_total_and_stop(tmp_path, capsys):
    d = tmp_path / "run"
    train(d, 1)
    _poison(d)
    capsys.readouterr()
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "6", "--max-nonfinite", "2", "--out", str(d), *TINY)
    assert code == 3, err
    warnings = [e for e in err if "warning" in e and "non-finite" in e]
    assert len(warnings) == 3 and "run total 3" in warnings[-1]
    assert "stopped at step 4" in err[-1] and "--max-nonfinite 2" in err[-1]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["nonfinite_actor"] == 3 and summary["stopped"] == "nonfinite"
    assert sorted(os.listdir(d / "checkpoints")) == ["1", "2", "3"]  # no checkpoint past the limit
    summary = train(d, 5, max_nonfinite=100)  # a larger limit goes on from step 3
    assert summary["nonfinite_actor"] == 4 and summary["steps"] == 5


def test_ctrl_c_says_where_and_exits_130(tmp_path, capsys, monkeypatch):
    from crl_jax.infra import metrics

    d = tmp_path / "run"
    real = metrics.MetricsWriter.write

    def write(self, rows):
        real(self, rows)
        if rows[-1]["step"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(metrics.MetricsWriter, "write", write)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "4", "--out", str(d), *TINY)
    assert code == 130
    assert err == ["crl-jax: interrupted at step 2, checkpoint at step 1; rerun the same command to resume"]


def _signal_at(monkeypatch, step, signum):
    """Send `signum` to this process once the rows of `step` are written (mid-run, as a scheduler would)."""
    from crl_jax.infra import metrics

    real = metrics.MetricsWriter.write

    def write(self, rows):
        real(self, rows)
        if rows[-1]["step"] == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(metrics.MetricsWriter, "write", write)


def test_sigterm_and_sigint_stop_with_a_checkpoint_and_the_rerun_is_byte_identical(straight, tmp_path, capsys,
                                                                                      monkeypatch):
    """SIGTERM at a seeded step of the 8-step run (a checkpoint every step), and SIGINT at the end of the first
    chunk of a 12-step run with no checkpoint before its end (so the stop saves step 10 itself): each exits 128 +
    the signal number with one line, and the rerun of the same command equals an uninterrupted run byte for
    byte (metrics.csv and every array of the final state)."""
    k = random.Random(7).randint(1, 7)
    d = tmp_path / "term"
    args = ["train", "--quiet", "--steps", "8", "--out", str(d), *TINY]
    _signal_at(monkeypatch, k, signal.SIGTERM)
    code, err = crl_main(capsys, *args)
    assert code == 143 and err[-1] == (f"crl-jax: stopped at step {k} (SIGTERM), checkpoint saved; rerun the same "
                                       "command to resume"), err
    assert not (d / "summary.json").exists() and max(int(n) for n in os.listdir(d / "checkpoints")) == k
    monkeypatch.undo()
    assert crl_main(capsys, *args)[0] == 0
    assert (d / "metrics.csv").read_bytes() == (straight / "metrics.csv").read_bytes()
    assert_same_state(d, straight)
    ref, d = tmp_path / "ref12", tmp_path / "int12"
    train(ref, 12, "checkpoint_every=20")
    args = ["train", "--quiet", "--steps", "12", "--out", str(d), *TINY, "checkpoint_every=20"]
    _signal_at(monkeypatch, 10, signal.SIGINT)
    code, err = crl_main(capsys, *args)
    assert code == 130 and err[-1].startswith("crl-jax: stopped at step 10 (SIGINT), checkpoint saved"), err
    assert os.listdir(d / "checkpoints") == ["10"]  # off the checkpoint cadence: saved by the stop
    monkeypatch.undo()
    assert crl_main(capsys, *args)[0] == 0
    assert (d / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
    assert_same_state(d, ref)


def test_a_full_disk_is_one_line_and_the_librarys_error_logs_are_dropped(tmp_path, capsys, monkeypatch, caplog):
    import logging

    import orbax.checkpoint as ocp

    def save(self, *a, **k):
        logging.getLogger("absl").error("orbax: async save failed, traceback follows")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "1", "--out", str(tmp_path / "r"), *TINY)
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0], err
    assert "traceback follows" not in caplog.text


def test_bank_replay_reports_the_final_rows_replay_share(straight, capsys):
    """`crl-jax bank replay RUN` replays the newest checkpoint's bank: its share is the last evaluation row's
    `bank_replay_success` (the same bank, the same function), and its held-in line with evaluation's pick is the
    last row's `eval_heldin_with_exp` (the same episodes)."""
    last = read_csv(os.path.join(straight, "metrics.csv"))[-1]
    capsys.readouterr()
    try:
        cli.main(["bank", "replay", str(straight)])
    except SystemExit as e:
        assert e.code in (0, None)
    out = capsys.readouterr().out.strip().splitlines()
    m = re.fullmatch(r"bank: (\d+) entries, ([\d.]+) replay to success \(([\d.]+|nan)\)", out[-1])
    assert m and int(m[1]) > 0, out
    assert float(m[3]) == pytest.approx(float(last["bank_replay_success"]), abs=5e-4)
    assert float(m[2]) == pytest.approx(int(m[1]) * float(m[3]), abs=0.06)
    t = re.fullmatch(r"tried: (\d+) of (\d+) entries have guided a rollout, ([\d.]+) of them replay to success; "
                     r"guided uses that succeed: (\d+) of (\d+) with those, (\d+) of (\d+) with the others", out[0])
    assert t and int(t[1]) <= int(t[2]) and int(t[4]) <= int(t[5]) and int(t[6]) <= int(t[7]), out
    assert int(t[5]) + int(t[7]) >= int(t[1])  # every tried entry guided at least one rollout
    lv = re.fullmatch(r"levels: (\d+) of (\d+) training levels have an entry that replays to success", out[1])
    assert lv and int(lv[1]) <= int(lv[2]), out
    h = re.fullmatch(r"held-in, greedy with experience: (\d+) of (\d+) levels succeed with evaluation's pick "
                     r"\((\d+) of the picks replay\); (\d+) of (\d+) with its pick among the entries that replay",
                     out[2])
    assert h and int(h[2]) == int(h[5]) == int(lv[2]) and int(h[3]) <= int(lv[1]), out
    assert int(h[1]) == round(int(h[2]) * float(last["eval_heldin_with_exp"]))
    w = re.fullmatch(r"by last write, iterations (.*)", out[-2])  # the bank's entries by when they were written
    spans = re.findall(r"(\d+)-(\d+): (\d+) entries, ([\d.]+|nan) replay", w[1]) if w else []
    assert [(int(a), int(b)) for a, b, _, _ in spans] == [(1, 2), (3, 4), (5, 6), (7, 8)], out
    assert sum(int(n) for _, _, n, _ in spans) == int(m[1])
    assert sum(int(n) * float(r) for _, _, n, r in spans if int(n)) == pytest.approx(float(m[2]), abs=0.005 * int(m[1]))


def test_cut_summary_and_killed_export_are_detected(straight, tmp_path, capsys, monkeypatch):
    """A member summary.json cut mid-write counts as unfinished (a sweep computes it again); a bank export killed
    mid-write leaves no file, and a copy cut between complete lines is refused naming the counts."""
    from crl_jax import atomic
    from crl_jax.infra.sweep import is_complete

    d = _copy_of(straight, tmp_path)
    assert is_complete(str(d), 8)
    (d / "summary.json").write_text((d / "summary.json").read_text()[:40])
    assert not is_complete(str(d), 8)
    out = tmp_path / "bank.jsonl"
    real = os.fsync

    def killed(fd):
        raise KeyboardInterrupt  # (the kill lands after the lines are written, before the rename)

    monkeypatch.setattr(atomic.os, "fsync", killed)
    code, _ = crl_main(capsys, "bank", "export", str(straight), "--out", str(out))
    assert code == 130 and not out.exists() and not (tmp_path / "bank.jsonl.tmp").exists()
    monkeypatch.setattr(atomic.os, "fsync", real)
    assert crl_main(capsys, "bank", "export", str(straight), "--out", str(out))[0] == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"crl_jax_bank_export": 1, "entries": len(lines) - 1} and len(lines) > 3
    out.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    code, err = crl_main(capsys, "train", "--quiet", "--steps", "1", "--out", str(tmp_path / "off"), "--method",
                         "offline", f"bank.offline_path={out}", *TINY)
    assert code == 2 and len(err) == 1 and f"holds {len(lines) // 2 - 1} entries, its header announces" in err[0], err


def test_train_help_and_config_show(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "dotted key=value" in out and "config show" in out and "--overwrite" in out
    cli.main(["config", "show", "actor.lr=2e-3"])
    import yaml

    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["actor"]["lr"] == 2e-3 and "keep_checkpoints" in shown and "offline_path" in shown["bank"]


# ------------------------------------------------------------------------------------------------
# plots


def test_plot_series_equals_the_csv_at_the_last_point_and_groups_by_label(tmp_path):
    from crl_jax.infra.metrics import MetricsWriter
    from crl_jax.infra.plot import group_series, run_label, smooth_series

    v = np.array([0.0, 1.0, np.nan, 1.0, 0.25])
    s = smooth_series(v, 3)
    assert s[0] == 0.0 and s[-1] == 0.25 and s[1] == 0.5 and s[2] == 1.0  # ends exact, NaN skipped
    rows = [{"step": i + 1, "success_guided": x} for i, x in enumerate(v)]
    d = tmp_path / "crl" / "seed0"
    d.mkdir(parents=True)
    MetricsWriter(str(d), tensorboard=False).write(rows)
    steps, mean, lo, hi, raw = group_series([read_csv(os.path.join(d, "metrics.csv"))], "success_guided", 3)
    assert steps[-1] == 5 and mean[-1] == 0.25 and raw[-1] == 0.25
    assert run_label(str(d)) == "crl" and run_label(str(tmp_path / "crl")) == "crl"
    (d / "config.json").write_text(json.dumps({"method": "crl", "label": "crl-lr3"}))
    assert run_label(str(d)) == "crl-lr3"
