"""Transformer core: cached decoding equals the full forward; padding-aware positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.models import attention
from crl_jax.models import layers as LY
from crl_jax.models import transformer as tr


@pytest.mark.parametrize("bias,qk", [(False, False), (True, False), (False, True)])
def test_cached_equals_full(bias, qk):
    cfg = tr.tiny_config(300, attention_bias=bias, qk_norm=qk)
    m = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, 300)
    full = m(toks)
    cache = tr.init_cache(cfg, 2, 16)
    lo, cache = m(toks[:, :4], positions=jnp.broadcast_to(jnp.arange(4), (2, 4)), cache=cache, cache_index=0)
    outs = [lo]
    for t in range(4, 7):
        lo, cache = m(toks[:, t:t + 1], positions=jnp.full((2, 1), t), cache=cache, cache_index=t)
        outs.append(lo)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=1e-5)


def test_left_padding_matches_unpadded():
    cfg = tr.tiny_config(300)
    m = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (1, 5), 0, 300)
    ref = m(toks)
    pad = 3
    padded = jnp.concatenate([jnp.zeros((1, pad), jnp.int32), toks], 1)
    pos = jnp.maximum(jnp.arange(8) - pad, 0)[None]
    mask = (jnp.arange(8) >= pad)[None]
    out = m(padded, positions=pos, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(out[:, pad:]), np.asarray(ref), atol=1e-5)


def test_bad_config_names_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        tr.tiny_config(10, num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize("layers,bias,qk,remat", [(2, False, False, False), (1, True, True, False),
                                                   (3, False, True, True)])
def test_last_hidden_equals_the_full_forward_at_the_last_position(layers, bias, qk, remat):
    """`last_hidden` (last layer computed for one query row) == the full forward's hidden state at
    lengths-1, for right-padded rows of every length, and its gradient too."""
    cfg = tr.tiny_config(50, hidden_size=32, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         attention_bias=bias, qk_norm=qk, remat=remat)
    model = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (5, 17), 0, 50)
    lens = jnp.array([17, 1, 5, 9, 12])
    mask = jnp.arange(17)[None] < lens[:, None]
    ref = model(toks, attention_mask=mask, return_hidden=True)[jnp.arange(5), lens - 1]
    np.testing.assert_allclose(np.asarray(model.last_hidden(toks, lens)), np.asarray(ref), atol=2e-6)
    graphdef, params = tr.split(model)

    def loss(p, fast):
        m = tr.merge(graphdef, p)
        h = m.last_hidden(toks, lens) if fast else m(toks, attention_mask=mask, return_hidden=True)[jnp.arange(5),
                                                                                                      lens - 1]
        return jnp.sum(jnp.sin(h))

    grad = jax.jit(jax.grad(loss), static_argnums=1)  # the forwards above run eagerly; eager autodiff compiles op by op
    g_fast, g_ref = grad(params, True), grad(params, False)
    for a, b in zip(jax.tree_util.tree_leaves(g_fast), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("layers,remat", [(1, False), (2, False), (3, True)])
def test_hidden_at_equals_the_full_forward_at_the_query_positions(layers, remat):
    """`hidden_at` (last layer computed for the W query rows only) == the full forward's hidden states gathered
    at query [B, W] (any positions: repeated, out of order, in the padding), with and without a key mask; and
    the gradient through it (the full forward packs gate / up into one matmul and `swiglu`'s hand-written
    backward; `hidden_at` keeps them apart under autodiff, so this also checks the packing's gradient)."""
    cfg = tr.tiny_config(50, hidden_size=32, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         remat=remat)
    model = tr.create(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (3, 11), 0, 50)
    query = jnp.array([[0, 4, 5, 6], [10, 10, 2, 9], [3, 1, 7, 0]])
    lens = jnp.array([11, 6, 8])
    graphdef, params = tr.split(model)
    for key_valid in (None, jnp.arange(11)[None] < lens[:, None]):
        full = model(toks, attention_mask=key_valid, return_hidden=True)
        ref = jnp.take_along_axis(full, query[:, :, None], axis=1)
        np.testing.assert_allclose(np.asarray(model.hidden_at(toks, query, key_valid)), np.asarray(ref), atol=2e-6)

    def loss(p, fast):
        m = tr.merge(graphdef, p)
        h = m.hidden_at(toks, query) if fast else jnp.take_along_axis(m(toks, return_hidden=True),
                                                                      query[:, :, None], axis=1)
        return jnp.sum(jnp.sin(h) * jnp.arange(4)[None, :, None])

    grad = jax.jit(jax.grad(loss), static_argnums=1)  # the forwards above run eagerly; eager autodiff compiles op by op
    g_fast, g_ref = grad(params, True), grad(params, False)
    for a, b in zip(jax.tree_util.tree_leaves(g_fast), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("layers,bias,qk", [(2, False, False), (1, True, True), (3, True, False)])
def test_last_hidden_after_an_encoded_prefix_equals_the_packed_prompt(layers, bias, qk):
    """`last_hidden(rest, prefix=encode_prefix(head))` == `last_hidden` over head and rest packed into one
    right-padded row, for rows whose prefix and rest have different lengths (a prefix of 0 tokens too)."""
    cfg = tr.tiny_config(50, hidden_size=32, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         attention_bias=bias, qk_norm=qk)
    model = tr.create(cfg, jax.random.key(0))
    if bias:  # non-zero biases
        model.bq[...] = 0.3 * jax.random.normal(jax.random.key(2), model.bq.shape)
    rng = np.random.default_rng(1)
    head, rest = rng.integers(1, 50, (4, 7)), rng.integers(1, 50, (4, 6))
    head_len, rest_len = np.array([7, 3, 0, 5]), np.array([6, 1, 4, 2])
    packed = np.zeros((4, 13), np.int64)
    for b in range(4):
        packed[b, :head_len[b]] = head[b, :head_len[b]]
        packed[b, head_len[b]:head_len[b] + rest_len[b]] = rest[b, :rest_len[b]]
    ref = model.last_hidden(jnp.asarray(packed), jnp.asarray(head_len + rest_len))
    pre = model.encode_prefix(jnp.asarray(head), jnp.asarray(head_len))
    assert pre.k.shape == (layers, 4, 7, 2, cfg.dim_head) and pre.valid.shape == (4, 7)
    got = jax.jit(lambda r, rl, p: model.last_hidden(r, rl, prefix=p))(jnp.asarray(rest), jnp.asarray(rest_len), pre)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-6)


@pytest.mark.parametrize("block", [2, 3, 8, 64])
def test_live_length_attention_equals_the_full_forward_at_every_length(block):
    """Prefill 5 tokens into a 13-slot cache, then decode one token at a time: the logits at every
    length 5..12 equal the uncached forward's, whatever the block size (2: seven blocks; 3 and 8:
    a clamped, overlapping last block; 64 >= capacity: one block)."""
    cfg = tr.tiny_config(97, num_layers=2)
    gd, pa = tr.split(tr.create(cfg, jax.random.key(3)))
    fwd = jax.jit(tr.apply, static_argnums=0, static_argnames="attn_block")  # one compile per shape
    toks = jax.random.randint(jax.random.key(4), (2, 12), 0, 97)
    full = fwd(gd, pa, toks)
    cache = tr.init_cache(cfg, 2, 13)
    lo, cache = fwd(gd, pa, toks[:, :5], positions=jnp.broadcast_to(jnp.arange(5), (2, 5)), cache=cache,
                    cache_index=0, attn_block=block)
    outs = [lo]
    for t in range(5, 12):
        lo, cache = fwd(gd, pa, toks[:, t:t + 1], positions=jnp.full((2, 1), t), cache=cache, cache_index=t,
                        attn_block=block)
        outs.append(lo)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=2e-5)
    assert cache["valid"][:, :12].all() and not cache["valid"][:, 12:].any()


def test_attend_live_reads_nothing_past_the_live_length():
    """Garbage (NaN) in unwritten slots past cache_index + T never reaches the output: only the live blocks
    are read. Left-padding slots (valid False) are masked; a query with no valid key gets 0."""
    B, S, Kv, G, D = 1, 12, 1, 2, 4
    k = jax.random.normal(jax.random.key(0), (1, B, S, Kv, D))
    v = jax.random.normal(jax.random.key(1), (1, B, S, Kv, D))
    q = jax.random.normal(jax.random.key(2), (B, 1, Kv * G, D))
    idx = 5  # query at slot 5: keys 0..5 live; slots 0, 1 are padding
    poison = jnp.arange(S)[None, None, :, None, None] >= 8  # past the block [4, 8) that holds slot 5
    kn, vn = jnp.where(poison, jnp.nan, k), jnp.where(poison, jnp.nan, v)
    valid = jnp.arange(S)[None, :] >= 2
    out = attention.attend_live(q, kn, vn, 0, valid, idx, Kv, block=4)  # blocks [0, 4), [4, 8): slots 8.. never read
    s = np.einsum("kgd,skd->kgs", np.asarray(q[0, 0]).reshape(Kv, G, D), np.asarray(k[0, 0, 2:idx + 1])) / 2.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("kgs,skd->kgd", p, np.asarray(v[0, 0, 2:idx + 1])).reshape(-1)
    np.testing.assert_allclose(np.asarray(out[0, 0]), want, rtol=1e-5, atol=1e-6)
    none = attention.attend_live(q, k, v, 0, jnp.zeros((B, S), bool), idx, Kv, block=4)
    assert not np.asarray(none).any()


def test_dense_attention_on_literal_values():
    """One query, two keys (one masked), D = 4: softmax over the single valid key gives its value exactly;
    with both valid, weights exp(s_i) / sum (hand-computed scores 1 and 0 after the 1/sqrt(4) scale)."""
    q = jnp.array([[[[2.0, 0.0, 0.0, 0.0]]]])  # [B=1, T=1, Nq=1, D=4]
    k = jnp.array([[[[1.0, 0.0, 0.0, 0.0]], [[0.0, 1.0, 0.0, 0.0]]]])  # [1, S=2, 1, 4]: scores 2/2 = 1 and 0
    v = jnp.array([[[[1.0, 2.0, 3.0, 4.0]], [[5.0, 6.0, 7.0, 8.0]]]])
    for impl in ("einsum", "xla"):
        one = attention.dense_attention(q, k, v, jnp.array([[[True, False]]]), 1, impl)
        np.testing.assert_allclose(np.asarray(one[0, 0]), [1.0, 2.0, 3.0, 4.0], rtol=1e-6)
        both = attention.dense_attention(q, k, v, jnp.array([[[True, True]]]), 1, impl)
        w = np.exp(1.0) / (np.exp(1.0) + 1.0)
        np.testing.assert_allclose(np.asarray(both[0, 0]), w * np.arange(1, 5) + (1 - w) * np.arange(5, 9), rtol=1e-6)
        none = attention.dense_attention(q, k, v, jnp.zeros((1, 1, 2), bool), 1, impl)
        assert not np.asarray(none).any()  # a query with no valid key gets 0, not a uniform average


@pytest.mark.parametrize("jit", [False, True])
def test_xla_attention_equals_einsum_with_padding_and_grouped_heads(jit):
    """attn_impl "xla" (jax.nn.dot_product_attention) gives the same logits and gradients as the float32
    einsum path on a padded, grouped-query model; "cudnn" off a GPU is a clear error."""
    cfg = tr.tiny_config(300, num_heads=4, num_kv_heads=2)
    models = {impl: tr.create(cfg.replace(attn_impl=impl), jax.random.key(0)) for impl in ("einsum", "xla")}
    toks = jax.random.randint(jax.random.key(1), (2, 9), 0, 300)
    mask = jnp.arange(9)[None, :] < jnp.array([[9], [5]])  # row 1 right-padded: padded queries see keys 0..4

    def loss(params, impl):
        logits = tr.merge(tr.split(models[impl])[0], params)(toks, attention_mask=mask)
        return jnp.sum(jnp.where(mask[..., None], logits, 0.0) ** 2) * 1e-3, logits

    outs = {}
    for impl, m in models.items():
        f = jax.value_and_grad(lambda p: loss(p, impl), has_aux=True)
        outs[impl] = (jax.jit(f) if jit else f)(tr.split(m)[1])
    (l_e, lo_e), g_e = outs["einsum"]
    (l_x, lo_x), g_x = outs["xla"]
    np.testing.assert_allclose(np.asarray(lo_x), np.asarray(lo_e), atol=2e-5)
    np.testing.assert_allclose(float(l_x), float(l_e), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_x), jax.tree.leaves(g_e)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            tr.create(cfg.replace(attn_impl="cudnn"), jax.random.key(0))(toks)
    with pytest.raises(ValueError, match="attn_impl"):
        cfg.replace(attn_impl="flash")


@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_an_unpadded_forward_passes_the_fused_kernel_no_mask(impl, monkeypatch):
    """Without an attention_mask the uncached forward attends under the causal mask alone: the same logits and
    gradients as with an all-True mask, and `jax.nn.dot_product_attention` gets `is_causal` with mask None (on a
    GPU: cuDNN's causal kernel, no [B, 1, T, T] bias and no pass zeroing key-less rows). With a mask it still
    gets the mask. mask=None without causal is a clear error."""
    cfg = tr.tiny_config(300, num_heads=4, num_kv_heads=2).replace(attn_impl=impl)
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    toks = jax.random.randint(jax.random.key(1), (2, 9), 0, 300)
    seen = []
    real = jax.nn.dot_product_attention

    def spy(*args, **kw):
        seen.append((kw.get("mask") is None, kw.get("is_causal")))
        return real(*args, **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)

    def loss(p, mask):
        logits = tr.merge(gd, p)(toks, attention_mask=mask)
        return jnp.sum(logits ** 2) * 1e-3, logits

    (l0, lo0), g0 = jax.value_and_grad(loss, has_aux=True)(params, None)
    (l1, lo1), g1 = jax.value_and_grad(loss, has_aux=True)(params, jnp.ones((2, 9), bool))
    np.testing.assert_allclose(np.asarray(lo0), np.asarray(lo1), atol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    assert seen == ([(True, True), (False, True)] if impl == "xla" else [])  # the layer scan traces once
    q = jnp.ones((1, 3, 1, 4))
    with pytest.raises(ValueError, match="causal=True"):
        attention.dense_attention(q, q, q, None, 1, impl)


def test_auto_attention_picks_cudnn_only_where_it_applies():
    """"auto" resolves by backend, dtype, head dim and CUDA compute capability (literal cases, so the GPU branch
    is covered on a CPU); explicit choices pass through; on this machine's backend the float32 tiny model runs
    einsum."""
    bf16, f32 = jnp.bfloat16, jnp.float32
    pick = attention.attention_impl
    assert pick("auto", bf16, 64, backend="gpu", compute_capability="9.0") == "cudnn"
    assert pick("auto", jnp.float16, 128, backend="gpu", compute_capability="8.0") == "cudnn"
    assert pick("auto", f32, 64, backend="gpu", compute_capability="9.0") == "einsum"  # cuDNN: bf16 / fp16 only
    assert pick("auto", bf16, 64, backend="gpu", compute_capability="7.5") == "einsum"  # pre-Ampere
    assert pick("auto", bf16, 256, backend="gpu", compute_capability="9.0") == "einsum"
    assert pick("auto", bf16, 60, backend="gpu", compute_capability="9.0") == "einsum"
    assert pick("auto", bf16, 64, backend="gpu", compute_capability="gfx90a") == "einsum"  # not CUDA
    assert pick("auto", bf16, 64, backend="cpu") == "einsum"
    assert pick("auto", bf16, 64, backend="tpu") == "einsum"
    assert pick("xla", f32, 64, backend="cpu") == "xla"
    assert tr.tiny_config(10).attn_impl == "auto"
    if jax.default_backend() != "gpu":
        assert pick("auto", bf16, 64) == "einsum"


def _next_token_loss(gd, toks):
    """params -> mean cross-entropy of each token under the full forward's logits at its own position."""

    def loss(p):
        logits = tr.merge(gd, p)(toks).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, toks[..., None], -1)[..., 0])

    return loss


def test_remat_policies_give_the_same_gradients_and_order_the_saved_memory():
    """`remat_policy`: "dots" keeps the projection matmuls' outputs for the backward pass; "mlp" rematerialises
    only the MLP. Gradients equal the unrematerialised ones under every policy, and the compiled temporary memory
    is ordered: recompute everything < keep the matmul outputs < no remat, and recompute everything < recompute
    the MLP only < no remat (T 256, so the saved activations dominate). The ordering is checked with gate and up
    as two matmuls (`pack_mlp=False`): packed, "dots" keeps the packed product `swiglu`'s backward reads, and on
    this CPU the full recompute's temporaries of that backward bring it level with "dots" (29.98 / 29.91 MB)."""
    cfg = tr.tiny_config(256, num_layers=3, hidden_size=64, intermediate_size=256, pack_mlp=False)
    toks = jax.random.randint(jax.random.key(1), (4, 256), 0, 256)
    grads, temp = {}, {}
    for name, kw in (("off", dict(remat=False)), ("nothing", dict(remat=True)),
                     ("dots", dict(remat=True, remat_policy="dots")), ("mlp", dict(remat=True, remat_policy="mlp")),
                     ("packed_nothing", dict(remat=True, pack_mlp=True)),
                     ("packed_mlp", dict(remat=True, remat_policy="mlp", pack_mlp=True))):
        gd, params = tr.split(tr.create(cfg.replace(**kw), jax.random.key(0)))

        loss = _next_token_loss(gd, toks)
        g = jax.jit(jax.grad(loss))
        grads[name] = g(params)
        temp[name] = g.lower(params).compile().memory_analysis().temp_size_in_bytes
    for name in ("nothing", "dots", "mlp", "packed_nothing", "packed_mlp"):
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                               grads[name], grads["off"])
    assert temp["nothing"] < temp["dots"] < temp["off"], temp
    assert temp["nothing"] < temp["mlp"] < temp["off"], temp
    with pytest.raises(ValueError, match="remat_policy"):
        tr.tiny_config(10, remat_policy="everything")


@pytest.mark.parametrize("unroll", [2, 3])
def test_an_unrolled_layer_scan_gives_the_same_loss_and_gradients(unroll):
    """`scan_unroll`: layers per iteration of the uncached forward's scan. Partly (2 of 3 layers) or fully
    unrolled, with the MLP rematerialised: the rolled scan's loss and gradients, and fully unrolled no loop is
    left in the program (the saved activations are no longer written into [L, ...] stacks)."""
    cfg = tr.tiny_config(64, num_layers=3, remat=True, remat_policy="mlp")
    toks = jax.random.randint(jax.random.key(2), (2, 16), 0, 64)
    out = {}
    for u in (1, unroll):
        gd, params = tr.split(tr.create(cfg.replace(scan_unroll=u), jax.random.key(0)))

        loss = _next_token_loss(gd, toks)
        g = jax.jit(jax.value_and_grad(loss))
        out[u] = g(params), g.lower(params).as_text().count("stablehlo.while")
    (l1, g1), loops1 = out[1]
    (lu, gu), loops_u = out[unroll]
    np.testing.assert_allclose(lu, l1, rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), gu, g1)
    assert loops1 == 2 and loops_u == (0 if unroll == 3 else 2)
    with pytest.raises(ValueError, match="scan_unroll"):
        cfg.replace(scan_unroll=0)


@pytest.mark.parametrize("jit", [False, True])
def test_swiglu_literal_values_and_gradient(jit):
    """`layers.swiglu` on a packed [g, u] [..., 2, I]: silu(g) * u, and the packed cotangent
    [dy u s (1 + g (1 - s)), dy g s] with s = sigmoid(g), on hand-computed values."""
    f = jax.jit(LY.swiglu) if jit else LY.swiglu
    gu = jnp.array([[[0.0, 1.0], [2.0, 3.0]]])  # g = [0, 1], u = [2, 3]
    s1 = 1 / (1 + np.exp(-1.0))
    np.testing.assert_allclose(f(gu), [[0.0, 3 * s1]], rtol=1e-6)
    dy = jnp.array([[1.0, -2.0]])
    (d,) = jax.vjp(f, gu)[1](dy)
    want = [1.0 * 2 * 0.5 * 1.0, -2.0 * 3 * s1 * (1 + 1 - s1), 1.0 * 0.0, -2.0 * 1 * s1]
    np.testing.assert_allclose(d, np.reshape(want, (1, 2, 2)), rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_dense_is_the_einsum_over_the_flattened_rows(jit):
    """`layers.dense`: x [..., K] times w [K, *F] (or w [F, K] with "fk") as one matmul over x's flattened rows,
    equal to the einsum over x's own axes, gradients too; w's own axes come back as they are (the packed
    gate / up [K, 2, I]); a literal 1-row case."""
    f = jax.jit(LY.dense, static_argnums=2) if jit else LY.dense
    np.testing.assert_allclose(f(jnp.array([[[1.0, 2.0]]]), jnp.array([[1.0, 0.0, 3.0], [0.5, 2.0, -1.0]]), "kf"),
                               [[[2.0, 4.0, 1.0]]])
    k = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(k[0], (3, 5, 8))
    for w, spec, axes in ((jax.random.normal(k[1], (8, 6)), "btk,kf->btf", "kf"),
                          (jax.random.normal(k[1], (6, 8)), "btk,fk->btf", "fk"),
                          (jax.random.normal(k[2], (8, 2, 4)), "btk,kai->btai", "kf")):
        got, ref = f(x, w, axes), jnp.einsum(spec, x, w)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        g = jax.grad(lambda x, w: (f(x, w, axes) ** 2).sum(), argnums=(0, 1))(x, w)
        r = jax.grad(lambda x, w: (jnp.einsum(spec, x, w) ** 2).sum(), argnums=(0, 1))(x, w)
        for a, b in zip(g, r):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_swiglu_gradient_equals_autodiff_in_float32_and_bfloat16():
    k = jax.random.split(jax.random.key(5), 2)
    gu = 3.0 * jax.random.normal(k[0], (2, 5, 2, 24))  # both tails of the sigmoid
    dy = jax.random.normal(k[1], (2, 5, 24))
    plain = lambda x: jax.nn.silu(x[..., 0, :]) * x[..., 1, :]  # noqa: E731
    for dt, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 2e-2)):
        x, c = gu.astype(dt), dy.astype(dt)
        (got,), (ref,) = jax.vjp(LY.swiglu, x)[1](c), jax.vjp(plain, x.astype(jnp.float32))[1](c.astype(jnp.float32))
        assert got.dtype == dt and LY.swiglu(x).dtype == dt
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref), rtol=tol, atol=tol)
        np.testing.assert_array_equal(np.asarray(LY.swiglu(x)), np.asarray(plain(x)))


def test_packed_gate_up_gives_the_same_loss_and_gradients_with_fewer_matmuls():
    """`pack_mlp` (the default): the uncached forward's gate / up as one [L, H, 2, I] matmul under `swiglu`'s
    backward; off, as two. Same loss and gradients (w_gate's and w_up's too), 3 dot_generals fewer per layer in
    the gradient's program (gate / up forward, their input gradient, their weight gradient). `merge_gate_up` (the
    packed weight's matmul over [H, 2I], the CPU's default without a tensor axis): the same, with as many matmuls."""
    cfg = tr.tiny_config(64, num_layers=2, hidden_size=32, intermediate_size=48)
    toks = jax.random.randint(jax.random.key(3), (2, 12), 0, 64)
    out = {}
    for name, kw in (("packed", dict(pack_mlp=True)), ("merged", dict(pack_mlp=True, merge_gate_up=True)),
                     ("apart", dict(pack_mlp=False))):
        gd, params = tr.split(tr.create(cfg.replace(**kw), jax.random.key(0)))

        loss = _next_token_loss(gd, toks)
        g = jax.jit(jax.value_and_grad(loss))
        out[name] = g(params), g.lower(params).as_text().count("stablehlo.dot_general")
    (lu, gu), dots_u = out["apart"]
    for name in ("packed", "merged"):
        (lp, gp), dots_p = out[name]
        np.testing.assert_allclose(lp, lu, rtol=1e-6)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), gp, gu)
        assert dots_u - dots_p == 3, (name, dots_p, dots_u)
