"""Host-side adapters for environments that cannot be written in JAX (the `envs` extra).

Same API as the pure-JAX envs (`crl_jax.envs`) minus jit: `reset(key_or_seed, task) -> (state,
text)`, `step(state, action) -> (state, text, reward, done, info)`, `render(state) -> str`,
`action_names`, `max_steps`, `task_text`, `num_tasks`, and `is_host = True` so the rollout code knows to
step them on the host. `key_or_seed` is an int or a JAX PRNG key; `task` indexes a finite, seeded pool.
Each adapter plays one game at a time (the simulators are stateful): `step` accepts only the latest
state of the current episode; use one adapter per parallel game.

- `minihack-room` (`MiniHackRoom`): the real MiniHack Room-5x5 family (variant random / dark / trap /
  monster / ultimate), the reference the JAX `room` env is calibrated against (see calibrate.py).
- `textworld` (`TextWorldGames`): TextWorld games generated offline (tw-simple / tw-cooking / ...).
- `alfworld` (`AlfworldPddl`): ALFWorld-style household tasks on the ALFRED PDDL domain shipped in the
  `alfworld` wheel, with small hand-written problems (the real ALFWorld game data is not shipped).

Text adapters have a variable action set: `action_names` is the admissible commands of the latest
state (`env.admissible(state)` for any state) and `step` takes an index into it or a command string.

`make_adapter(name, **params)` builds one (`make_pool_adapter`: one of a run's pools); heavy imports happen
only then.
"""

from __future__ import annotations

import importlib
import inspect

_REGISTRY = {
    "minihack-room": ("crl_jax.envs.adapters.minihack", "MiniHackRoom"),
    "textworld": ("crl_jax.envs.adapters.textworld", "TextWorldGames"),
    "alfworld": ("crl_jax.envs.adapters.alfworld", "AlfworldPddl"),
}


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def adapter_class(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"make_adapter: unknown adapter {name!r}; known: {sorted(_REGISTRY)}")
    mod, cls = _REGISTRY[name]
    return getattr(importlib.import_module(mod), cls)


def make_adapter(name: str, **params):
    return adapter_class(name)(**params)


def make_pool_adapter(name: str, *, pool: str, num_tasks: int, pool_seed: int, **params):
    """`make_adapter` for a run's pool: the pool keys (`pool`, `num_tasks`, `pool_seed`) are passed to the
    adapters that take them; `alfworld`'s tasks are its fixed problem files (the same for both pools)."""
    keys = inspect.signature(adapter_class(name)).parameters
    pool_keys = {"pool": pool, "num_tasks": num_tasks, "pool_seed": pool_seed}
    return make_adapter(name, **{k: v for k, v in pool_keys.items() if k in keys}, **params)
