"""A small model and a prefilled per-layer cache for the fused decode kernels' tests
(tests/unit/test_fused_decode.py, tests/unit/test_fused_sample.py). Not a test module."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax.models import transformer as tr
from crl_jax.models.gpu_target import abstract_gpu


def _model(seed=0, **kw):
    """A small model the kernels take (hidden 128 = 2 chunks, 4 q / 2 kv heads of 32, 3 MLP programs, 2 vocab
    programs) with every weight random, norms and biases included (their init is ones / zeros)."""
    base = dict(vocab_size=256, hidden_size=128, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=32, max_position_embeddings=256)
    base.update(kw)
    gd, state = tr.split(nnx.eval_shape(lambda: tr.create(tr.TransformerConfig(**base), jax.random.key(0))))
    rng = np.random.default_rng(seed)
    pure = {k: ((1.0 if "norm" in str(k) else 0.0) + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
            for k, v in nnx.to_pure_dict(state).items()}
    nnx.replace_by_pure_dict(state, {k: jnp.asarray(v).astype(base.get("param_dtype", "float32"))
                                     for k, v in pure.items()})
    return tr.merge(gd, state)


def lowered_step_for_cuda(cfg, capacity: int) -> str:
    """The StableHLO text of one fused decode step (`fused_decode.decode_step`) of a model of `cfg` with a
    `capacity`-slot cache, lowered for a CUDA GPU from any backend (shapes only: no weights are made)."""
    from crl_jax.models.experimental import fused_decode as fd

    gd, params = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    cache = jax.eval_shape(lambda: tr.split_cache(tr.init_cache(cfg, 1, capacity)))

    def step(params, tok, pos, cache, idx):
        m = tr.merge(gd, params)
        return fd.decode_step(m, m.layer_list(fused=True), tok, pos, cache, idx)

    i32 = jax.ShapeDtypeStruct((1,), jnp.int32)
    with abstract_gpu():  # jax 0.11 reads the target GPU from the mesh in context (0.10 assumed sm_90)
        return jax.jit(step).trace(params, i32, i32, cache, jax.ShapeDtypeStruct((), jnp.int32)).lower(
            lowering_platforms=("cuda",)).as_text()


def _prefilled(model, S_cap, P=21, pad=3):
    """A per-layer cache holding a left-padded prompt (slots 0 .. pad-1 invalid), ready for slot P."""
    cache = tr.init_cache(model.cfg, 1, S_cap)
    toks = jax.random.randint(jax.random.key(1), (1, P), 0, model.cfg.vocab_size)
    valid = jnp.arange(P)[None] >= pad
    pos = jnp.maximum(jnp.arange(P)[None] - pad, 0)
    layers = model.layer_list(fused=True)
    _, cache = model(toks, positions=pos, attention_mask=valid, cache=cache, cache_index=0, return_hidden=True,
                     layers=layers)
    return layers, tr.split_cache(cache), P, P - pad
