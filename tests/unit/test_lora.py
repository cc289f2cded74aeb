"""LoRA as a parameter transform (crl_jax/models/lora.py): zero-init adapters leave the logits unchanged,
the merged forward equals an independent numpy construction of W + (alpha/r) A B and, per projection, the
unmerged x W + s (x A) B; only adapters get gradients, and an optimizer step leaves the base bit-identical."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from crl_jax.models import lora
from crl_jax.models import transformer as tr


@pytest.fixture(scope="module")
def small():
    cfg = tr.tiny_config(40, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=24)
    gd, base = tr.split(tr.create(cfg, jax.random.key(0)))
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, 40)
    return gd, base, toks


def _random_b(ad, key):
    """Adapters with non-zero b (a fresh adapter's b is 0, which would hide a wrong product)."""
    return {n: {"a": v["a"], "b": jax.random.normal(jax.random.fold_in(key, i), v["b"].shape) * 0.3}
            for i, (n, v) in enumerate(ad.items())}


def test_zero_init_adapters_leave_logits_unchanged(small):
    gd, base, toks = small
    ad = lora.init(base, jax.random.key(2), rank=4)
    assert set(ad) == set(lora.ALL_TARGETS)
    assert all(float(jnp.abs(v["a"]).sum()) > 0 and float(jnp.abs(v["b"]).sum()) == 0 for v in ad.values())
    np.testing.assert_array_equal(tr.apply(gd, lora.merge(base, ad, lora.scale(4, 16.0)), toks),
                                  tr.apply(gd, base, toks))


def test_merged_equals_numpy_construction_and_unmerged_projection(small):
    gd, base, toks = small
    s = lora.scale(4, 8.0)
    ad = _random_b(lora.init(base, jax.random.key(3), rank=4, targets=("wq", "w_down")), jax.random.key(4))
    merged = lora.merge(base, ad, s)
    # independent construction: numpy W + s * A @ B per layer, only at the targets
    ref = jax.tree_util.tree_map(lambda x: x, base)
    for name in ("wq", "w_down"):
        w = np.asarray(base[name][...], np.float64)
        a, b = np.asarray(ad[name]["a"], np.float64), np.asarray(ad[name]["b"], np.float64)
        want = w + s * np.stack([a[i] @ b[i] for i in range(w.shape[0])])
        np.testing.assert_allclose(np.asarray(merged[name][...]), want, rtol=1e-5, atol=1e-6)
        ref[name].set_value(jnp.asarray(want, jnp.float32))
    for name in ("wk", "wv", "wo", "w_gate", "w_up", "embed"):
        np.testing.assert_array_equal(merged[name][...], base[name][...])
    np.testing.assert_allclose(tr.apply(gd, merged, toks), tr.apply(gd, ref, toks), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(tr.apply(gd, merged, toks) - tr.apply(gd, base, toks)).max()) > 1e-3  # it does act
    # unmerged, per projection: x W_eff == x W + s (x A) B
    x = jax.random.normal(jax.random.key(5), (3, base["wq"][...].shape[1]))
    w, a, b = base["wq"][...][1], ad["wq"]["a"][1], ad["wq"]["b"][1]
    np.testing.assert_allclose(x @ merged["wq"][...][1], x @ w + s * ((x @ a) @ b), rtol=1e-5, atol=1e-5)


def test_only_adapters_get_gradients_and_base_stays_bit_identical(small):
    gd, base, toks = small
    s = lora.scale(4, 16.0)
    ad = _random_b(lora.init(base, jax.random.key(6), rank=4), jax.random.key(7))
    before = jax.tree_util.tree_map(lambda x: np.array(x, copy=True), base)

    def loss(b_, a_):
        logits = tr.apply(gd, lora.merge(b_, a_, s), toks)
        return -jax.nn.log_softmax(logits)[..., 0].mean()

    g_base, g_ad = jax.jit(jax.grad(loss, argnums=(0, 1)))(base, ad)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(g_base))
    assert all(float(jnp.abs(g).max()) > 0.0 for g in jax.tree_util.tree_leaves(g_ad))
    tx = optax.adam(1e-2)
    opt = tx.init(ad)  # the optimizer only ever sees the adapters

    @jax.jit
    def step(b_, a_, o):
        l, g = jax.value_and_grad(lambda x: loss(b_, x))(a_)
        u, o = tx.update(g, o, a_)
        return optax.apply_updates(a_, u), o, l

    l0 = None
    for _ in range(3):
        ad, opt, l = step(base, ad, opt)
        l0 = l if l0 is None else l0
    assert float(jax.jit(loss)(base, ad)) < float(l0)
    for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(base)):
        np.testing.assert_array_equal(x, np.asarray(y))
    assert lora.num_params(ad) == sum(x.size for x in jax.tree_util.tree_leaves(opt[0].mu))


def test_targets_are_validated():
    assert lora.parse_targets("all") == lora.ALL_TARGETS
    assert lora.parse_targets("wq, wv") == ("wq", "wv")
    with pytest.raises(ValueError, match="lora.targets"):
        lora.parse_targets("wq,embed")


def _lora_states(small, tx):
    """Two train states over ONE base: the extractor holds it, the actor's LoRAParams has base None."""
    from crl_jax.learner import train_state as ts

    gd, base, _ = small
    s = lora.scale(4, 8.0)
    mk = lambda k, b: ts.create_train_state(  # noqa: E731
        (gd, lora.LoRAParams(adapters=_random_b(lora.init(base, jax.random.key(k), rank=4), jax.random.key(k + 1)),
                             base=b, scale=s)), tx)
    return mk(10, None), mk(20, base)


def _nll(graphdef, params, batch):
    toks, w = batch
    lp = jax.nn.log_softmax(tr.apply(graphdef, params, toks).astype(jnp.float32))
    tgt = jnp.take_along_axis(lp[:, :-1], toks[:, 1:, None], -1)[..., 0]
    num = -(tgt.sum(1) * w).sum()
    return num, (jnp.float32(toks.shape[0] * (toks.shape[1] - 1)), {"approx_kl": jnp.float32(0.0)})


def test_train_state_over_adapters_shared_base_and_exact_micro_batches(small):
    """`learner.train_state` with `lora.LoRAParams`: the optimizer state is the adapters', the actor borrows the
    extractor's base in the co-update, the base comes out bit-identical, the effective weights move only at the
    adapted projections, and 2 micro-batches give the 1-batch update (gradient accumulation is exact)."""
    from crl_jax.learner import train_state as ts

    gd, base, toks = small
    tx = optax.adam(1e-2)
    actor, extractor = _lora_states(small, tx)
    assert jax.tree_util.tree_structure(actor.opt_state[0].mu) == jax.tree_util.tree_structure(actor.params.adapters)
    assert ts.shared_base(actor.params, extractor.params) is extractor.params.base
    assert ts.shared_base(extractor.params, actor.params) is None
    batch = (jnp.concatenate([toks, toks[::-1]]), jnp.asarray([1.0, 0.5, 0.25, 2.0]))
    with pytest.raises(ValueError, match="share another model's base"):
        lora.effective(actor.params)
    up1 = jax.jit(lambda a, b: ts.apply_update(a, batch, _nll, 1, base=b))
    up2 = jax.jit(lambda a, b: ts.apply_update(a, batch, _nll, 2, base=b))
    (a1, m1), (a2, _) = up1(actor, extractor.params.base), up2(actor, extractor.params.base)
    assert float(m1["updated"]) == 1.0 and a1.params.base is None
    for x, y in zip(jax.tree_util.tree_leaves(a1.params.adapters), jax.tree_util.tree_leaves(a2.params.adapters)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    eb = ts.ExtractorBatch(tokens=batch[0], loss_mask=None, behavior_logp=None, advantages=batch[1],
                           ready=jnp.asarray(True))
    loss_e = lambda g, p, b: _nll(g, p, (b.tokens, b.advantages))  # noqa: E731
    co = ts.make_co_update(_nll, loss_e, donate=False)
    a3, e3, m = co(actor, extractor, batch, eb)
    assert float(m["actor/updated"]) == 1.0 and float(m["extractor/updated"]) == 1.0
    for x, y in zip(jax.tree_util.tree_leaves(a3.params.adapters), jax.tree_util.tree_leaves(a1.params.adapters)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)  # same step as alone
    for x, y in zip(jax.tree_util.tree_leaves(e3.params.base), jax.tree_util.tree_leaves(base)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    eff0, eff1 = lora.effective(actor.params, base), lora.effective(a3.params, e3.params.base)
    for name in eff0:
        assert np.array_equal(np.asarray(eff0[name][...]), np.asarray(eff1[name][...])) == \
            (name not in lora.ALL_TARGETS), name
