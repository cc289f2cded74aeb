"""Reading the actor's move from a free-text reply on the LLM path, inside jit.

Without a prefill the reply must hold `<answer>NAME</answer>` (`crl_jax.envs.actions.AnswerParser`).
With a prefill (`llm_prompt.prefill`: the prompt already ends with `<answer>`), a small model's reply is
usually just `NAME</answer>`, `NAME` then end-of-turn, or `NAME` and some chatter; so the reply is read
as its **bare first move**: after optional leading whitespace, an action name (ASCII, any case) that is
not followed by a letter or digit (`northeast` is never read as `north`, `northwards` is no move).
When the reply does not start with a move, the full `<answer>` rule still applies to it (a model that
repeats the tag), so a prefilled reply is never judged more strictly than an unprefilled one.

The replies stop at the first token whose text holds `>` (`reply_stop_tokens`), i.e. right after the
`</answer>` that closes the prefilled tag, so the conversation history keeps well-formed tags.
`parse_prefilled_text` is the host reference of the device rule (tests compare the two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import chex
import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.envs.actions import AnswerParser, _names, make_answer_parser, parse_answer_text


def parse_prefilled_text(text: str, action_names) -> int:
    """Host reference: the action of a reply that follows a prefilled `<answer>` (-1: none)."""
    names = [n.lower() for n in _names(action_names)]
    m = re.match(r"[ \t\n\r]*([A-Za-z0-9]+)", text)
    if m and m.group(1).lower() in names:
        return names.index(m.group(1).lower())
    return parse_answer_text(text, action_names)


def _is_word_byte(b):
    return ((b >= 48) & (b <= 57)) | ((b >= 97) & (b <= 122)) | ((b >= 65) & (b <= 90))


@dataclass(frozen=True, eq=False)
class PrefilledParser:
    """`parser(tokens int[T], length) -> int32 action or -1` for replies after a prefilled `<answer>`."""

    full: AnswerParser  # the `<answer>NAME</answer>` rule and the tokenizer's byte table

    def bytes_of(self, tokens, length):
        """The reply's lower-cased bytes [T * Lb] (0 past the end) and their count."""
        p = self.full
        t, lb, v = tokens.shape[0], p.token_bytes.shape[1], p.token_bytes.shape[0]
        ok = (jnp.arange(t) < length) & (tokens >= 0) & (tokens < v)
        tok = jnp.clip(tokens, 0, v - 1)
        nb = jnp.where(ok, jnp.asarray(p.token_nbytes)[tok], 0)
        starts = jnp.cumsum(nb) - nb
        j = jnp.arange(lb)[None, :]
        n = t * lb
        pos = jnp.where(j < nb[:, None], starts[:, None] + j, n)
        buf = jnp.zeros((n,), jnp.int32).at[pos.reshape(-1)].set(
            jnp.asarray(p.token_bytes, jnp.int32)[tok].reshape(-1), mode="drop")
        return buf, jnp.sum(nb)

    def first_move(self, tokens, length):
        """The bare-first-move rule alone (-1 when the reply does not start with a move)."""
        buf, total = self.bytes_of(tokens, length)
        n = buf.shape[0]
        ws = (buf == 32) | (buf == 9) | (buf == 10) | (buf == 13)
        lead = jnp.argmax(~ws | (jnp.arange(n) >= total))  # first non-whitespace byte (or the end)
        pats, plens = jnp.asarray(self.full.patterns, jnp.int32), jnp.asarray(self.full.pattern_lens)

        def hit(pat, plen):
            k = jnp.arange(pat.shape[0])
            idx = lead + k
            got = jnp.where(idx < total, buf[jnp.clip(idx, 0, n - 1)], -1)
            same = jnp.all((got == pat) | (k >= plen))
            nxt = lead + plen
            after = jnp.where(nxt < total, buf[jnp.clip(nxt, 0, n - 1)], 32)
            return same & ~_is_word_byte(after)

        hits = jax.vmap(hit)(pats, plens)
        return jnp.where(jnp.any(hits), jnp.argmax(hits), -1).astype(jnp.int32)

    def __call__(self, tokens, length) -> jax.Array:
        chex.assert_rank(tokens, 1)
        tokens = jnp.asarray(tokens, jnp.int32)
        bare = self.first_move(tokens, length)
        return jnp.where(bare >= 0, bare, self.full(tokens, length)).astype(jnp.int32)


def make_reply_parser(env_or_names, tokenizer, prefill: str):
    """The actor's reply parser: the `<answer>` rule, or (with a prefill) the bare-first-move rule first."""
    full = make_answer_parser(env_or_names, tokenizer)
    return PrefilledParser(full) if prefill else full


def reply_stop_tokens(tokenizer, prefill: str) -> tuple[int, ...]:
    """Stop tokens of actor replies: end-of-turn, and with a prefill every token whose text holds `>`
    (a reply after `<answer>` ends at the `>` of its `</answer>`; `</answer>` is 3 tokens for SmolLM2,
    and the sampler stops on tokens, not strings)."""
    stops = [] if tokenizer.eos_id is None else [int(tokenizer.eos_id)]
    if prefill:
        for i in range(int(tokenizer.vocab_size)):
            try:
                text = tokenizer.token_text(i)
            except Exception:  # ids without a text (holes in a vocabulary)
                continue
            if ">" in text and i not in stops:
                stops.append(i)
    return tuple(stops)


def reply_texts_valid(texts, action_names, prefill: str) -> np.ndarray:
    """Host: bool [N], does each decoded reply hold a valid move under the run's rule (probe helper)."""
    rule = parse_prefilled_text if prefill else parse_answer_text
    return np.array([rule(t, action_names) >= 0 for t in texts], bool)
