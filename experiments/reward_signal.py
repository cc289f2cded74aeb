"""Does the extractor's reward tell working entries from broken ones, and what does training retrieval hand out?

Steps one run of the tiny loop (built-in env, tiny models) one iteration at a time and, for every guided rollout
that retrieved an entry, records whether the entry replays to success on its level (before the step,
`actor.replay.entry_replays`), whether the rollout succeeded (the entry's +-1 credit), and whether the entry had
been credited before (tried). Prints 20-step windows:

    python experiments/reward_signal.py --seed 300 [--config F] [override ...]

P(success | entry works) far above P(success | entry broken) means each credited write carries a clean reward;
"tried before" near 0 means training retrieval hands out only untried entries (exploration), so guided training
success measures the extractor's fresh writes, not the bank's validated ones.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from crl_jax.actor.replay import can_replay, entry_replays  # noqa: E402
from crl_jax.config import load  # noqa: E402
from crl_jax.loop.runtime import build  # noqa: E402

it = importlib.import_module("crl_jax.loop.iteration")  # the module (`crl_jax.loop` exports its function)


def record(cfg):
    """[steps] dicts of [N] arrays: ok (the retrieved entry replays), used (a guided rollout with an entry),
    success, guided, tried (the entry had been credited before this step)."""
    rt = build(cfg)
    if not can_replay(rt):
        raise SystemExit("reward_signal needs the tiny models on a built-in environment")
    state = it.init_state(rt, jax.random.key(cfg.seed), cfg)

    @jax.jit
    def step(state):
        p = it.prepare(rt, state)
        slot = jnp.maximum(p.slots, 0)
        ok = (entry_replays(rt, p.bank) > 0.5)[slot]
        ep = rt.backend.play(rt, state, p, it.step_keys(state).roll)
        new, _ = it.finish(rt, state, p, ep)
        return new, dict(ok=ok, used=p.guided & p.has_exp, success=ep.success.astype(bool), guided=p.guided,
                         tried=p.bank.total_credit_count[slot] > 0)

    rows = []
    for _ in range(cfg.steps):
        state, r = step(state)
        rows.append({k: np.asarray(v, bool) for k, v in jax.device_get(r).items()})
    return rows


def windows(rows, width: int = 20) -> list[str]:
    """One line per `width` steps: P(success | entry works), P(success | entry broken), free success, the share
    of used entries that are broken and of used entries tried before (n = rollouts)."""
    out = []
    for a in range(0, len(rows), width):
        w = {k: np.concatenate([r[k] for r in rows[a:a + width]]) for k in rows[0]}
        s, used, ok = w["success"], w["used"], w["ok"]

        def p(m):
            return f"{s[m].mean():.2f} (n={int(m.sum())})" if m.any() else "-"

        share = lambda x: f"{x[used].mean():.2f}" if used.any() else "-"  # noqa: E731
        out.append(f"steps {a + 1}-{min(a + width, len(rows))}: P(success | entry works) {p(used & ok)}, "
                   f"P(success | entry broken) {p(used & ~ok)}, free {p(~w['guided'])}, "
                   f"used entries broken {share(~ok)}, tried before {share(w['tried'])}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "experiments", "configs", "default.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    a = ap.parse_args(argv)
    cfg = load(a.config, [f"seed={a.seed}", *a.overrides])
    print("\n".join(windows(record(cfg))))


if __name__ == "__main__":
    main()
