"""Bank inspection at the edge: decode, format, export JSON lines."""

import json

import jax
import jax.numpy as jnp

from crl_jax import bank as B
from crl_jax.bank.io import entry_records, export_jsonl, format_entries
from crl_jax.text.tokenizers import ByteTokenizer

L = 24


def _bank(tok):
    texts = ["go north", "avoid the trap", "unicode ok: é→"]
    ids = [tok.encode(t) for t in texts]
    toks = jnp.array([i + [tok.pad_id] * (L - len(i)) for i in ids], jnp.int32)
    bank = B.init(4, L, 2)
    bank, _ = jax.jit(B.add_many)(bank, toks, jnp.array([len(i) for i in ids]), jnp.eye(3, 2), jnp.array([0, 1, 0]),
                                  2, jnp.array([5, 6, 7]), jnp.ones(3, bool))
    bank = bank.replace(times_retrieved=jnp.array([1, 4, 4, 0]))
    return B.credit(bank, jnp.array([0.0, 0.0, 1.0, 0.0]), jnp.array([0, 2, 1, 0]))  # slot 1: +1 and -1


def test_records_and_format():
    tok = ByteTokenizer()
    bank = _bank(tok)
    recs = entry_records(bank, tok)
    assert [r["text"] for r in recs] == ["go north", "avoid the trap", "unicode ok: é→"]
    assert [r["reward_mean"] for r in recs] == [None, 0.0, 1.0] and [r["reward_count"] for r in recs] == [0, 2, 1]
    assert [r["source"] for r in recs] == [5, 6, 7] and recs[0]["created_step"] == 2
    out = format_entries(bank, tok, top=2)
    assert out.startswith("experience bank: 3 valid entries of 4 slots (all task families); showing 2")
    assert out.index("avoid the trap") < out.index("unicode ok") and "go north" not in out  # most retrieved first
    assert "reward=+0.000 (n=2)" in out
    only0 = format_entries(bank, tok, task=0)
    assert "avoid" not in only0 and "go north" in only0 and "2 valid entries" in only0


def test_export_jsonl(tmp_path):
    tok = ByteTokenizer()
    path = tmp_path / "bank.jsonl"
    assert export_jsonl(_bank(tok), tok, path) == 3
    head, *rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert head == {"crl_jax_bank_export": 1, "entries": 3}  # a copy cut between lines is refused on load
    assert [r["slot"] for r in rows] == [0, 1, 2] and rows[2]["text"] == "unicode ok: é→"
    assert rows[1]["task"] == 1 and rows[1]["times_retrieved"] == 4


def test_load_jsonl_roundtrip_and_keyless_entries_are_rejected(tmp_path):
    """An entry without `key` used to be keyed by its own text's embedding, which queries (task text + first
    observation) never resemble: it is now an error naming the file and line."""
    import pytest

    from crl_jax.bank.io import load_jsonl
    from crl_jax.config import ConfigError
    from crl_jax.models.embed import HashedNgramEmbedder

    tok = ByteTokenizer()
    path = tmp_path / "bank.jsonl"
    export_jsonl(_bank(tok), tok, path)
    back = load_jsonl(B.init(4, L, 2), tok, str(path))
    assert [r["text"] for r in entry_records(back, tok)] == ["go north", "avoid the trap", "unicode ok: é→"]
    assert [r["task"] for r in entry_records(back, tok)] == [0, 1, 0]
    lines = path.read_text(encoding="utf-8").splitlines()[1:]  # a hand-written file: no header line
    path.write_text("\n".join(lines + [json.dumps({"text": "keyless", "task": 0})]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bank\.jsonl:4: no `key`"):
        load_jsonl(B.init(4, L, 2), tok, str(path), HashedNgramEmbedder(dim=2))  # even with an embedder
