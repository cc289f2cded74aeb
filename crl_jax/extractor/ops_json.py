"""Structured-text extractor operations (the LLM format). Host-side; never raises.

Expected output: somewhere in the text, an answer block holding a JSON list of at most 3 objects

    <answer>[{"op": "add", "text": "<title>...</title><content>...</content>"},
             {"op": "update", "text": "..."}, {"op": "return"}]</answer>

`add` writes a new entry, `update` rewrites the entry that was retrieved for the episode, `return` means
nothing to learn. `parse_operations(text) -> list[Operation]`; `parse_operations_with_stats(text) ->
(ops, ParseStats)`. Any malformation (no answer block, bad JSON, a non-object item, a missing or
unknown op name, a missing / empty / non-string text for add or update) makes the WHOLE output invalid:
`[]`, which the loop treats as `return` and counts (`stats.valid == False`, `stats.error` says why).
A valid empty list `[]` is also no operation, but counts as valid.

Accepted leniencies (documented so prompts can stay strict while parsing stays liberal):
- tags: case-insensitive, whitespace inside the brackets (`< Answer >`); the LAST answer block that
  parses wins (thinking models may quote the format earlier; an entry text may quote a tag, in which
  case up to 16 blocks are tried from the last); a missing `</answer>` (truncated generation) reads to
  the end of the text, and a JSON string may contain `</answer>`;
- a Markdown code fence around the JSON; prose around the JSON inside the block (the first `[` or `{`
  starts the JSON value, anything after the value is ignored);
- trailing commas before `]` / `}` (outside strings); a single object instead of a list;
- op names case-insensitive with surrounding whitespace; `"operation"` or `"type"` as aliases of `"op"`;
- separate `"title"` and `"content"` string fields instead of `"text"` (combined into the tag form);
- entry text without `<title>` / `<content>` tags (the whole text is the content);
- more than 3 operations: the first 3 are kept, the rest dropped unvalidated and counted in `dropped`.
For compiled code: `operations_to_arrays(texts, encode, entry_len)` (numpy, host) and
`parse_operations_callback(tokens, lengths, decode, encode, entry_len)` (one `jax.pure_callback` per batch)
give fixed-shape op / entry / mask arrays with the constrained format's op ids (0 add, 1 update, 2 return).

Not accepted: single quotes, comments, unquoted keys (not JSON), bodies longer than `max_chars`.
Extra fields (e.g. indices) are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

MAX_OPS = 3
OPS = ("add", "update", "return")
_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
_TITLE = re.compile(r"<title>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_CONTENT = re.compile(r"<content>(.*?)</content>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Operation:
    op: str  # "add" | "update" | "return"
    text: str = ""  # entry text, "<title>...</title><content>...</content>" ("" for return)

    @property
    def title(self) -> str:
        m = _TITLE.search(self.text)
        return m.group(1).strip() if m else ""

    @property
    def content(self) -> str:
        m = _CONTENT.search(self.text)
        return m.group(1).strip() if m else self.text.strip()


@dataclass(frozen=True)
class ParseStats:
    valid: bool  # False: malformed output (ops == [])
    error: str = ""  # why it is invalid ("" when valid)
    num_ops: int = 0  # operations returned
    dropped: int = 0  # operations beyond MAX_OPS that were dropped
    n_add: int = 0
    n_update: int = 0
    n_return: int = 0
    repaired: bool = False  # a leniency beyond plain JSON was needed


class _Invalid(Exception):
    pass


def _answer_blocks(text: str, max_blocks: int = 16) -> list[tuple[str, str]]:
    """(body up to the first closing tag, rest of the text) for the last `max_blocks` opening tags, last first."""
    opens = list(_OPEN.finditer(text))
    if not opens:
        raise _Invalid("no <answer> block")
    blocks = []
    for m in reversed(opens[-max_blocks:]):
        close = _CLOSE.search(text, m.end())
        blocks.append((text[m.end(): close.start() if close else len(text)], text[m.end():]))
    return blocks


def _strip_trailing_commas(s: str) -> str:
    """Drop commas that directly precede `]` or `}` (ignoring whitespace), outside JSON strings."""
    out, i, n, in_str = [], 0, len(s), False
    while i < n:
        c = s[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(s[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif c == ",":
            j = i + 1
            while j < n and s[j] in " \t\r\n":
                j += 1
            if not (j < n and s[j] in "]}"):
                out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _strict(body: str) -> tuple[object, bool]:
    """Plain JSON of the block (a Markdown fence allowed) -> (value, repaired)."""
    body = body.strip()
    repaired = False
    if body.startswith("```"):  # Markdown fence: drop the opening line (with any language tag) and the closer
        nl = body.find("\n")
        body = body[nl + 1:] if nl >= 0 else body[3:]
        body = body.rstrip()
        body = (body[:-3] if body.endswith("```") else body).strip()
        repaired = True
    try:
        return json.loads(body), repaired
    except ValueError:
        raise _Invalid("bad JSON") from None


def _lenient(rest: str) -> tuple[object, bool]:
    """JSON value starting at the first `[` / `{` of the block, trailing commas dropped, tail ignored.

    The prose before it may not contain a double quote: that is what keeps a bogus block
    (an `<answer>` quoted inside an entry's JSON string) from parsing a fragment of the real one.
    """
    starts = [p for p in (rest.find("["), rest.find("{")) if p >= 0]
    if not starts:
        raise _Invalid("no JSON list or object in the answer")
    start = min(starts)
    if '"' in rest[:start]:
        raise _Invalid("bad JSON: a quote in the prose before the value")
    try:
        value, _ = json.JSONDecoder().raw_decode(_strip_trailing_commas(rest[start:]))
    except ValueError as e:
        raise _Invalid(f"bad JSON: {e.__class__.__name__}: {str(e)[:80]}") from None
    return value, True


def _operation(item) -> tuple[Operation, bool]:
    if not isinstance(item, dict):
        raise _Invalid(f"operation is a {type(item).__name__}, not an object")
    repaired = False
    name = item.get("op")
    if name is None:
        for alias in ("operation", "type"):
            if alias in item:
                name, repaired = item[alias], True
                break
    if not isinstance(name, str):
        raise _Invalid("operation without a string 'op'")
    name = name.strip().lower()
    if name not in OPS:
        raise _Invalid(f"unknown op {name[:20]!r}")
    if name == "return":
        return Operation("return"), repaired
    text = item.get("text")
    if text is None and isinstance(item.get("title"), str) and isinstance(item.get("content"), str):
        text, repaired = f"<title>{item['title']}</title><content>{item['content']}</content>", True
    if not isinstance(text, str) or not text.strip():
        raise _Invalid(f"'{name}' without a non-empty string 'text'")
    return Operation(name, text.strip()), repaired


def _operations(value, repaired: bool) -> tuple[list[Operation], ParseStats]:
    if isinstance(value, dict):
        value, repaired = [value], True
    if not isinstance(value, list):
        raise _Invalid(f"answer is a JSON {type(value).__name__}, not a list")
    kept, dropped = value[:MAX_OPS], max(0, len(value) - MAX_OPS)
    ops = []
    for item in kept:
        op, rep = _operation(item)
        ops.append(op)
        repaired = repaired or rep
    count = {k: sum(o.op == k for o in ops) for k in OPS}
    return ops, ParseStats(True, "", len(ops), dropped, count["add"], count["update"], count["return"], repaired)


def _parse(text, max_chars: int) -> tuple[list[Operation], ParseStats]:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise _Invalid(f"output is a {type(text).__name__}, not text")
    blocks = _answer_blocks(text)
    if len(blocks[0][0].strip()) > max_chars:
        raise _Invalid(f"answer longer than {max_chars} characters")
    # Pass 1: blocks that are plain JSON, last first. Pass 2: the lenient reading, last first. An earlier
    # block only matters when a later one is malformed (e.g. an entry text that quotes "<answer>").
    error = None
    for lenient in (False, True):
        for k, (body, rest) in enumerate(blocks):
            try:
                value, repaired = _lenient(rest[:max_chars]) if lenient else _strict(body)
                ops, stats = _operations(value, repaired)
            except _Invalid as e:
                if k == 0 and (error is None or str(error) == "bad JSON"):
                    error = e  # the last block's most specific reason
                continue
            if k > 0:
                stats = dataclasses.replace(stats, repaired=True)
            return ops, stats
    raise error


def parse_operations_with_stats(text, *, max_chars: int = 200_000) -> tuple[list[Operation], ParseStats]:
    """-> (operations, stats). Never raises; malformed output gives ([], stats with valid=False)."""
    try:
        return _parse(text, max_chars)
    except _Invalid as e:
        return [], ParseStats(False, str(e))
    except RecursionError:  # absurdly deep nesting inside the JSON decoder
        return [], ParseStats(False, "JSON nested too deeply")
    except Exception as e:  # noqa: BLE001 -- the contract is "never raises"; the reason is kept
        return [], ParseStats(False, f"unexpected {e.__class__.__name__}")


def parse_operations(text, *, max_chars: int = 200_000) -> list[Operation]:
    """Operations in `text` (see the module docstring); `[]` for malformed output. Never raises."""
    return parse_operations_with_stats(text, max_chars=max_chars)[0]


# --- arrays for compiled code (one batched host callback per step) -----------------------------------------

_OP_INDEX = {"add": 0, "update": 1, "return": 2}  # same ids as the constrained format (crl_jax.extractor)


def operations_to_arrays(texts, encode, entry_len: int, max_ops: int = MAX_OPS, max_chars: int = 200_000):
    """Parse a batch of B outputs and tokenise their entries (host side, numpy).

    encode: text -> list of token ids (entries are clipped to `entry_len`).
    -> dict of op [B, M] int32 (0 add, 1 update, 2 return; 2 in unused rows), entry [B, M, entry_len] int32,
    entry_len [B, M] int32, mask [B, M] bool (an add / update row), valid [B] bool, dropped [B] int32.
    """
    import numpy as np

    B, M = len(texts), max_ops
    out = {"op": np.full((B, M), 2, np.int32), "entry": np.zeros((B, M, entry_len), np.int32),
           "entry_len": np.zeros((B, M), np.int32), "mask": np.zeros((B, M), bool),
           "valid": np.zeros((B,), bool), "dropped": np.zeros((B,), np.int32)}
    for b, text in enumerate(texts):
        ops, stats = parse_operations_with_stats(text, max_chars=max_chars)
        out["valid"][b] = stats.valid
        out["dropped"][b] = stats.dropped + max(0, len(ops) - M)
        for m, op in enumerate(ops[:M]):
            out["op"][b, m] = _OP_INDEX[op.op]
            if op.op == "return":
                continue
            ids = list(encode(op.text))[:entry_len]
            out["entry"][b, m, : len(ids)] = ids
            out["entry_len"][b, m] = len(ids)
            out["mask"][b, m] = len(ids) > 0
    return out


def parse_operations_callback(tokens, lengths, decode, encode, entry_len: int, max_ops: int = MAX_OPS):
    """Inside jit: response tokens [B, R] + lengths [B] -> the arrays of `operations_to_arrays`.

    One `jax.pure_callback` for the whole batch (decode -> parse -> encode on the host); the rest of the
    step stays compiled. decode: list of ids -> text; encode: text -> list of ids.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    B = tokens.shape[0]
    M = max_ops
    shapes = {"op": jax.ShapeDtypeStruct((B, M), jnp.int32),
              "entry": jax.ShapeDtypeStruct((B, M, entry_len), jnp.int32),
              "entry_len": jax.ShapeDtypeStruct((B, M), jnp.int32), "mask": jax.ShapeDtypeStruct((B, M), jnp.bool_),
              "valid": jax.ShapeDtypeStruct((B,), jnp.bool_), "dropped": jax.ShapeDtypeStruct((B,), jnp.int32)}

    def host(tok, ln):
        tok, ln = np.asarray(tok), np.asarray(ln)
        texts = [decode(tok[b, : int(ln[b])].tolist()) for b in range(tok.shape[0])]
        return operations_to_arrays(texts, encode, entry_len, M)

    return jax.pure_callback(host, shapes, tokens, lengths)
