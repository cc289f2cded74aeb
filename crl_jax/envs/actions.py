"""Turning model output into env actions, inside jit.

Two formats:

(a) **constrained** (tiny models): the sampler's `allowed_tokens` restrict the action slot to one token
    per action. `action_token_ids(env, tokenizer)` picks the tokens: the atomic extra tokens `<name>` of
    a `ByteTokenizer` (see `tiny_tokenizer`), else the single token of `" " + name` or of `name` when
    every action maps to its own single token; otherwise a clear error. `token_to_action` maps a
    sampled token back (-1 when it is not an action token).

(b) **free text** (real LLMs): `make_answer_parser(action_names, tokenizer)(tokens[T], length)` finds
    `<answer> NAME </answer>` in the generated tokens. The tokens are turned into bytes on device with
    a per-tokenizer byte table (a gather), so any tokenisation of the text is understood. Supported:
    case-insensitive tag and name (ASCII), whitespace around the name, a missing `</answer>` when the text
    ends right after the name (a stop string cut it off); the name must be exactly an action name (so
    `northeast` is never read as `north`). The last `<answer>` that holds a valid action wins; none ->
    -1, the invalid action (it consumes the turn; see `crl_jax.envs.base`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import chex
import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.text.tokenizers import ByteTokenizer

OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"
_WS = b" \t\n\r"


def _names(env_or_names) -> tuple[str, ...]:
    return tuple(getattr(env_or_names, "action_names", env_or_names))


def tiny_tokenizer(action_names, extra=("<ADD>", "<UPDATE>", "<RETURN>")) -> ByteTokenizer:
    """Byte tokenizer with one atomic token `<name>` per action, then `extra`."""
    return ByteTokenizer(extra_tokens=tuple(f"<{n}>" for n in _names(action_names)) + tuple(extra))


def action_token_ids(env_or_names, tokenizer) -> np.ndarray:
    """int32 [A]: the token that stands for each action in constrained decoding."""
    names = _names(env_or_names)
    if isinstance(tokenizer, ByteTokenizer) and all(f"<{n}>" in tokenizer.extra_tokens for n in names):
        return np.array([tokenizer.extra_id(f"<{n}>") for n in names], np.int32)
    tried = []
    for fmt in (" {}", "{}"):
        enc = [list(tokenizer.encode(fmt.format(n))) for n in names]
        if all(len(e) == 1 for e in enc) and len({e[0] for e in enc}) == len(names):
            return np.array([e[0] for e in enc], np.int32)
        tried.append({fmt.format(n): e for n, e in zip(names, enc)})
    raise ValueError(
        f"action_token_ids: the actions {names} do not map to distinct single tokens of this tokenizer "
        f"(encodings tried: {tried}); use free-text answers (make_answer_parser) or a ByteTokenizer with "
        f"extra tokens '<name>' (tiny_tokenizer)")


def action_allowed_mask(ids, vocab_size: int) -> jax.Array:
    """bool [vocab_size], True at the action tokens (the sampler's `allowed_tokens`)."""
    return jnp.zeros((vocab_size,), bool).at[jnp.asarray(ids)].set(True)


def token_to_action(token, ids) -> jax.Array:
    """int32 action for a sampled token (any shape), -1 when it is not an action token."""
    token = jnp.asarray(token)
    match = token[..., None] == jnp.asarray(ids)
    return jnp.where(jnp.any(match, -1), jnp.argmax(match, -1), -1).astype(jnp.int32)


def parse_answer_text(text: str, action_names) -> int:
    """Host-side reference of the free-text rule (same semantics as the device parser)."""
    names = [n.lower() for n in _names(action_names)]
    best = -1
    for m in re.finditer(re.escape(OPEN_TAG), text, flags=re.IGNORECASE):
        rest = text[m.end():]
        for a, n in enumerate(names):
            if re.match(r"[ \t\n\r]*" + re.escape(n) + r"[ \t\n\r]*(" + re.escape(CLOSE_TAG) + r"|$)", rest,
                        flags=re.IGNORECASE):
                best = a
    return best


@dataclass(frozen=True, eq=False)
class AnswerParser:
    """`parser(tokens int[T], length int[]) -> int32 action or -1`; vmap for batches."""

    token_bytes: np.ndarray  # [V, Lb] uint8, lower-cased bytes of each token
    token_nbytes: np.ndarray  # [V] int32
    patterns: np.ndarray  # [A, Lp] uint8 action names, lower case
    pattern_lens: np.ndarray  # [A]

    def __call__(self, tokens, length) -> jax.Array:
        chex.assert_rank(tokens, 1)
        tokens = jnp.asarray(tokens, jnp.int32)
        t = tokens.shape[0]
        lb = self.token_bytes.shape[1]
        v = self.token_bytes.shape[0]
        valid_tok = (jnp.arange(t) < length) & (tokens >= 0) & (tokens < v)
        tok = jnp.clip(tokens, 0, v - 1)
        nb = jnp.where(valid_tok, jnp.asarray(self.token_nbytes)[tok], 0)
        n = t * lb
        starts = jnp.cumsum(nb) - nb
        j = jnp.arange(lb)[None, :]
        pos = jnp.where(j < nb[:, None], starts[:, None] + j, n)
        buf = jnp.zeros((n,), jnp.int32).at[pos.reshape(-1)].set(
            jnp.asarray(self.token_bytes, jnp.int32)[tok].reshape(-1), mode="drop")
        total = jnp.sum(nb)
        return _match(buf, total, jnp.asarray(self.patterns, jnp.int32), jnp.asarray(self.pattern_lens))


def _window_eq(buf, start, pat, plen):
    """Does buf[start : start + plen] == pat[:plen]? (positions past the buffer never match)."""
    k = jnp.arange(pat.shape[0])
    idx = start + k
    got = jnp.where(idx < buf.shape[0], buf[jnp.clip(idx, 0, buf.shape[0] - 1)], -1)
    return jnp.all((got == pat) | (k >= plen))


def _match(buf, total, patterns, plens):
    n = buf.shape[0]
    is_ws = jnp.zeros((256,), bool).at[jnp.array(list(_WS))].set(True)[buf] & (jnp.arange(n) < total)
    # next_non_ws[i] = first index >= i that is not whitespace (or total).
    idx = jnp.where(is_ws, n, jnp.arange(n))
    next_non_ws = jnp.minimum(jax.lax.cummin(idx, reverse=True), total)
    open_pat = jnp.array(list(OPEN_TAG.encode()), jnp.int32)
    close_pat = jnp.array(list(CLOSE_TAG.encode()), jnp.int32)
    starts = jnp.arange(n)
    is_open = jax.vmap(lambda s: _window_eq(buf, s, open_pat, open_pat.shape[0]))(starts)
    is_open = is_open & (starts + open_pat.shape[0] <= total)

    def at(i):
        k = next_non_ws[jnp.minimum(i + open_pat.shape[0], n - 1)]

        def one(pat, plen):
            ok = _window_eq(buf, k, pat, plen) & (k + plen <= total)
            e = jnp.where(k + plen < n, next_non_ws[jnp.minimum(k + plen, n - 1)], total)
            closed = _window_eq(buf, e, close_pat, close_pat.shape[0]) & (e + close_pat.shape[0] <= total)
            return ok & (closed | (e >= total))

        hits = jax.vmap(one)(patterns, plens)  # [A]
        return jnp.where(jnp.any(hits), jnp.argmax(hits), -1)

    acts = jax.vmap(at)(starts)  # [n]
    good = is_open & (acts >= 0)
    last = n - 1 - jnp.argmax(good[::-1])
    return jnp.where(jnp.any(good), acts[last], -1).astype(jnp.int32)


def _lower(b: bytes) -> list[int]:
    return [c + 32 if 65 <= c <= 90 else c for c in b]


def make_answer_parser(env_or_names, tokenizer, *, max_token_bytes: int = 32) -> AnswerParser:
    """Build the byte table of `tokenizer` once (host) for the free-text parser."""
    names = _names(env_or_names)
    v = int(tokenizer.vocab_size)
    tb = np.zeros((v, max_token_bytes), np.uint8)
    nbytes = np.zeros((v,), np.int32)
    specials = set(getattr(tokenizer, "special_ids", ()))
    for i in range(v):
        if i in specials:
            continue
        try:
            b = tokenizer.token_text(i).encode("utf-8", "replace")
        except Exception:  # ids without a text (holes in a vocabulary)
            continue
        if isinstance(tokenizer, ByteTokenizer) and i < 256:
            b = bytes([i])  # a raw byte, not its (possibly invalid) UTF-8 decoding
        b = bytes(_lower(b[:max_token_bytes]))
        tb[i, : len(b)] = list(b)
        nbytes[i] = len(b)
    lp = max(len(n) for n in names)
    pats = np.zeros((len(names), lp), np.uint8)
    for a, n in enumerate(names):
        pats[a, : len(n)] = _lower(n.encode())
    return AnswerParser(token_bytes=tb, token_nbytes=nbytes, patterns=pats,
                        pattern_lens=np.array([len(n) for n in names], np.int32))
