"""Per-step metrics that show whether the extractor learns (pure functions of one step's data).

An extractor that learns from its reward should write more from successful episodes than from failed
ones (`op_rates`), hand the actor entries that have helped before (`positive_credit_share`), and grow
more decided about its operation (the op token's entropy, `extractor.distill.op_entropy`); the bank's
replay success (`actor.replay`) says whether what it writes works at all. With the entry forms
(`extraction.forms`) the share of FACT writes (`fact_shares`) says which form it has come to write.
"""

from __future__ import annotations

import jax.numpy as jnp


def _rate(count, m):
    m = m.astype(jnp.float32)
    return jnp.where(m.sum() > 0, jnp.sum(count.astype(jnp.float32) * m) / jnp.maximum(m.sum(), 1.0), jnp.nan)


def op_rates(adds, updates, success, mask) -> dict:
    """ADDs and UPDATEs written per distilled episode (`mask` [N]), on successful and on failed episodes
    separately (`success` [N]); `adds` / `updates` [N]: the operations written from each episode. NaN where a
    side has no episode."""
    ok = success.astype(bool) & mask.astype(bool)
    bad = ~success.astype(bool) & mask.astype(bool)
    return {"ops_add_rate_success": _rate(adds, ok), "ops_add_rate_fail": _rate(adds, bad),
            "ops_update_rate_success": _rate(updates, ok), "ops_update_rate_fail": _rate(updates, bad)}


def positive_credit_share(bank, slots, has_exp) -> jnp.ndarray:
    """[] share of this step's retrievals (`has_exp` [N], entries `slots` [N]) whose entry's lifetime credit
    (the sum of the +-1 outcomes it guided, before this step's) is positive; NaN when nothing was retrieved."""
    pos = bank.total_credit_sum[jnp.maximum(slots, 0)] > 0
    return _rate(pos, has_exp)


def fact_shares(facts, writes) -> dict:
    """Per-step form metrics from per-episode FACT writes `facts` [N] and all writes `writes` [N] (int):
    `forms_fact` (FACT entries written) and `forms_fact_share` (their share of the writes; NaN without one)."""
    nf = jnp.sum(facts).astype(jnp.float32)
    nw = jnp.sum(writes).astype(jnp.float32)
    return {"forms_fact": nf, "forms_fact_share": jnp.where(nw > 0, nf / jnp.maximum(nw, 1.0), jnp.nan)}
