"""Loader unit tests without torch: config mapping, weight layout, GGUF row order, clear errors."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from _checkpoints import write_numpy_checkpoint
from crl_jax.models import from_pretrained
from crl_jax.models.gguf_loader import gguf_tensor_name, permute_rows, unpermute_rows
from crl_jax.models.loading import CheckpointError, SafetensorsSource, config_from_hf, rope_from_hf

# ----------------------------------------------------------------------------------------------
# config.json mapping

LLAMA = dict(architectures=["LlamaForCausalLM"], vocab_size=300, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def test_rope_new_and_old_spellings_agree():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    new = config_from_hf(dict(LLAMA, rope_parameters=dict(scaling, rope_theta=500000.0)))
    old = config_from_hf(dict(LLAMA, rope_theta=500000.0, rope_scaling=dict(scaling)))
    very_old = dict(scaling)
    very_old["type"] = very_old.pop("rope_type")
    older = config_from_hf(dict(LLAMA, rope_theta=500000.0, rope_scaling=very_old))
    assert new == old == older
    assert new.rope_theta == 500000.0
    assert new.rope_scaling_dict == scaling
    # default rope type means no scaling; a missing theta takes the family default
    assert rope_from_hf({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 1e4) == (1e6, None)
    assert rope_from_hf({}, 1e4) == (1e4, None)


def test_family_switches_and_defaults():
    q2 = config_from_hf(dict(LLAMA, architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True))
    assert (q2.family, q2.attention_bias, q2.qk_norm, q2.tie_embeddings) == ("qwen2", True, False, True)
    q3 = config_from_hf(dict(LLAMA, architectures=["Qwen3ForCausalLM"]))
    assert (q3.family, q3.attention_bias, q3.qk_norm, q3.head_dim) == ("qwen3", False, True, 128)
    ll = config_from_hf(dict(LLAMA, num_key_value_heads=None), dtype="bfloat16")
    assert (ll.num_kv_heads, ll.tie_embeddings, ll.param_dtype, ll.dim_head) == (4, False, "bfloat16", 16)


def test_config_errors_name_the_problem():
    with pytest.raises(CheckpointError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"):
        config_from_hf(dict(LLAMA, architectures=["GPT2LMHeadModel"]))
    bad = dict(LLAMA)
    del bad["hidden_size"]
    with pytest.raises(CheckpointError, match="hidden_size"):
        config_from_hf(bad)
    with pytest.raises(CheckpointError, match="gelu"):
        config_from_hf(dict(LLAMA, hidden_act="gelu"))


# ----------------------------------------------------------------------------------------------
# safetensors folders


@pytest.mark.parametrize("arch,tie", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_weights_land_in_the_right_slots(tmp_path, arch, tie):
    t = write_numpy_checkpoint(tmp_path, arch=arch, tie=tie)
    model, tok = from_pretrained(str(tmp_path))
    assert tok is None
    np.testing.assert_array_equal(np.asarray(model.embed[...]), t["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(model.final_norm[...]), t["model.norm.weight"])
    # Linear weights go from HF [out, in] to our [in, out]; layers stack along axis 0
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(model.wk[...][i]), t[f"model.layers.{i}.self_attn.k_proj.weight"].T)
        np.testing.assert_array_equal(np.asarray(model.w_down[...][i]), t[f"model.layers.{i}.mlp.down_proj.weight"].T)
        np.testing.assert_array_equal(np.asarray(model.mlp_norm[...][i]),
                                      t[f"model.layers.{i}.post_attention_layernorm.weight"])
        if arch == "qwen2":
            np.testing.assert_array_equal(np.asarray(model.bv[...][i]), t[f"model.layers.{i}.self_attn.v_proj.bias"])
        if arch == "qwen3":
            np.testing.assert_array_equal(np.asarray(model.k_norm[...][i]), t[f"model.layers.{i}.self_attn.k_norm.weight"])
    if tie:
        assert not hasattr(model, "lm_head")
    else:
        np.testing.assert_array_equal(np.asarray(model.lm_head[...]), t["lm_head.weight"].T)


def test_bfloat16_storage_rounds_like_ml_dtypes(tmp_path):
    t = write_numpy_checkpoint(tmp_path)
    model, _ = from_pretrained(tmp_path, dtype="bfloat16")
    assert model.wq[...].dtype == jnp.bfloat16 and model.embed[...].dtype == jnp.bfloat16
    want = t["model.layers.1.self_attn.q_proj.weight"].T.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(model.wq[...][1]), want)
    with pytest.raises(ValueError, match="float16"):
        from_pretrained(tmp_path, dtype="float16")


def test_bf16_tensor_read_from_raw_bytes(tmp_path):
    """safetensors' numpy API cannot return BF16; the source reads those bytes itself."""
    header = {"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}
    vals = np.array([[1.0, -2.5, 0.15625], [3.0, 65536.0, -0.0]], ml_dtypes.bfloat16)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    body = vals.view(np.uint16).astype("<u2").tobytes() + np.array([7.0, 8.0], "<f4").tobytes()
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + body)
    src = SafetensorsSource(str(tmp_path))
    got = src.get("w")
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (2, 3)
    np.testing.assert_array_equal(got.astype(np.float32), [[1.0, -2.5, 0.15625], [3.0, 65536.0, -0.0]])
    np.testing.assert_array_equal(src.get("b"), [7.0, 8.0])
    assert src.get("nope") is None


def test_missing_path_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        from_pretrained(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        from_pretrained(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="notes.txt.*not a GGUF"):
        from_pretrained(tmp_path / "notes.txt")


def test_wrong_architecture_in_config_json(tmp_path):
    write_numpy_checkpoint(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config.json.*'MistralForCausalLM'.*supported.*LlamaForCausalLM"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("keep", [5, 100, -7])
def test_truncated_safetensors_names_the_file(tmp_path, keep):
    write_numpy_checkpoint(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(truncated|corrupt)"):
        from_pretrained(tmp_path)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
    write_numpy_checkpoint(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight'.*\(96, 64\).*\(128, 64\)"):
        from_pretrained(tmp_path)


def test_missing_tensor_and_missing_shard(tmp_path):
    from safetensors.numpy import save_file

    t = write_numpy_checkpoint(tmp_path)
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        from_pretrained(tmp_path)
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        from_pretrained(tmp_path)


def test_sharded_numpy_checkpoint_and_unprefixed_names(tmp_path):
    """Tensors split over two files listed by an index; base-model names without "model." resolve."""
    from safetensors.numpy import save_file

    t = write_numpy_checkpoint(tmp_path, tie=True)
    os.remove(tmp_path / "model.safetensors")
    names = sorted(t)
    a = {k.removeprefix("model."): t[k] for k in names[: len(names) // 2]}
    b = {k: t[k] for k in names[len(names) // 2:]}
    save_file(a, str(tmp_path / "part-1.safetensors"))
    save_file(b, str(tmp_path / "part-2.safetensors"))
    wm = {k: "part-1.safetensors" for k in a} | {k: "part-2.safetensors" for k in b}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    model, _ = from_pretrained(tmp_path)
    np.testing.assert_array_equal(np.asarray(model.embed[...]), t["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(model.w_up[...][1]), t["model.layers.1.mlp.up_proj.weight"].T)


# ----------------------------------------------------------------------------------------------
# GGUF details


def test_llama_cpp_row_order_round_trip():
    # one head of width 8: llama.cpp interleaves the two halves of the rows
    w = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    p = permute_rows(w, 1)
    np.testing.assert_array_equal(p[:, 0], [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(unpermute_rows(p, 1), w)
    # two heads, each permuted on its own
    w2 = np.arange(16, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(permute_rows(w2, 2)[:, 0], [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15])
    x = np.random.default_rng(0).standard_normal((3 * 64, 5))
    np.testing.assert_array_equal(unpermute_rows(permute_rows(x, 3), 3), x)


def test_gguf_tensor_names():
    assert gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("lm_head.weight") == "output.weight"
    assert gguf_tensor_name("model.layers.12.self_attn.k_proj.bias") == "blk.12.attn_k.bias"
    assert gguf_tensor_name("model.layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    assert gguf_tensor_name("model.layers.3.self_attn.q_norm.weight") == "blk.3.attn_q_norm.weight"
    assert gguf_tensor_name("model.rotary_emb.inv_freq") is None


def test_truncated_gguf_names_the_file(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    with pytest.raises(CheckpointError, match="broken.gguf"):
        from_pretrained(f)
