"""The rules behind `crl_jax.config` (which re-exports the public names): `ConfigError`, the keys removed from
the config, the type check of every value against its dataclass field, dotted command-line overrides and the
range checks of a whole config (`validate`). Nothing here names a config dataclass, so `config.py` holds the
schema and the loading, and imports this.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import warnings
from typing import Any, Literal

import yaml

from crl_jax.errors import ConfigError  # noqa: F401  (re-exported: crl_jax.config.ConfigError)


# ------------------------------------------------------------------------------------------------
# Keys removed from the config (CHANGELOG 0.1.0): each one either restated what the path (tiny vs LLM, i.e.
# `actor.preset`) fixes or had a single legal value, so every run that started held exactly that value
# (extraction.format was not read at all on the tiny path). A config file or override that names one is an
# error saying so; a run folder's saved config.json that holds them still loads (`drop_removed_keys`), so
# runs saved before the removal resume, evaluate and show their bank.

REMOVED_KEYS = {
    "rollout.history": "the path fixes it: the current observation (tiny models) or the whole conversation "
                       "(LLM path)",
    "rollout.action_format": "the path fixes it: one constrained action token (tiny models) or a free-text "
                             "<answer> reply (LLM path)",
    "extraction.format": "the path fixes it: operation tokens (tiny models) or JSON operations (LLM path)",
    "bank.top_k": "one entry is retrieved per guided rollout (the paper's K_r = 1)",
}


def check_text_file(path: str, what: str = "file") -> None:
    """A ConfigError naming `path` unless it is a readable UTF-8 text file (a missing file is left to the
    caller's own message)."""
    import os

    if not os.path.exists(path):
        return
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a folder, not a file")
    try:
        with open(path, encoding="utf-8") as f:
            f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror or e})") from None


def drop_removed_keys(data: dict, source: str = "saved config") -> dict:
    """`data` (a nested config dict, e.g. a run folder's config.json) without the `REMOVED_KEYS`; warns
    naming the ones it dropped. Other unknown keys are left for `from_dict` to reject."""
    out, dropped = dict(data), []
    for key in REMOVED_KEYS:
        section, name = key.split(".")
        if isinstance(out.get(section), dict) and name in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != name}
            dropped.append(key)
    if dropped:
        warnings.warn(f"{source}: ignoring {', '.join(dropped)} (removed from the config: fixed by the path or "
                      "single-valued)", stacklevel=2)
    return out


# ------------------------------------------------------------------------------------------------
# Values against their fields



def _check_value(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errs = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_value(path, a, value)
            except ConfigError as e:
                errs.append(str(e))
        raise ConfigError(errs[0] if errs else f"{path}: bad value {value!r}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "2e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{path}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    return value


def _build(cls, data: Any, prefix: str = ""):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in data.items():
        path = f"{prefix}.{k}" if prefix else k
        if k not in names and path in REMOVED_KEYS:
            raise ConfigError(f"{path}: this key was removed ({REMOVED_KEYS[path]}); delete it")
        if k not in names:
            raise ConfigError(f"unknown config key {path!r}; known keys here: {sorted(names)}")
        kw[k] = _check_value(path, hints[k], v)
    return cls(**kw)


# ------------------------------------------------------------------------------------------------
# YAML files: a key given twice is an error (PyYAML keeps the last one without a word)


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                line = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if line != key_node.start_mark.line + 1:
                raise ConfigError(f"key {key!r} is given twice (lines {line} and {key_node.start_mark.line + 1}); "
                                  "the second would silently replace the first: merge them")
        return super().construct_mapping(node, deep=deep)


def load_yaml(stream, source: str):
    """`yaml.safe_load(stream)` that refuses a mapping key given twice (ConfigError naming `source`, the key and
    both lines) and reports a YAML syntax error as a ConfigError too."""
    try:
        return yaml.load(stream, Loader=_UniqueKeyLoader)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {e}") from None


# ------------------------------------------------------------------------------------------------
# Dotted overrides


def _set_dotted(d: dict, key: str, value: Any):
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        if p not in cur or not isinstance(cur[p], dict):
            cur[p] = {} if p not in cur else cur[p]
            if not isinstance(cur[p], dict):
                raise ConfigError(f"{key}: {p!r} is not a section")
        cur = cur[p]
    cur[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict:
    """["actor.lr=1e-3", "env.params.dark=false"] -> nested dict (values parsed as YAML scalars)."""
    out: dict = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"override {it!r} is not of the form key=value")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise ConfigError(f"override {it!r} has an empty key")
        _set_dotted(out, k, yaml.safe_load(v) if v.strip() else "")
    return out


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "params":
            out[k] = _deep_merge(out[k], v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


# ------------------------------------------------------------------------------------------------
# env.params against the environment's constructor


_SET_BY_THE_RUN = {"pool", "num_tasks", "pool_seed"}  # `make` keywords the run sets from env.* itself


def env_param_types(name: str) -> dict[str, type] | None:
    """{keyword: type of its default} of a built-in environment's constructor chain (its `__init__` and the
    base classes' it hands `**kw` to); None for an environment not in `crl_jax.envs`' registry (a host
    adapter registered at run time: its parameters are its own business)."""
    import importlib
    import inspect

    from crl_jax import envs

    if name not in envs.names():
        return None
    module, cls = envs._REGISTRY[name]
    out: dict[str, type] = {}
    made = getattr(importlib.import_module(module), cls)
    # a factory function (`make_room`) names the classes it hands `**kw` to in `param_classes`
    chain = made.__mro__ if isinstance(made, type) else (made, *(k for c in made.param_classes for k in c.__mro__))
    for klass in chain:
        init = klass if not isinstance(klass, type) else vars(klass).get("__init__")
        if init is None:
            continue
        more = False
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.name != "self" and p.default is not p.empty and p.name not in out:
                out[p.name] = type(p.default)
        if not more:
            break
    return {k: v for k, v in out.items() if k not in _SET_BY_THE_RUN}


def check_env_params(name: str, params: dict) -> None:
    """Every `env.params` key is a keyword of the environment's constructor and its value has the type of
    that keyword's default (`dark: "false"` is a string, which Python would read as true): ConfigError naming
    `env.params.KEY` otherwise."""
    types_ = env_param_types(name)
    if types_ is None:
        return
    for k, v in params.items():
        key = f"env.params.{k}"
        if k in _SET_BY_THE_RUN:
            raise ConfigError(f"{key}: set by the run from env.num_train_tasks / num_eval_tasks / pool_seed; delete it")
        if k not in types_:
            raise ConfigError(f"{key}: not a parameter of env {name!r}; its parameters: {sorted(types_)}")
        tp = types_[k]
        if tp in (bool, int, float, str):
            _check_value(key, tp, v)


# ------------------------------------------------------------------------------------------------
# Range checks


def validate(cfg) -> None:
    """Range checks that types alone cannot express (`cfg`: a `crl_jax.config.Config`)."""

    def need(cond, key, msg):
        if not cond:
            raise ConfigError(f"{key}: {msg}")

    need(cfg.steps >= 1, "steps", "must be >= 1 (0 steps would train nothing and write a summary of nulls)")
    need(cfg.rollout.groups >= 1, "rollout.groups", "must be >= 1")
    need(cfg.rollout.group_size >= 2, "rollout.group_size", "must be >= 2 (GRPO needs a group)")
    if cfg.loss.group_split and cfg.uses_bank:
        need(cfg.rollout.group_size % 2 == 0, "rollout.group_size", "must be even when loss.group_split is on")
    need(cfg.env.max_turns >= 1, "env.max_turns", "must be >= 1")
    need(cfg.env.num_train_tasks >= 1, "env.num_train_tasks", "must be >= 1")
    need(cfg.env.num_eval_tasks >= 1, "env.num_eval_tasks", "must be >= 1")
    need(cfg.bank.capacity >= 1, "bank.capacity", "must be >= 1")
    need(cfg.bank.entry_len >= 1, "bank.entry_len", "must be >= 1")
    need(cfg.bank.candidates >= 1, "bank.candidates", "must be >= 1")
    need(0.0 <= cfg.bank.demote_p <= 1.0, "bank.demote_p", "must be in [0, 1]")
    need(cfg.extraction.buffer_capacity > cfg.extraction.batch, "extraction.buffer_capacity", "must be > extraction.batch")
    need(cfg.extraction.batch >= 1, "extraction.batch", "must be >= 1")
    need(cfg.extraction.merge_every >= 1, "extraction.merge_every", "must be >= 1")
    need(cfg.extraction.merge_chunk >= 1, "extraction.merge_chunk", "must be >= 1")
    need(cfg.extraction.merge_max_chunks >= 0, "extraction.merge_max_chunks", "must be >= 0 (0 = the whole bank)")
    need(cfg.extraction.max_new_tokens >= 2, "extraction.max_new_tokens", "must be >= 2 (op token + entry)")
    need(cfg.eval.every >= 0, "eval.every", "must be >= 0")
    need(cfg.eval.tasks >= 1, "eval.tasks", "must be >= 1")
    need(cfg.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
    need(cfg.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1 (0 would leave no checkpoint to resume)")
    import math
    import os

    def float_leaves(node, prefix=""):
        """(dotted key, value) of every float in the config, env.params included."""
        items = dataclasses.asdict(node).items() if dataclasses.is_dataclass(node) else node.items()
        for k, v in items:
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                yield from float_leaves(v, key)
            elif isinstance(v, float):
                yield key, v

    for key, v in float_leaves(cfg):  # NaN / inf pass every range check and are not valid JSON
        need(math.isfinite(v), key, f"must be a finite number, got {v!r}")
    for name in ("actor", "extractor"):
        p = getattr(cfg, name).preset
        if p != "tiny" and not p.startswith("pkg:") and not os.path.exists(p):
            from crl_jax.models.presets import PRESETS

            need(p in PRESETS, f"{name}.preset", f"{p!r} is neither a known preset nor an existing path; known "
                 f"presets: {['tiny', *sorted(PRESETS)]}")
    need(cfg.loss.microbatches >= 1, "loss.microbatches", "must be >= 1")
    need(cfg.loss.turn_rows >= 0, "loss.turn_rows", "must be >= 0")
    need(cfg.loss.turn_rows % cfg.loss.microbatches == 0, "loss.turn_rows", "must be divisible by loss.microbatches")
    need(cfg.loss.epochs >= 1, "loss.epochs", "must be >= 1")
    need(cfg.loss.minibatches >= 1, "loss.minibatches", "must be >= 1")
    need(cfg.loss.target_kl >= 0.0, "loss.target_kl", "must be >= 0 (0 = off)")
    need(cfg.loss.head_chunk >= 0, "loss.head_chunk", "must be >= 0 (0 = the vocabulary-tiled path)")
    need(cfg.extraction.epochs >= 1, "extraction.epochs", "must be >= 1")
    need(0.0 <= cfg.extraction.op_explore < 1.0, "extraction.op_explore", "must be in [0, 1) (0 = off)")
    need(cfg.extraction.op_weight > 0.0, "extraction.op_weight", "must be > 0 (1 = the plain token mean)")
    need(cfg.extraction.op_entropy >= 0.0, "extraction.op_entropy", "must be >= 0 (0 = off)")
    # the tiny extractor's op token and distillation prompt: an LLM's reply has no op token first, its prompt is its own
    for name, off in (("op_explore", 0.0), ("op_weight", 1.0), ("op_entropy", 0.0), ("outcome_last", False),
                      ("oracle_write_reward", False), ("return_counterfactual", False)):
        need(getattr(cfg.extraction, name) == off or cfg.extractor.preset == "tiny", f"extraction.{name}",
             f"is a tiny-extractor option: its op token, its distillation prompt (set {str(off).lower()})")
    need(cfg.extraction.baseline != "outcome_mean" or cfg.extraction.outcome_last, "extraction.baseline",
         "'outcome_mean' groups samples by their prompt's last token: set extraction.outcome_last=true")
    need(cfg.extraction.update_unretrieved in ("add", "ignore"), "extraction.update_unretrieved",
         "must be 'add' (an UPDATE with nothing retrieved writes a new entry) or 'ignore' (it writes nothing)")
    need(cfg.extraction.return_samples >= 0, "extraction.return_samples", "must be >= 0 (0 = RETURN is never trained)")
    need(cfg.extraction.invalid_samples >= 0, "extraction.invalid_samples", "must be >= 0 (0 = never trained)")
    need(0 <= cfg.extraction.min_entry < cfg.extraction.max_new_tokens, "extraction.min_entry",
         "must be in [0, extraction.max_new_tokens)")
    need(cfg.rollout.tip_window >= 0, "rollout.tip_window", "must be >= 0 (0 = the whole entry)")
    need(cfg.rollout.turn_block >= 0, "rollout.turn_block", "must be >= 0 (0 = every episode at once)")
    need(cfg.rollout.turn_block == 0 or cfg.actor.preset == "tiny", "rollout.turn_block",
         "is the tiny actor's turn forward; an LLM actor's rollout already skips finished episodes (set 0)")
    need(-1.0 <= cfg.bank.min_similarity <= 1.0, "bank.min_similarity", "must be in [-1, 1] (-1 = off)")
    p = cfg.pretrain
    need(p.actor_steps >= 0, "pretrain.actor_steps", "must be >= 0")
    need(p.extractor_steps >= 0, "pretrain.extractor_steps", "must be >= 0")
    need(p.batch >= 1, "pretrain.batch", "must be >= 1")
    need(p.lr > 0, "pretrain.lr", "must be > 0")
    need(0.0 <= p.tip_p <= 1.0, "pretrain.tip_p", "must be in [0, 1]")
    need(p.aux_coef >= 0, "pretrain.aux_coef", "must be >= 0 (0 = no auxiliary loss)")
    need(p.aux_rows >= 1, "pretrain.aux_rows", "must be >= 1")
    need(p.extractor_aux_rows >= 1, "pretrain.extractor_aux_rows", "must be >= 1")
    for ax in ("data", "fsdp", "tensor"):
        need(getattr(cfg.mesh, ax) == -1 or getattr(cfg.mesh, ax) >= 1, f"mesh.{ax}", "must be >= 1 or -1 (auto)")
    need(0.0 <= cfg.mesh.extractor_devices < 1.0, "mesh.extractor_devices", "must be in [0, 1)")
    need(cfg.distributed.num_processes >= 1, "distributed.num_processes", "must be >= 1")
    for name in ("actor", "extractor"):
        m = getattr(cfg, name)
        need(m.lr > 0, f"{name}.lr", "must be > 0")
        need(m.temperature >= 0, f"{name}.temperature", "must be >= 0")
        need(m.dtype in ("float32", "bfloat16"), f"{name}.dtype", "must be float32 or bfloat16")
        need(m.param_dtype in ("float32", "bfloat16"), f"{name}.param_dtype", "must be float32 or bfloat16")
        need(not (m.param_dtype == "bfloat16" and m.dtype == "float32"), f"{name}.param_dtype",
             "bfloat16 masters of float32 weights would lose the weights' precision: use float32")
        need(m.truncate_layers >= 0, f"{name}.truncate_layers", "must be >= 0 (0 = every layer)")
        need(m.scan_unroll >= -1, f"{name}.scan_unroll", "must be >= -1 (0 = every layer, -1 = auto)")
        if m.preset == "tiny":  # an LLM preset's shapes come from its folder (checked by the loader)
            for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
                need(getattr(m, k) >= 1, f"{name}.{k}", "must be >= 1")
            need(m.num_heads % m.num_kv_heads == 0, f"{name}.num_heads",
                 f"must be a multiple of {name}.num_kv_heads ({m.num_heads} heads, {m.num_kv_heads} kv heads)")
    need(cfg.bank.key_dim >= 1, "bank.key_dim", "must be >= 1")
    # the distillation prompt holds the retrieved entry, the goal and at least five one-token labels (header,
    # moves, outcome, old tip, op) at full size; the exact need is checked when the runtime is built
    need(cfg.extraction.prompt_len >= cfg.bank.entry_len + 5, "extraction.prompt_len",
         f"must hold the retrieved entry (bank.entry_len={cfg.bank.entry_len}), the goal and the prompt's labels: "
         f">= bank.entry_len + 5 at the least")
    need(cfg.method != "archive" or cfg.actor.preset == "tiny", "method",
         "archive stores the episodes' moves as plans of action tokens: it needs the tiny models (actor.preset=tiny)")
    forms = cfg.extraction.forms
    need(not forms or (cfg.extractor.preset == cfg.actor.preset == "tiny" and cfg.rollout.view == "compact"),
         "extraction.forms", "the entry forms are the tiny models' constrained answers and a FACT is the compact view's "
         "<r{i}> <c{j}> cell: set actor.preset=tiny, extractor.preset=tiny and rollout.view=compact")
    need(not forms or not cfg.extraction.merge, "extraction.forms", "needs extraction.merge=false (merges copy moves)")
    need(not forms or cfg.rollout.tip_window >= 2, "extraction.forms",
         "a FACT tip (a row and a column token) is shown next to the action prompt: set rollout.tip_window >= 2")
    need(cfg.method != "oracle_archive" or forms, "method",
         "oracle_archive writes FACT entries (end cells), which the actor reads only with extraction.forms=true")
    if cfg.method == "offline":
        need(bool(cfg.bank.offline_path), "bank.offline_path", "method=offline needs a bank file")
