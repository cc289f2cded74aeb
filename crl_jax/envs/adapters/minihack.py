"""Host adapter for the real MiniHack Room-5x5 family (NLE), with the API of the pure-JAX envs minus jit.

`MiniHackRoom(variant="ultimate")` wraps `MiniHack-Room-{Random,Dark,Trap,Monster,Ultimate}-5x5-v0`:

- `reset(key_or_seed, task) -> (state, text)`: `task` (int, modulo `num_tasks`) fixes the level through
  NLE's level-generator seed (`env.unwrapped.seed(core, disp, reseed=False, lgen=...)` before the
  reset; `gymnasium`'s `reset(seed=...)` does not fix a MiniHack level); `key_or_seed` (an int or a JAX
  PRNG key) seeds the in-game dynamics (monster moves, combat, teleport destinations).
- `step(state, action) -> (state, text, reward, done, info)`: actions are the 8 compass moves in the
  order of `action_names` (north east south west northeast southeast southwest northwest, the same as
  the JAX `room` env), mapped to NLE's `CompassDirection`. Reward 1.0 when the agent reaches the
  stairs down (MiniHack's `TASK_SUCCESSFUL`), else 0.0 -- death and truncation give 0 (MiniHack's own
  -0.01 step penalty is dropped). The episode ends on success, on death or after `max_steps` moves
  (every call counts one move, including bumps into stone, which take no game time in NetHack).
  `info`: `success`, `died`, `invalid` (action out of range: the turn is consumed, nothing else
  changes), `truncated` (ints), and `hp`.
- `render(state) -> str`: the text view, laid out like `crl_jax.envs.render`: the message line, the
  9x9 egocentric crop (`chars_crop`) with trailing blanks stripped, then `Legend: ...` of the visible
  symbols (descriptions from NetHack itself, e.g. `d: jackal`).

NetHack is stateful: an adapter plays one game at a time, and `step` only accepts the latest state of
the current episode (an older one raises). Use one adapter per parallel game.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, replace

import numpy as np

from crl_jax.envs.adapters.common import DIR_NAMES, INVALID_MESSAGE, seed_to_int

VARIANTS = {
    "random": "MiniHack-Room-Random-5x5-v0",
    "dark": "MiniHack-Room-Dark-5x5-v0",
    "trap": "MiniHack-Room-Trap-5x5-v0",
    "monster": "MiniHack-Room-Monster-5x5-v0",
    "ultimate": "MiniHack-Room-Ultimate-5x5-v0",
}
# Short descriptions shared with the JAX envs' legend (crl_jax.envs.base.GLYPHS) where they overlap.
_CMAP_NAMES = {"floor of a room": "floor", "dark part of a room": "floor", "staircase down": "stairs down",
               "staircase up": "stairs up", "doorway": "doorway"}
_LEGEND_ORDER = "@.><^#"  # then everything else in order of first appearance
_BL_X, _BL_Y, _BL_HP = 0, 1, 10  # NLE blstats indices
_POOL_IDS = {"train": 0, "eval": 1}


def import_minihack():
    """Import gymnasium + minihack. minihack 1.0.2 imports `pkg_resources`, which setuptools >= 81 no
    longer ships; it only calls `resource_filename`, so a minimal stand-in is provided for the import
    and removed again afterwards (other libraries probing for pkg_resources still see it missing)."""
    shim = None
    if importlib.util.find_spec("pkg_resources") is None and "pkg_resources" not in sys.modules:
        shim = types.ModuleType("pkg_resources")

        def resource_filename(package, name):
            spec = importlib.util.find_spec(package)
            return os.path.join(os.path.dirname(spec.origin), name)

        shim.resource_filename = resource_filename
        sys.modules["pkg_resources"] = shim
    try:
        import gymnasium
        import minihack  # noqa: F401  (registers the MiniHack-* ids)
    finally:
        if shim is not None and sys.modules.get("pkg_resources") is shim:
            del sys.modules["pkg_resources"]
    return gymnasium


def _mix(*parts) -> int:
    """Deterministic 63-bit seed from integers (stable across processes, unlike `hash`)."""
    h = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


@dataclass(frozen=True)
class MiniHackState:
    """Host-side handle of one move of one game (read-only snapshot of what the agent saw)."""

    episode: int  # adapter-local episode counter (stale-state check)
    task: int
    t: int  # moves taken
    done: bool
    success: bool
    died: bool
    chars: np.ndarray  # [9, 9] uint8 ASCII of the crop, blanks for stone / unseen
    glyphs: np.ndarray  # [9, 9] int NLE glyph ids (for the legend)
    message: str
    pos: tuple[int, int]  # (row, col) of the agent on NetHack's 21x79 map
    hp: int


class MiniHackRoom:
    """Real MiniHack Room-5x5 (see module docstring). `variant` in `VARIANTS`."""

    is_host = True
    action_names = DIR_NAMES
    task_text = "Find the staircase down (>) and step on it."

    def __init__(self, variant: str = "ultimate", *, max_steps: int = 30, num_tasks: int | None = None,
                 pool: str = "train", pool_seed: int = 0):
        if variant not in VARIANTS:
            raise ValueError(f"MiniHackRoom: variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        if pool not in _POOL_IDS:
            raise ValueError(f"MiniHackRoom: pool must be 'train' or 'eval', got {pool!r}")
        gym = import_minihack()
        from nle import nethack

        self._nethack = nethack
        self.variant = variant
        self.env_id = VARIANTS[variant]
        self.max_steps = int(max_steps)
        self.pool, self.pool_seed = pool, int(pool_seed)
        self.num_tasks = int(num_tasks if num_tasks is not None else (1000 if pool == "train" else 200))
        if variant in ("monster", "ultimate"):
            self.task_text += " Beware of monsters: attack one by moving into it."
        # Our own step counter decides truncation; MiniHack's (100 by default) never triggers first.
        self._env = gym.make(self.env_id, observation_keys=("chars_crop", "glyphs_crop", "message", "blstats"))
        actions = self._env.unwrapped.actions
        compass = nethack.CompassDirection
        want = [compass.N, compass.E, compass.S, compass.W, compass.NE, compass.SE, compass.SW, compass.NW]
        self._action_ids = [actions.index(a) for a in want]  # our action -> index into MiniHack's actions
        self._success_status = self._env.unwrapped.StepStatus.TASK_SUCCESSFUL
        self._death_status = self._env.unwrapped.StepStatus.DEATH
        self._episode = 0
        self._latest = None

    # ---- seeds -----------------------------------------------------------------------------
    def level_seed(self, task: int) -> int:
        """NLE level-generator seed of `task`; train and eval pools use disjoint seed streams."""
        return _mix(self.pool_seed, _POOL_IDS[self.pool], int(task) % self.num_tasks)

    # ---- API ---------------------------------------------------------------------------------
    def reset(self, key_or_seed, task: int = 0) -> tuple[MiniHackState, str]:
        task = int(task) % self.num_tasks
        lgen = self.level_seed(task)
        core = _mix(seed_to_int(key_or_seed), lgen)
        self._env.unwrapped.seed(core, _mix(core, 1), reseed=False, lgen=lgen)
        obs, _ = self._env.reset()
        self._episode += 1
        state = self._snapshot(obs, task=task, t=0, done=False, success=False, died=False)
        self._latest = state
        return state, self.render(state)

    def step(self, state: MiniHackState, action) -> tuple[MiniHackState, str, float, bool, dict]:
        if state is not self._latest:
            raise ValueError("MiniHackRoom.step: stale state (NetHack is stateful: step the latest state of "
                             "the current episode; use one adapter per parallel game)")
        info = {"success": int(state.success), "died": int(state.died), "invalid": 0, "truncated": 0,
                "hp": state.hp}
        if state.done:  # absorbing, as in the JAX envs
            return state, self.render(state), 0.0, True, info
        t = state.t + 1
        truncated = t >= self.max_steps
        a = int(action) if np.ndim(action) == 0 else -1
        if not 0 <= a < len(self.action_names):
            new = replace(state, t=t, done=truncated, message=INVALID_MESSAGE)
            info.update(invalid=1, truncated=int(truncated))
        else:
            obs, _, terminated, _, env_info = self._env.step(self._action_ids[a])
            status = env_info.get("end_status")
            success = bool(terminated) and status == self._success_status
            died = bool(terminated) and not success
            if terminated and not np.any(obs["chars_crop"]):
                # NLE returns a blank view once the game is over: keep the last view, say what happened.
                msg = "There is a staircase down here." if success else "You die..."
                new = replace(state, t=t, done=True, success=success, died=died, message=msg)
            else:
                new = self._snapshot(obs, task=state.task, t=t, done=bool(terminated) or truncated,
                                     success=success, died=died)
            info.update(success=int(success), died=int(died), truncated=int(truncated and not terminated),
                        hp=new.hp)
        self._latest = new
        return new, self.render(new), float(new.success and not state.success), new.done, info

    def render(self, state: MiniHackState) -> str:
        rows = [bytes(r).decode("ascii", "replace").rstrip() for r in state.chars]
        legend = ", ".join(f"{c}: {d}" for c, d in self.legend(state))
        return "\n".join([state.message, *rows, "Legend: " + legend])

    def legend(self, state: MiniHackState) -> list[tuple[str, str]]:
        """(symbol, description) of each distinct visible symbol, `@ . > < ^ #` first."""
        nh = self._nethack
        found: dict[str, str] = {}
        h, w = state.chars.shape
        for i, (ch, g) in enumerate(zip(state.chars.reshape(-1), state.glyphs.reshape(-1))):
            c = chr(int(ch))
            if c == " " or c in found:
                continue
            # The crop is centred on the hero, whose glyph is its role's monster glyph.
            found[c] = "you" if (i == (h // 2) * w + w // 2 and c == "@") else self._describe(int(g), nh)
        order = {c: i for i, c in enumerate(_LEGEND_ORDER)}
        keys = sorted(found, key=lambda c: order.get(c, len(order)))  # stable: first appearance otherwise
        return [(c, found[c]) for c in keys]

    @staticmethod
    def _describe(g: int, nh) -> str:
        if nh.glyph_is_monster(g):
            return nh.permonst(nh.glyph_to_mon(g)).mname
        if nh.glyph_is_body(g):
            return nh.permonst(g - nh.GLYPH_BODY_OFF).mname + " corpse"
        if nh.glyph_is_cmap(g):  # includes traps
            text = nh.symdef.from_idx(g - nh.GLYPH_CMAP_OFF).explanation
            return _CMAP_NAMES.get(text, text)
        if nh.glyph_is_object(g):
            return "object"
        return "unknown"

    def close(self) -> None:
        self._env.close()

    # ---- internals ---------------------------------------------------------------------------
    def _snapshot(self, obs, *, task, t, done, success, died) -> MiniHackState:
        chars = np.array(obs["chars_crop"], np.uint8)
        chars[chars == 0] = ord(" ")  # the crop pads beyond the map with 0: draw it as stone
        bl = obs["blstats"]
        msg = bytes(obs["message"]).split(b"\x00", 1)[0].decode("ascii", "replace").strip()
        return MiniHackState(episode=self._episode, task=task, t=t, done=done, success=success, died=died,
                             chars=chars, glyphs=np.array(obs["glyphs_crop"]), message=msg,
                             pos=(int(bl[_BL_Y]), int(bl[_BL_X])), hp=int(bl[_BL_HP]))
