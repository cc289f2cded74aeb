"""Package structure: the import graph of `crl_jax` read from the source (ast, nothing imported).

Edges: every `import` / `from ... import` of a `crl_jax` module, at module level (including `if` / `try`
blocks and class bodies, which run at import time) or inside a function body (`if TYPE_CHECKING:`
imports, which never run, count with these). `from pkg import name` is an edge to `pkg.name` when that is a module, else to
`pkg`. Importing `pkg.sub.mod` runs `pkg/sub/__init__.py` first, so it is also an edge to every parent
package of the target that the importer is not itself inside (a package `__init__` that re-exports from a
module deep in the graph would otherwise close a cycle that only shows in some import orders).

Asserted: no import cycle among the module-level imports, and none either once the function-level imports
are added (an import moved into a function to dodge a cycle still is one), apart from `ALLOWED_CYCLES`.
Asserted too: imports only go down the layers of `LAYERS`; no module over `LONG_MODULE` lines (small files, one
concept each); no history ("session N", "issue #N") in the package, the docs or the experiments' pages.
Reported (printed, run with `-s`): function-level imports of crl_jax modules.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/unit/ -> repo
PACKAGE = os.path.join(ROOT, "crl_jax")
LONG_MODULE = 400  # lines

# Cycles allowed through function-level imports: each entry is the exact set of modules of one strongly
# connected component of the full graph. Keep it empty.
ALLOWED_CYCLES: list[set[str]] = []

# The layers of the package, lowest first: a package (or top-level module) of `crl_jax` may import only those
# before it. Imports inside functions and under TYPE_CHECKING count too.
LAYERS = (
    "errors",         # error classes and the damaged-JSON reader
    "atomic",         # files written whole (temporary name, fsync, rename)
    "text",           # tokenizers, packing, prompts
    "models",         # transformer, loaders, embedders, LoRA
    "token_draw",     # the sampler's token draw
    "sampling",       # prefill + decode
    "envs",           # built-in environments and adapters
    "config_checks",  # config validation (reads model presets)
    "config_rules",   # the paper's write rules (an LLM extractor's defaults)
    "config",         # the config dataclasses and loader
    "config_doc",     # the config's field comments as commented YAML (`config show`)
    "bank",           # the experience bank
    "losses",         # advantages, policy losses, credit
    "actor",          # rollouts, experience retrieval, evaluation
    "extractor",      # operations, distillation, merge, sample buffer
    "learner",        # train states, batches, loss functions, priors
    "backends",       # the built-in, LLM and host paths
    "loop",           # one iteration, runtime, chunks
    "host",           # the host driver: a second driver of the loop, for games stepped on the host
    "infra",          # runs, CLI, checkpoints, sweeps, sharding
    "__main__",       # python -m crl_jax
)
# Known exceptions, as (importer module, imported layer). Keep it empty.
ALLOWED_UP: set[tuple[str, str]] = set()


def module_files() -> dict[str, str]:
    """{dotted module name: file path} of every module of the package."""
    out = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(module: str, is_package: bool, node, modules) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:  # relative: from the module's package, one level up per extra dot
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    return [n for n in names if n in modules]


def _parents_outside(target: str, importer: str, modules) -> list[str]:
    """The parent packages of `target` (below `crl_jax` itself) that `importer` is not inside: importing the
    target runs their `__init__` first."""
    parts = target.split(".")
    out = []
    for i in range(2, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg in modules and importer != pkg and not importer.startswith(pkg + "."):
            out.append(pkg)
    return out


def import_graph():
    """-> (module-level edges, function-level and type-only edges): {module: {imported module: first line}}."""
    modules = module_files()
    top: dict[str, dict[str, int]] = {m: {} for m in modules}
    inner: dict[str, dict[str, int]] = {m: {} for m in modules}

    def walk(module, is_package, node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                # never runs, so not a module-level edge; but a type-only dependency still is one for the
                # full graph (the cycle it would close is a design cycle)
                walk(module, is_package, ast.Module(body=child.body, type_ignores=[]), True)
                walk(module, is_package, ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(module, is_package, child, modules):
                    for u in [t, *_parents_outside(t, module, modules)]:
                        (inner if in_function else top)[module].setdefault(u, child.lineno)
            walk(module, is_package, child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for m, path in modules.items():
        with open(path) as f:
            walk(m, path.endswith("__init__.py"), ast.parse(f.read(), path), False)
    return top, inner


def cycles(graph: dict[str, dict]) -> list[set[str]]:
    """Strongly connected components with more than one module (or a module importing itself)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan, iterative enough for a package of ~100 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _describe(comp: set[str], graph) -> str:
    edges = [f"{a} -> {b} (line {graph[a][b]})" for a in sorted(comp) for b in sorted(graph.get(a, {})) if b in comp]
    return "{" + ", ".join(sorted(comp)) + "}: " + "; ".join(edges)


def _merged(top, inner):
    return {m: {**inner.get(m, {}), **top.get(m, {})} for m in set(top) | set(inner)}


def test_graph_sees_the_package():
    top, inner = import_graph()
    assert "crl_jax.loop.iteration" in top and "crl_jax.bank" in top["crl_jax.loop.iteration"]  # a known edge
    assert "crl_jax.extractor" in top["crl_jax.backends.base"]  # a parent package's __init__ (of extractor.buffer)
    assert len(top) > 50


def test_no_cycle_among_module_level_imports():
    top, _ = import_graph()
    found = [c for c in cycles(top) if c not in ALLOWED_CYCLES]
    assert not found, "module-level import cycles:\n" + "\n".join(_describe(c, top) for c in found)


def test_no_cycle_hidden_in_function_level_imports():
    top, inner = import_graph()
    full = _merged(top, inner)
    found = [c for c in cycles(full) if c not in ALLOWED_CYCLES]
    assert not found, ("import cycles through function-level imports (move the import to module level and "
                       "break the cycle instead):\n" + "\n".join(_describe(c, full) for c in found))


def long_modules(limit: int = LONG_MODULE) -> list[tuple[int, str]]:
    """(lines, module) of every module of the package over `limit` lines, longest first."""
    long = []
    for m, path in sorted(module_files().items()):
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > limit:
            long.append((n, m))
    return sorted(long, reverse=True)


def test_no_module_over_the_size_limit():
    long = long_modules()
    assert not long, f"modules over {LONG_MODULE} lines (split them along concept lines):\n" + "\n".join(
        f"  {m}: {n}" for n, m in long)


def test_size_check_can_fail():
    assert long_modules(limit=10), "every module is under 10 lines: the size check reads nothing"


def test_report_function_level_imports():
    """Not a failure: what is left to clean up (run with -s to see it)."""
    _, inner = import_graph()
    lazy = {m: d for m, d in sorted(inner.items()) if d}
    print(f"\nfunction-level imports of crl_jax modules ({sum(map(len, lazy.values()))} in {len(lazy)} modules):")
    for m, d in lazy.items():
        print(f"  {m}: " + ", ".join(f"{t} (line {n})" for t, n in sorted(d.items())))


def test_public_api_paths():
    """The public API contract (docs/ARCHITECTURE.md) keeps its paths whatever the package layout (and `crl-jax` its entry)."""
    import importlib

    contract = {
        "crl_jax.losses": ["group_advantages", "subgroup_advantages", "ppo_clip_loss", "cispo_loss", "repeat_weights",
                           "extractor_advantages"],
        "crl_jax.bank": ["init", "add", "update", "retrieve", "ExperienceBank"],
        "crl_jax.extractor": ["parse_operations"],
        "crl_jax.models": ["from_pretrained"],
        "crl_jax.sampling": ["generate"],
        "crl_jax.envs": ["make"],
        "crl_jax.loop": ["train"],
        "crl_jax.config": ["load"],
    }
    missing = [f"{m}.{n}" for m, names in contract.items() for n in names
               if not callable(getattr(importlib.import_module(m), n, None))]
    assert not missing, f"public API names missing: {missing}"
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        entry = next(line for line in f if line.startswith("crl-jax = ")).split("=", 1)[1].strip().strip('"')
    mod, _, fn = entry.partition(":")
    assert callable(getattr(importlib.import_module(mod), fn)), entry


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph, layers=LAYERS) -> list[str]:
    """'importer -> imported' for every edge from a layer to one at or above it in `layers` (other layers than
    its own), apart from `ALLOWED_UP`."""
    rank = {name: i for i, name in enumerate(layers)}
    out = []
    for a, targets in sorted(graph.items()):
        la = _layer(a)
        for b in sorted(targets):
            lb = _layer(b)
            if b == "crl_jax":  # the root package: its __init__ holds only __version__ and imports nothing
                continue
            if la != lb and rank[lb] > rank[la] and (a, lb) not in ALLOWED_UP:
                out.append(f"{a} -> {b} (line {targets[b]})")
    return out


def test_every_module_has_a_layer():
    assert {_layer(m) for m in module_files() if m != "crl_jax"} == set(LAYERS)


def test_imports_only_go_down():
    top, inner = import_graph()
    up = upward_imports(_merged(top, inner))
    assert not up, f"imports up the layers (LAYERS, lowest first):\n" + "\n".join(f"  {e}" for e in up)


def test_layer_check_can_fail():
    top, inner = import_graph()
    assert upward_imports(_merged(top, inner), layers=tuple(reversed(LAYERS))), "the layer check reads nothing"


HISTORY = re.compile(r"session [0-9]|issue #[0-9]", re.IGNORECASE)


def history_mentions() -> list[str]:
    """'file:line' of every "session N" / "issue #N" in crl_jax/, docs/, README.md and experiments/**/*.md:
    history lives in git."""
    paths = [os.path.join(ROOT, "README.md")]
    for top in ("crl_jax", "docs", "experiments"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            paths += [os.path.join(folder, f) for f in files
                      if f.endswith(".md") or (top == "crl_jax" and f.endswith((".py", ".txt", ".jinja", ".json")))]
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out += [f"{os.path.relpath(path, ROOT)}:{i}" for i, line in enumerate(f, 1) if HISTORY.search(line)]
    return out


def test_no_history_in_code_or_docs():
    found = history_mentions()
    assert not found, "history belongs in git, not in files:\n" + "\n".join(f"  {x}" for x in found)


def test_history_pattern_matches():
    assert HISTORY.search("as measured in Session 12") and HISTORY.search("see Issue #16")
    assert not HISTORY.search("a test session's cache") and not HISTORY.search("issue a warning")
