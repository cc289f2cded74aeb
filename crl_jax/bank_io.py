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
    """Write one JSON object per valid entry (fields of `entry_records` plus its retrieval `key`) to `path`;
    returns the count. `load_jsonl` reads it back (method=offline)."""
    recs = entry_records(bank, tokenizer)
    keys = np.asarray(bank.keys)
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            r = dict(r, key=[round(float(x), 7) for x in keys[r["slot"]]])
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(recs)


def load_jsonl(bank: ExperienceBank, tokenizer, path, embedder=None) -> ExperienceBank:
    """Add the entries of a JSON-lines file (as written by `export_jsonl`) to `bank`, in file order.

    Each line needs `text`; `task` defaults to 0; `key` (a list of `bank.key_dim` floats) defaults to
    `embedder` applied to the text. Malformed lines raise ValueError naming the file and line.
    """
    import jax.numpy as jnp

    from crl_jax import bank as bank_lib

    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        raise FileNotFoundError(f"offline bank file {path!r} cannot be read: {e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            text = r["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a bank entry ({e})") from None
        ids = tokenizer.encode(text)[: bank.entry_len]
        tokens = np.zeros((bank.entry_len,), np.int32)
        tokens[: len(ids)] = ids
        if "key" in r:
            key = np.asarray(r["key"], np.float32)
            if key.shape != (bank.key_dim,):
                raise ValueError(f"{path}:{i}: key has {key.shape[0]} dims, the bank uses {bank.key_dim}")
        elif embedder is not None:
            key = np.asarray(embedder(jnp.asarray(tokens), jnp.int32(len(ids))))
        else:
            raise ValueError(f"{path}:{i}: no key and no embedder to compute one")
        bank, _ = bank_lib.add(bank, jnp.asarray(tokens), jnp.int32(len(ids)), jnp.asarray(key),
                               jnp.int32(r.get("task", 0)), jnp.int32(-1), jnp.int32(-1))
    return bank
