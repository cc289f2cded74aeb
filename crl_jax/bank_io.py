"""Host-side inspection of an experience bank: decode entries, print them, export JSON lines.

Text is decoded only here, at the edge (DESIGN.md principle 3). Used by `crl-jax bank show / export`.
"""

from __future__ import annotations

import json

import numpy as np

from crl_jax.bank import ExperienceBank


def entry_records(bank: ExperienceBank, tokenizer, task: int | None = None) -> list[dict]:
    """One dict per valid entry (optionally of one task family), ordered by slot.

    Fields: slot, task, text, length, created_step, updated_step, times_retrieved, last_retrieved_step,
    source, insert_order, reward_mean (lifetime plus any not-yet-taken credit; None without credit),
    reward_count.
    """
    b = {k: np.asarray(v) for k, v in vars(bank).items()}
    if b["valid"].ndim != 1:
        raise ValueError(f"entry_records expects one bank, got a batch of shape {b['valid'].shape}")
    records = []
    for slot in np.flatnonzero(b["valid"]):
        if task is not None and int(b["task"][slot]) != int(task):
            continue
        length = int(b["lengths"][slot])
        ids = [int(t) for t in b["tokens"][slot][: max(length, 0)]]
        r_sum = float(b["total_credit_sum"][slot] + b["credit_sum"][slot])
        r_cnt = int(b["total_credit_count"][slot] + b["credit_count"][slot])
        records.append(dict(
            slot=int(slot), task=int(b["task"][slot]), text=tokenizer.decode(ids), length=length,
            created_step=int(b["created_step"][slot]), updated_step=int(b["updated_step"][slot]),
            times_retrieved=int(b["times_retrieved"][slot]),
            last_retrieved_step=int(b["last_retrieved_step"][slot]), source=int(b["source"][slot]),
            insert_order=int(b["insert_order"][slot]),
            reward_mean=(r_sum / r_cnt) if r_cnt else None, reward_count=r_cnt))
    return records


def format_entries(bank: ExperienceBank, tokenizer, task: int | None = None, top: int | None = None) -> str:
    """Human-readable listing, most retrieved first (ties: oldest insert first); `top` limits the count."""
    recs = sorted(entry_records(bank, tokenizer, task), key=lambda r: (-r["times_retrieved"], r["insert_order"]))
    total = len(recs)
    if top is not None:
        recs = recs[: max(int(top), 0)]
    scope = "all task families" if task is None else f"task family {task}"
    lines = [f"experience bank: {total} valid entries of {bank.capacity} slots ({scope}); showing {len(recs)}"]
    for r in recs:
        reward = "-" if r["reward_mean"] is None else f"{r['reward_mean']:+.3f} (n={r['reward_count']})"
        lines.append(
            f"[slot {r['slot']}] task={r['task']} retrieved={r['times_retrieved']} "
            f"last={r['last_retrieved_step']} reward={reward} created={r['created_step']} "
            f"updated={r['updated_step']} source={r['source']}")
        lines.extend("    " + line for line in (r["text"].splitlines() or [""]))
    return "\n".join(lines) + "\n"


def export_jsonl(bank: ExperienceBank, tokenizer, path) -> int:
    """Write one JSON object per valid entry (fields of `entry_records`) to `path`; returns the count."""
    recs = entry_records(bank, tokenizer)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    return len(recs)
