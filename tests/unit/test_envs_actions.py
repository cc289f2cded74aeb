"""Action parsing: constrained token ids and the free-text <answer> parser (jit, any tokenisation)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from crl_jax.envs.actions import (action_allowed_mask, action_token_ids, make_answer_parser, parse_answer_text,
                                  tiny_tokenizer, token_to_action)
from crl_jax.envs.base import DIR_NAMES
from crl_jax.text.tokenizers import ByteTokenizer, HFTokenizer


def bpe(words, vocab=400):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(words, trainer)
    return HFTokenizer(tok, eos_id=0)


def test_constrained_ids_byte_and_bpe():
    tt = tiny_tokenizer(DIR_NAMES)
    ids = action_token_ids(DIR_NAMES, tt)
    np.testing.assert_array_equal(ids, np.arange(259, 267))
    assert tt.extra_tokens[-3:] == ("<ADD>", "<UPDATE>", "<RETURN>")
    mask = action_allowed_mask(ids, tt.vocab_size)
    assert mask.shape == (270,) and int(mask.sum()) == 8 and bool(mask[259]) and not bool(mask[258])
    tok_actions = jax.jit(token_to_action)(jnp.array([[259, 266], [65, 260]]), ids)
    np.testing.assert_array_equal(tok_actions, [[0, 7], [-1, 1]])
    # A BPE that learned " north", " east", ... as single tokens.
    tok = bpe([" " + " ".join(DIR_NAMES)] * 50)
    ids = action_token_ids(DIR_NAMES, tok)
    assert len(set(ids.tolist())) == 8 and [tok.decode([i]) for i in ids] == [" " + n for n in DIR_NAMES]
    with pytest.raises(ValueError, match="distinct single tokens"):
        action_token_ids(DIR_NAMES, ByteTokenizer())


CASES = [
    ("I think <answer>north</answer>", 0),
    ("<answer> NorthEast \n</answer> trailing", 4),
    ("<ANSWER>west", 3),  # closing tag cut off by a stop string
    ("<answer>northeastern</answer>", -1),
    ("<answer>north east</answer>", -1),
    ("no tag: north", -1),
    ("<answer>up</answer> then <answer>south</answer>", 2),  # last valid answer wins
    ("<answer>south</answer> <answer>bogus</answer>", 2),
    ("<answer>sw</answer>", -1),
    ("", -1),
]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_free_text_parser(kind):
    tok = ByteTokenizer() if kind == "byte" else bpe(["<answer>north</answer> I think the answer is"] * 20)
    parser = make_answer_parser(DIR_NAMES, tok)
    t = 48
    rows, lens = [], []
    for text, want in CASES:
        assert parse_answer_text(text, DIR_NAMES) == want, text
        ids = tok.encode(text)
        assert len(ids) <= t
        rows.append(ids + [7] * (t - len(ids)))  # junk after `length` is ignored
        lens.append(len(ids))

    def vparse(tokens, lengths):
        return jax.vmap(parser)(tokens, lengths)

    chex.clear_trace_counter()  # the parametrised cases share the function's code object
    f = jax.jit(chex.assert_max_traces(vparse, n=1))
    # Another tokenisation of a text (one token per character) gives the same action.
    text = "<answer> North </answer>"
    ids = [i for ch in text for i in tok.encode(ch)]
    rows.append(ids + [0] * (t - len(ids)))
    lens.append(len(ids))
    got = f(jnp.array(rows), jnp.array(lens))
    np.testing.assert_array_equal(got, [w for _, w in CASES] + [0])
    f(jnp.array(rows), jnp.array(lens))  # no retrace
