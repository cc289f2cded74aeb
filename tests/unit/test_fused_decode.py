"""The fused batch-1 decode step (`models.experimental.fused_decode`): its Pallas kernels, run in Pallas'
interpreter on the CPU, against the XLA decode step (logits, the written cache slots) and through the sampler
(the same greedy tokens); and the kernels lowered for a CUDA GPU (Triton) from the CPU, which catches the
shapes and operations Triton would refuse before a GPU ever sees them."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import sampling as S
from crl_jax.models.experimental import fused_decode as fd
from crl_jax.models.experimental import fused_sample as fs
from crl_jax.models import transformer as tr
from _fused_models import _model, _prefilled, lowered_step_for_cuda  # tests/ is on sys.path (conftest.py)


@pytest.mark.parametrize("kw,S_cap", [
    ({}, 40),  # 32-slot attention blocks, the last one clamped to end at slot 40
    ({"attention_bias": True}, 100),  # 64-slot blocks, clamped
    ({"qk_norm": True, "tie_embeddings": False}, 64),
    ({"num_kv_heads": 4}, 48),  # no grouping
])
def test_decode_step_equals_the_xla_step(kw, S_cap):
    model = _model(**kw)
    layers, cache, slot, pos = _prefilled(model, S_cap)
    tok, p = jnp.array([7]), jnp.array([pos])
    h, ref = model(tok[:, None], positions=p[:, None], attention_mask=jnp.ones((1, 1), bool), cache=cache,
                   cache_index=slot, return_hidden=True, layers=layers)
    want = model.unembed(h)[:, 0]
    got, new = fd.decode_step(model, layers, tok, p, cache, slot, interpret=True)
    assert got.shape == want.shape == (1, model.cfg.vocab_size) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(new["valid"], ref["valid"])
    for name in ("k", "v"):
        for a, b in zip(new[name], ref[name]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert float(jnp.abs(new[name][0][0, slot]).max()) > 0  # the new slot was written


def test_decode_step_bf16_is_close_to_the_xla_step():
    """bf16: the roundings differ slightly (the normalised input of a projection is not rounded; see the
    module docstring), so the logits agree to bf16 precision, not bitwise."""
    model = _model(param_dtype="bfloat16")
    layers, cache, slot, pos = _prefilled(model, 64)
    tok, p = jnp.array([11]), jnp.array([pos])
    h, _ = model(tok[:, None], positions=p[:, None], attention_mask=jnp.ones((1, 1), bool), cache=cache,
                 cache_index=slot, return_hidden=True, layers=layers)
    want = model.unembed(h)[:, 0]
    got, new = fd.decode_step(model, layers, tok, p, cache, slot, interpret=True)
    assert new["k"][0].dtype == jnp.bfloat16
    rel = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    assert rel < 3e-2, rel


def test_sampler_with_the_kernels_gives_the_same_greedy_tokens():
    model = _model(seed=3)
    gd, params = tr.split(model)
    prompt = jnp.array([[5, 9, 200, 31, 0, 0]])
    length = jnp.array([4])
    out = {k: S.generate((gd, params), prompt, length, jax.random.key(2), max_new_tokens=12, temperature=0.0,
                         decode_kernel=k) for k in ("xla", "pallas_interpret")}
    np.testing.assert_array_equal(out["pallas_interpret"][0], out["xla"][0])
    np.testing.assert_allclose(out["pallas_interpret"][1], out["xla"][1], atol=1e-4)
    np.testing.assert_array_equal(out["pallas_interpret"][2], out["xla"][2])


def test_batches_above_one_keep_the_xla_path_and_bad_shapes_are_errors():
    cfg = _model().cfg
    assert fs.wanted("pallas_interpret", cfg, 1) and not fs.wanted("pallas_interpret", cfg, 4)
    assert not fs.wanted("xla", cfg, 1)
    with pytest.raises(ValueError, match="vocab_size 250 is not a multiple of 128"):
        fs.wanted("pallas_interpret", cfg.replace(vocab_size=250), 1)
    with pytest.raises(ValueError, match="head dim 24"):
        fs.wanted("pallas_interpret", cfg.replace(head_dim=24), 1)
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="CUDA GPU"):
            fs.wanted("pallas", cfg, 1)
    with pytest.raises(ValueError, match="decode_kernel must be one of"):
        S.SamplerConfig(max_new_tokens=4, decode_kernel="triton")


def test_a_jax_without_the_triton_backend_still_samples_and_names_the_way_out():
    """jax 0.11 deprecates Pallas' Triton backend for removal. On a jax without it (simulated: the module made
    unimportable before anything imports it) the sampler imports and samples through XLA and through Pallas'
    interpreter, and only decode_kernel='pallas' fails, with one error naming 'xla'."""
    code = textwrap.dedent("""
        import sys
        sys.modules["jax.experimental.pallas.triton"] = None  # import now raises ImportError
        import jax, jax.numpy as jnp
        from crl_jax import sampling as S
        from crl_jax.models import transformer as tr
        m = tr.create(tr.TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                                           num_heads=4, num_kv_heads=2), jax.random.key(0))
        args = (m, jnp.array([[5, 6, 7]]), jnp.array([3]), jax.random.key(1))
        xla = S.generate(*args, max_new_tokens=4, temperature=0.0)[0]
        interp = S.generate(*args, max_new_tokens=4, temperature=0.0, decode_kernel="pallas_interpret")[0]
        assert (xla == interp).all(), (xla, interp)
        try:
            S.generate(*args, max_new_tokens=4, decode_kernel="pallas")
        except ValueError as e:
            print("ERROR:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stdout.strip().splitlines()[-1]
    assert err.startswith("ERROR: decode_kernel='pallas' builds its kernels with Pallas' Triton backend"), err
    assert "use decode_kernel='xla'" in err


def test_the_kernels_lower_for_cuda_with_triton():
    """SmolLM2-135M's shapes (H 576, 9 / 3 heads of 64, I 1536, V 49,152), bf16, 2 layers, with q/k/v biases and
    q/k norms: every kernel lowers to a Triton call (power-of-two blocks, supported operations)."""
    cfg = tr.TransformerConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=2, num_heads=9,
                               num_kv_heads=3, param_dtype="bfloat16", attention_bias=True, qk_norm=True)
    text = lowered_step_for_cuda(cfg, 256)
    assert text.count("xla.gpu.triton") == 3 * cfg.num_layers + 2  # + the last layer's sum and the head
    for name in ("decode_qkv", "decode_attn", "decode_mlp", "decode_sum", "decode_head"):
        assert name in text


def test_a_carried_cache_with_the_kernels_continues_as_xla_does():
    """Two turns of `continue_tokens` on a carried cache (the LLM rollout's path), temperature 1 with stop
    tokens: the kernels' sampler draws the same tokens as XLA's from the same keys, and leaves the same cache."""
    model = _model(seed=5)
    gd, params = tr.split(model)
    cont = jax.jit(S.continue_tokens, static_argnums=(0, 8))
    out = {}
    for kernel in ("xla", "pallas_interpret"):
        cfg = S.SamplerConfig(max_new_tokens=6, temperature=1.0, stop_tokens=tuple(range(3, 256, 9)),
                              decode_kernel=kernel)
        cache, start, rows = tr.init_cache(model.cfg, 1, 2 * (4 + 6)), jnp.array([0]), []
        for t, user in enumerate(([5, 9, 31, 0], [200, 7, 0, 0])):
            u = jnp.array([user])
            ul = jnp.array([sum(x > 0 for x in user)])
            toks, lp, n, cache = cont(gd, params, cache, t * 10, start, u, ul, jax.random.key(t), cfg)
            start = start + ul + n
            rows.append((toks, lp, n))
        out[kernel] = rows, cache
    for (t1, lp1, n1), (t2, lp2, n2) in zip(out["xla"][0], out["pallas_interpret"][0]):
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(n1, n2)
        np.testing.assert_allclose(lp1, lp2, atol=1e-4)
    np.testing.assert_array_equal(out["xla"][1]["valid"], out["pallas_interpret"][1]["valid"])
    for name in ("k", "v"):  # stacked back to [L, B, S, Hkv, D]
        np.testing.assert_allclose(out["xla"][1][name], out["pallas_interpret"][1][name], atol=1e-5)


@pytest.mark.parametrize("unroll", [0, 1])
def test_every_loop_form_gives_the_same_step(monkeypatch, unroll):
    """The hidden-size loops all unrolled (0) or rolled (1), against the default groups: the same logits
    (hidden 448 = 7 chunks: the default runs two groups of 3 in a loop, then one chunk)."""
    assert fd.UNROLL == 3
    model = _model(hidden_size=448, num_heads=14, num_kv_heads=2)
    layers, cache, slot, pos = _prefilled(model, 40)
    tok, p = jnp.array([9]), jnp.array([pos])
    want, _ = fd.decode_step(model, layers, tok, p, cache, slot, interpret=True)
    monkeypatch.setattr(fd, "UNROLL", unroll)
    got, _ = fd.decode_step(model, layers, tok, p, cache, slot, interpret=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


def test_mlp_partials_summed_between_layers_give_the_same_step(monkeypatch):
    """More MLP programs than `MAX_PARTS` (Qwen2.5-0.5B: 152): `_sum_kernel` sums their partials between layers;
    the same step as XLA's."""
    model = _model(intermediate_size=192)  # 6 MLP programs
    layers, cache, slot, pos = _prefilled(model, 40)
    tok, p = jnp.array([4]), jnp.array([pos])
    h, _ = model(tok[:, None], positions=p[:, None], attention_mask=jnp.ones((1, 1), bool), cache=cache,
                 cache_index=slot, return_hidden=True, layers=layers)
    monkeypatch.setattr(fd, "MAX_PARTS", 4)
    got, _ = fd.decode_step(model, layers, tok, p, cache, slot, interpret=True)
    np.testing.assert_allclose(got, model.unembed(h)[:, 0], rtol=1e-5, atol=2e-5)
