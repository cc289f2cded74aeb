"""The periodic merge on the LLM path: the merge prompt rendered from the templates through the SmolLM2
chat template, with its worked example and prefilled `<answer>[` (golden files, both chunks; and without
them), JSON answers read by the distillation's host parser (after the prefill), the bank / buffer /
provenance rules of `crl_jax.extractor.merge`, bad answers leaving the bank alone, and the real sampler inside the
compiled merge."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _golden import check_golden
from _llm_common import small_runtime

from crl_jax import bank as bank_lib
from crl_jax.backends.llm import merge as llm_merge
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.extractor.merge_step import merge_into
from crl_jax.models import transformer as tr

L = 24  # bank.entry_len
SMALL = {"rollout": {"groups": 2, "group_size": 2, "max_action_tokens": 8},
         "env": {"max_turns": 2, "num_train_tasks": 4, "num_eval_tasks": 4},
         "extraction": {"max_new_tokens": 48, "prompt_len": 640, "batch": 2,
                        "buffer_capacity": 8, "merge_chunk": 5},
         "bank": {"entry_len": L, "capacity": 16, "key_dim": 8},
         "eval": {"every": 0, "tasks": 1}}


@pytest.fixture(scope="module")
def rt():
    return small_runtime(SMALL)[0]


def _bank(rt, texts):
    b = bank_lib.init(16, L, 8)
    for i, t in enumerate(texts):
        ids = rt.tokenizer.encode(t)
        b, _ = bank_lib.add(b, jnp.asarray(ids + [0] * (L - len(ids)), jnp.int32), jnp.int32(len(ids)),
                            jax.nn.one_hot(i % 8, 8), jnp.int32(0), jnp.int32(1), jnp.int32(i))
    return b


def _texts(rt, b):
    """{slot: (text, source)} of the valid entries."""
    return {int(s): (rt.tokenizer.decode(np.asarray(b.tokens[s][: int(b.lengths[s])]).tolist()), int(b.source[s]))
            for s in np.nonzero(np.asarray(b.valid))[0]}


def _scripted(rt, answer: str, R: int = 48):
    """generate_fn that always answers `answer` (log-probs -0.5 per token)."""
    ids = rt.tokenizer.encode(answer)[:R]

    def gen(prompt, plen, key):
        toks = jnp.asarray(ids + [rt.tokenizer.pad_id] * (R - len(ids)), jnp.int32)[None]
        return toks, jnp.where(jnp.arange(R) < len(ids), -0.5, 0.0)[None], jnp.asarray([len(ids)], jnp.int32)

    return gen


def _merge(rt, bank, buffer, answer):
    f = jax.jit(lambda b, buf: merge_into(rt, b, buf, jax.random.key(0), jnp.int32(7),
                                          generate_fn=_scripted(rt, answer), max_out=llm_merge.max_out(rt.cfg),
                                          parse_fn=lambda r, n: llm_merge.parse_merge_response(rt, r, n)))
    return f(bank, buffer)


def _buffer(rt):
    return buffer_lib.init(8, llm_merge.prompt_len(rt.cfg, rt.merge_pieces), 48)


ANSWER = '{"op": "add", "text": "merged A"}, {"op": "add", "title": "B", "content": "merged B"}, {"op": "return"}]</answer>'


def test_json_merge_rewrites_chunks_with_provenance_and_golden_prompt(rt):
    lessons = [f"lesson {i}" for i in range(7)]  # chunks of 5: [0..4], [5, 6]
    answer = ANSWER  # the continuation of the prefilled '<answer>['
    buf0 = _buffer(rt)
    bank, buf, n = _merge(rt, _bank(rt, lessons), buf0, answer)
    # Each chunk becomes its two merged lessons, source = the buffer id of the merge sample.
    got = sorted(_texts(rt, bank).values())
    b_text = "<title>B</title><content>merged B</content>"
    assert got == sorted([("merged A", 0), (b_text, 0), ("merged A", 1), (b_text, 1)])
    assert int(n) == 2 and int(buf.next_id) == 2 and int(buf.valid.sum()) == 2
    # The buffer holds the prompts: chunk 0 without carried lessons, chunk 1 with chunk 0's merged ones.
    dec = lambda i: rt.tokenizer.decode(np.asarray(buf.prompt[i][: int(buf.prompt_len[i])]).tolist())  # noqa: E731
    p0, p1 = dec(0), dec(1)
    assert "Lessons merged so far" not in p0 and "\n- lesson 4\nWrite the merged lessons now." in p0
    check_golden("merge_first_chunk.txt", p0)
    check_golden("merge_second_chunk.txt", p1)
    # the worked example sits between the system message and the real chunk; the prompt ends with the prefill
    assert p0.count("<|im_start|>assistant\n") == 2 and p0.endswith("<|im_start|>assistant\n<answer>[")
    assert "- <title>Stairs in sight</title>" in p0 and p0.index("Stairs in sight") < p0.index("lesson 0")
    assert rt.tokenizer.decode(np.asarray(buf.response[0][: int(buf.response_len[0])]).tolist()) == answer
    np.testing.assert_allclose(np.asarray(buf.behavior_logp[0][:3]), -0.5)


@pytest.mark.parametrize("answer", ["I would merge them.", '{"op": "add", "text": ""}]</answer>',
                                    '{"op": "return"}]</answer>', "{'op': 'add'}]</answer>",
                                    '{"op": "update", "text": "x"}]</answer>'])
def test_bad_or_empty_answers_leave_the_bank_and_buffer_alone(rt, answer):
    lessons = [f"lesson {i}" for i in range(7)]
    bank0 = _bank(rt, lessons)
    bank, buf, n = _merge(rt, bank0, _buffer(rt), answer)
    assert int(n) == 0 and int(buf.next_id) == 0
    assert _texts(rt, bank) == _texts(rt, bank0)


def test_run_merge_with_the_real_sampler_and_the_schedule(rt):
    """A random 1-block model: the compiled merge samples, parses and (as its answers are not JSON) keeps
    the bank; the schedule runs it only on steps where (step + 1) % merge_every == 0."""
    params = tr.split(tr.create(rt.extractor_config, jax.random.key(3)))[1]
    bank0 = _bank(rt, [f"lesson {i}" for i in range(3)])
    f = jax.jit(lambda b, buf, step, on: llm_merge.maybe_merge(rt, b, buf, params, jax.random.key(1), step, on))
    for step, on in ((4, True), (3, True), (4, False)):
        bank, buf, n = f(bank0, _buffer(rt), jnp.int32(step), jnp.bool_(on))
        assert int(n) == 0 and _texts(rt, bank) == _texts(rt, bank0)
    assert rt.cfg.extraction.merge_every == 5


def test_without_example_and_prefill_the_prompt_and_parser_are_the_plain_ones():
    """`llm_prompt.merge_example=false merge_prefill=false`: system + chunk only; a whole answer parses."""
    r = small_runtime({**SMALL, "llm_prompt": {"merge_example": False, "merge_prefill": False}})[0]
    answer = 'Thinking... <answer>[' + ANSWER
    bank, buf, n = _merge(r, _bank(r, [f"lesson {i}" for i in range(3)]), _buffer(r), answer)
    p0 = r.tokenizer.decode(np.asarray(buf.prompt[0][: int(buf.prompt_len[0])]).tolist())
    assert int(n) == 1 and p0.count("<|im_start|>assistant\n") == 1 and p0.endswith("<|im_start|>assistant\n")
    assert "Stairs in sight" not in p0
    assert sorted(t for t, _ in _texts(r, bank).values()) == ["<title>B</title><content>merged B</content>", "merged A"]
