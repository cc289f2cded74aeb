"""The in-place KV cache and live-length attention of the sampler against the sampler as it
was before (experiments/bench/legacy_decode.py, the benchmark's baseline): identical greedy tokens, equal
log-probs, and no second stacked cache in the compiled program."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax import sampling as S
from crl_jax.models import transformer as tr

from _peaked_models import peaked_tiny

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench", "legacy_decode.py")
_spec = importlib.util.spec_from_file_location("legacy_decode", _PATH)
LD = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(LD)

V = 64


@pytest.fixture(scope="module")
def model():
    """Tiny model with peaked logits (`_peaked_models.peaked_tiny`): greedy choices have clear margins."""
    return peaked_tiny(V, seed=1)


_new = jax.jit(S.sample_tokens, static_argnums=(0, 5))


@pytest.mark.parametrize("block,temperature", [(3, 0.0), (128, 0.0), (4, 1.0)])
def test_tokens_equal_the_old_sampler(model, block, temperature):
    """Prompts of lengths 9, 3, 6 (left-padding in lock-step), 12 new tokens, a stop token: the same
    tokens and lengths as the old sampler (greedy; at temperature 1 the same key draws the same tokens
    from equal distributions), log-probs equal."""
    gd, pa = model
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(1, V, (3, 9)), jnp.int32)
    plen = jnp.array([9, 3, 6], jnp.int32)
    stop = (7,)
    key = jax.random.key(5)
    old = LD.legacy_generate_jit(gd, pa, prompt, plen, key,
                                 S.SamplerConfig(max_new_tokens=12, temperature=temperature, stop_tokens=stop))
    new = _new(gd, pa, prompt, plen, key,
               S.SamplerConfig(max_new_tokens=12, temperature=temperature, stop_tokens=stop, attn_block=block))
    np.testing.assert_array_equal(new[0], old[0])
    # float32 in a different order (blocked attention, in-place cache): ~1e-6 relative. atol 1e-5 alone failed on
    # one CPU (a log-prob of -2.3347 off by 1.2e-5, relative 5e-6), so the check is relative too.
    np.testing.assert_allclose(new[1], old[1], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(new[2], old[2])
    assert len(set(np.asarray(old[0]).ravel().tolist())) > 3  # not a degenerate constant output


def test_compiled_decode_holds_one_cache_not_two():
    """The old scan returned fresh k / v stacks (a second [L, B, S, Hkv, D] cache) every step; the
    in-place program's temporaries are smaller than the old program's by more than one cache."""
    cfg = tr.tiny_config(V, num_layers=4, max_position_embeddings=1024)
    gd, pa = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    B, P, N = 8, 256, 256
    args = (gd, pa, jax.ShapeDtypeStruct((B, P), jnp.int32), jax.ShapeDtypeStruct((B,), jnp.int32),
            jax.random.key(0), S.SamplerConfig(max_new_tokens=N, temperature=0.0))
    cache_bytes = 2 * cfg.num_layers * B * (P + N) * cfg.num_kv_heads * cfg.dim_head * 4
    old = LD.legacy_generate_jit.lower(*args).compile().memory_analysis().temp_size_in_bytes
    new = _new.lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert new < old - cache_bytes, (new, old, cache_bytes)


@pytest.mark.parametrize("P,N,temperature", [(9, 12, 0.0), (2, 20, 1.0)])
def test_straight_line_layers_equal_the_layer_scan(model, P, N, temperature):
    """Decode with the layers as straight-line code over weights sliced once (`unroll_layers`, the default for
    this 2-layer model) and with the layer scan (`unroll_layers=0`): the same tokens and lengths, equal
    log-probs, at two prompt / generation lengths and with a looped (3-slot) attention block."""
    gd, pa = model
    prompt = jnp.asarray(np.random.default_rng(P).integers(1, V, (3, P)), jnp.int32)
    plen = jnp.array([P, 1, max(1, P // 2)], jnp.int32)
    base = dict(max_new_tokens=N, temperature=temperature, attn_block=3)
    key = jax.random.key(11)
    lin = _new(gd, pa, prompt, plen, key, S.SamplerConfig(**base))
    scan = _new(gd, pa, prompt, plen, key, S.SamplerConfig(**base, unroll_layers=0))
    np.testing.assert_array_equal(lin[0], scan[0])
    np.testing.assert_allclose(lin[1], scan[1], atol=1e-5)
    np.testing.assert_array_equal(lin[2], scan[2])
    assert len(set(np.asarray(lin[0]).ravel().tolist())) > 3


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_layer_list_forward_equals_the_scan(family):
    """`model(..., cache=..., layers=model.layer_list(fused))` gives the scan's hidden states and cache, with
    the per-layer weights as stored and with q/k/v and gate/up fused (what the sampler passes), for the
    llama, qwen2 (q/k/v biases) and qwen3 (q/k norms) layers; and over one KV buffer per layer
    (`transformer.split_cache`), stacked back (`stack_cache`)."""
    extra = {"llama": {}, "qwen2": dict(attention_bias=True), "qwen3": dict(qk_norm=True)}[family]
    m = tr.create(tr.tiny_config(V, num_layers=3, **extra), jax.random.key(5))
    if family == "qwen2":  # non-zero biases, so a mis-split would show
        for name in ("bq", "bk", "bv"):
            getattr(m, name)[...] = 0.1 * jax.random.normal(jax.random.key(len(name)), getattr(m, name).shape)
    toks = jnp.asarray(np.random.default_rng(3).integers(1, V, (2, 7)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
    outs = [m(toks, positions=pos, cache=tr.init_cache(m.cfg, 2, 16), cache_index=0, return_hidden=True,
              layers=layers) for layers in (None, m.layer_list(), m.layer_list(fused=True))]
    # one KV buffer per layer (what the sampler decodes over), with a block loop (block 4) and without (16)
    for block in (4, 16):
        h, c = m(toks, positions=pos, cache=tr.split_cache(tr.init_cache(m.cfg, 2, 16)), cache_index=0,
                 return_hidden=True, layers=m.layer_list(fused=True), attn_block=block)
        assert isinstance(c["k"], list) and c["k"][0].shape == (2, 16, m.cfg.num_kv_heads, m.cfg.dim_head)
        outs.append((h, tr.stack_cache(c)))
    assert set(m.layer_list(fused=True)[0]) >= {"wqkv", "w_gate_up"}
    for out in outs[1:]:
        np.testing.assert_allclose(outs[0][0], out[0], rtol=2e-5, atol=1e-5)  # float32 op order
        for k in ("k", "v"):
            np.testing.assert_allclose(outs[0][1][k], out[1][k], rtol=2e-5, atol=1e-5)


def test_split_cache_round_trip_and_attend_live_rank_check():
    """`split_cache` / `stack_cache` round-trip; `attend_live` on one layer's buffer (layer None) equals the same
    layer read from the stack; a per-layer buffer with a layer index (or a stack without one) is refused."""
    from crl_jax.models.attention import attend_live

    rng = np.random.default_rng(0)
    kc, vc = (jnp.asarray(rng.standard_normal((3, 2, 10, 2, 8)), jnp.float32) for _ in range(2))
    cache = {"k": kc, "v": vc, "valid": jnp.ones((2, 10), bool)}
    split = tr.split_cache(cache)
    assert len(split["k"]) == 3 and split["valid"] is cache["valid"]
    back = tr.stack_cache(split)
    np.testing.assert_array_equal(back["k"], kc)
    np.testing.assert_array_equal(back["v"], vc)
    q = jnp.asarray(rng.standard_normal((2, 1, 4, 8)), jnp.float32)
    for block in (3, 16):
        ref = attend_live(q, kc, vc, 1, cache["valid"], 6, 2, block)
        np.testing.assert_allclose(attend_live(q, split["k"][1], split["v"][1], None, cache["valid"], 6, 2, block),
                                   ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="rank 4 with layer=1"):
        attend_live(q, split["k"][1], split["v"][1], 1, cache["valid"], 6, 2)
    with pytest.raises(ValueError, match="rank 5 with layer=None"):
        attend_live(q, kc, vc, None, cache["valid"], 6, 2)


def test_unroll_layers_config_checked():
    with pytest.raises(ValueError, match="unroll_layers"):
        S.SamplerConfig(max_new_tokens=2, unroll_layers=-2)
    with pytest.raises(ValueError, match="attn_block"):
        S.SamplerConfig(max_new_tokens=2, attn_block=-1)


def test_decode_plan_by_backend():
    """Defaults by backend (a GPU pays a host round trip per data-dependent loop iteration): one block over the
    whole cache and every layer unrolled there; 128-slot blocks and unrolled layers up to 8 deep elsewhere;
    explicit values win everywhere."""
    auto = S.SamplerConfig(max_new_tokens=4)
    assert S.decode_plan(auto, 256, 30, backend="gpu") == (256, True)
    assert S.decode_plan(auto, 256, 30, backend="cpu") == (128, False)
    assert S.decode_plan(auto, 256, 8, backend="tpu") == (128, True)
    assert S.decode_plan(auto, 256, 9, backend="tpu") == (128, False)
    fixed = S.SamplerConfig(max_new_tokens=4, attn_block=32, unroll_layers=0)
    for backend in ("gpu", "cpu"):
        assert S.decode_plan(fixed, 256, 2, backend=backend) == (32, False)
    assert S.decode_plan(auto, 256, 2) == S.decode_plan(auto, 256, 2, backend=jax.default_backend())
