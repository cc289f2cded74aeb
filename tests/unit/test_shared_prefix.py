import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax.models import transformer as tr
from crl_jax.models.shared_prefix import encode_unique_prefixes, unique_rows


def test_unique_rows_on_literal_rows():
    """Padding is ignored, the length counts, and each row points at its first equal row's place."""
    tokens = jnp.array([[1, 2, 0], [3, 0, 0], [1, 2, 9], [1, 2, 0], [3, 0, 5], [1, 0, 0]])
    lengths = jnp.array([2, 1, 2, 3, 1, 2])
    for f in (unique_rows, jax.jit(unique_rows)):
        order, compact, n = f(tokens, lengths)
        # distinct: row 0 ([1, 2]), row 1 ([3]), row 3 ([1, 2, 0]: one token longer), row 5 ([1, 0])
        assert int(n) == 4
        assert np.asarray(order).tolist()[:4] == [0, 1, 3, 5] and sorted(np.asarray(order).tolist()) == list(range(6))
        assert np.asarray(compact).tolist() == [0, 1, 0, 2, 1, 3]


@pytest.fixture(scope="module")
def model():
    m = tr.create(tr.tiny_config(64), jax.random.key(0))
    return nnx.split(m)


@pytest.mark.parametrize("layout,block", [("groups", 2), ("groups", 3), ("distinct", 2), ("same", 4), ("same", 1)])
def test_encoding_each_distinct_prefix_once_equals_encoding_every_row(model, layout, block):
    """Keys, values, validity and lengths equal `encode_prefix` over the whole batch (to float32 order), for
    groups of equal rows, all rows distinct, all rows equal, and a batch that is not a multiple of the block."""
    gd, st = model
    rng = np.random.default_rng(0)
    B, L = 7, 9
    if layout == "groups":
        base = [rng.integers(1, 64, rng.integers(1, L + 1)).tolist() for _ in range(3)]
        rows = [base[i % 3] for i in (0, 0, 1, 1, 1, 2, 0)]
    elif layout == "distinct":
        rows = [rng.integers(1, 64, rng.integers(1, L + 1)).tolist() for _ in range(B)]
    else:
        rows = [[5, 6, 7]] * B
    tokens = np.zeros((B, L), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
        tokens[i, len(r):] = rng.integers(0, 64, L - len(r))  # padding content must not matter
    lengths = jnp.array([len(r) for r in rows], jnp.int32)
    tokens = jnp.asarray(tokens)
    want = jax.jit(lambda s: nnx.merge(gd, s).encode_prefix(tokens, lengths))(st)
    got = jax.jit(lambda s: encode_unique_prefixes(nnx.merge(gd, s), tokens, lengths, block))(st)
    valid = np.asarray(want.valid)[None, :, :, None, None]
    for a, b in ((got.k, want.k), (got.v, want.v)):
        np.testing.assert_allclose(np.where(valid, a, 0), np.where(valid, b, 0), atol=1e-5)
    np.testing.assert_array_equal(got.valid, want.valid)
    np.testing.assert_array_equal(got.length, want.length)
