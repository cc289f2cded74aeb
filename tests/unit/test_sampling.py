"""Sampler: greedy == uncached argmax, batching invariance, filtered log-probs, masks, stops, retracing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import sampling as S
from crl_jax.models import transformer as tr

from _peaked_models import PROMPTS, batch, peaked_tiny  # tests/ is on sys.path (conftest.py)

V = 64
N = 6


@pytest.fixture(scope="module")
def model():
    """Tiny model with peaked logits (`_peaked_models.peaked_tiny`)."""
    return peaked_tiny(V)


T_REF = 12  # every reference forward is padded to [3, T_REF]: one compile for the module
_fwd = jax.jit(tr.apply, static_argnums=0)
_seq_lp = jax.jit(S.sequence_logprobs, static_argnums=0)


def ref_logits(model, seqs):
    """Uncached full forward of unpadded sequences -> float64 logits [B, T_REF, V]. The model is causal,
    so logits[b, t] are those of the prefix seqs[b][:t+1] alone (trailing zeros never influence them)."""
    gd, pa = model
    arr = np.zeros((3, T_REF), np.int32)
    for i, q in enumerate(seqs):
        arr[i, : len(q)] = q
    return np.asarray(_fwd(gd, pa, jnp.asarray(arr)), np.float64)


def log_softmax(x):
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def ref_filter(logits, temperature, top_k=0, top_p=1.0, allowed=None):
    """Independent numpy filter: mask -> temperature -> top-k -> top-p; returns log-probs (-inf = dropped)."""
    x = np.where(allowed, logits, -np.inf) if allowed is not None else logits.copy()
    x = x / temperature
    if top_k:
        x = np.where(x >= np.sort(x)[-top_k], x, -np.inf)
    if top_p < 1:
        p = np.exp(log_softmax(x))
        order = np.argsort(-p)
        keep = np.zeros_like(p, bool)
        mass = 0.0
        for j in order:  # add tokens until the kept mass reaches top_p
            keep[j] = True
            mass += p[j]
            if mass >= top_p:
                break
        x = np.where(keep, x, -np.inf)
    return log_softmax(x)


# ----------------------------------------------------------------------------------------------


def test_left_align_literal():
    toks, pos, valid = S.left_align(jnp.array([[1, 2, 3], [4, 0, 0]]), jnp.array([3, 1]), pad_id=9)
    np.testing.assert_array_equal(toks, [[1, 2, 3], [9, 9, 4]])
    np.testing.assert_array_equal(pos, [[0, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(valid, [[True, True, True], [False, False, True]])


def test_sample_logits_hand_computed():
    lg = jnp.log(jnp.array([[0.5, 0.3, 0.2]]))
    k = jax.random.key(0)
    # top-p 0.6 keeps {0.5, 0.3}: renormalised p(token 0) = 0.5 / 0.8.
    x = S.filter_logits(lg, top_p=0.6)
    np.testing.assert_allclose(jax.nn.softmax(x)[0], [0.625, 0.375, 0.0], atol=1e-6)
    # top-k 1 -> deterministic, log-prob 0.
    tok, lp = S.sample_logits(lg, k, top_k=1)
    assert int(tok[0]) == 0 and abs(float(lp[0])) < 1e-6
    # Mask out token 0 then greedy: token 1 with log(0.3 / 0.5).
    tok, lp = S.sample_logits(lg, k, temperature=0.0, allowed=jnp.array([False, True, True]))
    assert int(tok[0]) == 1
    np.testing.assert_allclose(float(lp[0]), np.log(0.6), atol=1e-6)
    # Temperature 0.5 squares the probabilities: p ∝ (0.25, 0.09, 0.04).
    x = S.filter_logits(lg, temperature=0.5)
    np.testing.assert_allclose(jax.nn.softmax(x)[0], np.array([0.25, 0.09, 0.04]) / 0.38, atol=1e-6)


def test_inverse_cdf_index_literal():
    """c = cumsum(p) = (0, .2, .2, .7, 1.0): u in [0, .2) -> 1, [.2, .7) -> 3, [.7, 1) -> 4; the weight-0 tokens
    0 and 2 are never drawn, not even at u = 0 or exactly on a boundary."""
    p = jnp.array([[0.0, 0.2, 0.0, 0.5, 0.3]] * 7)
    u = jnp.array([0.0, 0.1, 0.2, 0.45, 0.7, 0.99, 1.0 - 2.0 ** -24])
    np.testing.assert_array_equal(S.inverse_cdf_index(u, p), [1, 1, 3, 3, 4, 4, 4])
    # unnormalised weights and trailing zeros: (0, 2, 0, 0) always gives 1
    trailing = S.inverse_cdf_index(jnp.array([0.0, 0.5, 0.9999999]), jnp.array([[0.0, 2.0, 0, 0]] * 3))
    np.testing.assert_array_equal(trailing, [1, 1, 1])
    np.testing.assert_array_equal(jax.jit(S.inverse_cdf_index)(u, p), [1, 1, 3, 3, 4, 4, 4])


def test_categorical_inverse_cdf_frequencies():
    """20,000 draws per row match the probabilities (4 sigma), and -inf tokens never come up."""
    probs = np.array([[0.5, 0.0, 0.3, 0.15, 0.05], [0.0, 0.0, 0.0, 1.0, 0.0]])
    logp = jnp.log(jnp.asarray(probs, jnp.float32))
    keys = jax.random.split(jax.random.key(0), 20000)
    toks = np.asarray(jax.vmap(lambda k: S.categorical_inverse_cdf(k, logp))(keys))  # [n, 2]
    n = toks.shape[0]
    for row in range(2):
        freq = np.bincount(toks[:, row], minlength=5) / n
        sigma = np.sqrt(probs[row] * (1 - probs[row]) / n)
        assert np.all(np.abs(freq - probs[row]) <= 4 * sigma + 1e-12), (row, freq)
        assert np.all(freq[probs[row] == 0] == 0)


def test_first_token_mixture_literal():
    """SamplerConfig.first_mix: the first token comes from (1 - m) p + m * uniform(allowed) with that
    log-prob; later tokens are unmixed."""
    lg = jnp.log(jnp.array([[0.5, 0.3, 0.2, 1e-30]]))
    allowed = jnp.array([True, True, False, True])  # p over the allowed set: (.5, .3, ~0) / .8
    m = 0.3
    p = np.array([0.5, 0.3, 0.0, 0.0]) / 0.8
    want = (1 - m) * p + m / 3 * np.array([1, 1, 0, 1])
    got = np.exp(S.mix_uniform(jax.nn.log_softmax(S.filter_logits(lg, allowed=allowed)), jnp.float32(m)))
    np.testing.assert_allclose(got[0], want, atol=1e-6)
    keys = jax.random.split(jax.random.key(0), 4000)
    toks, lps = jax.vmap(lambda k: S.sample_logits(lg, k, allowed=allowed, mix=jnp.float32(m)))(keys)
    toks, lps = np.asarray(toks[:, 0]), np.asarray(lps[:, 0])
    np.testing.assert_allclose(lps, np.log(want[toks]), atol=1e-5)  # the mixture's log-prob, token by token
    assert 2 not in toks  # never a disallowed token
    np.testing.assert_allclose(np.mean(toks == 3), m / 3, atol=0.02)  # the ~0-probability token: m/3 of draws
    # m = 0 is the plain distribution
    np.testing.assert_allclose(np.exp(S.mix_uniform(jnp.log(jnp.array([[0.25, 0.75]])), jnp.float32(0.0))),
                               [[0.25, 0.75]], atol=1e-7)


def test_first_mix_in_sample_tokens(model):
    """Through the decode loop: only the first step is mixed (its log-prob >= log(m / n_allowed)); the later
    tokens and log-probs equal an unmixed run's given the same first token."""
    allowed = np.zeros((N, V), bool)
    allowed[0, [3, 4, 5]] = True
    allowed[1:, :] = True
    pb, lb = batch(PROMPTS)
    cfg = S.SamplerConfig(max_new_tokens=N, temperature=1.0, first_mix=0.6)
    toks, lps, _ = S.sample_tokens(*model, pb, lb, jax.random.key(1), cfg, jnp.broadcast_to(jnp.asarray(allowed), (3, N, V)))
    assert set(np.asarray(toks[:, 0]).tolist()) <= {3, 4, 5}
    assert (np.asarray(lps[:, 0]) >= np.log(0.6 / 3) - 1e-6).all()
    ref = ref_logits(model, [pr + np.asarray(toks[b]).tolist() for b, pr in enumerate(PROMPTS)])
    for b, pr in enumerate(PROMPTS):
        for t in range(N):
            lp_ref = ref_filter(ref[b, len(pr) + t - 1], 1.0, 0, 1.0, allowed[t])
            if t == 0:  # the mixture over the 3 allowed first tokens
                lp_ref = np.log(0.4 * np.exp(lp_ref) + 0.6 / 3 * allowed[0])
            np.testing.assert_allclose(float(lps[b, t]), lp_ref[int(toks[b, t])], atol=1e-4)
    with pytest.raises(ValueError, match="first_mix"):
        S.SamplerConfig(max_new_tokens=2, first_mix=1.0)


def test_bad_config():
    with pytest.raises(ValueError, match="top_p"):
        S.SamplerConfig(max_new_tokens=2, top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        S.SamplerConfig(max_new_tokens=0)


def test_greedy_equals_uncached_argmax_and_batch_invariance(model):
    p, l = batch(PROMPTS)
    toks, lps, lens = S.generate(model, p, l, jax.random.key(0), max_new_tokens=N, temperature=0.0)
    chex.assert_shape([toks, lps], (3, N))
    np.testing.assert_array_equal(lens, [N] * 3)
    seqs = [pr + np.asarray(toks[b]).tolist() for b, pr in enumerate(PROMPTS)]
    ref = ref_logits(model, seqs)
    for b, pr in enumerate(PROMPTS):
        for t in range(N):  # argmax of the uncached forward over the prompt and tokens so far
            lg = ref[b, len(pr) + t - 1]
            assert int(toks[b, t]) == int(np.argmax(lg)), (b, t)
            np.testing.assert_allclose(float(lps[b, t]), log_softmax(lg)[int(toks[b, t])], atol=1e-4)
    # Rows are independent: the reversed batch (other pads per row) gives the same rows; and the shortest
    # prompt alone, with no padding at all, gives the same tokens and log-probs.
    tr_, lpr, _ = S.generate(model, p[::-1], l[::-1], jax.random.key(0), max_new_tokens=N, temperature=0.0)
    np.testing.assert_array_equal(tr_[::-1], toks)
    np.testing.assert_allclose(lpr[::-1], lps, atol=1e-5)
    t1, lp1, _ = S.generate(model, jnp.asarray([PROMPTS[1]]), jnp.asarray([2]), jax.random.key(0),
                            max_new_tokens=N, temperature=0.0)
    np.testing.assert_array_equal(t1[0], toks[1])
    np.testing.assert_allclose(lp1[0], lps[1], atol=1e-5)


def check_logprobs(model, toks, lps, n_steps, temperature, top_k=0, top_p=1.0, allowed=None):
    ref = ref_logits(model, [pr + np.asarray(toks[b]).tolist() for b, pr in enumerate(PROMPTS)])
    for b, pr in enumerate(PROMPTS):
        for t in range(n_steps):
            lp_ref = ref_filter(ref[b, len(pr) + t - 1], temperature, top_k, top_p,
                                None if allowed is None else allowed[b])
            tok = int(toks[b, t])
            assert np.isfinite(lp_ref[tok]), f"sampled token {tok} that the filter drops"
            np.testing.assert_allclose(float(lps[b, t]), lp_ref[tok], atol=1e-4)


@pytest.mark.parametrize("opts", [dict(temperature=0.7, top_k=5), dict(temperature=0.7, top_p=0.8),
                                  dict(temperature=1.0)])
def test_logprobs_of_filtered_distribution(model, opts):
    p, l = batch(PROMPTS)
    toks, lps, _ = S.generate(model, p, l, jax.random.key(3), max_new_tokens=N, **opts)
    check_logprobs(model, toks, lps, N, opts["temperature"], opts.get("top_k", 0), opts.get("top_p", 1.0))


def test_allowed_tokens_respected_and_logprobs(model):
    allowed_v = np.zeros(V, bool)
    allowed_v[[7, 20, 41]] = True
    p, l = batch(PROMPTS)
    seen = set()
    for k in range(5):  # 90 samples from one compiled program
        toks, _, _ = S.generate(model, p, l, jax.random.key(k), max_new_tokens=N, temperature=1.5,
                                allowed_tokens=allowed_v)
        seen |= set(np.unique(np.asarray(toks)).tolist())
    assert seen <= {7, 20, 41} and len(seen) >= 2  # respected, and not degenerate
    # Per-row masks [B, V]; log-probs renormalised over each row's allowed set.
    rows = np.zeros((3, V), bool)
    rows[0, [1, 2]] = True
    rows[1, [30]] = True
    rows[2, :] = True
    pb, lb = batch(PROMPTS)
    toks, lps, _ = S.generate(model, pb, lb, jax.random.key(2), max_new_tokens=N, temperature=0.7,
                              allowed_tokens=rows)
    assert set(np.asarray(toks[0]).tolist()) <= {1, 2}
    np.testing.assert_array_equal(toks[1], [30] * N)
    np.testing.assert_allclose(lps[1], 0.0, atol=1e-6)  # a single allowed token has probability 1
    check_logprobs(model, toks, lps, N, 0.7, allowed=rows)
    # Per-step masks [B, N, V]: step t of row b allows only token 10 + t + b -> forced, probability 1.
    steps = np.zeros((3, N, V), bool)
    for b in range(3):
        steps[b, np.arange(N), 10 + np.arange(N) + b] = True
    toks, lps, _ = S.generate(model, pb, lb, jax.random.key(2), max_new_tokens=N, temperature=0.7,
                              allowed_tokens=steps)
    np.testing.assert_array_equal(toks, 10 + np.arange(N)[None, :] + np.arange(3)[:, None])
    np.testing.assert_allclose(lps, 0.0, atol=1e-6)


def test_stop_tokens_stop_and_pad(model):
    p, l = batch(PROMPTS)
    kw = dict(max_new_tokens=N, temperature=0.0)
    ref, ref_lp, _ = S.generate(model, p, l, jax.random.key(0), **kw)
    # Row 0 stops at step <= 2, rows 1 and 2 on their first token: every row stops, so the loop exits early.
    stops = (int(ref[0, 2]), int(ref[1, 0]), int(ref[2, 0]))
    toks, lps, lens = S.generate(model, p, l, jax.random.key(0), stop_tokens=stops, pad_id=63, **kw)
    for b in range(3):
        row = np.asarray(ref[b])
        n = int(np.argmax(np.isin(row, stops))) + 1
        assert int(lens[b]) == n
        np.testing.assert_array_equal(toks[b, :n], ref[b, :n])
        np.testing.assert_allclose(lps[b, :n], ref_lp[b, :n], atol=1e-6)
        assert (np.asarray(toks[b, n:]) == 63).all() and (np.asarray(lps[b, n:]) == 0).all()
    assert int(lens[1]) == 1 and int(lens[2]) == 1 and 1 <= int(lens[0]) <= 3


def test_keys_determinism_and_compiles_once(model):
    gd, pa = model
    m = tr.merge(gd, pa)  # a Module is accepted too; each call re-splits it
    p, l = batch(PROMPTS)
    kw = dict(max_new_tokens=N, temperature=1.0)
    a = S.generate(model, p, l, jax.random.key(5), **kw)
    size = S._generate_jit._cache_size()
    b = S.generate(m, p, l, jax.random.key(5), **kw)
    c = S.generate(model, p + 1, l, jax.random.key(6), **kw)  # new values, same shapes
    assert S._generate_jit._cache_size() == size, "generate retraced for identical shapes/options"
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    d = S.generate(model, p, l, jax.random.key(6), **kw)
    assert not np.array_equal(a[0], d[0])
    assert S._generate_jit._cache_size() == size


CFG_STOP = S.SamplerConfig(max_new_tokens=N, temperature=1.0, stop_tokens=(3,))


def test_sample_tokens_in_outer_jit_with_batched_keys(model):
    gd, pa = model
    p, l = batch(PROMPTS)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params, prompt, plen, keys):  # like a training iteration: one sampled group per key
        return jax.vmap(lambda k: S.sample_tokens(gd, params, prompt, plen, k, CFG_STOP))(keys)

    keys = jax.random.split(jax.random.key(0), 2)
    t, lp, n = step(pa, p, l, keys)
    chex.assert_shape([t, lp], (2, 3, N))
    step(pa, p, l, jax.random.split(jax.random.key(1), 2))  # no retrace (assert_max_traces)
    g = S.generate(model, p, l, keys[1], max_new_tokens=N, temperature=1.0, stop_tokens=(3,))
    np.testing.assert_array_equal(t[1], g[0])
    np.testing.assert_allclose(lp[1], g[1], atol=1e-5)
    np.testing.assert_array_equal(n[1], g[2])


def test_sequence_logprobs_match_generate(model):
    gd, pa = model
    p, l = batch(PROMPTS)
    toks, lps, lens = S.generate(model, p, l, jax.random.key(4), max_new_tokens=N, temperature=1.0,
                                 stop_tokens=(3,))
    full = np.zeros((3, T_REF), np.int32)
    for b, pr in enumerate(PROMPTS):  # prompt then response, right-padded
        n = int(lens[b])
        full[b, : len(pr)] = pr
        full[b, len(pr): len(pr) + n] = np.asarray(toks[b, :n])
    total = l + lens
    seq = _seq_lp(gd, pa, jnp.asarray(full), l, total)
    for b, pr in enumerate(PROMPTS):
        n = int(lens[b])
        got = np.asarray(seq[b])
        np.testing.assert_allclose(got[len(pr): len(pr) + n], lps[b, :n], atol=1e-4)
        assert (got[: len(pr)] == 0).all() and (got[len(pr) + n:] == 0).all()


def test_sequence_logprobs_literal(model):
    """All-zero weights -> every logit is 0 -> uniform next-token distribution: log(1/V) inside the window."""
    gd, pa = model
    zeros = jax.tree.map(jnp.zeros_like, pa)
    tokens = jnp.asarray(np.arange(3 * T_REF).reshape(3, T_REF) % V, jnp.int32)
    lp = _seq_lp(gd, zeros, tokens, jnp.array([1, 3, 0]), jnp.array([4, 3, 2]))
    want = np.zeros((3, T_REF))
    want[0, 1:4] = want[2, 1:2] = np.log(1.0 / V)  # t = 0 has no prediction; row 1 has an empty window
    np.testing.assert_allclose(lp, want, atol=1e-6)


def test_greedy_equals_transformers_generate(tmp_path):
    """Greedy decoding equals transformers' greedy `generate` on a tiny random LlamaForCausalLM loaded
    through `crl_jax.models.from_pretrained` (save_pretrained -> safetensors folder)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from crl_jax.models import from_pretrained

    torch.manual_seed(0)
    hc = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                     tie_word_embeddings=False)
    hf = LlamaForCausalLM(hc).eval()
    with torch.no_grad():  # larger weights than HF's 0.02 init -> peaked logits, no near-ties
        for prm in hf.parameters():
            if prm.ndim == 2:
                prm.normal_(0.0, 0.15)
    hf.save_pretrained(tmp_path)
    ours, _ = from_pretrained(tmp_path)
    p, l = batch(PROMPTS)
    toks, _, _ = S.generate(ours, p, l, jax.random.key(0), max_new_tokens=N, temperature=0.0)
    for b, pr in enumerate(PROMPTS):
        with torch.no_grad():  # min_new_tokens keeps HF from stopping at the config's eos id
            out = hf.generate(torch.tensor([pr]), attention_mask=torch.ones(1, len(pr), dtype=torch.long),
                              max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
        np.testing.assert_array_equal(np.asarray(toks[b]), out[0, len(pr):].numpy())


@pytest.mark.parametrize("temperature,unroll", [(0.0, 8), (1.0, 8), (1.0, 0)])
def test_sampling_after_an_encoded_prefix_equals_the_packed_prompt(model, temperature, unroll):
    """`continue_tokens(rest)` on `init_cache(prefix=encode_prefix(head))` samples what `sample_tokens` samples
    from head and rest packed into one prompt (same key): the same tokens and lengths, log-probs equal to float32 order; with the
    straight-line layers and with the layer scan, for heads of different lengths (0 included)."""
    gd, pa = model
    heads, rests = [[5, 9, 2], [7], []], [[1, 4], [3, 3, 8], [11]]
    packed, plen = batch([h + r for h, r in zip(heads, rests)])
    head, head_len = batch([h or [0] for h in heads])
    head_len = head_len.at[2].set(0)
    rest, rest_len = batch(rests)
    cfg = S.SamplerConfig(max_new_tokens=N, temperature=temperature, unroll_layers=unroll)
    run = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    key = jax.random.key(7)
    ref = run(gd, pa, packed, plen, key, cfg)
    m = tr.merge(gd, pa)
    pre = m.encode_prefix(head, head_len)
    cache = tr.init_cache(m.cfg, 3, head.shape[1] + rest.shape[1] + N, prefix=pre)
    got = jax.jit(S.continue_tokens, static_argnums=(0, 8))(gd, pa, cache, head.shape[1], pre.length, rest, rest_len,
                                                             key, cfg)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_allclose(got[1], ref[1], atol=1e-5)
    assert len(set(np.asarray(ref[0]).ravel().tolist())) > 2


@pytest.mark.parametrize("unroll", [8, 0])
def test_a_carried_cache_continues_the_conversation(model, unroll):
    """`continue_tokens` on the cache the last turn returned (head encoded once, then per turn only the new user
    part) samples what `sample_tokens` samples from the whole conversation packed into one prompt (same key):
    the same tokens and lengths over two turns, log-probs equal to float32 order. Replies stop at different
    lengths (a fifth of the vocabulary stops), so the cache holds masked slots between turns."""
    gd, pa = model
    cfg = S.SamplerConfig(max_new_tokens=N, temperature=1.0, stop_tokens=tuple(range(1, V, 5)), unroll_layers=unroll)
    heads = [[5, 9, 2], [7], [4, 4, 4, 4]]
    turns = [[[1, 4], [3, 3, 8], [11]], [[6], [2, 2], [9, 8, 7]]]
    U = 3
    head, head_len = batch(heads)
    m = tr.merge(gd, pa)
    pk = m.encode_prefix(head, head_len)
    Hc = head.shape[1]
    cache = tr.init_cache(m.cfg, len(heads), Hc + len(turns) * (U + N), prefix=pk)
    cont = jax.jit(S.continue_tokens, static_argnums=(0, 8))
    run = jax.jit(S.sample_tokens, static_argnums=(0, 5))
    start, ctx, lengths = head_len, [list(h) for h in heads], []
    for t, users in enumerate(turns):
        u, ul = batch(users, U)
        key = jax.random.key(10 + t)
        got_t, got_lp, got_len, cache = cont(gd, pa, cache, Hc + t * (U + N), start, u, ul, key, cfg)
        ref_t, ref_lp, ref_len = run(gd, pa, *batch([c + x for c, x in zip(ctx, users)]), key, cfg)
        np.testing.assert_array_equal(got_t, ref_t)
        np.testing.assert_array_equal(got_len, ref_len)
        np.testing.assert_allclose(got_lp, ref_lp, atol=1e-5)
        valid = np.asarray(cache["valid"][:, Hc + t * (U + N):])
        for b in range(len(heads)):
            n = int(ref_len[b])
            ctx[b] += users[b] + np.asarray(ref_t[b, :n]).tolist()
            assert valid[b, :U].sum() == len(users[b]) and valid[b, U:U + N].tolist() == [True] * n + [False] * (N - n)
        start = start + ul + got_len
        lengths += np.asarray(ref_len).tolist()
    assert min(lengths) < N and len(set(lengths)) > 1  # replies that stopped early, at different lengths
    with pytest.raises(ValueError, match="do not fit"):  # a turn past the cache's end is refused, not clamped
        S.continue_tokens(gd, pa, cache, Hc + len(turns) * (U + N) - N, start, u, ul, key, cfg)


def test_rows_that_are_not_live_generate_nothing_and_do_not_hold_the_loop(model):
    """live=False rows give pad tokens, log-prob 0 and length 0, the live rows sample what they sample without
    the mask, and the decode loop ends when the live rows have stopped: the cache's last reply slot is written
    when the (never stopping) middle row is live and left unwritten when it is not."""
    gd, pa = model
    prompt, plen = batch(PROMPTS)
    greedy = S.SamplerConfig(max_new_tokens=N, temperature=0.0)
    t0 = np.asarray(jax.jit(S.sample_tokens, static_argnums=(0, 5))(gd, pa, prompt, plen, jax.random.key(0),
                                                                   greedy)[0])
    dead_row = set(t0[1].tolist())
    stops = {next(int(x) for x in t0[r][:N - 1] if int(x) not in dead_row) for r in (0, 2)}
    cfg = S.SamplerConfig(max_new_tokens=N, temperature=0.0, stop_tokens=tuple(sorted(stops)))
    m = tr.merge(gd, pa)
    cache = tr.init_cache(m.cfg, 3, prompt.shape[1] + N)
    run = jax.jit(S.continue_tokens, static_argnums=(0, 8))
    start = jnp.zeros((3,), jnp.int32)
    ref = run(gd, pa, cache, 0, start, prompt, plen, jax.random.key(0), cfg, None, None)
    got = run(gd, pa, cache, 0, start, prompt, plen, jax.random.key(0), cfg, None, jnp.array([True, False, True]))
    for r in (0, 2):
        np.testing.assert_array_equal(got[0][r], ref[0][r])
        assert int(got[2][r]) == int(ref[2][r]) < N
    assert np.asarray(got[0][1]).tolist() == [0] * N and int(got[2][1]) == 0 and not np.asarray(got[1][1]).any()
    assert int(ref[2][1]) == N  # live, the middle row never stops ...
    last = prompt.shape[1] + N - 1
    assert np.abs(np.asarray(ref[3]["k"][:, :, last])).sum() > 0  # ... so its loop wrote the last slot
    assert np.abs(np.asarray(got[3]["k"][:, :, last])).sum() == 0  # without it the loop ended early
