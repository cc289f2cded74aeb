"""A sweep's spec (the YAML file format is in `crl_jax.infra.sweep`'s docstring) and its expansion into
members: one validated config and run folder per (grid point, seed).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field

import yaml

from crl_jax.config import Config, ConfigError, load
from crl_jax.config_checks import check_text_file, load_yaml


@dataclass(frozen=True)
class SweepSpec:
    config: str | None = None  # base YAML config path
    overrides: dict = field(default_factory=dict)  # flat {dotted key: value} applied to every run
    grid: dict = field(default_factory=dict)  # {dotted key: [values]}, in file order
    seeds: tuple = (0,)
    points: dict = field(default_factory=dict)  # optional named variants {name: {dotted key: value}}, each
    #                                          crossed with the grid (e.g. the ablations of METHOD.md §4)
    per_point: bool = False  # one program per grid point (its seeds vmapped): the method flags stay unbatched,
    #                          so the conds skipping the bank's work stay branches (grpo members do not pay
    #                          for distillation), and memory holds one point's seeds at a time
    vmap_seeds: bool | None = None  # True: a program's members vmapped; False: every run alone, one after the
    #                          other, with the single-run program (`loop.compiled_chunk`, one compilation for all
    #                          runs of a Runtime); None ("auto", the default): vmapped on GPUs and TPUs, alone on
    #                          CPUs (`sweep.vmap_by_backend`: 8 vmapped seeds of the default cost 2.86x one seed
    #                          on an H200; on 2 CPU cores they took as long as 8 runs in turn)


@dataclass
class Member:
    point: str  # grid point name, the run's label
    seed: int
    cfg: Config
    run_dir: str


def _flat_overrides(ov, where: str = "sweep overrides") -> dict:
    if ov is None:
        return {}
    if isinstance(ov, dict):
        bad = [k for k in ov if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{where}: keys must be dotted config keys, got {bad[0]!r}")
        return dict(ov)
    if not isinstance(ov, list):
        raise ConfigError(f"{where}: expected a mapping of dotted keys to values (or a list of key=value), "
                          f"got {ov!r}")
    out = {}
    for it in ov:
        if not isinstance(it, str) or "=" not in it:
            raise ConfigError(f"{where}: {it!r} is not of the form key=value")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def _seeds(s, where: str) -> tuple:
    """`seeds: N` (0..N-1) or a list of distinct integers, as a tuple."""
    if isinstance(s, int) and not isinstance(s, bool):
        if s < 1:
            raise ConfigError(f"{where}: seeds must be >= 1 (a count) or a list of seeds, got {s}")
        return tuple(range(s))
    if not isinstance(s, (list, tuple)) or not s or not all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in s):
        raise ConfigError(f"{where}: seeds must be a count (e.g. 3) or a non-empty list of integers, got {s!r}")
    dup = sorted({x for x in s if list(s).count(x) > 1})
    if dup:
        raise ConfigError(f"{where}: seeds {dup} are listed twice (one run folder per seed)")
    return tuple(s)


def _no_seed_key(flat: dict, where: str) -> None:
    if "seed" in flat:
        raise ConfigError(f"{where}: 'seed' cannot be set here (every run's seed comes from the sweep's "
                          "seeds: list, e.g. seeds: [1, 2])")


def load_spec(path: str, *, seeds: int | None = None, steps: int | None = None) -> SweepSpec:
    """Read a sweep YAML; `seeds` (n -> 0..n-1) and `steps` override the file's."""
    check_text_file(path, "sweep file")
    try:
        with open(path, encoding="utf-8") as f:
            d = load_yaml(f, f"sweep file {path}")
    except FileNotFoundError:
        raise ConfigError(f"sweep file not found: {path}") from None
    d = {} if d is None else d
    if not isinstance(d, dict):
        raise ConfigError(f"sweep file {path} must hold a mapping (config, overrides, grid, seeds, ...), "
                          f"got a {type(d).__name__}")
    known = {"config", "overrides", "grid", "points", "seeds", "per_point", "vmap_seeds"}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown keys {sorted(map(str, unknown))} "
                          f"(known: {', '.join(sorted(known))})")
    split = d.get("per_point", False)
    vmap_seeds = d.get("vmap_seeds", "auto")
    if not isinstance(split, bool):
        raise ConfigError(f"sweep file {path}: per_point must be true or false, got {split!r}")
    if not isinstance(vmap_seeds, bool) and vmap_seeds != "auto":
        raise ConfigError(f"sweep file {path}: vmap_seeds must be true, false or auto, got {vmap_seeds!r}")
    vmap_seeds = None if vmap_seeds == "auto" else vmap_seeds
    base = d.get("config")
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"sweep file {path}: config must be the path of a YAML config, got {base!r}")
    if base and not os.path.isabs(base):
        base = os.path.join(os.path.dirname(os.path.abspath(path)), base)
    grid = d.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"sweep file {path}: grid must map dotted config keys to lists of values "
                          f"(e.g. grid: {{method: [crl, grpo]}}), got {grid!r}")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"sweep grid.{k}: expected a non-empty list of values, got {v!r}")
    _no_seed_key(grid, f"sweep file {path}: grid")
    if seeds is not None and seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    s = _seeds(d.get("seeds", 1) if seeds is None else seeds, f"sweep file {path}")
    ov = _flat_overrides(d.get("overrides"), f"sweep file {path}: overrides")
    _no_seed_key(ov, f"sweep file {path}: overrides")
    if steps is not None:
        ov["steps"] = steps
    points = d.get("points") or {}
    if not isinstance(points, dict) or not all(isinstance(v, (dict, list, type(None))) for v in points.values()):
        raise ConfigError(f"sweep file {path}: points must map names to override mappings")
    points = {k: _flat_overrides(v, f"sweep file {path}: points.{k}") for k, v in points.items()}
    for k, v in points.items():
        _no_seed_key(v, f"sweep file {path}: points.{k}")
    return SweepSpec(config=base, overrides=ov, grid=dict(grid), seeds=s, points=points, per_point=split,
                     vmap_seeds=vmap_seeds)


def _nest(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        cur = out
        parts = k.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
            if not isinstance(cur, dict):
                raise ConfigError(f"{k}: {p!r} is not a section")
        cur[parts[-1]] = v
    return out


def point_name(values: dict) -> str:
    """{"method": "crl", "actor.lr": 0.001} -> "crl,actor.lr=0.001" (method by value alone)."""
    parts = [str(v) if k == "method" else f"{k}={v}" for k, v in values.items()]
    return ",".join(parts) or "base"


def _folder(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name.replace(",", "__"))


def expand(spec: SweepSpec, out: str) -> list[Member]:
    """Every (grid point, seed) as a Member with its validated config and run folder."""
    _seeds(list(spec.seeds), "sweep")
    _no_seed_key(spec.grid, "sweep grid")
    _no_seed_key(spec.overrides, "sweep overrides")
    keys = list(spec.grid)
    members = []
    variants = list(spec.points.items()) or [("", {})]
    for (vname, vov), combo in itertools.product(variants, itertools.product(*(spec.grid[k] for k in keys))):
        values = dict(zip(keys, combo))
        _no_seed_key(_flat_overrides(vov), f"sweep points.{vname}")
        name = ",".join(x for x in (vname, point_name(values) if values else "") if x) or "base"
        for s in spec.seeds:
            cfg = load(spec.config, _nest({**spec.overrides, **_flat_overrides(vov), **values, "seed": int(s)}))
            members.append(Member(name, int(s), cfg, os.path.join(out, _folder(name), f"seed{s}")))
    names = [m.point for m in members]
    if len({_folder(n) for n in names}) != len(set(names)):
        raise ConfigError("sweep: two grid points map to the same folder name")
    return members
