"""`crl-jax bank replay RUN`: do the bank's entries work, and does evaluation show the ones that do?

Four parts, all on the run's newest checkpoint (tiny models on a built-in environment, where an entry's moves
replay open-loop, `crl_jax.actor.replay`):

- tried: how many valid entries have been credited by a guided rollout (only those have rewarded the extractor
  sample that wrote them), how many of those replay to success, and how often the sampled guided rollouts that used
  them succeeded, for those and for the others (set against free success, what the extractor's reward compares);
- levels (fixed levels only): how many training levels have an entry that replays, and the held-in greedy
  evaluation played twice, with evaluation's own pick and with its pick among the entries that replay (the
  broken ones left out; a level with none plays without experience). The first count is the final
  `eval_heldin_with_exp` times the number of levels; the gap between the two is what evaluation loses to the entry
  it shows, not to what the bank holds or to how the actor follows a working plan;
- by last write: the valid entries split by the quarter of the run in which they were last written, how many
  replay (and the FACT share): whether what the extractor writes now works better than what it wrote early on,
  which the bank's overall share mixes;
- bank: how many valid entries replay to success (the forms' FACT and MOVES entries apart).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.actor.evaluate import greedy_success, pool_retrieval
from crl_jax.actor.replay import can_replay, entry_levels, entry_replays, level_queries
from crl_jax.config import ConfigError
from crl_jax.envs.compact import is_fact


def write_spans(updated, valid, ok, fact, steps: int, parts: int = 4) -> list[tuple]:
    """Valid entries split by the iteration of their last write into `parts` equal spans of a run of `steps`
    iterations (`updated`: the bank's 0-based `updated_step`) -> [(first, last iteration (1-based), entries,
    replay share, FACT share)] (NaN shares for an empty span)."""
    edges = [i * steps // parts for i in range(parts + 1)]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = valid & (updated >= lo) & (updated < hi)
        n = int(m.sum())
        rows.append((int(lo) + 1, int(hi), n, float(ok[m].mean()) if n else float("nan"),
                     float(fact[m].mean()) if n else float("nan")))
    return rows


def entry_outcomes(rt, bank) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(valid [N] bool, replay success [N] float, FACT entry [N] bool; all False without the entry forms) of a
    bank's slots."""
    if not can_replay(rt):
        raise ConfigError("bank replay replays the tiny models' entries on a built-in environment; this run has none")
    ok = np.asarray(jax.jit(lambda b: entry_replays(rt, b))(bank))
    valid = np.asarray(bank.valid, bool)
    fact = (np.asarray(is_fact(bank.tokens, bank.lengths, rt.tiny.row_ids), bool) if rt.tiny.row_ids is not None
            else np.zeros_like(valid))
    return valid, ok, fact


def bank_replay_report(rt, state) -> str:
    """The `bank replay` lines of a restored run's state (see the module doc)."""
    bank = state.bank
    valid, ok, fact = entry_outcomes(rt, bank)

    def line(name, m):
        n = int(m.sum())
        share = ok[m].mean() if n else float("nan")
        return f"{name}: {n} entries, {float(ok[m].sum()):.1f} replay to success ({share:.3f})"

    cnt, tot = np.asarray(bank.total_credit_count), np.asarray(bank.total_credit_sum)
    tried = valid & (cnt > 0)  # entries whose write has earned a reward

    def uses(m):  # guided uses of the entries in m that succeeded (each +-1 credit is one use), of all
        return f"{(tot[m].sum() + cnt[m].sum()) / 2:.0f} of {int(cnt[m].sum())}"

    works = ok > 0.5
    rows = [f"tried: {int(tried.sum())} of {int(valid.sum())} entries have guided a rollout, "
            f"{float(ok[tried].sum()):.1f} of them replay to success; guided uses that succeed: "
            f"{uses(tried & works)} with those, {uses(tried & ~works)} with the others"]
    if valid.any() and not getattr(rt.env, "episode_layouts", False):
        rows += level_rows(rt, state, works)
    steps = int(state.step)
    if steps >= 4:
        forms = rt.tiny.row_ids is not None
        spans = [f"{lo}-{hi}: {n} entries, {r:.2f} replay" + (f" (FACT {f:.2f})" if forms else "")
                 for lo, hi, n, r, f in write_spans(np.asarray(bank.updated_step), valid, ok, fact, steps)]
        rows.append("by last write, iterations " + "; ".join(spans))
    rows.append(line("bank", valid))
    if rt.tiny.row_ids is not None:
        rows += ["  " + line("FACT", valid & fact), "  " + line("MOVES", valid & ~fact)]
    return "\n".join(rows)


def level_rows(rt, state, works) -> list[str]:
    """The levels part on fixed levels: `works` [N] bool, each entry replays to success on its level."""
    bank = state.bank
    _, _, q_levels = level_queries(rt)
    level = np.asarray(entry_levels(bank.keys, q_levels))
    good = np.asarray(bank.valid, bool) & works
    covered = np.zeros(rt.env.num_tasks, bool)
    covered[level[good]] = True

    @jax.jit
    def held_in(state, works):
        env, renderer, key, tasks, tt, tl, slot, *pick = pool_retrieval(rt, state, False, state.bank)
        alt = pool_retrieval(rt, state, False, state.bank.replace(valid=state.bank.valid & works))[7:]
        return greedy_success(rt, state, env, renderer, key, tasks, tt, tl, [tuple(pick), alt]), slot, pick[2]

    s, slot, has = map(np.asarray, held_in(state, jnp.asarray(works)))
    n = s.shape[1]
    replays = has & works[np.maximum(slot, 0)]
    return [f"levels: {int(covered.sum())} of {covered.size} training levels have an entry that replays to success",
            f"held-in, greedy with experience: {int(s[0].sum())} of {n} levels succeed with evaluation's pick "
            f"({int(replays.sum())} of the picks replay); {int(s[1].sum())} of {n} with its pick among the entries "
            f"that replay"]
