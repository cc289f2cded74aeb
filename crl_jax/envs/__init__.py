"""Pure-JAX text environments (see `base.py` for the API and `render.py` for the text view).

`make(name, *, pool="train"|"eval", num_tasks=None, pool_seed=0, **params) -> env`:

- `room`: MiniHack Room-5x5 family; params `dark`, `traps`, `monster` (all three: the paper's
  "Ultimate" task), `size=5`, `crop=9` (egocentric 9x9 text view like MiniHack; 0 = the whole room),
  `max_steps=30`; `families=True` (with `obstacles=3`): task families, one goal cell per family and a
  layout per episode (`families.py`).
- `maze`: MazeWalk-style 9x9 maze (`dark=False`, `max_steps=40`).
- `keyroom`: dark 5x5 room with a locked 2x2 sub-room holding the stairs (`max_steps=50`).
- `sokoban`: 6x6 room, 2 boxes, 2 targets, reverse-play generation (`max_steps=60`).
- `frozen_lake`: 6x6 lake (`slippery=False`, `max_steps=40`).
"""

from __future__ import annotations

import importlib

from crl_jax.envs.base import Env, Obs  # noqa: F401

_REGISTRY = {
    "room": ("crl_jax.envs.families", "make_room"),
    "maze": ("crl_jax.envs.maze", "Maze"),
    "keyroom": ("crl_jax.envs.keyroom", "KeyRoom"),
    "sokoban": ("crl_jax.envs.sokoban", "Sokoban"),
    "frozen_lake": ("crl_jax.envs.frozen_lake", "FrozenLake"),
}


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def register(name: str, module: str, cls: str) -> None:
    """Add an environment class (`module:cls`, constructed with `make`'s keyword arguments)."""
    _REGISTRY[name] = (module, cls)


def make(name: str, **params) -> Env:
    if name not in _REGISTRY:
        raise ValueError(f"make: unknown environment {name!r}; known: {sorted(_REGISTRY)}")
    mod, cls = _REGISTRY[name]
    try:
        return getattr(importlib.import_module(mod), cls)(**params)
    except TypeError as e:
        raise TypeError(f"make({name!r}, ...): {e}") from None
