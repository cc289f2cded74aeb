"""An up-front memory check of a run, before any prior fit or compilation: a rough LOWER bound of what the
rollout and the learner hold at once, against the memory the devices have. It refuses only runs that cannot
fit (`rollout.groups=100000` used to fail with an out-of-memory traceback after minutes of compiling); a run
that passes can still run out of memory, since every term below leaves out most of what it stands for.

Terms (bytes; float32 activations; `E` = rollout.groups * rollout.group_size episodes, `S` = a lower bound of
a turn's tokens: the compact prompt's 13 tokens plus the reply's `rollout.max_action_tokens`):
- models: parameters of the actor and the extractor (one copy when both name the same LLM), plus Adam's two
  float32 moments for what is trained in full (the tiny models; LLMs unless `lora.train`);
- rollout: one layer's activations of every episode's turn, `E * S * hidden * 4`, plus one position's
  vocabulary logits per episode, `E * vocab * 4`;
- learner: activations a backward pass keeps of one minibatch (two per layer), `rows * S * layers * hidden
  * 4 * 2` with `rows` = loss.turn_rows (0: E * env.max_turns) / (loss.minibatches * loss.microbatches).

Available: the sum of the devices' `bytes_limit` on accelerators, MemAvailable of /proc/meminfo on the CPU
(unknown: no check).
"""

from __future__ import annotations

import json
import math
import os

import jax

from crl_jax.config import Config, ConfigError

PROMPT_TOKENS = 13  # the compact view's per-turn prompt (level, turn, row, column, 3x3 cells): the shortest one
GIB = 1024 ** 3


def model_shape(m) -> tuple[int, int, int, int] | None:
    """(vocab, hidden, layers, intermediate) of a model config: the tiny fields, an LLM preset's, or a folder's
    config.json; None when unknown (a .gguf file, a package model)."""
    if m.preset == "tiny":
        return 0, m.hidden_size, m.num_layers, m.intermediate_size  # (vocab: a few hundred tokens, left out)
    from crl_jax.models.presets import PRESETS

    if m.preset in PRESETS:
        p = PRESETS[m.preset]
        layers = m.truncate_layers or p["num_layers"]
        return p["vocab_size"], p["hidden_size"], layers, p["intermediate_size"]
    path = os.path.join(m.preset, "config.json")
    if os.path.isfile(path):
        try:
            with open(path) as f:
                c = json.load(f)
            layers = m.truncate_layers or int(c["num_hidden_layers"])
            return int(c["vocab_size"]), int(c["hidden_size"]), layers, int(c["intermediate_size"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def _params(shape) -> int:
    v, h, n, i = shape
    return v * h + n * (4 * h * h + 3 * h * i)


def estimate(cfg: Config) -> dict[str, int]:
    """{"models", "rollout", "learner"}: lower bounds in bytes (module docstring)."""
    a, e = model_shape(cfg.actor), model_shape(cfg.extractor)
    llm = cfg.actor.preset != "tiny"
    models = 0
    for m, shape in ((cfg.actor, a), (cfg.extractor, e)):
        if shape is None or (m is cfg.extractor and llm and m.preset == cfg.actor.preset):
            continue
        p = _params(shape)
        models += p * (2 if m.dtype == "bfloat16" else 4) + (0 if llm and cfg.lora.train else 8 * p)
    if a is None:
        return {"models": models, "rollout": 0, "learner": 0}
    v, h, n, _ = a
    episodes = cfg.rollout.groups * cfg.rollout.group_size
    s = PROMPT_TOKENS + cfg.rollout.max_action_tokens
    rows = cfg.loss.turn_rows or episodes * cfg.env.max_turns
    rows = math.ceil(rows / (cfg.loss.minibatches * cfg.loss.microbatches))
    return {"models": models, "rollout": episodes * s * h * 4 + episodes * v * 4, "learner": rows * s * n * h * 8}


def available() -> tuple[int, str] | None:
    """(bytes, where from) the run can use; None when unknown."""
    devices = jax.local_devices()
    if devices and devices[0].platform != "cpu":
        limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
        if all(limits):
            return sum(limits), f"{len(devices)} {devices[0].platform.upper()} device(s)"
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        return None
    return None


def check(cfg: Config) -> None:
    """ConfigError when the lower bound of `estimate` exceeds `available()`; names the biggest term's keys."""
    have = available()
    if have is None:
        return
    need = estimate(cfg)
    total = sum(need.values())
    if total <= have[0]:
        return
    keys = {"models": "actor.preset / extractor.preset / lora.train",
            "rollout": "rollout.groups / rollout.group_size",
            "learner": "loss.turn_rows / loss.minibatches / loss.microbatches / rollout.groups"}
    big = max(need, key=need.get)
    parts = ", ".join(f"{k} {need[k] / GIB:.1f}" for k in need)
    raise ConfigError(f"{keys[big]}: the run needs at least {total / GIB:.1f} GiB ({parts} GiB; a lower bound, "
                      f"docs/USAGE.md) but only {have[0] / GIB:.1f} GiB is available ({have[1]}); make the {big} smaller")
