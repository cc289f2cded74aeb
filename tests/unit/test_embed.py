"""Embedders: hashed n-grams (literal hash reference), LM mean pooling, MiniLM parity with torch."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax.models import transformer as tr
from crl_jax.models.embed import (HashedNgramEmbedder, LMMeanPoolEmbedder, MiniLMEmbedder, embed_texts,
                                  minilm_dir)
from crl_jax.text.tokenizers import ByteTokenizer

TOK = ByteTokenizer()
M32 = 0xFFFFFFFF
_call = jax.jit(lambda emb, t, n: emb(t, n))  # one compile per embedder config and shape


def _mix(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _ref_hashed(ids, dim, ns, seed):
    """Plain-Python reference of the signed n-gram hash."""
    v = np.zeros(dim)
    for n in ns:
        for i in range(len(ids) - n + 1):
            h = _mix((seed * 1000003 + n) & M32)
            for t in ids[i:i + n]:
                h = ((h ^ t) * 16777619) & M32
            h = _mix(h)
            v[h % dim] += -1.0 if h >> 31 else 1.0
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


def _pad(ids, L, fill=0):
    return np.array(list(ids) + [fill] * (L - len(ids)), np.int32)


def test_hashed_matches_python_reference():
    e = HashedNgramEmbedder(dim=16, n=(1, 2, 3), seed=3)
    for text in ["a", "ab", "go to the red door", "héllo"]:
        ids = TOK.encode(text)
        got = _call(e, _pad(ids, 24), len(ids))
        np.testing.assert_allclose(np.asarray(got), _ref_hashed(ids, 16, (1, 2, 3), 3), atol=1e-6)
    # a single token with unigrams only is exactly +-1 in one bucket
    one = np.asarray(_call(HashedNgramEmbedder(dim=8, n=(1,)), _pad([97], 4), 1))
    assert np.count_nonzero(one) == 1 and abs(one.sum()) == pytest.approx(1.0)


def test_hashed_deterministic_padding_and_similarity():
    e = HashedNgramEmbedder()
    texts = ["go to the red door", "go to the red doors", "pick up the blue key"]
    k1 = np.asarray(embed_texts(e, TOK, texts, 32))
    k2 = np.asarray(embed_texts(HashedNgramEmbedder(), TOK, texts, 32))
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_allclose(np.linalg.norm(k1, axis=-1), 1.0, atol=1e-6)
    sims = k1 @ k1.T
    assert sims[0, 1] > 0.9 > sims[0, 2] + 0.3
    # a different seed gives a different key
    assert not np.allclose(np.asarray(_call(HashedNgramEmbedder(seed=1), _pad(TOK.encode(texts[0]), 32), 18)), k1[0])
    # padding beyond length is ignored, whatever it holds
    ids = TOK.encode(texts[0])
    junk = np.array(ids + list(range(100, 114)), np.int32)
    np.testing.assert_allclose(np.asarray(_call(e, junk, len(ids))), k1[0], atol=1e-7)
    np.testing.assert_allclose(np.asarray(e(junk, len(ids))), k1[0], atol=1e-6)  # not jitted
    # empty text -> zero key
    assert np.all(np.asarray(_call(e, junk, 0)) == 0)


def test_hashed_batch_jit_and_retrace():
    e = HashedNgramEmbedder(dim=32)
    toks = jax.random.randint(jax.random.key(0), (5, 12), 0, 256)
    lens = jnp.array([0, 1, 5, 12, 7])

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(emb, t, l):
        return emb(t, l)

    out = f(e, toks, lens)
    f(e, toks + 1, lens)
    chex.assert_shape(out, (5, 32))
    single = jnp.stack([_call(e, toks[i], lens[i]) for i in range(5)])
    np.testing.assert_allclose(np.asarray(out), np.asarray(single), atol=1e-6)


def test_lm_mean_pool():
    cfg = tr.tiny_config(300)
    # numpy weights on the abstract model: jax's random init costs seconds of compile on a busy CPU
    graphdef, abstract = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: jnp.asarray(0.1 * rng.standard_normal(a.shape), a.dtype), abstract)
    model = tr.merge(graphdef, params)
    e = LMMeanPoolEmbedder.from_model(model)
    assert e.dim == 64
    toks = jax.random.randint(jax.random.key(1), (2, 6), 0, 300)
    lens = jnp.array([4, 6])
    out = _call(e, toks, lens)
    # The decoder is causal, so the first n hidden states of the full row are those of the unpadded prefix.
    h = np.asarray(jax.jit(lambda m, t: m(t, return_hidden=True))(model, toks))
    for i in range(2):
        ref = h[i, : int(lens[i])].mean(0)
        np.testing.assert_allclose(np.asarray(out[i]), ref / np.linalg.norm(ref), atol=1e-5)
    junk = toks.at[0, 4:].set(7)
    np.testing.assert_allclose(np.asarray(_call(e, junk, lens)), np.asarray(out), atol=1e-6)


@pytest.fixture(scope="module")
def minilm():
    return MiniLMEmbedder.from_package()


@pytest.mark.slow
def test_minilm_parity_with_torch(minilm):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "Ünïcode — and a long tail " * 30, ""]
    keys = np.asarray(minilm.embed_texts(texts))
    assert keys.shape == (5, 384)
    ids, lens = minilm.encode(texts)
    # Same word pieces as the Hugging Face tokenizer with sentence-transformers' max_seq_length=256.
    hf_tok = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    hf_ids = hf_tok(texts, truncation=True, max_length=256)["input_ids"]
    for i, ref in enumerate(hf_ids):
        assert list(ids[i, : lens[i]]) == ref
    try:  # sentence-transformers itself when it imports (it needs scikit-learn), else its math in torch
        from sentence_transformers import SentenceTransformer

        ref = SentenceTransformer(minilm_dir(), device="cpu").encode(texts, normalize_embeddings=True)
    except ImportError:
        bm = transformers.BertModel.from_pretrained(minilm_dir()).eval()
        mask = torch.tensor(np.arange(ids.shape[1])[None] < lens[:, None], dtype=torch.long)
        with torch.no_grad():
            h = bm(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=mask).last_hidden_state
        m = mask[..., None].float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        ref = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    np.testing.assert_allclose(keys, ref, atol=1e-5)
    sims = keys[:3] @ keys[:3].T
    assert sims[0, 1] > sims[0, 2] + 0.3
