"""The run folder of `crl_jax.infra.run`: its lock (`RunLock`), the saved config a resumed run must match
(`config_diff`, apart from `RESUME_FREE`), and starting a folder clean (`clear_run`, `--overwrite`).
"""

from __future__ import annotations

import json
import os
import shutil

from crl_jax.config import Config, ConfigError, drop_removed_keys, to_dict
from crl_jax.infra.checkpoint import step_dirs

RESUME_FREE = ("steps", "checkpoint_every", "keep_checkpoints", "eval.every", "label")  # may change on resume
RUN_FILES = ("checkpoints", "corrupt_checkpoints", "tb", "metrics.csv", "summary.json", "config.json")


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


def _check_saved_config(out_dir: str, cfg: Config) -> None:
    """A folder holding a run resumes only under a config that gives the same training columns."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        return
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
