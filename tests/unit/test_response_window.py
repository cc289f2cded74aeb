"""The extractor's losses over the response window only (tiny path: `loss_fns.response_window_logits`; LLM path:
`train_state.compact_token_logprobs`, also the LLM actor's replies): equal values, metrics and gradients to the
full-sequence path they replace (`response_width=None` / `trained_width=None`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.config import load
from crl_jax.learner import pretrain
from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import extractor_constrained_loss, extractor_prior_loss
from crl_jax.loop.runtime import build
from crl_jax.models import transformer as tr

CFG = ["extractor.hidden_size=32", "extractor.num_layers=2", "extractor.intermediate_size=64",
       "extraction.max_new_tokens=6", "bank.entry_len=8", "extraction.prompt_len=30", "extraction.merge=true",
       "extraction.merge_chunk=2", "env.max_turns=4", "extraction.min_entry=1"]


@pytest.fixture(scope="module")
def rt():
    return build(load(None, CFG))


def _params(rt):
    return tr.split(tr.create(rt.extractor_config, jax.random.key(5)))


def _assert_trees_close(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["distill", "merge"])
def test_prior_loss_over_the_window_equals_the_full_sequence(rt, kind):
    """Synthetic distillation rows (response width = max_new_tokens) and merge rows (their own, wider one)."""
    rows = (pretrain.extractor_rows(rt, jax.random.key(1), 16) if kind == "distill"
            else pretrain.merge_rows(rt, jax.random.key(2), 8))
    assert rows.response_width is not None and rows.response_width < rows.tokens.shape[1] - 1
    gd, params = _params(rt)
    masks, ec = rt.tiny.response_masks(), rt.cfg.extraction
    vg = jax.jit(jax.value_and_grad(lambda p, r: extractor_prior_loss(gd, p, r, masks, ec.min_entry, 0.7)))
    win, full = vg(params, rows), vg(params, rows.replace(response_width=None))
    assert np.isfinite(float(win[0])) and float(win[0]) > 0
    _assert_trees_close(win, full)


def _constrained_batch(rt, W):
    """Rows with responses of different lengths after prompts of different lengths, an empty row (no trained
    token) and a response that ends at the last position -> (masks (first, early, rest), batch)."""
    T = 14
    first, early, rest = (np.asarray(m) for m in rt.tiny.response_masks())
    start = jnp.array([3, 9, 4, 10])
    length = jnp.array([5, 2, 0, 4])  # row 2: nothing trained; row 3: positions 10..13 (the window runs to 14)
    rng = np.random.default_rng(3)
    toks = rng.integers(1, rt.vocab_size, (4, T))
    for b in range(4):  # response tokens the constrained sampler could have drawn (op, entry token, then any)
        for j in range(int(length[b])):
            allowed = first if j == 0 else early if j <= 1 else rest
            toks[b, int(start[b]) + j] = rng.choice(np.flatnonzero(allowed))
    toks = jnp.asarray(toks)
    t = jnp.arange(T)[None]
    mask = (t >= start[:, None]) & (t < (start + length)[:, None])
    blogp = jnp.where(mask, -jax.random.uniform(jax.random.key(4), (4, T), minval=0.2, maxval=3.0), 0.0)
    eb = ts.ExtractorBatch(tokens=toks, loss_mask=mask, behavior_logp=blogp, advantages=jnp.array([1.0, -0.5, 2.0, 0.7]),
                           ready=jnp.asarray(True), response_width=W)
    return (first, early, rest), eb


def test_constrained_cispo_over_the_window_equals_the_full_sequence(rt):
    """The batch of `_constrained_batch`: the window (it runs past T and is clipped) and the full path agree."""
    gd, params = _params(rt)
    (first, early, rest), eb = _constrained_batch(rt, 5)
    fn = extractor_constrained_loss(jnp.asarray(first), jnp.asarray(rest), early_allowed=jnp.asarray(early), min_entry=1, temperature=0.8)

    def loss(p, b):
        num, (den, met) = fn(gd, p, b)
        return num / den, (den, met)

    vg = jax.jit(jax.value_and_grad(loss, has_aux=True))
    win, full = vg(params, eb), vg(params, eb.replace(response_width=None))
    assert float(win[0][1][0]) == 11  # trained tokens: 5 + 2 + 0 + 4
    assert abs(float(win[0][0])) < 100  # tokens the masks allow: finite log-probs
    _assert_trees_close(win, full)


@pytest.mark.parametrize("window", [5, None])
def test_op_entropy_bonus_is_the_op_tokens_mean_entropy(rt, window):
    """`op_entropy=c` lowers the loss by exactly c times the mean entropy of the op token's distribution (the
    first-token mask at temperature 0.8), computed here from the model's logits, over the rows that train an op."""
    gd, params = _params(rt)
    (first, early, rest), eb = _constrained_batch(rt, 5)
    eb = eb.replace(response_width=window)
    kw = dict(early_allowed=jnp.asarray(early), min_entry=1, temperature=0.8)
    off, on = (extractor_constrained_loss(jnp.asarray(first), jnp.asarray(rest), op_entropy=c, **kw)
               for c in (0.0, 0.3))
    (n0, (d0, _)), (n1, (d1, _)) = off(gd, params, eb), on(gd, params, eb)
    logits = np.asarray(tr.merge(gd, params)(eb.tokens), np.float64) / 0.8
    hs = []
    for b, st in ((0, 3), (1, 9), (3, 10)):  # rows with an op; row 2 trains nothing
        z = np.where(first, logits[b, st - 1], -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        hs.append(-np.sum(p[p > 0] * np.log(p[p > 0])))
    assert float(d0) == float(d1) == 11
    np.testing.assert_allclose(float(n1 / d1), float(n0 / d0) - 0.3 * np.mean(hs), rtol=1e-5, atol=1e-6)


def _llm_batch(W):
    """A full-vocabulary extractor batch (the LLM path's layout: prompt, then response; right-padded)."""
    T, V = 16, 300
    start = jnp.array([3, 9, 4, 12])
    length = jnp.array([5, 2, 0, 4])  # row 2: nothing trained; row 3: positions 12..15 (the window runs past T)
    toks = jnp.asarray(np.random.default_rng(7).integers(1, V, (4, T)), jnp.int32)
    t = jnp.arange(T)[None]
    mask = (t >= start[:, None]) & (t < (start + length)[:, None])
    blogp = jnp.where(mask, -jax.random.uniform(jax.random.key(4), (4, T), minval=2.0, maxval=7.0), 0.0)
    return V, ts.ExtractorBatch(tokens=toks, loss_mask=mask, behavior_logp=blogp,
                                advantages=jnp.array([1.0, -0.5, 2.0, 0.7]), ready=jnp.asarray(True), response_width=W)


@pytest.mark.parametrize("jit", [True, False])
def test_llm_cispo_head_over_the_window_equals_the_full_sequence(jit):
    """`extractor_cispo_loss` (LLM path) with the batch's response width: the vocabulary head runs over the
    response tokens only (`train_state.compact_token_logprobs`); log-probs, entropies, loss, metrics and gradients
    equal the full path's. A bound narrower than a response drops its tail (the check can fail)."""
    from crl_jax.learner.loss_fns import CISPOLossConfig, extractor_cispo_loss

    V, eb = _llm_batch(5)
    gd, params = tr.split(tr.create(tr.tiny_config(V), jax.random.key(3)))
    mask = eb.loss_mask & (jnp.arange(eb.tokens.shape[1]) >= 1)[None]
    wrap = jax.jit if jit else (lambda f: f)
    win = wrap(lambda p: ts.compact_token_logprobs(gd, p, eb.tokens, mask, 5, with_entropy=True))(params)
    full = wrap(lambda p: ts.token_logprobs(gd, p, eb.tokens, mask, with_entropy=True))(params)
    _assert_trees_close(win, full)
    assert int((np.asarray(win[0]) != 0).sum()) == 11  # every trained token scored, nothing else
    fn = extractor_cispo_loss(CISPOLossConfig(eps_low=0.2, eps_high=0.1))

    def loss(p, b):
        num, (den, met) = fn(gd, p, b)
        return num / den, (den, met)

    vg = wrap(jax.value_and_grad(loss, has_aux=True))
    w, f = vg(params, eb), vg(params, eb.replace(response_width=None))
    assert float(w[0][1][0]) == 11 and np.isfinite(float(w[0][0]))
    _assert_trees_close(w, f)
    # the head's gradient taken in its forward pass (the default, `train_state.token_loss`) against the general
    # path (`compact_token_logprobs` / `chunked_logprobs` under the loss)
    fn = extractor_cispo_loss(CISPOLossConfig(eps_low=0.2, eps_high=0.1, fused_head=False))
    general = wrap(jax.value_and_grad(lambda p, b: loss(p, b), has_aux=True))  # a new function: no cached trace
    _assert_trees_close(w, general(params, eb))
    _assert_trees_close(w, general(params, eb.replace(response_width=None)))
    narrow = ts.compact_token_logprobs(gd, params, eb.tokens, mask, 3)[0]
    assert int((np.asarray(narrow) != 0).sum()) == 3 + 2 + 0 + 3  # rows 0 and 3 lose their last tokens


def test_llm_actor_ppo_head_over_the_replies_equals_the_full_sequence(monkeypatch):
    """`actor_ppo_loss` on whole conversations (replies scattered between observation tokens, rows with 3, 1 and 0
    replies) with `trained_width`: the vocabulary head runs over the reply tokens only; loss, metrics and
    gradients equal the full path's, with the KL term on too."""
    from crl_jax.learner import loss_fns
    from crl_jax.learner.loss_fns import PPOLossConfig, actor_ppo_loss

    chunks = []  # the head chunk each fused loss hands the head
    fused_loss = loss_fns.token_loss
    monkeypatch.setattr(loss_fns, "token_loss", lambda *a, **k: chunks.append(k["head_chunk"]) or fused_loss(*a, **k))
    T, V = 24, 300
    m = np.zeros((3, T), bool)
    m[0, 5:8] = m[0, 11:13] = m[0, 18:22] = True  # three replies: 3 + 2 + 4 tokens
    m[1, 20:24] = True  # one reply that ends the row
    mask = jnp.asarray(m)
    toks = jnp.asarray(np.random.default_rng(8).integers(1, V, (3, T)), jnp.int32)
    blogp = jnp.where(mask, -jax.random.uniform(jax.random.key(1), (3, T), minval=2.0, maxval=7.0), 0.0)
    ab = ts.ActorBatch(tokens=toks, loss_mask=mask, behavior_logp=blogp, advantages=jnp.array([1.0, -1.0, 0.5]),
                       weight=jnp.ones(3), ref_logp=blogp - 0.1, trained_width=9)
    gd, params = tr.split(tr.create(tr.tiny_config(V), jax.random.key(2)))
    fn = actor_ppo_loss(PPOLossConfig(kl_coef=0.05))

    def loss(p, b):
        num, (den, met) = fn(gd, p, b)
        return num / den, (den, met)

    vg = jax.jit(jax.value_and_grad(loss, has_aux=True))
    c, f = vg(params, ab), vg(params, ab.replace(trained_width=None))
    assert float(c[0][1][0]) > 0 and np.isfinite(float(c[0][0]))
    _assert_trees_close(c, f)
    # fused head (the default) against the general path, over the replies and over every position, both
    # aggregations (row weights unequal), both ratios (with "sequence" the head's chunks hold whole rows)
    for agg, ratio in (("seq_mean_token_mean", "token"), ("token_mean", "token"), ("seq_mean_token_mean", "sequence"),
                       ("token_mean", "sequence")):
        b = ab.replace(weight=jnp.array([0.5, 2.0, 1.0]))
        for width in (9, None):
            fn = actor_ppo_loss(PPOLossConfig(kl_coef=0.05, aggregation=agg, ratio=ratio, fused_head=False))
            general = jax.value_and_grad(loss, has_aux=True)(params, b.replace(trained_width=width))
            for chunk in (1024, 4):  # one head chunk; several (with "sequence": one row each)
                fn = actor_ppo_loss(PPOLossConfig(kl_coef=0.05, aggregation=agg, ratio=ratio, head_chunk=chunk))
                _assert_trees_close(jax.value_and_grad(loss, has_aux=True)(params, b.replace(trained_width=width)),
                                    general)
    assert chunks[-16:] == [1024, 4] * 8
    lp = ts.compact_token_logprobs(gd, params, toks, mask, 9)[0]
    assert int((np.asarray(lp) != 0).sum()) == 13  # 9 + 4: every reply token scored, nothing else
    assert int((np.asarray(ts.compact_token_logprobs(gd, params, toks, mask, 4)[0]) != 0).sum()) == 4 + 4
