"""`room`: the MiniHack Room-5x5 family (Random / Dark / Trap / Monster / Ultimate) in pure JAX.

Level (the task): an open 5x5 room surrounded by solid stone; distinct random start (drawn as `<`,
the up staircase), stairs down `>`, teleport-trap cell and monster cells.

Dynamics of one move (8 compass directions):
- into stone: the agent stays ("It's solid stone."); onto a monster: a bare-handed attack (hit prob
  `AGENT_HIT`, damage 1d4 + d6-1 martial-arts bonus; monster hit points 1d4, so one hit usually kills);
- onto the stairs: success, reward 1, the episode ends (MiniHack ends navigation tasks on `>`);
- onto the teleport trap (`traps=True`): the trap becomes visible (`^`) and the agent is teleported to a
  uniformly random room cell free of monsters and traps (possibly the stairs: a success);
- `dark=True`: only the agent's 8 neighbours are visible; floor, stairs and the trap stay drawn once
  seen (as MiniHack remembers them); monsters are drawn only while adjacent;
- then each live monster acts with probability speed / 16 (a calibrated rate: MiniHack's hero is a
  speed-12 Rogue, but bumping into stone takes no game time there): adjacent -> attack (hit prob `MON_HIT`, damage 1..`dmg`; a lichen's touch makes the agent stick
  to it: moves away fail until it dies), else a step that brings it closer (grid bugs move orthogonally
  only). Hit points reach 0 -> "You die...", the episode ends with reward 0.

The monster kinds and weights approximate NetHack's random level-1 generation (`MONSTER: random`):
jackals, grid bugs and sewer rats come as a pair half of the time (NetHack small groups).
The real MiniHack Room is the reference; see the calibration test of the adapters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from crl_jax.envs.base import (DIR_NAMES, DIRS, G_AGENT, G_BLANK, G_DOWN, G_FLOOR, G_MONSTER0, G_TRAP,
                               G_UP, MSG_NONE, Env, Obs, categorical_u, cell_mask, egocentric_crop, randint_u,
                               sample_cells)

# name, glyph id, speed (NetHack units), max damage, sticky, orthogonal-only moves, P(pair), weight.
# Weights are the kind frequencies seen in 400 resets of the real MiniHack-Room-Monster-5x5-v0; small
# groups (jackal, grid bug, sewer rat) had a second member in about half of the levels.
MONSTERS = (
    ("newt", G_MONSTER0 + 0, 6, 3, False, False, 0.0, 96),
    ("jackal", G_MONSTER0 + 1, 12, 2, False, False, 0.5, 91),
    ("grid bug", G_MONSTER0 + 2, 12, 1, False, True, 0.5, 64),
    ("lichen", G_MONSTER0 + 3, 1, 0, True, False, 0.0, 56),
    ("sewer rat", G_MONSTER0 + 4, 12, 3, False, False, 0.5, 24),
    ("kobold", G_MONSTER0 + 5, 6, 4, False, False, 0.0, 17),
    ("goblin", G_MONSTER0 + 6, 6, 3, False, False, 0.0, 28),
    ("kobold zombie", G_MONSTER0 + 7, 6, 4, False, False, 0.0, 24),
)
MON_GLYPH = np.array([m[1] for m in MONSTERS], np.int32)
MON_MOVE_P = np.array([m[2] / 16.0 for m in MONSTERS], np.float32)
MON_DMG = np.array([m[3] for m in MONSTERS], np.int32)
MON_STICKY = np.array([m[4] for m in MONSTERS], bool)
MON_ORTH = np.array([m[5] for m in MONSTERS], bool)
MON_PAIR_P = np.array([m[6] for m in MONSTERS], np.float32)
MON_WEIGHT = np.array([m[7] for m in MONSTERS], np.float32)
AGENT_HP = 12  # the MiniHack hero's starting hit points (measured)
AGENT_HIT = 0.9
MON_HIT = 0.75
NM = 2  # monster slots

# Message templates; "{m}" expands to every monster name (one message id per name).
_TEMPLATES = ("You hit the {m}.", "You miss the {m}.", "You kill the {m}!", "The {m} bites!",
              "The {m} misses!", "You cannot escape from the {m}!", "The {m} touches you! You are stuck.")
_FIXED = ("Hello Agent, welcome to the room!", "It's solid stone.", "There is a staircase down here.",
          "You step onto a teleportation trap!", "You die...")
ROOM_MESSAGES = _FIXED + tuple(t.format(m=m[0]) for t in _TEMPLATES for m in MONSTERS)


def _tmsg(template: int, kind) -> jax.Array:
    """Message id of template `template` for monster `kind` (offset by the 2 common messages)."""
    return 2 + len(_FIXED) + template * len(MONSTERS) + kind


@struct.dataclass
class RoomLevel:
    start: jax.Array  # [2] int32
    stairs: jax.Array  # [2]
    trap: jax.Array  # [2] (unused when traps=False)
    mon_kind: jax.Array  # [] int32
    mon_pos: jax.Array  # [NM, 2]
    mon_alive: jax.Array  # [NM] bool
    mon_hp: jax.Array  # [NM] int32


@struct.dataclass
class RoomState:
    key: jax.Array
    t: jax.Array
    done: jax.Array
    success: jax.Array
    msg: jax.Array  # [2]
    level: RoomLevel
    pos: jax.Array  # [2]
    hp: jax.Array
    stuck: jax.Array
    seen: jax.Array  # [S, S] bool
    trap_seen: jax.Array
    mon_pos: jax.Array  # [NM, 2]
    mon_alive: jax.Array  # [NM]
    mon_hp: jax.Array  # [NM]


def _cheb(a, b):
    return jnp.max(jnp.abs(a - b), axis=-1)


class Room(Env):
    name = "room"
    action_names = DIR_NAMES
    env_messages = ROOM_MESSAGES
    task_text = "Find the staircase down (>) and step on it."

    def __init__(self, *, dark: bool = False, traps: bool = False, monster: bool = False, size: int = 5,
                 crop: int = 9, max_steps: int = 30, **kw):
        super().__init__(max_steps=max_steps, **kw)
        if size < 3:
            raise ValueError(f"room: size must be >= 3, got {size}")
        if crop < 0 or (crop and crop % 2 == 0):
            raise ValueError(f"room: crop must be 0 (whole room) or odd, got {crop}")
        self.dark, self.traps, self.monster, self.size, self.crop = bool(dark), bool(traps), bool(monster), size, crop
        if monster:
            self.task_text += " Beware of monsters: attack one by moving into it."

    # ---- task generation -------------------------------------------------------------------
    def generate(self, key) -> RoomLevel:
        s = self.size
        u = jax.random.uniform(key, (s * s + 4,))
        cells = sample_cells(u[: s * s], jnp.ones((s, s), bool), 5)
        kind = categorical_u(u[s * s], MON_WEIGHT)
        pair = u[s * s + 1] < jnp.asarray(MON_PAIR_P)[kind]
        alive = jnp.array([True, False]) | (pair & jnp.array([False, True]))
        alive = alive & self.monster
        hp = randint_u(u[s * s + 2: s * s + 4], 1, 5)
        trap = cells[2] if self.traps else jnp.array([-1, -1], jnp.int32)
        return RoomLevel(start=cells[0], stairs=cells[1], trap=trap, mon_kind=jnp.where(self.monster, kind, 0),
                         mon_pos=jnp.where(alive[:, None], cells[3:5], -1), mon_alive=alive,
                         mon_hp=jnp.where(alive, hp, 0))

    def level_code(self, lv: RoomLevel):
        return jnp.concatenate([lv.start, lv.stairs, lv.trap, lv.mon_kind[None], lv.mon_pos.reshape(-1),
                                lv.mon_hp]).astype(jnp.int32)

    def init_state(self, level: RoomLevel, key) -> RoomState:
        s = self.size
        state = RoomState(key=key, t=jnp.int32(0), done=jnp.bool_(False), success=jnp.bool_(False),
                          msg=jnp.array([2, MSG_NONE], jnp.int32), level=level, pos=level.start,
                          hp=jnp.int32(AGENT_HP), stuck=jnp.bool_(False), seen=jnp.zeros((s, s), bool),
                          trap_seen=jnp.bool_(False), mon_pos=level.mon_pos, mon_alive=level.mon_alive,
                          mon_hp=level.mon_hp)
        return state.replace(seen=self._visible(state.pos))

    def _visible(self, pos):
        s = self.size
        if not self.dark:
            return jnp.ones((s, s), bool)
        rows = jnp.arange(s)[:, None]
        cols = jnp.arange(s)[None, :]
        return (jnp.abs(rows - pos[0]) <= 1) & (jnp.abs(cols - pos[1]) <= 1)

    # ---- dynamics ----------------------------------------------------------------------------
    def _transition(self, st: RoomState, action, key):
        s, lv = self.size, st.level
        # All randomness of the step in one draw: [agent hit, damage x2, teleport cell x S*S,
        # then per monster: act, hit, damage, move noise x 8].
        u = jax.random.uniform(key, (3 + s * s + NM * 11,))
        um = u[3 + s * s:].reshape(NM, 11)
        kind = lv.mon_kind
        d = jnp.asarray(DIRS)[action]
        target = st.pos + d
        in_room = jnp.all((target >= 0) & (target < s))
        at_target = st.mon_alive & jnp.all(st.mon_pos == target, axis=-1)  # [NM]
        attack = jnp.any(at_target)
        blocked_stuck = st.stuck & ~attack & in_room
        move = in_room & ~attack & ~st.stuck
        # The agent's attack.
        hit = u[0] < AGENT_HIT
        dmg = randint_u(u[1], 1, 5) + randint_u(u[2], 0, 6)
        mon_hp = st.mon_hp - jnp.where(at_target & hit, dmg, 0)
        killed = at_target & hit & (mon_hp <= 0)
        mon_alive = st.mon_alive & ~killed
        stuck = st.stuck & jnp.any(mon_alive)
        # The agent's move, the trap.
        pos = jnp.where(move, target, st.pos)
        on_trap = self.traps & move & jnp.all(pos == lv.trap)
        # NetHack's teleport never lands on a monster or a trap.
        occupied = cell_mask((s, s), lv.trap) if self.traps else jnp.zeros((s, s), bool)
        for i in range(NM):
            occupied = occupied | (cell_mask((s, s), st.mon_pos[i]) & mon_alive[i])
        tele = sample_cells(u[3:3 + s * s], ~occupied, 1)[0]
        pos = jnp.where(on_trap, tele, pos)
        trap_seen = st.trap_seen | on_trap
        success = jnp.all(pos == lv.stairs)
        seen = st.seen | self._visible(pos)
        msg0 = jnp.select(
            [~in_room, blocked_stuck, killed.any(), attack & hit, attack, on_trap, success],
            [2 + 1, _tmsg(5, kind), _tmsg(2, kind), _tmsg(0, kind), _tmsg(1, kind), 2 + 3, 2 + 2],
            MSG_NONE).astype(jnp.int32)
        # Monsters' turn (skipped once the agent stands on the stairs).
        hp, msg1, mon_pos = st.hp, jnp.int32(MSG_NONE), st.mon_pos
        for i in range(NM):
            acts = mon_alive[i] & ~success & (hp > 0) & (um[i, 0] < jnp.asarray(MON_MOVE_P)[kind])
            diff = jnp.abs(mon_pos[i] - pos)
            orth = jnp.asarray(MON_ORTH)[kind]
            adjacent = jnp.where(orth, jnp.sum(diff) == 1, jnp.max(diff) == 1)
            m_attack = acts & adjacent
            m_hit = m_attack & (um[i, 1] < MON_HIT)
            sticky = jnp.asarray(MON_STICKY)[kind]
            m_dmg = randint_u(um[i, 2], 1, jnp.maximum(jnp.asarray(MON_DMG)[kind], 1) + 1)
            hp = hp - jnp.where(m_hit & ~sticky, m_dmg, 0)
            stuck = stuck | (m_hit & sticky)
            msg1 = jnp.where(m_attack, jnp.where(m_hit, jnp.where(sticky, _tmsg(6, kind), _tmsg(3, kind)),
                                                 _tmsg(4, kind)), msg1)
            # Step towards the agent: the free neighbour closest to it, if closer than now.
            cand = mon_pos[i][None, :] + jnp.asarray(DIRS)  # [8, 2]
            ok = jnp.all((cand >= 0) & (cand < s), axis=-1) & ~jnp.all(cand == pos, axis=-1)
            ok = ok & jnp.where(orth, jnp.arange(8) < 4, True)
            for j in range(NM):
                if j != i:
                    ok = ok & ~(mon_alive[j] & jnp.all(cand == mon_pos[j], axis=-1))
            dist = jnp.sum((cand - pos) ** 2, axis=-1).astype(jnp.float32)
            score = jnp.where(ok, -dist + 0.1 * um[i, 3:], -jnp.inf)
            best = jnp.argmax(score)
            closer = ok[best] & (dist[best] < jnp.sum((mon_pos[i] - pos) ** 2))
            new_p = jnp.where(acts & ~adjacent & closer, cand[best], mon_pos[i])
            mon_pos = mon_pos.at[i].set(new_p)
        died = hp <= 0
        msg1 = jnp.where(died, 2 + 4, msg1)
        state = st.replace(pos=pos, hp=hp, stuck=stuck & ~died, seen=seen, trap_seen=trap_seen,
                           mon_pos=mon_pos, mon_alive=mon_alive, mon_hp=mon_hp)
        reward = success.astype(jnp.float32)
        return state, reward, success | died, success, jnp.stack([msg0, msg1]).astype(jnp.int32)

    # ---- observation -------------------------------------------------------------------------
    def glyph_map(self, st: RoomState) -> jax.Array:
        """[S, S] glyph ids of the room as the agent currently sees / remembers it."""
        s, lv = self.size, st.level
        g = jnp.full((s, s), G_FLOOR, jnp.int32)
        g = jnp.where(cell_mask((s, s), lv.start), G_UP, g)
        g = jnp.where(cell_mask((s, s), lv.stairs), G_DOWN, g)
        if self.traps:
            g = jnp.where(cell_mask((s, s), lv.trap) & st.trap_seen, G_TRAP, g)
        g = jnp.where(st.seen, g, G_BLANK)
        visible = self._visible(st.pos)
        for i in range(NM):
            m = cell_mask((s, s), st.mon_pos[i]) & st.mon_alive[i] & visible
            g = jnp.where(m, jnp.asarray(MON_GLYPH)[lv.mon_kind], g)
        return jnp.where(cell_mask((s, s), st.pos), G_AGENT, g)

    def observe(self, st: RoomState) -> Obs:
        g = self.glyph_map(st)
        grid = egocentric_crop(g, st.pos, self.crop) if self.crop else g
        return Obs(grid=grid, message=st.msg)
