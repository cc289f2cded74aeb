"""Sweeps: a grid of seeds x hyperparameters (x methods), the tiny loop's as a few vmapped programs, every other
path's members through `crl-jax train`'s engine one after another.

A sweep file (YAML) names a base config, common overrides, a grid and seeds::

    config: default.yaml          # base config (relative to the sweep file); optional
    overrides: {steps: 40}        # dotted keys (or a list of "key=value"), applied to every run
    seeds: 3                      # an int n (seeds 0..n-1) or a list of seeds
    grid:                         # cartesian product of dotted keys -> grid points
      method: [crl, grpo]
      actor.lr: [3.0e-4, 1.0e-3]
    points:                       # optional named variants, each crossed with the grid
      no_split: {loss.group_split: false}
    per_point: false              # true: one program per grid point, its seeds vmapped (flags unbatched,
    #                               conds stay branches; less memory than one program for all points)
    vmap_seeds: auto              # true: seeds vmapped; false: every run alone with the single-run program;
    #                               auto (the default): vmapped on GPUs / TPUs, alone on CPUs (faster there)

Grid points whose configs build the same `Runtime` (they differ only in seed, method or the traced
ablations `loss.group_split`, `loss.advantage`) form one *program*: their initial
states are stacked and every (point, seed) member runs in one `jax.jit(jax.vmap(run_steps))`. Points
that change the Runtime (learning rates, widths, groups, env ...) form separate programs, run one after
another. Each member writes an ordinary run folder `OUT/<point>/seed<s>/` (config.json with the point
name as label, metrics.csv, summary.json, Orbax checkpoints) in the format of `crl_jax.infra.run.run`, so
`crl-jax plot` and `crl-jax eval` read it; the sweep folder gets `summary.md`, `summary.csv` (one row
per point: mean ± 95% t-interval over seeds) and `curves.png`.

Which engine runs a member (`sequential`): a config of the LLM path, a host-side environment, any mesh setting
(`mesh.*`) or a multi-process job (`distributed.*`, or the JAX_* environment) runs through `crl_jax.infra.run.run`,
the engine of `crl-jax train`, member after member: each with its own mesh, its checkpoints and resume, exactly
as `crl-jax train --config ... --out OUT/<point>/seed<s>` would. Only tiny configs on one device form the vmapped
(or, on CPUs, single-run) programs below. The members of one sweep must share their `distributed.*` settings (the
process joins one job); the sweep folder is locked for the sweep's life (`RunLock`, on process 0).

The spec and its expansion into members: `crl_jax.infra.sweep_spec`.

Safety: the sweep folder is locked for the whole sweep (`RunLock`: a second sweep into it is refused);
SIGTERM / SIGINT stop it after the current chunk (`infra.preempt`: every member has the checkpoint of the step
reached; exit 128 + the signal number); sweep.json, the tables and each member's summary.json are replaced
atomically, and a damaged member summary.json counts as unfinished (it is computed again).

Resume: a member whose folder has a summary.json for the requested number of steps is done; a program
whose members are all done is skipped (never compiled). Otherwise the program restarts from the latest
checkpoint step every unfinished member has (chunks of `chunk` steps between checkpoints); checkpoints a member
saved past that step before an interrupt are moved aside (`RUN_DIR/superseded_checkpoints/`), as their steps
are trained again. A sweep never shortens a run: a member folder whose run already has more steps than asked
for stops the sweep before anything is written (`RunFolderError`, one line).
"""

from __future__ import annotations

import csv
import io
import os
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import loop
from crl_jax.atomic import write_text_atomic
from crl_jax.backends.llm.runtime import is_llm_config
from crl_jax.config import ConfigError, MeshConfig, drop_removed_keys, to_dict
from crl_jax.infra import distributed, preempt
from crl_jax.infra.checkpoint import Checkpointer, step_dirs
from crl_jax.infra.errors import CheckpointError, read_json
from crl_jax.infra.metrics import MetricsWriter, read_csv, rows_from_chunk, summary_from_rows, write_summary
from crl_jax.infra.plot import plot_runs, t_interval
from crl_jax.infra.run import _NoLock, _prior_id, run
from crl_jax.infra.run_folder import (RunLock, longer_run_error, missing_rows_warning, newest_checkpoint,
                                      write_json_atomic)
from crl_jax.infra.sweep_spec import Member, SweepSpec, expand
from crl_jax.loop.runtime import Runtime, build, is_host


@dataclass
class Program:
    rt: Runtime | None  # None for a sequential member (its run builds what it needs)
    steps: int
    members: list = field(default_factory=list)
    vmapped: bool = True  # False: a single member run with the single-run program
    sequential: bool = False  # True: one member run by `crl_jax.infra.run.run` (train's engine)


def sequential(cfg) -> bool:
    """Does this config run through train's engine (`run.run`), not a vmapped program: the LLM path, any `mesh.*`
    setting, a multi-process job? (A host-side environment, known once its Runtime is built, does too: `plan`.)"""
    return (is_llm_config(cfg) or cfg.mesh != MeshConfig()  # any mesh setting: placed as `crl-jax train` places it
            or distributed.settings(cfg.distributed) is not None)


def vmap_by_backend(backend: str | None = None) -> bool:
    """The default of `vmap_seeds`: vmapped seeds on accelerators, one run after another on CPUs. Measured with the
    embedded default: on 2 CPU cores, 8 vmapped seeds took 1.02-1.10x the time of the same 8 run in
    turn (steady state, interleaved), so vmapping buys nothing there and running alone keeps each run's
    progress, checkpoints and memory its own; on an H200, 8 vmapped seeds cost 2.86x one seed (from a fresh
    state), i.e. 2.8x faster than 8 in turn."""
    return (backend or jax.default_backend()) != "cpu"


def plan(members: list[Member], per_point: bool = False, vmap_seeds: bool | None = None) -> list[Program]:
    """Group members by compiled program: same Runtime (`build` is cached by every program-shaping
    field) and same run length (and, with `per_point`, same grid point); programs in first-appearance
    order. Programs of one Runtime, length and member count share one compilation. Without `vmap_seeds`
    every member is a program of its own, run with the single-run program; None: `vmap_by_backend()`."""
    if vmap_seeds is None:
        vmap_seeds = vmap_by_backend()
    programs: dict = {}
    for i, m in enumerate(members):
        if sequential(m.cfg):  # built by its run, not here (an LLM's weights are read once, by the run)
            programs[("run", i)] = Program(None, m.cfg.steps, [m], vmapped=False, sequential=True)
            continue
        rt = build(m.cfg)
        if is_host(rt):
            programs[("run", i)] = Program(rt, m.cfg.steps, [m], vmapped=False, sequential=True)
            continue
        k = (id(rt), m.cfg.steps, m.point if per_point else None, None if vmap_seeds else i)
        programs.setdefault(k, Program(rt, m.cfg.steps, vmapped=vmap_seeds)).members.append(m)
    return list(programs.values())


TRACES: dict = {}  # (id(rt), chunk, flags batched) -> times the vmapped chunk was traced (retrace guard)


def state_axes(template, flags_batched: bool):
    """vmap axes of a stacked LoopState: every leaf along axis 0, except the step counter (members run in
    lockstep, and an unbatched step keeps the evaluation `lax.cond` a real branch instead of a select
    that evaluates every step) and, when every member runs the same method, the method flags."""
    axes = jax.tree.map(lambda _: 0, template)
    return axes.replace(step=None, flags=axes.flags if flags_batched else None)


@lru_cache(maxsize=16)
def vmapped_chunk(rt: Runtime, num_steps: int, flags_batched: bool = True):
    """Jitted `(stacked states, last_step) -> (states, metrics {name: [M, num_steps]})`: `run_steps` vmapped
    over the M members of a state stacked by `stack_states`."""

    def f(states, last):
        key = (id(rt), num_steps, flags_batched)
        TRACES[key] = TRACES.get(key, 0) + 1
        axes = state_axes(states, flags_batched)
        return jax.vmap(lambda s: loop.run_steps(rt, s, num_steps, last), in_axes=(axes,), out_axes=(axes, 0))(states)

    return jax.jit(f)


def _same(trees) -> bool:
    leaves = [jax.tree.leaves(t) for t in trees]
    return all(all(bool(jnp.array_equal(a, b)) for a, b in zip(leaves[0], other)) for other in leaves[1:])


def stack_states(states: list) -> tuple:
    """Member states -> (stacked state, flags_batched): leaves stacked on a new axis 0, except the shared step
    and (when all members run one method) the shared flags."""
    steps = {int(s.step) for s in states}
    if len(steps) != 1:
        raise ValueError(f"sweep members must be at the same step to run together, got {sorted(steps)}")
    flags_batched = not _same([s.flags for s in states])
    st = jax.tree.map(lambda *x: jnp.stack(x), *states)
    return st.replace(step=states[0].step, flags=st.flags if flags_batched else states[0].flags), flags_batched


def member_state(stacked, flags_batched: bool, i: int):
    """Member i's LoopState out of a stacked one (for its checkpoint)."""
    axes = state_axes(stacked, flags_batched)
    return jax.tree.map(lambda a, x: x if a is None else x[i], axes, stacked, is_leaf=lambda a: a is None)


def is_complete(run_dir: str, steps: int) -> bool:
    """The member's summary.json says it ran `steps` steps; a damaged one counts as not complete (the member
    resumes from its last checkpoint, `steps`, and its summary is computed again)."""
    p = os.path.join(run_dir, "summary.json")
    if not (os.path.exists(p) and os.path.exists(os.path.join(run_dir, "metrics.csv"))):
        return False
    try:
        return read_json(p).get("steps") == steps
    except CheckpointError:
        return False


def _comparable(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("steps", "label")}


def _write_config(m: Member) -> None:
    os.makedirs(m.run_dir, exist_ok=True)
    path = os.path.join(m.run_dir, "config.json")
    now = {**to_dict(m.cfg), "label": m.point}
    if os.path.exists(path):
        if _comparable(drop_removed_keys(read_json(path, error=ConfigError, what="run config"), path)) != \
                _comparable(now):
            raise ConfigError(f"run folder {m.run_dir} holds a run with a different config; use another --out")
    write_json_atomic(path, now)


def _finish(m: Member, steps: int, wall: float) -> dict:
    rows = read_csv(os.path.join(m.run_dir, "metrics.csv"))
    s = summary_from_rows(rows)

    s.update(method=m.cfg.method, seed=m.seed, steps=steps, wall_seconds=round(wall, 2), point=m.point,
             prior=_prior_id(m.cfg))
    write_summary(m.run_dir, s)
    return s


def refuse_shortening(members) -> None:
    """Raise `RunFolderError` (one line) when a member's folder already holds a run with more steps than its
    config asks for: resuming it would delete its later rows and fail to save over its later checkpoints."""
    longer = [(m, newest_checkpoint(m.run_dir)) for m in members if newest_checkpoint(m.run_dir) > m.cfg.steps]
    if longer:
        (m, have), more = longer[0], len(longer) - 1
        where = m.run_dir + (f" (and {more} other member folder(s))" if more else "")
        raise longer_run_error(where, have, m.cfg.steps, again="use another --out (or delete the folder)")


def run_program(prog: Program, *, chunk: int, bar=None, log=print) -> None:
    """Train every unfinished member of one program to `prog.steps`: as one vmapped program, or (a
    program of `vmapped=False`) its one member with the single-run program `loop.compiled_chunk`."""
    refuse_shortening(prog.members)
    todo = [m for m in prog.members if not is_complete(m.run_dir, prog.steps)]
    if not todo:
        return
    if prog.sequential:  # train's engine: its mesh, checkpoints (every checkpoint_every), resume and summary
        for m in todo:
            run(m.cfg, m.run_dir, progress=bar is not None, label=m.point, log=log)
            if bar is not None:
                bar.update(-(-prog.steps // chunk))
        return
    for m in todo:
        _write_config(m)
    templates = [loop.init_state(prog.rt, jax.random.key(m.cfg.seed), m.cfg) for m in todo]
    cks = [Checkpointer(m.run_dir, keep=m.cfg.keep_checkpoints) for m in todo]
    # Resume from the latest step every member has a checkpoint of (members advance in lockstep).
    common = set.intersection(*(set(c.steps()) for c in cks))
    done = max((s for s in common if s <= prog.steps), default=0)
    states = [c.restore(t, done)[0] for c, t in zip(cks, templates)] if done else templates
    if done:
        log(f"resumed {len(todo)} runs from step {done}")
    for c in cks:  # saved past the common step before an interrupt: trained again, so their steps must be free
        c.move_aside([s for s in step_dirs(c.directory) if s > done], log, folder="superseded_checkpoints",
                     say=f"moved checkpoint {{src}} (newer than step {done}, where the sweep resumes) to {{dst}}")
    writers = [MetricsWriter(m.run_dir, purge_step=done + 1) for m in todo]
    for m, w in zip(todo, writers):
        w.truncate_after(done)
        if done == 0 and os.path.exists(w.path):
            os.remove(w.path)
        missing = missing_rows_warning(m.run_dir, done)
        if missing:
            print(missing, file=sys.stderr, flush=True)
    stacked, fb = stack_states(states) if prog.vmapped else (states[0], False)
    t0 = time.time()
    while done < prog.steps:
        sig = preempt.requested()
        if sig is not None:  # every member has the checkpoint of `done` (saved after each chunk)
            for w, c in zip(writers, cks):
                w.close()
                c.close()
            raise preempt.Stopped(done, sig, saved=done > 0)
        n = min(chunk - done % chunk, prog.steps - done)
        if prog.vmapped:
            stacked, metrics = vmapped_chunk(prog.rt, n, fb)(stacked, jnp.int32(prog.steps))
        else:
            stacked, metrics = loop.compiled_chunk(prog.rt, n)(stacked, jnp.int32(prog.steps))
            metrics = {k: v[None] for k, v in metrics.items()}  # the one member's rows, as [1, n]
        metrics = jax.device_get(metrics)
        for i, (m, w, c) in enumerate(zip(todo, writers, cks)):
            w.write(rows_from_chunk({k: v[i] for k, v in metrics.items()}, done))
            c.save(done + n, member_state(stacked, fb, i) if prog.vmapped else stacked)
        done += n
        if bar is not None:
            bar.update(1)
    for w, c in zip(writers, cks):
        w.close()
        c.close()
    for m in todo:
        _finish(m, prog.steps, time.time() - t0)


SUMMARY_COLUMNS = (("eval_heldin_with_exp", "held-in, with exp"), ("eval_heldin_without_exp", "held-in, without exp"),
                   ("eval_heldout_with_exp", "held-out, with exp"),
                   ("eval_heldout_without_exp", "held-out, without exp"),
                   ("success_all_last10", "train success (last 10)"))


def summarize(members: list[Member]) -> list[dict]:
    """One row per grid point (first-appearance order): {"point", "seeds", KEY: mean, KEY + "_ci95": half-width}
    over the seeds' summary.json (final evaluation, last-10-step training success)."""

    by_point: dict[str, list[dict]] = {}
    for m in members:
        p = os.path.join(m.run_dir, "summary.json")
        if os.path.exists(p):
            by_point.setdefault(m.point, []).append(read_json(p, error=ConfigError, what="run summary"))
    rows = []
    for point, sums in by_point.items():
        row = {"point": point, "seeds": len(sums)}
        for key, _ in SUMMARY_COLUMNS:
            v = np.array([s[key] if s.get(key) is not None else np.nan for s in sums], float)
            row[key], row[key + "_ci95"] = t_interval(v)
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown table, cells "mean ± 95% half-width" ("n/a" where no seed has the value, e.g. GRPO with exp)."""
    head = ["point", "seeds"] + [name for _, name in SUMMARY_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["point"], str(r["seeds"])]
        for key, _ in SUMMARY_COLUMNS:
            cells.append("n/a" if np.isnan(r[key]) else f"{r[key]:.3f} ± {r[key + '_ci95']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_tables(out: str, rows: list[dict]) -> str:
    """Write out/summary.md and out/summary.csv; returns the markdown table."""
    table = format_table(rows)
    write_text_atomic(os.path.join(out, "summary.md"), table + "\n")
    cols = ["point", "seeds"] + [c for key, _ in SUMMARY_COLUMNS for c in (key, key + "_ci95")]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    for r in rows:
        w.writerow([r[c] if c in ("point", "seeds") else ("" if np.isnan(r[c]) else f"{r[c]:.6g}") for c in cols])
    write_text_atomic(os.path.join(out, "summary.csv"), buf.getvalue(), newline="")
    return table


def _chunks(prog: Program, chunk: int) -> int:
    return -(-prog.steps // chunk) if any(not is_complete(m.run_dir, prog.steps) for m in prog.members) else 0


def run_sweep(spec: SweepSpec, out: str, *, chunk: int | None = None, progress: bool = True, plot: bool = True,
              log=print) -> list[dict]:
    """Run (or resume) a sweep into `out`; returns the per-point summary rows (also written to
    `out/summary.md` and `out/summary.csv`)."""
    members = expand(spec, out)
    if len({m.cfg.distributed for m in members}) > 1:
        raise ConfigError("distributed.*: every member of a sweep must have the same settings (one job)")
    if members:
        distributed.initialize(members[0].cfg.distributed)  # no-op for one process
    os.makedirs(out, exist_ok=True)
    # one sweep per folder (the lock on process 0); SIGTERM / SIGINT stop at a chunk end
    with RunLock(out) if distributed.is_main() else _NoLock(), preempt.stop_requests():
        return _sweep_locked(spec, out, members, chunk=chunk, progress=progress, plot=plot, log=log)


def _sweep_locked(spec, out, members, *, chunk, progress, plot, log) -> list[dict]:
    refuse_shortening(members)  # before any program runs (or sweep.json is rewritten)
    main = distributed.is_main()
    programs = plan(members, spec.per_point, spec.vmap_seeds)
    if main:
        write_json_atomic(os.path.join(out, "sweep.json"), {
            "config": spec.config, "overrides": spec.overrides, "grid": spec.grid, "seeds": list(spec.seeds),
            "programs": [[f"{m.point}/seed{m.seed}" for m in p.members] for p in programs if not p.sequential],
            "sequential": [f"{m.point}/seed{m.seed}" for p in programs if p.sequential for m in p.members]})
    log(f"sweep: {len(members)} runs in {len(programs)} program(s) -> {out}")
    bar = None
    if progress and main:
        from tqdm import tqdm

        bar = tqdm(total=sum(_chunks(p, chunk or p.steps or 1) for p in programs), desc="sweep", unit="chunk",
                   file=sys.stderr, dynamic_ncols=True)
    for i, p in enumerate(programs):
        if bar is not None:
            bar.set_description(f"program {i + 1}/{len(programs)} ({len(p.members)} runs)")
        run_program(p, chunk=max(1, chunk or p.steps or 1), bar=bar, log=log)
    if bar is not None:
        bar.close()
    rows = summarize(members)
    if not main:
        return rows
    table = write_tables(out, rows)
    log("\n" + table)
    if plot:

        # smoothing window no longer than the run (plot_runs' 'same' convolution would outgrow the steps)
        png = plot_runs([m.run_dir for m in members], os.path.join(out, "curves.png"),
                        smooth=max(1, min(3, min(p.steps for p in programs))))
        log(f"plot: {png}")
    return rows
