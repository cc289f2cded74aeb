"""Host driver of a training run: run folder, resume, chunks of compiled steps, checkpoints, progress.

`run(cfg, out_dir)` trains `cfg.steps` iterations in chunks of `checkpoint_every` compiled steps
(`loop.compiled_chunk`); after each chunk it appends the metric rows, saves an Orbax checkpoint and
updates the progress bar. On start it resumes from the latest checkpoint in `out_dir` if one exists
(the config saved beside it must match, apart from `steps`). Since each chunk is the same pure
function of the state, a resumed run writes the same rows and ends with the same parameters as an
uninterrupted one; a kill loses at most the steps since the last checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp

from crl_jax import distributed, loop, sharding
from crl_jax.checkpoint import Checkpointer
from crl_jax.config import Config, ConfigError, to_dict
from crl_jax.metrics import MetricsWriter, read_csv, rows_from_chunk, summary_from_rows, write_summary
from crl_jax.runtime import build


def _comparable(d: dict) -> dict:
    d = dict(d)
    d.pop("steps", None)
    return d


def _check_saved_config(out_dir: str, cfg: Config) -> None:
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        saved = json.load(f)
    saved.pop("label", None)
    now = to_dict(cfg)
    if _comparable(saved) != _comparable(now):
        diff = [k for k in sorted(set(saved) | set(now)) if k != "steps" and saved.get(k) != now.get(k)]
        raise ConfigError(f"run folder {out_dir} holds a run with a different config (sections differing: "
                          f"{diff}); use another --out or the same config")


def engine(cfg: Config):
    """(runtime, init_state, chunk) of the path a config runs on: the compiled built-in-env loop, the host
    driver of an environment adapter (`host_loop`: env steps on the host between jitted pieces), or the
    LLM path (`crl_jax.llm`: pretrained models, chat prompts). Every chunk has the contract of
    `loop.compiled_chunk(rt, n)`: `(state, last_step) -> (state, metrics [n])` over the same `LoopState`;
    the pure `run_steps` (None for the host driver) is what a sharded run jits with in/out shardings."""
    from crl_jax import llm

    if llm.is_llm_config(cfg):
        from crl_jax.llm.loop import run_steps as llm_run_steps

        return llm.build(cfg), llm.init_state, llm.compiled_chunk, llm_run_steps
    rt = build(cfg)
    from crl_jax import host_loop

    if host_loop.is_host(rt):
        return rt, loop.init_state, host_loop.chunk, None
    return rt, loop.init_state, loop.compiled_chunk, loop.run_steps


def run(cfg: Config, out_dir: str, *, resume: str = "latest", progress: bool = True, label: str | None = None,
        log=print) -> dict:
    """Train (or resume) into `out_dir`; returns the summary dict (also written to summary.json)."""
    os.makedirs(out_dir, exist_ok=True)
    _check_saved_config(out_dir, cfg)
    distributed.initialize(cfg.distributed)  # no-op for one process
    main = distributed.is_main()  # multi-process: process 0 writes the files, every process checkpoints
    if main:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump({**to_dict(cfg), "label": label or cfg.method}, f, indent=2)
    rt, init, chunk_fn, run_steps = engine(cfg)
    template = init(rt, jax.random.key(cfg.seed), cfg)
    if run_steps is None and not sharding.is_trivial(cfg.mesh):
        raise ConfigError("mesh: host-side environments run on one device (set mesh.* to 1)")
    placement = None if sharding.is_trivial(cfg.mesh) else sharding.for_runtime(rt, template, cfg.mesh)
    if placement is not None and init is loop.init_state:  # each device creates its own shards (multi-host too)
        template = sharding.init_sharded(rt, jax.random.key(cfg.seed), cfg, placement)
    elif placement is not None:  # pretrained weights are read on the host, then placed (single process)
        template = sharding.shard_state(template, placement)
    ck = Checkpointer(out_dir, keep=cfg.keep_checkpoints)
    writer = MetricsWriter(out_dir) if main else _NoWriter()
    state, done = template, 0
    if ck.latest_step() is not None and resume != "never":
        if resume == "latest_valid":
            state, done = ck.restore_latest_valid(template)
        else:
            state, done = ck.restore(template)
        log(f"resumed {out_dir} from step {done}")
    writer.truncate_after(done)
    bar = None
    if progress and main and done < cfg.steps:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=done, desc=f"{label or cfg.method} seed {cfg.seed}", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    t0 = time.time()
    while done < cfg.steps:
        n = min(cfg.checkpoint_every - done % cfg.checkpoint_every, cfg.steps - done)
        chunk = chunk_fn(rt, n) if placement is None else sharding.sharded_chunk(rt, n, placement, run_steps)
        state, metrics = chunk(state, jnp.int32(cfg.steps))
        rows = rows_from_chunk(jax.device_get(metrics), done)
        writer.write(rows)
        done += n
        ck.save(done, state)
        if bar is not None:
            last = rows[-1]
            bar.set_postfix(guided=f"{last.get('success_guided', float('nan')):.2f}",
                            free=f"{last.get('success_free', float('nan')):.2f}",
                            bank=int(last.get("bank_size", 0)))
            bar.update(n)
    if bar is not None:
        bar.close()
    writer.close()
    ck.close()
    rows = read_csv(os.path.join(out_dir, "metrics.csv")) if os.path.exists(os.path.join(out_dir, "metrics.csv")) \
        else []
    summary = summary_from_rows(rows)
    summary.update(method=cfg.method, seed=cfg.seed, steps=done, wall_seconds=round(time.time() - t0, 2))
    if main:
        write_summary(out_dir, summary)
    return summary


class _NoWriter:
    """Metrics sink of the non-main processes of a multi-process run."""

    def truncate_after(self, step):
        pass

    def write(self, rows):
        pass

    def close(self):
        pass
