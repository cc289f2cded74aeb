"""Orbax checkpoints of the whole `LoopState` (both models, optimizers, bank, buffer, key, step).

Layout: `RUN_DIR/checkpoints/<step>/` written by an `orbax.checkpoint.CheckpointManager` (atomic:
a checkpoint only counts once Orbax has committed it, so a kill mid-write leaves the previous one).
Typed PRNG keys are stored as their raw key data and re-wrapped on restore. Restoring needs a
template state (a freshly initialised one) so shapes and dtypes are checked; a checkpoint that does
not match raises `CheckpointError` naming the directory and what differs.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or does not match the run; the message names the directory."""


def _to_saveable(state):
    return state.replace(key=jax.random.key_data(state.key))


def _from_saved(saved, template):
    return saved.replace(key=jax.random.wrap_key_data(saved.key, impl=jax.random.key_impl(template.key)))


def _abstract(tree):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                                  tree)


class Checkpointer:
    def __init__(self, run_dir: str, keep: int = 3):
        self.directory = os.path.abspath(os.path.join(run_dir, "checkpoints"))
        self._mgr = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, step: int, state) -> None:
        self._mgr.save(int(step), args=ocp.args.StandardSave(_to_saveable(state)))
        self._mgr.wait_until_finished()

    def restore(self, template, step: int | None = None):
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        path = os.path.join(self.directory, str(step))
        target = _abstract(_to_saveable(template))
        try:
            saved = self._mgr.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # orbax raises many types for unreadable / mismatched trees
            raise CheckpointError(f"checkpoint {path} cannot be restored into this run's state "
                                  f"(corrupt, or written by a different config): {type(e).__name__}: {e}") from e
        bad = [
            f"{jax.tree_util.keystr(p)}: saved {a.shape}/{a.dtype} vs expected {b.shape}/{b.dtype}"
            for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(saved), jax.tree_util.tree_leaves(target))
            if a.shape != b.shape or a.dtype != b.dtype
        ]
        if bad:
            raise CheckpointError(f"checkpoint {path} does not match this run's state: " + "; ".join(bad[:5]))
        return _from_saved(saved, template), step

    def restore_latest_valid(self, template):
        """Newest checkpoint that restores; older ones are tried in turn (`--resume=latest_valid`)."""
        errors = []
        for step in reversed(self.steps()):
            try:
                return self.restore(template, step)
            except CheckpointError as e:
                errors.append(str(e))
        raise CheckpointError("no valid checkpoint: " + (" | ".join(errors) or f"none in {self.directory}"))

    def close(self):
        self._mgr.close()
