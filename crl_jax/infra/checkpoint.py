"""Orbax checkpoints of the whole `LoopState` (both models, optimizers, bank, buffer, key, step).

Layout: `RUN_DIR/checkpoints/<step>/` written by an `orbax.checkpoint.CheckpointManager` (atomic:
a checkpoint only counts once Orbax has committed it, so a kill mid-write leaves the previous one, and
the half-written temporary folder is removed when the folder is opened again).
Typed PRNG keys are stored as their raw key data and re-wrapped on restore. Restoring needs a
template state (a freshly initialised one) so shapes and dtypes are checked; a checkpoint that does
not match or cannot be read raises `CheckpointError` with one line naming the directory.

Every committed checkpoint carries the sha256 of each of its files (`CHECKSUMS` in the step folder), verified
before a restore: flipped bytes in an array file are a `CheckpointError` naming the file (Orbax itself only
notices cut files), and `restore_latest_valid` goes past such a checkpoint like any unreadable one.

Nothing is skipped silently: a save that Orbax declines (its step is not newer than the newest one
on disk) raises, and `restore_latest_valid` moves the unreadable checkpoints newer than the one it
restores aside (`RUN_DIR/corrupt_checkpoints/<step>`), so the retrained steps can be written again
and no reader later trips over them. A sweep resuming its members from their common step moves their newer
(readable) checkpoints aside the same way (`RUN_DIR/superseded_checkpoints/<step>`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys

import jax
import orbax.checkpoint as ocp

from crl_jax.atomic import write_json_atomic
from crl_jax.infra.errors import CheckpointError  # noqa: F401  (re-exported: the class the CLI catches)


_RESTORED: set[str] = set()  # checkpoint folders restores were started on, in this process


def _keep_log_record(record: logging.LogRecord) -> bool:
    """False for asyncio's "... exception was never retrieved" report of a read that a failed restore left
    behind: it names Orbax's reader, Orbax's read error, or the folder being restored."""
    msg = record.getMessage()
    return not ("exception was never retrieved" in msg and (
        "orbax" in msg or "reading array index" in msg or any(path in msg for path in _RESTORED)))


def _quiet_orphaned_reads(path: str) -> None:
    """When a restore fails, Orbax closes its asyncio loop while TensorStore still finishes the reads it
    started. What is left then reaches stderr as stray tracebacks around the one-line `CheckpointError`:
    callbacks failing with RuntimeError("Event loop is closed"), read coroutines dropped with their errors
    unretrieved (both unraisable exceptions), and asyncio's "... exception was never retrieved" log records of
    the same reads. They say nothing the error does not, so they are dropped. This is set up before a restore
    starts (the first callbacks can fail before the error reaches us) and stays; every other unraisable
    exception and log record passes as before. A restore that succeeds leaves nothing of these kinds."""
    _RESTORED.add(path)
    log = logging.getLogger("asyncio")
    if _keep_log_record not in log.filters:
        log.addFilter(_keep_log_record)
    previous = sys.unraisablehook
    if getattr(previous, "drops_orphaned_reads", False):
        return

    def hook(unraisable):
        exc, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
        closed_loop = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
        orbax_read = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
        if not (closed_loop or orbax_read):
            previous(unraisable)

    hook.drops_orphaned_reads = True
    sys.unraisablehook = hook


LIBRARY_LOGGERS = ("absl", "orbax", "jax", "tensorstore")


def _drop_errors(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


@contextlib.contextmanager
def _library_errors_silenced():
    """A failed save (a full disk) makes Orbax log the failure, with tracebacks, through absl (~300 lines) before
    it raises; the `CheckpointError` says it in one line, so ERROR records of these loggers are dropped while a
    save runs (their warnings and below pass)."""
    loggers = [logging.getLogger(n) for n in LIBRARY_LOGGERS]
    for lg in loggers:
        lg.addFilter(_drop_errors)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(_drop_errors)


def _to_saveable(state):
    return state.replace(key=jax.random.key_data(state.key))


def _from_saved(saved, template):
    return saved.replace(key=jax.random.wrap_key_data(saved.key, impl=jax.random.key_impl(template.key)))


def _abstract(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _first_line(e: BaseException, limit: int = 160) -> str:
    """`Type: first line of the message`, cut to `limit` characters: TensorStore errors span ~60 lines."""
    text = (str(e).strip().splitlines() or [""])[0]
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


CHECKSUMS = "crl_jax_checksums.json"  # in each step folder: {relative path: sha256} of Orbax's files


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(step_dir: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), step_dir) for r, _, fs in os.walk(step_dir) for f in fs
                  if f != CHECKSUMS)


def write_checksums(step_dir: str) -> None:
    """Record the sha256 of every file of a committed checkpoint (`CHECKSUMS`, written atomically): Orbax
    detects a cut file but restores flipped bytes in an array file without a word."""
    sums = {f: _sha256(os.path.join(step_dir, f)) for f in _files(step_dir)}
    write_json_atomic(os.path.join(step_dir, CHECKSUMS), sums)


def checksum_mismatch(step_dir: str) -> str | None:
    """None when the step folder's files match its `CHECKSUMS` (or it has none: written before checksums, or a
    kill came between Orbax's commit and the checksum file); else what is wrong, naming the file."""
    path = os.path.join(step_dir, CHECKSUMS)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            sums = json.load(f)
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} unreadable ({type(e).__name__})"
    if not isinstance(sums, dict):
        return f"{CHECKSUMS} is not a mapping"
    for name, digest in sorted(sums.items()):
        f = os.path.join(step_dir, name)
        if not os.path.isfile(f):
            return f"{name} is missing"
        if _sha256(f) != digest:
            return f"{name} does not match its sha256 checksum"
    return None


def step_dirs(directory: str) -> list[int]:
    """Steps with a folder named by an integer under `directory` (committed or not: what a reader would
    try), without asking Orbax (whose step cache can lag the disk)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


class Checkpointer:
    def __init__(self, run_dir: str, keep: int = 3, *, writer: bool = False):
        """writer: this process owns the folder (holds its lock): half-written temporary folders of a killed
        save are removed on opening. Readers (`crl-jax eval`) leave them, as a live run may be writing."""
        if keep < 1:
            raise CheckpointError(f"keep_checkpoints={keep}: at least one checkpoint must be kept")
        self.run_dir = os.path.abspath(run_dir)
        self.directory = os.path.join(self.run_dir, "checkpoints")
        self._ocp = ocp
        self._mgr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=writer))

    def steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, step: int, state) -> None:
        """Write the checkpoint of `step` and wait for it; raises `CheckpointError` when it was not written."""
        step = int(step)
        try:
            with _library_errors_silenced():
                saved = self._mgr.save(step, args=self._ocp.args.StandardSave(_to_saveable(state)))
                self._mgr.wait_until_finished()
        except Exception as e:  # orbax: ValueError (step exists), OSError (disk full), tensorstore errors
            raise CheckpointError(f"checkpoint of step {step} could not be written to {self.directory}: "
                                  f"{_first_line(e)}") from e
        if not saved:
            raise CheckpointError(f"checkpoint of step {step} was not written to {self.directory}: the folder "
                                  f"already holds step(s) {self.steps()}, not older than it")
        if jax.process_count() == 1:  # (several processes: each writes its own files, maybe on its own disk)
            write_checksums(os.path.join(self.directory, str(step)))

    def restore(self, template, step: int | None = None):
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        path = os.path.join(self.directory, str(step))
        bad_file = checksum_mismatch(path)
        if bad_file is not None:
            raise CheckpointError(f"checkpoint {path} cannot be restored (corrupt: {bad_file}); rerun training with "
                                  "--resume latest_valid to continue from the newest readable checkpoint")
        target = _abstract(_to_saveable(template))
        _quiet_orphaned_reads(path)
        try:
            saved = self._mgr.restore(step, args=self._ocp.args.StandardRestore(target))
        except Exception as e:  # orbax raises many types for unreadable / mismatched trees
            raise CheckpointError(f"checkpoint {path} cannot be restored (corrupt, incomplete, or written by "
                                  f"another config: {_first_line(e)}); rerun training with --resume latest_valid "
                                  "to continue from the newest readable checkpoint") from e
        bad = [
            f"{jax.tree_util.keystr(p)}: saved {a.shape}/{a.dtype} vs expected {b.shape}/{b.dtype}"
            for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(saved), jax.tree_util.tree_leaves(target))
            if a.shape != b.shape or a.dtype != b.dtype
        ]
        if bad:
            raise CheckpointError(f"checkpoint {path} does not match this run's state: " + "; ".join(bad[:5]))
        return _from_saved(saved, template), step

    def restore_latest_valid(self, template, log=None):
        """Newest checkpoint that restores (`--resume=latest_valid`); older ones are tried in turn, and the
        unreadable ones newer than it are moved aside to `RUN_DIR/corrupt_checkpoints/` (`log` says so)."""
        errors, bad = [], []
        for step in reversed(sorted(set(self.steps()) | set(step_dirs(self.directory)))):
            try:
                restored = self.restore(template, step)
            except CheckpointError as e:
                errors.append(str(e).split(" (corrupt")[0])
                bad.append(step)
                continue
            self.move_aside(bad, log)
            return restored
        raise CheckpointError("no readable checkpoint: " + (" | ".join(errors) or f"none in {self.directory}"))

    def move_aside(self, steps, log=None, folder: str = "corrupt_checkpoints",
                   say: str = "moved unreadable checkpoint {src} to {dst}") -> None:
        """Move the folders of `steps` to `RUN_DIR/<folder>/<step>[.N]` and forget them (`log` gets `say` of
        each)."""
        if not steps:
            return
        self._mgr.wait_until_finished()
        aside = os.path.join(self.run_dir, folder)
        os.makedirs(aside, exist_ok=True)
        for step in steps:
            src = os.path.join(self.directory, str(step))
            if not os.path.exists(src):
                continue
            dst, i = os.path.join(aside, str(step)), 1
            while os.path.exists(dst):
                dst, i = os.path.join(aside, f"{step}.{i}"), i + 1
            shutil.move(src, dst)
            if log is not None:
                log(say.format(src=src, dst=dst))
        self._mgr.reload()

    def close(self):
        self._mgr.close()
