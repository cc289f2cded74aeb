"""Tokenizers: byte-level round trips, Hugging Face folders, GGUF metadata, chat templates."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _checkpoints import CHATML, tiny_bpe
from crl_jax.text.tokenizers import CHATML_TEMPLATE, ByteTokenizer, HFTokenizer, Tokenizer

# ----------------------------------------------------------------------------------------------
# ByteTokenizer


def test_byte_tokenizer_layout_and_literal_ids():
    tok = ByteTokenizer(extra_tokens=("<north>", "<north_east>", "add("))
    assert isinstance(tok, Tokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (256, 257, 258, 262)
    assert tok.special_ids == (256, 257, 258)
    assert tok.extra_id("<north>") == 259 and tok.extra_id("<north_east>") == 260 and tok.extra_id("add(") == 261
    # "<north_east>" is matched whole, not as "<north" + ...; plain bytes stay bytes
    assert tok.encode("go<north_east>!") == [103, 111, 260, 33]
    assert tok.encode("<north>", add_special=True) == [257, 259, 258]
    assert tok.encode("é") == [0xC3, 0xA9]
    assert tok.decode([257, 104, 105, 256, 258]) == "<s>hi</s>"  # pad renders as nothing
    assert tok.token_text(259) == "<north>" and tok.token_text(65) == "A"
    with pytest.raises(ValueError, match="out of range"):
        tok.token_text(262)
    with pytest.raises(KeyError, match="<south>"):
        tok.extra_id("<south>")
    with pytest.raises(ValueError, match="duplicate"):
        ByteTokenizer(extra_tokens=("a", "a"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.sampled_from(["<north>", "<north_east>", "add("])), max_size=6))
def test_byte_tokenizer_round_trip(parts):
    tok = ByteTokenizer(extra_tokens=("<north>", "<north_east>", "add("))
    text = "".join(parts)
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_special=True)) == "<s>" + text + "</s>"


def test_byte_tokenizer_unicode_and_split_multibyte():
    tok = ByteTokenizer(extra_tokens=("<x>",))
    text = "naïve 👋 日本<x>語"
    assert tok.decode(tok.encode(text)) == text
    # an extra token between the bytes of one character: each half decodes on its own (replacement char)
    ids = list("é".encode()[:1]) + [tok.extra_id("<x>")] + list("é".encode()[1:])
    assert tok.decode(ids) == "\ufffd<x>\ufffd"


def test_byte_tokenizer_chat_template():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("U<|im_end|>\n")
    assert tok.chat_template == CHATML_TEMPLATE


# ----------------------------------------------------------------------------------------------
# HFTokenizer from a folder and from GGUF metadata


def _gguf_meta(pre="smollm", add_bos=False):
    tokens, merges, types = tiny_bpe()
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
            "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.chat_template": CHATML}


def test_from_gguf_metadata_specials_digits_and_round_trip():
    tok = HFTokenizer.from_gguf_metadata(_gguf_meta())
    assert isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 0, 300)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    # control tokens are matched whole; digits are split one by one ("smollm" pre-tokenizer)
    ids = tok.encode("<|im_start|>hi 2024<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    digits = [tok.token_to_id(d) for d in "2024"]
    assert ids[-5:-1] == digits
    for text in ["the cat sat on the mat", "naïve 👋 日本語\n\t x", "  leading and trailing  "]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("x", add_special=True) == tok.encode("x")  # add_bos_token false
    with_bos = HFTokenizer.from_gguf_metadata(_gguf_meta(add_bos=True))
    assert with_bos.encode("x", add_special=True) == [1] + with_bos.encode("x")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>system\nYou are tiny.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_from_gguf_metadata_rejects_sentencepiece():
    meta = _gguf_meta()
    meta["tokenizer.ggml.model"] = "llama"
    with pytest.raises(ValueError, match="'llama' is not supported"):
        HFTokenizer.from_gguf_metadata(meta)


def _save_folder(path, *, template=None, template_file=None):
    tok = HFTokenizer.from_gguf_metadata(_gguf_meta())
    tok.raw.save(str(path / "tokenizer.json"))
    cfg = {"bos_token": "<|im_start|>", "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "rstrip": False,
                                                         "normalized": False, "single_word": False, "special": True}, "pad_token": "<|endoftext|>"}
    if template is not None:
        cfg["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    return tok


def test_from_folder_matches_gguf_tokenizer_and_reads_specials(tmp_path):
    src = _save_folder(tmp_path, template=CHATML)
    tok = HFTokenizer.from_folder(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    for text in ["the cat <|im_end|> 123", "héllo"]:
        assert tok.encode(text) == src.encode(text)
    msgs = [{"role": "user", "content": "q"}]
    assert tok.apply_chat_template(msgs) == src.apply_chat_template(msgs)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_folder(str(tmp_path / "nope"))


def test_from_folder_template_file_and_transformers_rendering(tmp_path):
    """A template with tojson / loop controls / a trailing newline renders as transformers renders it."""
    transformers = pytest.importorskip("transformers")
    template = (
        "{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% if m.get('meta') %} {{ m['meta'] | tojson }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}\n"
    )
    _save_folder(tmp_path, template_file=template)
    tok = HFTokenizer.from_folder(str(tmp_path))
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "user", "content": "a<b>&", "meta": {"k": "é"}}, {"role": "skip", "content": "x"},
            {"role": "assistant", "content": "ok"}]
    for gen in (True, False):
        assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == ref.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    text = tok.apply_chat_template(msgs)
    assert '{"k": "é"}' in text and "skip" not in text
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False)


def test_from_pretrained_folder_returns_its_tokenizer(tmp_path):
    from _checkpoints import write_numpy_checkpoint
    from crl_jax.models import from_pretrained

    write_numpy_checkpoint(tmp_path)
    _save_folder(tmp_path, template=CHATML)
    _, tok = from_pretrained(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 2
