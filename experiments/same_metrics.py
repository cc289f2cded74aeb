"""Do two trees of crl_jax give the same metrics? (A restructuring must not change a number.)

    python experiments/same_metrics.py --before <commit> [--after <commit or worktree path>] [--runs ...]

`--before` (and `--after` when it is a commit) is checked out into a temporary git worktree (removed at
the end); `--after` defaults to the tree this script lives in, uncommitted changes included. Each tree
runs, in its own subprocess with PYTHONPATH set to that tree (so each imports its own `crl_jax`), the
same short fixed-seed runs:

  default_crl, default_grpo  the embedded default config through the CLI
                             (`crl_jax.infra.cli.main(["train", "--steps", "3", "--seed", "0", "eval.every=3", ...])`)
  host                       the MiniHack host-adapter micro config of the tests (tests/_micro.py `HOST_MICRO`), 2
                             steps through the CLI (needs the `envs` extra; reported SKIPPED without `nle`)
  llm                        the small random-init LLM runtime of tests/_llm_common.py (`small_runtime`,
                             with the overrides of tests/integration/test_llm_loop.py `SMALL`), 2 steps through
                             `crl_jax.infra.run.run` (the run driver, chunk program and CSV writer of a real run)

and writes two files per run: the run folder's `metrics.csv` (7 significant digits: the acceptance
criterion's file) and `full.csv`, every metric row the driver handed to the CSV writer with `repr` floats
(a fixed column order: the sorted union of the keys), which catches last-bit differences that the 7-digit
file rounds away. Both files are compared byte for byte; the script prints IDENTICAL / DIFFERENT (with the
first differing row and column) per run, and exits 0 only if every run is identical.

What the in-process driver relies on, in both trees (it fails loudly, never silently, when one moved; each
module is looked up at its path in the package layout first, then at its path before it, so a BEFORE
tree of the old flat layout and an AFTER tree of the new one both work):
- `crl_jax.infra.cli.main(argv)` (old: `crl_jax.cli`) (the `train` command with `--steps/--seed/--method/--out/--quiet` and
  key=value overrides) for the CLI runs;
- `crl_jax.infra.metrics.MetricsWriter.write(self, rows)` (old: `crl_jax.metrics`): wrapped to record the rows for `full.csv` (if no row
  comes through it, `full.csv` is reported missing and only `metrics.csv` is compared);
- for `llm`: `crl_jax.infra.run.run(cfg, out_dir, progress=...)` (old: `crl_jax.run`) and the test hook
  `crl_jax.backends.llm.runtime._build(cfg, *, tokenizer, actor_config, extractor_config)` (old:
  `crl_jax.llm.runtime`): `small_runtime` is
  called once to capture its config and hook arguments, then `_build` is wrapped so that the runtime the
  run driver builds (through whatever function it calls) is that small random-init one. The wrapper counts
  its calls and the driver fails if the run never reached it (i.e. would have loaded real weights).
The helper files the driver imports (tests/_llm_common.py, this script) are copied from the AFTER tree,
so both trees run the same driver code; the test override lists are read from the after tree's tests.

Both trees run with the same environment: CPU only, `--xla_backend_optimization_level=0` (as the tests:
compile time dominates these short runs; `--xla-flags ""` for XLA's defaults), a private prior cache
(the tiny path's pretraining prior is fitted per tree, not shared; `--priors DIR` shares one) and, unless `--no-cache`, one
persistent XLA compilation cache shared by both trees (keyed by the compiled program: a tree that
compiles a different program misses it).

Time: each run is one subprocess per tree, two at a time (`--jobs`). The default runs are dominated by
fitting the tiny prior once per tree (default_crl; default_grpo then reuses it): on a 2-core machine shared
with other jobs (load ~10) the whole check took 38 min (default_crl 28 min, llm 5, host 2.5, default_grpo
2.3; not measured on an idle machine). `--priors DIR` with a DIR that already holds the prior skips the fitting
(and its comparison); `--runs` picks a subset.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
THIS_TREE = os.path.dirname(HERE)
RUNS = ("default_crl", "default_grpo", "host", "llm")
HELPERS = ("tests/_llm_common.py",)  # copied from the after tree next to the driver


# ------------------------------------------------------------------------------------------------
# Reading the test override lists (from the after tree's tests, without importing them)


def _literal(path: str, name: str):
    """The literal value assigned to the module-level `name` in a Python file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"same_metrics: no literal `{name} = ...` in {path}")


def _first_literal(tree: str, places) -> object:
    """The literal `name = ...` of the first (path, name) that exists in `tree` (the tests moved in the package regrouping)."""
    for rel, name in places:
        path = os.path.join(tree, rel)
        if os.path.exists(path):
            return _literal(path, name)
    raise SystemExit(f"same_metrics: none of {[p for p, _ in places]} in {tree}")


def run_specs(after: str) -> dict:
    micro = _first_literal(after, [("tests/_micro.py", "HOST_MICRO"), ("tests/test_host_loop.py", "MICRO")])
    small = _first_literal(after, [("tests/integration/test_llm_loop.py", "SMALL"), ("tests/test_llm_loop.py", "SMALL")])
    default = ["train", "--steps", "3", "--seed", "0", "--quiet", "eval.every=3"]
    return {
        "default_crl": {"kind": "cli", "argv": default + ["--method", "crl"]},
        "default_grpo": {"kind": "cli", "argv": default + ["--method", "grpo"]},
        "host": {"kind": "cli", "needs": "nle", "argv": ["train", "--steps", "2", "--seed", "0", "--quiet", *micro]},
        "llm": {"kind": "llm", "overrides": small, "steps": 2, "seed": 0},
    }


# ------------------------------------------------------------------------------------------------
# The driver (runs inside a tree's subprocess)

# module -> where it was before the package layout (a BEFORE tree may be of either layout)
LAYOUTS = {
    "crl_jax.infra.cli": ("crl_jax.infra.cli", "crl_jax.cli"),
    "crl_jax.infra.metrics": ("crl_jax.infra.metrics", "crl_jax.metrics"),
    "crl_jax.infra.run": ("crl_jax.infra.run", "crl_jax.run"),
    "crl_jax.backends.llm.runtime": ("crl_jax.backends.llm.runtime", "crl_jax.llm.runtime"),
}


def _module(name: str, attr: str):
    """The module `name` of this tree's layout, at its new path or else its old one (`LAYOUTS`); it must
    have `attr`. Fails loudly, naming every path tried, when none exists."""
    import importlib
    import importlib.util

    tried = []
    for path in LAYOUTS[name]:
        try:
            found = importlib.util.find_spec(path) is not None
        except ModuleNotFoundError:  # a parent package of this layout is absent
            found = False
        if found:
            mod = importlib.import_module(path)
            root = os.path.realpath(os.path.dirname(os.path.dirname(sys.modules["crl_jax"].__file__)))
            if not os.path.realpath(mod.__file__).startswith(root + os.sep):
                raise SystemExit(f"same_metrics: {path} came from {mod.__file__}, outside the tree {root}")
            if hasattr(mod, attr):
                return mod
            tried.append(f"{path} (no {attr})")
        else:
            tried.append(f"{path} (absent)")
    raise SystemExit(f"same_metrics: {attr} is in none of {', '.join(tried)}; update the driver")


def _record_rows(sink: list):
    """Wrap `MetricsWriter.write` so every row the run hands to the CSV writer is also kept in `sink`."""
    metrics = _module("crl_jax.infra.metrics", "MetricsWriter")
    orig = metrics.MetricsWriter.write

    def write(self, rows):
        sink.extend(dict(r) for r in rows)
        return orig(self, rows)

    metrics.MetricsWriter.write = write


def _write_full(path: str, rows: list) -> None:
    cols = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([repr(r[c]) if c in r else "<absent>" for c in cols])


def _drive_cli(spec: dict, out: str) -> None:
    cli = _module("crl_jax.infra.cli", "main")
    cli.main([*spec["argv"], "--out", os.path.join(out, "run")])


def _drive_llm(spec: dict, out: str) -> None:
    import dataclasses

    from _llm_common import small_runtime  # the after tree's helper, copied next to this driver

    lrt = _module("crl_jax.backends.llm.runtime", "_build")
    orig = lrt._build
    captured = {}

    def capture(cfg, **hooks):
        captured.update(hooks)
        return orig(cfg, **hooks)

    lrt._build = capture
    try:
        _, cfg = small_runtime(spec["overrides"])
    finally:
        lrt._build = orig
    if set(captured) != {"tokenizer", "actor_config", "extractor_config"}:
        raise SystemExit(f"same_metrics: small_runtime passed {sorted(captured)} to _build; update the driver")
    calls = []

    def small_build(cfg, **hooks):
        calls.append(1)
        return orig(cfg, **{**captured, **hooks})

    lrt._build = small_build
    run = _module("crl_jax.infra.run", "run").run
    cfg = dataclasses.replace(cfg, steps=spec["steps"], seed=spec["seed"])
    run(cfg, os.path.join(out, "run"), progress=False, log=lambda *a: None)
    if not calls:
        raise SystemExit("same_metrics: the run never built its runtime through crl_jax.backends.llm.runtime._build (the "
                         "small random-init test hook); update the driver")


def _isolate_tree() -> None:
    """Drop the editable install's import hook (`__editable___crl_jax_*_finder`) from this process: it maps
    any `crl_jax.*` name that the tree on PYTHONPATH lacks to the installed checkout, so a tree of the old
    layout would import the new layout's modules from there (seen: the old tree's run reached the installed
    `crl_jax/infra/cli.py`) instead of falling back to its own old paths."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]


def drive(name: str, spec: dict, out: str, tree: str) -> None:
    _isolate_tree()
    import crl_jax

    where = os.path.realpath(os.path.dirname(os.path.dirname(crl_jax.__file__)))
    if where != os.path.realpath(tree):
        raise SystemExit(f"same_metrics: imported crl_jax from {where}, not from the tree {tree}")
    rows: list = []
    _record_rows(rows)
    (_drive_llm if spec["kind"] == "llm" else _drive_cli)(spec, out)
    shutil.copyfile(os.path.join(out, "run", "metrics.csv"), os.path.join(out, "metrics.csv"))
    if rows:
        _write_full(os.path.join(out, "full.csv"), rows)


# ------------------------------------------------------------------------------------------------
# Trees, subprocesses, comparison


def git(*args, cwd=THIS_TREE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


class Trees:
    """Resolved trees (a path as is, a commit as a temporary detached worktree, removed on exit)."""

    def __init__(self, tmp: str):
        self.tmp, self.added = tmp, []

    def resolve(self, spec: str | None, label: str) -> tuple[str, str]:
        """-> (path, description)."""
        if spec is None:
            return THIS_TREE, f"{THIS_TREE} (working tree, HEAD {git('rev-parse', '--short', 'HEAD')}" + \
                (", with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ")")
        if os.path.isdir(spec):
            path = os.path.abspath(spec)
            return path, f"{path} (working tree, HEAD {git('rev-parse', '--short', 'HEAD', cwd=path)})"
        sha = git("rev-parse", "--verify", f"{spec}^{{commit}}")
        path = os.path.join(self.tmp, f"tree_{label}")
        git("worktree", "add", "--detach", path, sha)
        self.added.append(path)
        return path, f"{spec} = {sha[:10]} (temporary worktree)"

    def close(self):
        for path in self.added:
            subprocess.run(["git", "worktree", "remove", "--force", path], cwd=THIS_TREE, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=THIS_TREE, capture_output=True)


def child_env(tree: str, args, prior_cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree
    env["JAX_PLATFORMS"] = "cpu"
    env["CRL_JAX_CACHE"] = prior_cache
    env["PYTHONHASHSEED"] = "0"
    if args.xla_flags:
        env["XLA_FLAGS"] = args.xla_flags
    else:
        env.pop("XLA_FLAGS", None)
    if args.cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = args.cache_dir
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    else:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def launch(name, spec, tree, out, driver_dir, args, prior_cache):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "spec.json"), "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.join(driver_dir, "same_metrics.py"), "--_drive", name, "--_tree", tree,
           "--_out", out]
    log = open(os.path.join(out, "log.txt"), "w")
    p = subprocess.Popen(cmd, cwd=out, env=child_env(tree, args, prior_cache), stdout=log, stderr=subprocess.STDOUT)
    return p, log, time.time()


COMMON_SAME = "IDENTICAL values"
ALLOW_NEW_COLUMNS = [False]  # --allow-new-columns: a metric column added or removed is not a difference


def first_difference(a: bytes, b: bytes) -> str:
    ra = list(csv.reader(io.StringIO(a.decode(errors="replace"))))
    rb = list(csv.reader(io.StringIO(b.decode(errors="replace"))))
    if not ra or not rb:
        return "one file is empty"
    if ra[0] != rb[0]:
        only_a, only_b = set(ra[0]) - set(rb[0]), set(rb[0]) - set(ra[0])
        head = f"header differs (before only: {sorted(only_a)}, after only: {sorted(only_b)})" if only_a | only_b \
            else "header order differs"
        common = [c for c in ra[0] if c in rb[0]]
        pick = lambda rows: [[r[rows[0].index(c)] if rows[0].index(c) < len(r) else "" for c in common]  # noqa: E731
                             for r in rows[1:]]
        inner = first_difference(*(("\n".join(",".join(x) for x in [common] + pick(rows)) + "\n").encode()
                                   for rows in (ra, rb)), )
        return f"{head}; the {len(common)} common columns: {inner}"
    if len(ra) != len(rb):
        return f"{len(ra) - 1} rows before, {len(rb) - 1} after"
    at = ra[0].index("step") if "step" in ra[0] else None
    for i, (x, y) in enumerate(zip(ra[1:], rb[1:]), start=1):
        for col, u, v in zip(ra[0], x, y):
            if u != v:
                step = x[at] if at is not None and at < len(x) else "?"
                return f"row {i} (step {step}), column {col}: before {u!r}, after {v!r}"
    return "bytes differ (line endings?)" if a != b else COMMON_SAME


def compare(name, dirs) -> tuple[bool, list[str]]:
    ok, lines = True, []
    for fname in ("metrics.csv", "full.csv"):
        paths = [os.path.join(d, fname) for d in dirs]
        have = [os.path.exists(p) for p in paths]
        if not any(have) and fname == "full.csv":
            lines.append(f"  {fname}: not written by either tree (MetricsWriter.write hook saw no rows)")
            continue
        if not all(have):
            ok = False
            lines.append(f"  {fname}: DIFFERENT (missing in {'before' if not have[0] else 'after'})")
            continue
        a, b = (open(p, "rb").read() for p in paths)
        if a == b:
            lines.append(f"  {fname}: IDENTICAL ({len(a.splitlines()) - 1} rows, {len(a)} bytes)")
        else:
            why = first_difference(a, b)
            # columns added or removed with every common value equal: a new metric, not a changed number
            added_only = why.endswith(COMMON_SAME) and ALLOW_NEW_COLUMNS[0]
            ok = ok and added_only
            lines.append(f"  {fname}: {'SAME VALUES' if added_only else 'DIFFERENT'}: {why}")
    return ok, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="commit (or worktree path) of the reference tree")
    ap.add_argument("--after", default=None, help="commit or worktree path (default: the tree of this script)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    ap.add_argument("--jobs", type=int, default=2, help="subprocesses at a time (default 2)")
    ap.add_argument("--xla-flags", default="--xla_backend_optimization_level=0",
                    help="XLA_FLAGS of both trees ('' for XLA's defaults)")
    ap.add_argument("--no-cache", action="store_true", help="no shared persistent compilation cache")
    ap.add_argument("--priors", default=None, metavar="DIR",
                    help="prior cache of both trees (default: a fresh one per tree, so each fits the tiny prior with "
                         "its own code; a DIR that holds the prior skips that fitting, and its check)")
    ap.add_argument("--allow-new-columns", action="store_true",
                    help="columns present in one tree only pass when every common column is identical")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the run folders and logs in DIR")
    ap.add_argument("--_drive", help=argparse.SUPPRESS)
    ap.add_argument("--_tree", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._drive:  # inside a tree's subprocess
        with open(os.path.join(args._out, "spec.json")) as f:
            drive(args._drive, json.load(f), args._out, args._tree)
        return 0
    if not args.before:
        ap.error("--before is required")
    ALLOW_NEW_COLUMNS[0] = args.allow_new_columns
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    bad = sorted(set(names) - set(RUNS))
    if bad:
        ap.error(f"unknown runs {bad}; choose from {RUNS}")

    t_start = time.time()
    # SIGTERM ends the script through `finally` (the temporary worktrees are removed); the children get it too
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="same_metrics_")
    trees = Trees(tmp)
    try:
        before, before_desc = trees.resolve(args.before, "before")
        after, after_desc = trees.resolve(args.after, "after")
        print(f"before: {before_desc}\nafter:  {after_desc}", flush=True)
        driver_dir = os.path.join(tmp, "driver")
        os.makedirs(driver_dir)
        shutil.copyfile(os.path.abspath(__file__), os.path.join(driver_dir, "same_metrics.py"))
        for h in HELPERS:
            shutil.copyfile(os.path.join(after, h), os.path.join(driver_dir, os.path.basename(h)))
        args.cache_dir = None if args.no_cache else os.path.join(tmp, "xla_cache")
        specs = run_specs(after)
        have_nle = importlib.util.find_spec("nle") is not None
        skipped = [n for n in names if specs[n].get("needs") == "nle" and not have_nle]
        todo = [(n, side, tree) for n in names if n not in skipped for side, tree in (("before", before), ("after", after))]
        out_root = os.path.abspath(args.keep) if args.keep else os.path.join(tmp, "out")
        if args.keep and os.path.exists(out_root):
            shutil.rmtree(out_root)
        running, failed, took = [], {}, {}
        while todo or running:
            while todo and len(running) < max(1, args.jobs):
                n, side, tree = todo.pop(0)
                prior_cache = os.path.abspath(args.priors) if args.priors else os.path.join(tmp, f"priors_{side}")
                p, log, t0 = launch(n, specs[n], tree, os.path.join(out_root, side, n), driver_dir, args, prior_cache)
                running.append((n, side, p, log, t0))
            time.sleep(0.2)
            for item in list(running):
                n, side, p, log, t0 = item
                if p.poll() is None:
                    continue
                running.remove(item)
                log.close()
                took[(n, side)] = time.time() - t0
                print(f"  ran {n:<12} {side:<6} {took[(n, side)]:6.1f} s"
                      f"{'' if p.returncode == 0 else f'  FAILED (exit {p.returncode})'}", flush=True)
                if p.returncode != 0:
                    with open(os.path.join(out_root, side, n, "log.txt")) as f:
                        failed[(n, side)] = f.read()[-3000:]
        all_ok = True
        print()
        for n in names:
            if n in skipped:
                print(f"{n}: SKIPPED (nle not installed: the `envs` extra)")
                continue
            if (n, "before") in failed or (n, "after") in failed:
                all_ok = False
                print(f"{n}: FAILED")
                for side in ("before", "after"):
                    if (n, side) in failed:
                        print(f"  --- {side} log tail ---\n{failed[(n, side)]}")
                continue
            ok, lines = compare(n, [os.path.join(out_root, side, n) for side in ("before", "after")])
            all_ok &= ok
            print(f"{n}: {'IDENTICAL' if ok else 'DIFFERENT'}")
            print("\n".join(lines))
        print(f"\n{'ALL IDENTICAL' if all_ok else 'NOT IDENTICAL'}; {time.time() - t_start:.0f} s in all"
              f"{f'; run folders in {out_root}' if args.keep else ''}")
        return 0 if all_ok else 1
    finally:
        trees.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
