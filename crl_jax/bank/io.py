"""Host-side inspection of an experience bank: decode entries, print them, export JSON lines.

Text is decoded only here, at the edge (docs/ARCHITECTURE.md, "Principles"). Used by `crl-jax bank show / export`.
"""

from __future__ import annotations

import json
import warnings

import jax.numpy as jnp
import numpy as np

from crl_jax import bank as bank_lib
from crl_jax.bank import ExperienceBank
from crl_jax.config import ConfigError


def entry_records(bank: ExperienceBank, tokenizer, task: int | None = None) -> list[dict]:
    """One dict per valid entry (optionally of one task family), ordered by slot.

    Fields: slot, task, text, length, created_step, updated_step, times_retrieved, last_retrieved_step,
    source, insert_order, reward_mean (lifetime credit; None without credit),
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
        r_sum = float(b["total_credit_sum"][slot])
        r_cnt = int(b["total_credit_count"][slot])
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


HEADER = "crl_jax_bank_export"  # key of an export's first line: {HEADER: 1, "entries": N}


def export_jsonl(bank: ExperienceBank, tokenizer, path) -> int:
    """Write a header line `{HEADER: 1, "entries": N}` then one JSON object per valid entry (fields of
    `entry_records` plus its retrieval `key`) to `path`, through a temporary file (a killed export leaves no
    file); returns N. `load_jsonl` reads it back (method=offline) and refuses a file holding fewer or more
    entries than its header announces (cut short, or edited)."""
    from crl_jax.atomic import write_text_atomic

    recs = entry_records(bank, tokenizer)
    keys = np.asarray(bank.keys)
    lines = [json.dumps({HEADER: 1, "entries": len(recs)})]
    lines += [json.dumps(dict(r, key=[round(float(x), 7) for x in keys[r["slot"]]]), ensure_ascii=False) for r in recs]
    write_text_atomic(str(path), "\n".join(lines) + "\n")
    return len(recs)


class BankFileWarning(UserWarning):
    """An offline bank file loaded with a caveat (empty, texts cut to `bank.entry_len`, more entries than
    `bank.capacity`); the message names the file and the counts."""


def _bank_error(path, line: int | None, msg: str):
    where = f"{path}:{line}" if line else str(path)
    return ConfigError(f"bank.offline_path: {where}: {msg}")


def _read_lines(path) -> list[str]:
    """The file's lines as text; a byte sequence that is not UTF-8 is reported with its line number."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise FileNotFoundError(f"offline bank file {path!r} cannot be read: {e}") from None
    lines = data.split(b"\n")
    out = []
    for i, raw in enumerate(lines, 1):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _bank_error(path, i, f"not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
    if out and out[-1] == "":
        out.pop()
    return out


def parse_entry(path, i: int, line: str, key_dim: int, num_tasks: int | None = None) -> tuple[str, int, np.ndarray]:
    """(text, task, key [key_dim] float32) of one JSON line, or a one-line ConfigError naming file and line;
    `task` must be below `num_tasks` (the run's training tasks) when it is given.

    `key` is required: retrieval queries are embeddings of a task's text plus its first observation, which a
    line of text cannot reproduce, so an entry keyed by its own text would never be retrieved."""
    try:
        r = json.loads(line)  # NaN / Infinity parse as floats: rejected below
    except json.JSONDecodeError as e:
        raise _bank_error(path, i, f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(r, dict):
        raise _bank_error(path, i, f"expected a JSON object, got {type(r).__name__}")
    text = r.get("text")
    if not isinstance(text, str):
        raise _bank_error(path, i, "needs a string `text`")
    task = r.get("task", 0)
    if isinstance(task, bool) or not isinstance(task, int) or task < 0:
        raise _bank_error(path, i, f"`task` must be a non-negative integer, got {task!r}")
    if num_tasks is not None and task >= num_tasks:
        raise _bank_error(path, i, f"`task` {task} is not a task of this run (env.num_train_tasks={num_tasks}: "
                                   f"0..{num_tasks - 1}); its entry could never be retrieved")
    if task >= 2**31:
        raise _bank_error(path, i, f"`task` {task} is out of range (at most {2**31 - 1})")
    if "key" not in r:
        raise _bank_error(path, i, "no `key`: an entry's key is the embedding of its task text + first observation "
                                   "(what queries are), which its text alone cannot give; write bank files with "
                                   "`crl-jax bank export`, which stores each entry's key")
    k = r["key"]
    if not isinstance(k, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in k):
        raise _bank_error(path, i, "`key` must be a list of numbers")
    key = np.asarray(k, np.float32)
    if key.shape != (key_dim,):
        raise _bank_error(path, i, f"key has {key.shape[0]} dims, the bank uses {key_dim} (bank.key_dim)")
    if not np.isfinite(key).all():
        raise _bank_error(path, i, "key holds NaN or infinite values")
    return text, task, key


def _entry_lines(path) -> list[tuple[int, str]]:
    """(line number, text) of the entry lines of a bank file; an export's header line is checked against the
    entries that follow it (a file cut between complete lines is refused, naming the counts)."""
    lines = [(i, line) for i, line in enumerate(_read_lines(path), 1) if line.strip()]
    if not lines:
        return lines
    try:
        head = json.loads(lines[0][1])
    except json.JSONDecodeError:
        return lines
    if not (isinstance(head, dict) and HEADER in head):
        return lines  # a hand-written file: no header, nothing to count against
    n = head.get("entries")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise _bank_error(path, lines[0][0], f"the header's `entries` must be a count, got {n!r}")
    if len(lines) - 1 != n:
        raise _bank_error(path, None, f"holds {len(lines) - 1} entries, its header announces {n}: the file was cut "
                                      "short or edited; export it again (`crl-jax bank export`)")
    return lines[1:]


def load_jsonl(bank: ExperienceBank, tokenizer, path, embedder=None, num_tasks: int | None = None) -> ExperienceBank:
    """Add the entries of a JSON-lines file (as written by `export_jsonl`) to `bank`, in file order.

    Each line needs `text` and `key` (a list of `bank.key_dim` finite floats); `task` (a non-negative
    integer below `num_tasks` when given) defaults to 0; an export's header line must count the entries. A
    bad line raises `ConfigError` naming the file and line; an empty file, texts
    longer than `bank.entry_len` tokens and more entries than `bank.capacity` give a `BankFileWarning` with
    the counts. `embedder` is not used (an entry's key cannot be computed from its text; see `parse_entry`).
    """
    del embedder
    entries = [parse_entry(path, i, line, bank.key_dim, num_tasks) for i, line in _entry_lines(path)]
    if not entries:
        warnings.warn(f"offline bank file {path} holds no entries: the bank starts empty", BankFileWarning,
                      stacklevel=2)
    cut = 0
    for text, task, key in entries:
        ids = tokenizer.encode(text)
        cut += len(ids) > bank.entry_len
        ids = ids[: bank.entry_len]
        tokens = np.zeros((bank.entry_len,), np.int32)
        tokens[: len(ids)] = ids
        bank, _ = bank_lib.add(bank, jnp.asarray(tokens), jnp.int32(len(ids)), jnp.asarray(key),
                               jnp.int32(task), jnp.int32(-1), jnp.int32(-1))
    if cut:
        warnings.warn(f"offline bank file {path}: {cut} of {len(entries)} entries cut to bank.entry_len="
                      f"{bank.entry_len} tokens", BankFileWarning, stacklevel=2)
    if len(entries) > bank.capacity:
        warnings.warn(f"offline bank file {path}: {len(entries)} entries for bank.capacity={bank.capacity}: the "
                      f"first {len(entries) - bank.capacity} were overwritten (FIFO)",
                      BankFileWarning, stacklevel=2)
    return bank
