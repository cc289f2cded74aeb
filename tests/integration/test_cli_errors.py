"""Bad input to `crl-jax` (and `crl-jax sweep` as experiments/sweep.py): one `PROG: error: ...` line naming the key or file, exit 2,
never a traceback. Every case fails before anything is compiled (config, sweep file, model or run folder
checks), so the file runs in a few seconds."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from crl_jax.infra import cli, cli_errors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_main(capsys, main, args, prog="crl-jax"):
    """(exit code, the `PROG:` lines of stderr) of `main(args)` in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        rc = main(list(args))
        raise SystemExit(rc or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return e.value.code, [line for line in err.splitlines() if line.startswith(f"{prog}:")]


def one_error(capsys, args, *words, main=cli.main, prog="crl-jax"):
    code, lines = run_main(capsys, main, args, prog)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), (code, lines)
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------------------------
# experiments/sweep.py


@pytest.fixture(scope="module")
def sweep_main():
    spec = importlib.util.spec_from_file_location("sweep_script", os.path.join(REPO, "experiments", "sweep.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("text, words", [
    ("seeds: 2\ngridd:\n  method: [crl]\n", ["gridd"]),
    ("grid:\n  actor.lrr: [1.0e-3]\n", ["actor.lrr"]),
    ("overrides: steps=3\n", ["overrides", "steps=3"]),
    ("grid: [crl, grpo]\n", ["grid must map"]),
    ("seeds: three\n", ["seeds", "three"]),
    ("seeds: 0\n", ["seeds must be >= 1"]),
    ("- a\n- b\n", ["must hold a mapping"]),
    ("grid:\n  seed: [1, 2]\n", ["grid", "'seed'", "seeds:"]),
    ("overrides: {seed: 5}\n", ["overrides", "'seed'", "seeds:"]),
    ("points:\n  a: {seed: 5}\n", ["points.a", "'seed'"]),
    ("seeds: [0, 0]\noverrides: {steps: 1}\n", ["seeds [0] are listed twice"]),
])
def test_bad_sweep_file_is_one_line(capsys, tmp_path, sweep_main, text, words):
    f = tmp_path / "sweep.yaml"
    f.write_text(text)
    one_error(capsys, ["--config", str(f), "--out", str(tmp_path / "out"), "--dry-run"], *words,
              main=sweep_main, prog="sweep")


def test_missing_or_folder_sweep_file(capsys, tmp_path, sweep_main):
    one_error(capsys, ["--config", str(tmp_path / "nope.yaml"), "--dry-run"], "nope.yaml", main=sweep_main,
              prog="sweep")
    one_error(capsys, ["--config", str(tmp_path), "--dry-run"], str(tmp_path), "folder", main=sweep_main, prog="sweep")
    one_error(capsys, ["sweep", "--config", str(tmp_path / "nope.yaml"), "--dry-run"], "nope.yaml")  # crl-jax sweep
    f = tmp_path / "two_jobs.yaml"
    f.write_text("overrides: {steps: 1}\ngrid: {distributed.num_processes: [1, 2]}\n")
    one_error(capsys, ["sweep", "--config", str(f), "--out", str(tmp_path / "o")], "distributed.*", "same settings")


# ----------------------------------------------------------------------------------------------
# Config values that passed validation and crashed later


@pytest.mark.parametrize("override, key", [
    ("actor.num_heads=3", "actor.num_heads"), ("actor.num_kv_heads=3", "actor.num_heads"),
    ("extractor.num_kv_heads=0", "extractor.num_kv_heads"), ("actor.hidden_size=0", "actor.hidden_size"),
    ("bank.key_dim=0", "bank.key_dim"), ("extraction.prompt_len=0", "extraction.prompt_len"),
])
def test_shapes_that_crashed_later_name_the_key(capsys, override, key):
    one_error(capsys, ["config", "show", override], key)


# ----------------------------------------------------------------------------------------------
# Damaged model folders


def _model_folder(path, *, tokenizer=True, lower=False):
    from _checkpoints import tiny_bpe, write_numpy_checkpoint
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    os.makedirs(path, exist_ok=True)
    write_numpy_checkpoint(path)
    if tokenizer:
        if lower:  # a normalising tokenizer: "That" comes back as "that"
            tok = Tokenizer(models.WordLevel({"[UNK]": 0, "that": 1}, unk_token="[UNK]"))
            tok.normalizer, tok.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
            tok.save(os.path.join(path, "tokenizer.json"))
        else:
            from crl_jax.text.tokenizers import HFTokenizer

            tokens, merges, types = tiny_bpe()
            HFTokenizer.from_gguf_metadata({
                "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types}).raw.save(
                    os.path.join(path, "tokenizer.json"))
    return path


def _edit_config(path, **kw):
    f = os.path.join(path, "config.json")
    with open(f) as fh:
        cfg = json.load(fh)
    cfg.update(kw)
    with open(f, "w") as fh:
        json.dump(cfg, fh)


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory):
    return _model_folder(str(tmp_path_factory.mktemp("model") / "m"))


def _damaged(good, tmp_path, edit):
    import shutil

    d = str(tmp_path / "damaged")
    shutil.copytree(good, d)
    edit(d)
    return d


def _write(d, name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


@pytest.mark.parametrize("edit, words", [
    (lambda d: _write(d, "model.safetensors.index.json", "{bad"), ["model.safetensors.index.json"]),
    (lambda d: _write(d, "model.safetensors.index.json", "[]"), ["model.safetensors.index.json", "list"]),
    (lambda d: _write(d, "tokenizer.json", "{not json"), ["tokenizer.json"]),
    (lambda d: open(os.path.join(d, "tokenizer.json"), "r+").truncate(1000), ["tokenizer.json"]),
    (lambda d: _write(d, "tokenizer_config.json", "{oops"), ["tokenizer_config.json"]),
    (lambda d: _write(d, "tokenizer_config.json", "[1]"), ["tokenizer_config.json"]),
    (lambda d: _write(d, "config.json", "[1, 2]"), ["config.json", "list"]),
    (lambda d: _edit_config(d, hidden_size="sixteen"), ["config.json", "'hidden_size'", "sixteen"]),
    (lambda d: _edit_config(d, vocab_size=None), ["config.json", "'vocab_size'"]),
    (lambda d: _edit_config(d, num_attention_heads=3), ["config.json", "num_kv_heads"]),
    (lambda d: _edit_config(d, rms_norm_eps="tiny"), ["config.json", "'rms_norm_eps'"]),
])
def test_damaged_model_folder_names_the_file(good_folder, tmp_path, edit, words):
    from crl_jax.infra.errors import CheckpointError
    from crl_jax.models import from_pretrained

    d = _damaged(good_folder, tmp_path, edit)
    with pytest.raises(CheckpointError) as e:
        from_pretrained(d)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_folder_named_safetensors_is_skipped(good_folder, tmp_path):
    from crl_jax.models import from_pretrained

    d = _damaged(good_folder, tmp_path, lambda d: os.mkdir(os.path.join(d, "extra.safetensors")))
    _, tok = from_pretrained(d)
    assert tok is not None


def test_llm_train_on_damaged_folder_is_one_line(capsys, good_folder, tmp_path):
    d = _damaged(good_folder, tmp_path, lambda d: _edit_config(d, hidden_size="sixteen"))
    one_error(capsys, ["train", "--quiet", "--steps", "1", "--out", str(tmp_path / "run"), f"actor.preset={d}",
                       f"extractor.preset={d}", "format_prior.enabled=false"], "config.json", "'hidden_size'")


def test_a_tokenizer_that_does_not_round_trip_the_environment_text_is_one_line(capsys, tmp_path):
    """A lower-casing tokenizer loads (the loader takes any valid tokenizer.json); the token renderer that
    needs the environment's text back unchanged refuses it, and the CLI says so in one line."""
    from crl_jax.models import from_pretrained

    d = _model_folder(str(tmp_path / "m"), lower=True)
    _, tok = from_pretrained(d)
    assert tok.decode(tok.encode("That")) == "that"

    def build():
        raise ValueError("make_token_renderer: tokenizer does not round-trip 'That is not a valid action.'")

    code, lines = run_main(capsys, lambda _: cli_errors.report_errors(build), [])
    assert code == 2 and len(lines) == 1 and "round-trip" in lines[0], lines


# ----------------------------------------------------------------------------------------------
# Run folders, metrics, plots


def _run_folder(path, config_text="{}", rows=("1,0.5,0.25",), header="step,success_guided,eval_heldin_with_exp"):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(config_text)
    with open(os.path.join(path, "metrics.csv"), "w") as f:
        f.write("\n".join([header, *rows]) + "\n")
    return str(path)


@pytest.mark.parametrize("text", ["", "{bad", "[1]"])
def test_damaged_run_config_is_one_line(capsys, tmp_path, text):
    d = _run_folder(tmp_path / "run", config_text=text)
    one_error(capsys, ["eval", d], "config.json")
    one_error(capsys, ["plot", d], "config.json")


def test_plot_skips_cut_rows_and_names_bad_cells(capsys, tmp_path):
    d = _run_folder(tmp_path / "run", rows=("1,0.5,0.25", "2,0.5,0.5", "3,0.7"))
    capsys.readouterr()
    cli.main(["plot", d, "--out", str(tmp_path / "curves")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "curves.png")  # the path written, not "curves"
    assert os.path.exists(tmp_path / "curves.png")
    bad = _run_folder(tmp_path / "bad", rows=("1,0.5,0.25", "2,oops,0.5"))
    one_error(capsys, ["plot", bad], "metrics.csv", "success_guided", "oops")


# ----------------------------------------------------------------------------------------------
# Files and folders in the wrong place


def test_filesystem_errors_are_one_line(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_error(capsys, ["train", "--quiet", "--steps", "1", "--out", str(afile)], str(afile))
    one_error(capsys, ["config", "show", "--config", str(tmp_path)], str(tmp_path), "folder")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("steps: 3  # caf\xe9\n".encode("latin-1"))
    one_error(capsys, ["config", "show", "--config", str(latin)], str(latin), "UTF-8")
    one_error(capsys, ["train", "--config", str(latin)], str(latin))
    one_error(capsys, ["bank", "export", str(tmp_path), "--out", str(tmp_path)], "--out", str(tmp_path))


def test_oserror_is_one_line_naming_the_file(capsys, tmp_path):
    def fails(_):
        raise NotADirectoryError(20, "Not a directory", str(tmp_path / "afile" / "sub"))

    with pytest.raises(SystemExit) as e:
        cli_errors.report_errors(fails, None)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"crl-jax: error: '{tmp_path / 'afile' / 'sub'}': Not a directory"


def test_demo_needs_a_seed(capsys, tmp_path):
    one_error(capsys, ["demo", "--seeds", "0", "--out", str(tmp_path / "demo")], "--seeds")


# ----------------------------------------------------------------------------------------------
# Configs that were silently reinterpreted, and settings that failed later with a traceback


@pytest.mark.parametrize("text, words", [
    ("env:\n  max_turns: 5\nsteps: 3\nenv:\n  name: maze\n", ["'env'", "twice", "lines 1 and 4"]),
    ("actor:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", ["'lr'", "twice"]),
    ("", ["is empty"]),
    ("# only a comment\n", ["is empty"]),
    ("env:\n  params: {dark: \"false\"}\n", ["env.params.dark", "true/false", "'false'"]),
])
def test_config_files_that_were_reinterpreted_are_refused(capsys, tmp_path, text, words):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    one_error(capsys, ["config", "show", "--config", str(f)], str(f) if "env.params" not in words[0] else "", *words)


@pytest.mark.parametrize("args, words", [
    (["env.params.dark='false'"], ["env.params.dark", "true/false"]),
    (["env.params.crop=1.5"], ["env.params.crop", "integer"]),
    (["env.params.drak=true"], ["env.params.drak", "not a parameter", "'dark'"]),
    (["env.params.num_tasks=3"], ["env.params.num_tasks", "set by the run"]),
    (["--steps", "0"], ["steps: must be >= 1"]),
    (["mesh.data=16"], ["mesh", "16", "device(s) visible"]),
    (["mesh.extractor_devices=0.01", "mesh.data=-1"], ["extractor_devices", "device(s) visible"]),
    (["distributed.coordinator=localhost:1"], ["distributed.num_processes", "distributed.process_id"]),
    (["distributed.coordinator=localhost:1", "distributed.num_processes=2", "distributed.process_id=2"],
     ["distributed.process_id: 2 not in [0, 2)"]),
    (["rollout.groups=1000000"], ["rollout.groups", "at least", "GiB", "available"]),
])
def test_train_settings_that_failed_late_are_one_line_before_anything_is_built(capsys, tmp_path, args, words):
    one_error(capsys, ["train", "--quiet", "--out", str(tmp_path / "r"), *args], *words)


def test_options_may_follow_overrides_and_every_option_has_help(capsys):
    args = cli.parse(cli.build_parser(), ["train", "actor.lr=2e-3", "--steps", "3", "seed=1", "--quiet"])
    assert args.overrides == ["actor.lr=2e-3", "seed=1"] and args.steps == 3 and args.quiet and args.cmd == "train"
    args = cli.parse(cli.build_parser(), ["plot", "a", "--out", "x.png", "b"])
    assert args.run_dirs == ["a", "b"] and args.out == "x.png"
    parser = cli.build_parser()
    subs = next(a.choices for a in parser._actions if a.dest == "cmd")
    missing = [f"{name} {a.dest}" for name, p in subs.items() for a in p._actions
               if a.dest != "help" and not a.help]
    assert not missing, missing
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("crl-jax ")


def test_config_show_prints_each_keys_comment_and_parses_back(capsys):
    import yaml

    from crl_jax.config import load, to_dict

    cli.main(["config", "show", "actor.lr=2e-3"])
    out = capsys.readouterr().out
    assert yaml.safe_load(out) == to_dict(load(None, ["actor.lr=2e-3"]))
    lines = out.splitlines()
    i = lines.index("  lr: 0.002")  # the actor's (the first `lr`), its config.py comment right above it
    assert lines[i - 3].startswith("  # AdamW learning rate (constant)") and lines[i - 1].startswith("  # per update")
    assert "# envs.make kwargs" in out
    cli.main(["config", "show", "--no-comments"])
    assert "#" not in capsys.readouterr().out


def test_a_second_sweep_into_one_folder_is_refused(capsys, tmp_path, sweep_main):
    from crl_jax.infra.run_folder import RunLock

    f = tmp_path / "sweep.yaml"
    f.write_text("seeds: 1\noverrides: {steps: 1}\n")
    out = tmp_path / "out"
    out.mkdir()
    with RunLock(str(out)):  # as a running sweep holds it
        one_error(capsys, ["--config", str(f), "--out", str(out)], "in use by another process", main=sweep_main,
                  prog="sweep")


def test_each_warning_is_shown_once():
    import warnings

    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *a, **k: shown.append(warnings.formatwarning(message, *a[:3]))
        cli_errors._one_line_warnings()
        for _ in range(2):
            warnings.warn("offline bank file b.jsonl: 2 of 3 entries cut")
        warnings.warn("another")
    assert shown == ["crl-jax: warning: offline bank file b.jsonl: 2 of 3 entries cut\n", "crl-jax: warning: another\n"]


def test_plot_warns_of_duplicated_steps_and_empty_files_and_refuses_a_cut_file(capsys, tmp_path):
    import json

    dup = _run_folder(tmp_path / "dup", rows=("1,0.5,0.25", "2,0.5,0.5", "1,0.5,0.25", "2,0.5,0.5"))
    empty = _run_folder(tmp_path / "empty", rows=())
    with pytest.warns(UserWarning) as w:
        cli.main(["plot", dup, empty, "--out", str(tmp_path / "c.png")])
    msgs = " | ".join(str(x.message) for x in w)
    assert "2 duplicated step(s)" in msgs and "holds no rows" in msgs, msgs
    one_error(capsys, ["plot", empty], "nothing to plot")
    cut = _run_folder(tmp_path / "cut", rows=("1,0.5,0.25",))
    with open(os.path.join(cut, "summary.json"), "w") as fh:
        json.dump({"steps": 2, "rows": 2}, fh)
    one_error(capsys, ["plot", cut], "holds 1 rows up to step 2", "counts 2", "cut short")
