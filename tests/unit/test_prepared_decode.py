"""`sampling.prepare`: decode weights computed once give the tokens and log-probs of the per-call path, and the
compiled call no longer holds them in its temporary memory."""

import jax
import numpy as np
import pytest

from crl_jax import sampling as S
from crl_jax.models import transformer as tr

from _peaked_models import PROMPTS, batch, peaked_tiny  # tests/ is on sys.path (conftest.py)

V = 64
N = 6


@pytest.fixture(scope="module")
def model():
    return peaked_tiny(V)


def assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("opts", [dict(temperature=1.0), dict(temperature=0.0, stop_tokens=(3,)),
                                  dict(temperature=0.7, top_k=5)])
def test_prepared_weights_give_the_per_call_tokens_and_logprobs(model, opts):
    p, l = batch(PROMPTS)
    prep = S.prepare(model)
    assert prep.layers is not None and len(prep.layers) == 2 and "wqkv" in prep.layers[0]
    for seed in (0, 1):
        want = S.generate(model, p, l, jax.random.key(seed), max_new_tokens=N, **opts)
        got = S.generate(prep, p, l, jax.random.key(seed), max_new_tokens=N, **opts)
        assert_same(got, want)


def test_prepared_weights_with_attention_biases_and_a_module():
    gd, pa = peaked_tiny(V, attention_bias=True)  # q/k/v biases fused into "bqkv"
    p, l = batch(PROMPTS)
    prep = S.prepare(tr.merge(gd, pa))
    assert "bqkv" in prep.layers[0]
    assert S.prepare(prep) is prep
    kw = dict(max_new_tokens=N, temperature=1.0)
    assert_same(S.generate(prep, p, l, jax.random.key(3), **kw), S.generate((gd, pa), p, l, jax.random.key(3), **kw))


def test_a_model_decoded_by_the_layer_scan_prepares_nothing():
    deep = peaked_tiny(V, num_layers=9)  # deeper than the CPU's straight-line limit (8): the layer scan
    assert not S.decode_plan(S.SamplerConfig(max_new_tokens=1), 16, 9)[1]
    prep = S.prepare(deep)
    assert prep.layers is None
    p, l = batch(PROMPTS)
    kw = dict(max_new_tokens=N, temperature=1.0)
    assert_same(S.generate(prep, p, l, jax.random.key(4), **kw), S.generate(deep, p, l, jax.random.key(4), **kw))


def test_the_prepared_call_holds_no_copy_of_the_weights_and_compiles_once(model):
    gd, pa = model
    p, l = batch(PROMPTS)
    cfg = S.SamplerConfig(max_new_tokens=N, temperature=1.0)
    prep = S.prepare(model)
    key = jax.random.key(0)
    per_call = S._generate_jit.lower(gd, pa, p, l, key, cfg, None, None).compile().memory_analysis()
    prepared = S._generate_jit.lower(gd, pa, p, l, key, cfg, None, prep.layers).compile().memory_analysis()
    layer_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(prep.layers))
    assert per_call.temp_size_in_bytes - prepared.temp_size_in_bytes >= 0.9 * layer_bytes, (
        per_call.temp_size_in_bytes, prepared.temp_size_in_bytes, layer_bytes)
    S.generate(prep, p, l, key, max_new_tokens=N)
    size = S._generate_jit._cache_size()
    S.generate(prep, p + 1, l, jax.random.key(1), max_new_tokens=N)
    assert S._generate_jit._cache_size() == size, "a prepared call retraced for the same shapes"


def test_prepared_layers_of_another_depth_are_refused(model):
    other = S.prepare(peaked_tiny(V, num_layers=3))
    gd, pa = model
    p, l = batch(PROMPTS)
    with pytest.raises(ValueError, match="3 prepared layers for a model of 2"):
        S.generate(S.Prepared(gd, pa, other.layers), p, l, jax.random.key(0), max_new_tokens=N)


def test_prepared_weights_feed_the_fused_kernels():
    """Batch 1 through the Pallas kernels (`decode_kernel="pallas_interpret"`, Pallas' interpreter on the CPU): the
    prepared per-layer weights are the kernels' operands, with the same tokens as the per-call path."""
    model = peaked_tiny(128)  # the kernels' vocabulary tiles are 128 tokens
    p, l = batch(PROMPTS[:1])
    kw = dict(max_new_tokens=3, temperature=1.0, decode_kernel="pallas_interpret")
    want = S.generate(model, p, l, jax.random.key(7), **kw)
    assert_same(S.generate(S.prepare(model), p, l, jax.random.key(7), **kw), want)
