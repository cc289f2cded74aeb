"""The run folder of `crl_jax.infra.run` (and of every sweep member): its lock (`RunLock`), the saved config a
resumed run must match (`config_diff`, apart from `RESUME_FREE`), starting a folder clean (`clear_run`,
`--overwrite`), config.json written atomically (`write_json_atomic`), the refusal to shorten a run that already
went further (`longer_run_error`), and the warning for a metrics.csv that lost rows (`missing_rows_warning`).
"""

from __future__ import annotations

import json
import os
import shutil

from crl_jax.config import Config, ConfigError, drop_removed_keys, to_dict
from crl_jax.atomic import write_json_atomic  # noqa: F401  (re-exported)
from crl_jax.infra.checkpoint import step_dirs
from crl_jax.infra.metrics import read_csv

RESUME_FREE = ("steps", "checkpoint_every", "keep_checkpoints", "eval.every", "label")  # may change on resume
RUN_FILES = ("checkpoints", "corrupt_checkpoints", "superseded_checkpoints", "tb", "metrics.csv", "summary.json",
             "config.json")


class RunFolderError(ConfigError):
    """The run folder cannot be used as asked (locked by another process, holds another run)."""


class RunLock:
    """Exclusive `fcntl.flock` on `RUN_DIR/.lock` for the life of a run: a second writer is refused with a
    message naming the holder's pid. The OS drops the lock when its process dies (even by kill -9), so a
    stale lock file never blocks."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, ".lock")
        self._fd = None

    def __enter__(self):
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderError(f"run folder {os.path.dirname(self.path)} is in use by another process (pid "
                                 f"{holder}, lock {self.path}); wait for it to finish or use another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc):
        import fcntl

        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _dotted(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v and k != "params":
            out.update(_dotted(v, key))
        else:
            out[key] = v
    return out


def config_diff(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts, with both values; `RESUME_FREE` ignored."""
    a, b = _dotted(saved), _dotted(now)
    return [f"{k} (saved {a.get(k, '<absent>')!r}, now {b.get(k, '<absent>')!r})"
            for k in sorted(set(a) | set(b)) if k not in RESUME_FREE and a.get(k) != b.get(k)]


def _check_saved_config(out_dir: str, cfg: Config) -> dict | None:
    """A folder holding a run resumes only under a config that gives the same training columns; returns the
    saved config (None: the folder has no config.json)."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise RunFolderError(f"{path} cannot be read ({e}); pass --overwrite to start this folder again") from None
    diff = config_diff(drop_removed_keys(saved, path), to_dict(cfg))
    if diff:
        raise RunFolderError(f"run folder {out_dir} holds a run with another config: {'; '.join(diff[:8])}"
                             f"{' ...' if len(diff) > 8 else ''}; use the same config, another --out, or "
                             "--overwrite to start it again")
    return saved


def holds_run(out_dir: str) -> bool:
    """True when the folder has checkpoints (committed or not): a run that a new one must not mix with."""
    return bool(step_dirs(os.path.join(out_dir, "checkpoints")))


def clear_run(out_dir: str) -> None:
    """Delete a previous run's files (`--overwrite`), leaving the folder (and its lock) in place."""
    for name in RUN_FILES:
        p = os.path.join(out_dir, name)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


def newest_checkpoint(out_dir: str) -> int:
    """The newest step with a checkpoint folder in the run folder (0: none): how far the run went."""
    return max(step_dirs(os.path.join(out_dir, "checkpoints")), default=0)


def longer_run_error(out_dir: str, have: int, asked: int, again: str = "pass --overwrite") -> RunFolderError:
    """The one-line refusal to run `asked` steps in a folder whose run already has `have` > `asked`: resuming
    it would drop its later rows and checkpoints, so the folder is left as it is."""
    return RunFolderError(f"run folder {out_dir} already has {have} steps, more than the {asked} asked for; it is "
                          f"left as it is: ask for --steps >= {have} to go on, or {again} to start it again")


def missing_rows_warning(out_dir: str, done: int) -> str | None:
    """The one-line warning for a run resumed from the checkpoint of step `done` whose metrics.csv lacks rows of
    steps 1..`done` (deleted or cut short by hand: they are not computed again); None when none is missing."""
    path = os.path.join(out_dir, "metrics.csv")
    rows = read_csv(path) if done > 0 and os.path.exists(path) else []
    have = {int(r["step"]) for r in rows if (r.get("step") or "").isdigit() and int(r["step"]) <= done}
    if len(have) >= done:
        return None
    return (f"crl-jax: warning: {path} lacks the rows of {done - len(have)} of the {done} steps before the "
            f"checkpoint of step {done} it resumes from (deleted or cut short?); they are not computed again, so "
            "plots and summary.json miss them (start the run again to have every row)")
