"""The batch-1 draw in a Pallas kernel and the all-kernel decode loop (`models.experimental.fused_sample`): the
head kernel's tile statistics against XLA's, the draw against `sampling.sample_logits` / `inverse_cdf_index`
with the same uniforms (tokens equal, log-probs close; greedy ties; uniforms at 0 and next to 1), and the
sampler through the kernels against XLA's at several temperatures; run in Pallas' interpreter on the CPU, and
lowered for a CUDA GPU (Triton)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import sampling as S
from crl_jax.models.experimental import fused_decode as fd
from crl_jax.models.experimental import fused_sample as fs
from crl_jax.models import transformer as tr
from crl_jax.models.gpu_target import abstract_gpu
from _fused_models import _model, _prefilled, lowered_step_for_cuda  # tests/ is on sys.path (conftest.py)


def _logits(V, seed, spread=3.0):
    """Random logits with a few peaked tokens (most of the mass in a handful of tiles, as a trained LM's)."""
    rng = np.random.default_rng(seed)
    x = spread * rng.standard_normal(V)
    x[rng.integers(0, V, 4)] += 8.0
    return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("V,chunk,padded", [(256, 2, 2), (384, 4, 4), (128 * 300, 128, 384)])
def test_stat_tiles_pad_to_whole_chunks(V, chunk, padded):
    assert fd.stat_tiles(V) == (V // 128, padded, chunk)
    m, s = fs.tile_stats(_logits(V, 0), 0.7)
    assert m.shape == s.shape == (padded,)
    assert np.all(np.isneginf(m[V // 128:])) and np.all(s[V // 128:] == 0) and np.all(s[:V // 128] >= 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_the_head_kernel_writes_the_tile_statistics(temperature):
    model = _model(vocab_size=384)  # 3 tiles, padded to 4: one program writes an empty tile
    layers, cache, slot, pos = _prefilled(model, 40)
    start = jnp.array([slot, pos], jnp.int32)
    logits, m, s, *_ = fd.forward(model, layers, jnp.array([7], jnp.int32), jnp.zeros((1,), jnp.int32), start,
                                  cache["k"], cache["v"], cache["valid"][0].astype(jnp.int32),
                                  temperature=temperature, interpret=True)
    want_m, want_s = fs.tile_stats(logits, temperature)
    np.testing.assert_allclose(m, want_m, rtol=1e-6)
    np.testing.assert_allclose(s, want_s, rtol=1e-5)


@functools.partial(jax.jit, static_argnames=("temperature", "step", "N", "stops"))
def _draw_kernel(logits, u, temperature, step, N, stops):
    """The statistics and draw kernels (interpreted) as one compiled program: u is an argument, so the draw
    tests' 40 uniforms per (V, temperature) run one program (eagerly, each draw re-traced the interpreter)."""
    m, s = fs.tile_stats(logits, temperature)
    out_t, out_lp = jnp.full((1, N), -1, jnp.int32), jnp.full((1, N), 9.0, jnp.float32)
    us = jnp.zeros((N,), jnp.float32).at[step].set(u)
    return fs.sample(jnp.array([step], jnp.int32), us, logits, m, s, out_t, out_lp, temperature=temperature,
                     stops=stops, interpret=True)


def _draw(logits, u, temperature, step=2, N=5, stops=(5, 7)):
    tok, out_t, out_lp, done = _draw_kernel(logits, jnp.float32(u), temperature, step, N, stops)
    assert int(done[0]) == int(int(tok[0]) in stops)  # the stop check
    others = np.delete(np.arange(N), step)
    assert np.all(np.asarray(out_t)[0, others] == -1) and np.all(np.asarray(out_lp)[0, others] == 9.0)
    assert int(out_t[0, step]) == int(tok[0])
    return int(tok[0]), float(out_lp[0, step])


@pytest.mark.parametrize("V", [384, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_draw_equals_xla_inverse_cdf_with_the_same_uniform(V, temperature):
    """Each key's uniform gives the token `sample_logits` draws, and its log-prob; 40 draws over 2 logit rows."""
    for seed in range(2):
        logits = _logits(V, seed)
        for k in range(20):
            key = jax.random.fold_in(jax.random.key(seed), k)
            u = float(jax.random.uniform(key, (1,), jnp.float32)[0])
            want_t, want_lp = S.sample_logits(logits[None], key, temperature=temperature)
            tok, lp = _draw(logits, u, temperature)
            assert tok == int(want_t[0]), (seed, k, u)
            np.testing.assert_allclose(lp, float(want_lp[0]), atol=2e-5)


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0 ** -24, 0.5])
def test_the_draw_at_the_ends_of_the_unit_interval(u):
    """u = 0: the first token of positive probability; u next to 1: the last (`inverse_cdf_index`'s rule),
    even where float32 rounding of the sums would pass it."""
    logits = _logits(1024, 3, spread=6.0)
    p = jax.nn.softmax(logits)[None]
    want = int(S.inverse_cdf_index(jnp.array([u], jnp.float32), p)[0])
    tok, lp = _draw(logits, u, 1.0)
    assert tok == want
    np.testing.assert_allclose(lp, float(jax.nn.log_softmax(logits)[want]), atol=2e-5)


def test_greedy_takes_the_first_maximum_across_tiles():
    logits = _logits(1024, 4).at[300].set(50.0).at[700].set(50.0).at[299].set(50.0)
    tok, lp = _draw(logits, 0.3, 0.0, stops=(3, 299))  # a stop token: done
    assert tok == 299 == int(jnp.argmax(logits))
    np.testing.assert_allclose(lp, float(jax.nn.log_softmax(logits)[299]), atol=1e-5)


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(temperature=1.0, stop_tokens=(3, 17, 40, 101)),
                                dict(temperature=1.0, top_k=20)])
def test_the_sampler_through_the_kernels_equals_xla(kw):
    """`generate` at batch 1: the all-kernel loop (temperature only, with or without stop tokens) and the
    kernels with XLA's sampling between them (top-k) draw XLA's tokens from the same key."""
    model = _model(seed=6)
    gd, params = tr.split(model)
    prompt, length = jnp.array([[5, 9, 200, 31, 0, 0]]), jnp.array([4])
    for key in range(3):
        out = {k: S.generate((gd, params), prompt, length, jax.random.key(key), max_new_tokens=10,
                             decode_kernel=k, **kw) for k in ("xla", "pallas_interpret")}
        np.testing.assert_array_equal(out["pallas_interpret"][0], out["xla"][0])
        np.testing.assert_array_equal(out["pallas_interpret"][2], out["xla"][2])
        np.testing.assert_allclose(out["pallas_interpret"][1], out["xla"][1], atol=1e-4)


def test_a_dead_row_generates_nothing_through_the_kernels():
    model = _model(seed=1)
    gd, params = tr.split(model)
    cfg = S.SamplerConfig(max_new_tokens=4, decode_kernel="pallas_interpret", pad_id=0)
    cache = tr.init_cache(model.cfg, 1, 10)
    toks, lp, n, _ = S.continue_tokens(gd, params, cache, 0, jnp.array([0]), jnp.array([[5, 9]]), jnp.array([2]),
                                       jax.random.key(0), cfg, live=jnp.array([False]))
    assert np.all(np.asarray(toks) == 0) and np.all(np.asarray(lp) == 0) and int(n[0]) == 0


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_draw_lowers_for_cuda_with_triton(temperature):
    """At SmolLM2's vocabulary (384 tiles: 3 chunks of statistics): one Triton call, no XLA fallback."""
    V, N = 49152, 16
    sds = jax.ShapeDtypeStruct
    args = (sds((1,), jnp.int32), sds((N,), jnp.float32), sds((V,), jnp.float32), sds((384,), jnp.float32),
            sds((384,), jnp.float32), sds((1, N), jnp.int32), sds((1, N), jnp.float32))
    draw = lambda *a: fs.sample(*a, temperature=temperature, stops=(2, V - 1))  # noqa: E731
    with abstract_gpu():  # jax 0.11 reads the target GPU from the mesh in context
        text = jax.jit(draw).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1 and "decode_sample" in text


def test_a_step_with_padded_tile_statistics_lowers_for_cuda():
    """Vocabulary 384 (3 tiles, padded to 4): the head's programs past the vocabulary write an empty tile, which
    Triton must lower too (a scalar store of an infinite literal does not)."""
    cfg = tr.TransformerConfig(vocab_size=384, hidden_size=128, intermediate_size=96, num_layers=1, num_heads=4,
                               num_kv_heads=2, head_dim=32)
    text = lowered_step_for_cuda(cfg, 64)
    assert text.count("xla.gpu.triton") == 3 + 2
