"""Host driver of a training run: run folder, resume, chunks of compiled steps, checkpoints, progress.

`run(cfg, out_dir)` trains `cfg.steps` iterations and saves an Orbax checkpoint every `checkpoint_every`
steps and at the end, appending the metric rows as it goes. On start it resumes from the latest checkpoint
in `out_dir` if one exists (the config saved beside it must match, apart from the fields in
`RESUME_FREE`, which cannot change the training columns).

Exact at any step: every call of the compiled paths runs the SAME program, a scan of `CHUNK_STEPS`
iterations whose iterations at or past a traced stop step are skipped inside it (`lax.cond`; their
metric rows are dropped). A scan compiles its body once, so step t is computed by the same code whatever
the chunk it falls in, and a run killed, resumed or extended at any step writes the training columns of an
uninterrupted run byte for byte (chunks of other lengths are other programs with other float rounding).
The host-env path steps one jitted iteration at a time and is exact anyway.

Evaluation rows: the four eval columns are filled every `eval.every` steps and at the run's last step. A
run extended later (`--steps 2`, then `--steps 3`) keeps the evaluation of its earlier last step (row 2),
which a straight 3-step run has only when `eval.every` divides 2; the training columns are identical.

Safety: the folder is locked for the whole run (`RunLock`, an OS lock released when the process dies,
so a killed run never blocks the next); `config.json` is written only once the run has started (a failed
start leaves nothing that blocks the corrected command); `--resume never` refuses a folder that holds a
run unless `overwrite` starts it clean; a folder whose run already has more steps than asked for is refused
and left as it is (resuming it would drop its later checkpoints and rows); config.json is replaced atomically
and keeps the saved label unless a new one is given; a resumed run whose metrics.csv lacks rows before its
checkpoint is warned about; skipped non-finite updates are warned about, totalled in summary.json and stop the
run past `max_nonfinite`. SIGTERM and SIGINT (`infra.preempt`) stop the run at the next chunk boundary (a chunk
is at most `CHUNK_STEPS` steps and never crosses a checkpoint step): the step reached is checkpointed and
`preempt.Stopped` raised (the CLI exits 128 + the signal number); a second signal raises `Interrupted` at once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import loop
from crl_jax.host import driver as host_loop
from crl_jax.backends.llm.format_prior import format_prior_id
from crl_jax.backends.llm.runtime import is_llm_config
from crl_jax.config import Config, ConfigError, to_dict
from crl_jax.infra import distributed, memory, preempt
from crl_jax.infra import sharding
from crl_jax.infra.checkpoint import Checkpointer, step_dirs
from crl_jax.infra.metrics import MetricsWriter, read_csv, rows_from_chunk, summary_from_rows, write_summary
from crl_jax.learner import pretrain
from crl_jax.loop.runtime import build
from crl_jax.infra.run_folder import (  # noqa: F401  (RESUME_FREE: named by this docstring)
    RESUME_FREE, RunFolderError, RunLock, _check_saved_config, clear_run, holds_run, longer_run_error,
    missing_rows_warning, newest_checkpoint, write_json_atomic,
)

CHUNK_STEPS = 10  # iterations of the one compiled chunk program (a fixed number: see the module docstring)
MAX_NONFINITE = 10  # skipped non-finite updates (actor + extractor) a run tolerates by default


class NonFiniteError(RuntimeError):
    """The run skipped more non-finite updates than allowed and stopped; the message says where and why."""


class Interrupted(Exception):
    """Ctrl-C during a run: `step` = steps whose rows were written, `checkpoint` = newest checkpoint step."""

    def __init__(self, step: int, checkpoint: int | None):
        where = "no checkpoint yet" if checkpoint is None else f"checkpoint at step {checkpoint}"
        super().__init__(f"interrupted at step {step}, {where}; rerun the same command to resume")
        self.step, self.checkpoint = step, checkpoint


# ------------------------------------------------------------------------------------------------
# The path of a config and its one chunk program


def _prior_id(cfg: Config):
    if is_llm_config(cfg):  # the LLM path's format prior (crl_jax/backends/llm/format_prior.py), when enabled
        return format_prior_id(cfg) if cfg.format_prior.enabled else None
    return pretrain.prior_id(cfg) if cfg.pretrain.enabled else None


def runtime_of(cfg: Config):
    """The (cached) Runtime of the path a config runs on (the LLM path's or the tiny one): `loop.runtime.build`."""
    return build(cfg)


def engine(cfg: Config):
    """(runtime, init_state, chunk, run_steps) of the path a config runs on: the one compiled loop
    (`crl_jax.loop`) on the built-in backend or the LLM backend (`crl_jax.backends.llm`: pretrained models, chat
    prompts), or the host driver of an environment adapter (`host.driver`: env steps on the host between
    jitted pieces). Every chunk has the contract of `loop.compiled_chunk(rt, n)`: `(state, last_step) ->
    (state, metrics [n])` over the same `LoopState`; the pure `run_steps` (None for the host driver) is
    what a sharded run jits with in/out shardings."""
    rt = runtime_of(cfg)
    if host_loop.is_host(rt):
        return rt, loop.init_state, host_loop.chunk, None
    return rt, loop.init_state, loop.compiled_chunk, loop.run_steps


def step_function(cfg: Config, run_steps, rt=None):
    """(one iteration with its evaluations `(rt, state, last_step) -> (state, metrics)`, donate the state?)
    of a compiled path; (None, False) for the host driver. `rt` (default: built from `cfg`) says whether
    its backend donates (two LLMs with optimizer states do not fit twice in memory)."""
    if run_steps is None:
        return None, False
    rt = rt if rt is not None else runtime_of(cfg)
    return loop.step_with_eval, rt.backend.donate


_MASKED: dict = {}


def masked_run_steps(step_fn):
    """`run_steps(rt, state, num_steps, bounds)` with `bounds` = int32 [3] (last_step, stop_step, eval_every):
    a scan of `num_steps` iterations in which those at `state.step >= stop_step` are skipped (state unchanged,
    NaN metrics), evaluating every `eval_every` steps (0: never) and at `last_step`; `rt` must be built with
    `eval.every = 0` (`program_config`). One function object per step function, so compiled-program caches
    keyed on it hit."""
    if step_fn not in _MASKED:
        def run_steps(rt, state, num_steps: int, bounds):
            from jax.extend.core import jaxpr_as_fun

            last, stop, every = bounds[0], bounds[1], bounds[2]
            # Trace the iteration once (tracing it is most of a start-up): its jaxpr runs in the taken branch,
            # its output shapes give the skipped branch's NaN metrics.
            closed, out = jax.make_jaxpr(lambda s, lst: step_fn(rt, s, lst), return_shape=True)(state, last)
            out_tree, shapes = jax.tree_util.tree_structure(out), out[1]
            skipped = jax.tree_util.tree_map(
                lambda x: jnp.full(x.shape, jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else 0, x.dtype), shapes)

            def step(s):
                # rt is built with eval.every = 0 (evaluate at `last_step` only): passing the new step as
                # `last_step` when an evaluation is due makes the cadence a traced value (`every` may
                # change on a resume without changing the program)
                new = s.step + 1
                due = ((every > 0) & (new % jnp.maximum(every, 1) == 0)) | (new == last)
                flat = jaxpr_as_fun(closed)(*jax.tree_util.tree_leaves((s, jnp.where(due, new, -1))))
                return jax.tree_util.tree_unflatten(out_tree, flat)

            def body(s, _):
                return jax.lax.cond(s.step < stop, step, lambda t: (t, skipped), s)

            return jax.lax.scan(body, state, None, length=num_steps)

        _MASKED[step_fn] = run_steps
    return _MASKED[step_fn]


@functools.lru_cache(maxsize=16)
def masked_chunk(rt, step_fn, num_steps: int, donate: bool):
    """Jitted `(state, bounds) -> (state, metrics [num_steps])` of `masked_run_steps` (single device)."""
    rs = masked_run_steps(step_fn)
    return jax.jit(lambda s, b: rs(rt, s, num_steps, b), donate_argnums=(0,) if donate else ())


def _committed(state):
    """Every leaf committed to its device(s), as a restored checkpoint's and a chunk's outputs are: a fresh
    state's uncommitted arrays would lower the chunk to another program (and another compilation)."""
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, x.sharding), state)


def _scalar(x) -> int:
    """An int out of a (possibly multi-process, replicated) scalar array."""
    return int(np.asarray(x.addressable_data(0))) if hasattr(x, "addressable_data") else int(x)


def nonfinite_counts(state) -> tuple[int, int]:
    """(actor, extractor) updates skipped so far for a non-finite loss or gradient (kept in the state)."""
    return _scalar(state.actor.nonfinite_count), _scalar(state.extractor.nonfinite_count)


# ------------------------------------------------------------------------------------------------
# The run


def run(cfg: Config, out_dir: str, *, resume: str = "latest", progress: bool = True, label: str | None = None,
        overwrite: bool = False, max_nonfinite: int = MAX_NONFINITE, log=print) -> dict:
    """Train (or resume) into `out_dir`; returns the summary dict (also written to summary.json).

    resume: "latest" (the newest checkpoint must restore), "latest_valid" (the newest that restores; newer
    unreadable ones are moved aside), "never" (refused on a folder holding a run unless `overwrite`).
    overwrite: delete the folder's previous run first. max_nonfinite: stop (`NonFiniteError`) once more
    updates than this were skipped for non-finite values. label: None keeps the label saved with the run.
    A folder whose run already has more than `cfg.steps` steps raises `RunFolderError` and is left as it is."""
    if resume not in ("latest", "latest_valid", "never"):
        raise ConfigError(f"resume={resume!r}: expected latest, latest_valid or never")
    os.makedirs(out_dir, exist_ok=True)
    distributed.initialize(cfg.distributed)  # no-op for one process
    sharding.check_fits(cfg.mesh)  # before anything is built: a mesh the devices cannot hold is refused
    memory.check(cfg)  # a rough lower bound of the memory the run needs, against what the devices have
    main = distributed.is_main()  # multi-process: process 0 writes the files, every process checkpoints
    lock = RunLock(out_dir) if main else _NoLock()
    with lock:
        if overwrite and main:
            clear_run(out_dir)
        elif holds_run(out_dir):
            if resume == "never":
                raise RunFolderError(
                    f"run folder {out_dir} holds a run (checkpoints {step_dirs(os.path.join(out_dir, 'checkpoints'))}"
                    "); --resume never would mix a new run with it: pass --overwrite to delete it and start again, "
                    "or use another --out")
            saved = _check_saved_config(out_dir, cfg)
            if resume == "latest" and newest_checkpoint(out_dir) > cfg.steps:  # before building anything
                raise longer_run_error(out_dir, newest_checkpoint(out_dir), cfg.steps)
            label = label if label is not None or saved is None else saved.get("label")
        return _run_locked(cfg, out_dir, resume=resume, progress=progress, label=label, main=main,
                           max_nonfinite=max_nonfinite, log=log)


def program_config(cfg: Config) -> Config:
    """The config a compiled path's Runtime is built from: eval cadence removed (it is a traced argument of
    `masked_run_steps`), so runs that differ only in `RESUME_FREE` fields share one program."""
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, every=0))


def _run_locked(cfg, out_dir, *, resume, progress, label, main, max_nonfinite, log) -> dict:
    with preempt.stop_requests():  # SIGTERM / SIGINT: stop at a chunk boundary with a checkpoint
        return _train(cfg, out_dir, resume=resume, progress=progress, label=label, main=main,
                      max_nonfinite=max_nonfinite, log=log)


def _train(cfg, out_dir, *, resume, progress, label, main, max_nonfinite, log) -> dict:
    rt, init, chunk_fn, run_steps = engine(program_config(cfg))
    if run_steps is None:  # host driver: cadence read on the host each step, no program to share
        rt, init, chunk_fn, run_steps = engine(cfg)
    template = init(rt, jax.random.key(cfg.seed), cfg)
    if run_steps is None and not sharding.is_trivial(cfg.mesh):
        raise ConfigError("mesh: host-side environments run on one device (set mesh.* to 1)")
    placement = None if sharding.is_trivial(cfg.mesh) else sharding.for_runtime(rt, template, cfg.mesh)
    if placement is not None and init is loop.init_state:  # each device creates its own shards (multi-host too)
        template = sharding.init_sharded(rt, jax.random.key(cfg.seed), cfg, placement)
    elif placement is not None:  # pretrained weights are read on the host, then placed (single process)
        template = sharding.shard_state(template, placement)
    ck = Checkpointer(out_dir, keep=cfg.keep_checkpoints, writer=True)
    state, done = template, 0
    if holds_run(out_dir) and resume != "never":
        state, done = ck.restore_latest_valid(template, log=log) if resume == "latest_valid" else ck.restore(template)
        if done > cfg.steps:  # (resume latest_valid) its later rows and checkpoints are kept: nothing is written
            ck.close()
            raise longer_run_error(out_dir, done, cfg.steps)
        log(f"resumed {out_dir} from step {done}")
    state = _committed(state)
    if main:  # the run has started: from here on the folder holds it
        write_json_atomic(os.path.join(out_dir, "config.json"), {**to_dict(cfg), "label": label})
    writer = MetricsWriter(out_dir, purge_step=done + 1) if main else _NoWriter()
    writer.truncate_after(done)
    missing = missing_rows_warning(out_dir, done) if main else None
    if missing:
        _warn(missing)
    call = _caller(cfg, rt, chunk_fn, run_steps, placement)
    bar = None
    if progress and main and done < cfg.steps:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=done, desc=f"{label or cfg.method} seed {cfg.seed}", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    t0 = time.time()
    seen = nonfinite_counts(state)
    stopped = signalled = None
    reached = done
    try:
        while done < cfg.steps and stopped is None and signalled is None:
            target = min(done + cfg.checkpoint_every - done % cfg.checkpoint_every, cfg.steps)
            while done < target:
                signalled = preempt.requested_by_any()
                if signalled is not None:  # SIGTERM / SIGINT: stop at this chunk boundary (saved below)
                    break
                n = min(CHUNK_STEPS, target - done)
                state, metrics = call(state, n, done + n)
                rows = rows_from_chunk({k: v[:n] for k, v in jax.device_get(metrics).items()}, done)
                reached = done + n  # these steps are computed and their rows handed to the writer
                writer.write(rows)
                done += n
                if bar is not None:
                    _postfix(bar, rows[-1])
                    bar.update(n)
                now = nonfinite_counts(state)
                if now != seen:
                    _warn(f"crl-jax: warning: step {done}: {now[0] - seen[0]} actor and {now[1] - seen[1]} "
                          f"extractor update(s) skipped for non-finite loss/gradients (run total {sum(now)}, "
                          f"--max-nonfinite {max_nonfinite})")
                    seen = now
                if sum(now) > max_nonfinite:
                    stopped = now
                    break
            if stopped is None and (signalled is None or (done > 0 and ck.latest_step() != done)):
                ck.save(done, state)
    except KeyboardInterrupt:
        raise Interrupted(reached, ck.latest_step()) from None
    finally:
        if bar is not None:
            bar.close()
        writer.close()
        newest = ck.latest_step()
        ck.close()
    path = os.path.join(out_dir, "metrics.csv")
    summary = summary_from_rows(read_csv(path) if os.path.exists(path) else [])
    a, e = nonfinite_counts(state)
    summary.update(method=cfg.method, seed=cfg.seed, steps=done, wall_seconds=round(time.time() - t0, 2),
                   nonfinite_actor=a, nonfinite_extractor=e,
                   prior=_prior_id(cfg))  # which prior (METHOD.md §6) the run started from; None = from scratch
    if stopped is not None:
        summary["stopped"] = "nonfinite"
    if signalled is not None and stopped is None:  # no summary: the run is not finished
        raise preempt.Stopped(done, signalled, saved=done > 0)
    if main:
        write_summary(out_dir, summary)
    if stopped is not None:
        raise NonFiniteError(
            f"stopped at step {done}: {sum(stopped)} updates skipped for non-finite loss/gradients (actor "
            f"{stopped[0]}, extractor {stopped[1]}), more than --max-nonfinite {max_nonfinite}; the newest "
            f"checkpoint (step {newest or 0}) is from before the limit was passed. Lower the "
            "learning rate, or rerun with a larger --max-nonfinite to go on")
    return summary


def _caller(cfg, rt, chunk_fn, run_steps, placement):
    """`(state, n, stop_step) -> (state, metrics [>= n])`: the path's one chunk program, run up to `stop_step`
    (only the first n metric rows are real)."""
    step_fn, donate = step_function(cfg, run_steps, rt)
    if step_fn is None:  # host driver: one jitted iteration at a time, n of them
        return lambda s, n, stop: chunk_fn(rt, n)(s, jnp.int32(cfg.steps))
    if placement is None:
        fn = masked_chunk(rt, step_fn, CHUNK_STEPS, donate)
    else:
        fn = sharding.sharded_chunk(rt, CHUNK_STEPS, placement, masked_run_steps(step_fn))
    return lambda s, n, stop: fn(s, _bounds(cfg.steps, stop, cfg.eval.every))


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _bounds(last_step: int, stop_step: int, every: int):
    return jnp.array([last_step, stop_step, every], jnp.int32)


def _postfix(bar, last: dict) -> None:
    bar.set_postfix(guided=f"{last.get('success_guided', float('nan')):.2f}",
                    free=f"{last.get('success_free', float('nan')):.2f}", bank=int(last.get("bank_size", 0)))


class _NoLock:
    """Non-main processes of a multi-process run: process 0 holds the folder's lock."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _NoWriter:
    """Metrics sink of the non-main processes of a multi-process run."""

    def truncate_after(self, step):
        pass

    def write(self, rows):
        pass

    def close(self):
        pass
