import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax.models import transformer as tr
from crl_jax.models.row_blocks import block_widths, last_hidden_in_blocks

V, B, T, LP = 64, 7, 21, 5
NAN_TOKEN = V - 1  # its embedding row is set to NaN: a slot holding it poisons every query that reads it


def test_block_widths_literal():
    assert block_widths(21, 8) == (8, 16, 21)
    assert block_widths(16, 8) == (8, 16)
    assert block_widths(5, 8) == (5,)
    assert block_widths(3, 1) == (1, 2, 3)
    for bad in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match="width and step"):
            block_widths(*bad)


@pytest.fixture(scope="module")
def model():
    m = tr.create(tr.tiny_config(V), jax.random.key(0))
    m.embed[...] = m.embed[...].at[NAN_TOKEN].set(jnp.nan)
    return nnx.split(m)


def _batch(seed, pad_token):
    """Right-padded rows tokens [B, T] (lengths 0..T; padding = `pad_token`), a live mask, a prefix batch."""
    rng = np.random.default_rng(seed)
    lengths = np.array([3, 0, 21, 9, 16, 1, 12], np.int32)
    tokens = np.full((B, T), pad_token, np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, V - 1, n)
    live = np.array([True, True, True, False, True, False, True])
    pre = jnp.asarray(rng.integers(1, V - 1, (B, LP)), jnp.int32)
    pre_len = jnp.asarray(rng.integers(1, LP + 1, B), jnp.int32)
    return jnp.asarray(tokens), jnp.asarray(lengths), jnp.asarray(live), pre, pre_len


@pytest.mark.parametrize("block,step", [(1, 8), (2, 8), (3, 16), (7, 4), (9, 64)])
@pytest.mark.parametrize("with_prefix", [False, True])
def test_live_rows_equal_the_one_batch_forward_and_dead_rows_are_zero(model, block, step, with_prefix):
    """Live rows: `last_hidden` over the whole batch to float32 order (blocks of rows of unequal lengths,
    a batch that is not a multiple of the block, a block larger than the batch, random padding content); dead
    rows: zeros. Jitted (and once not)."""
    gd, st = model
    tokens, lengths, live, pre, pre_len = _batch(0, pad_token=7)

    def both(s):
        m = nnx.merge(gd, s)
        prefix = m.encode_prefix(pre, pre_len) if with_prefix else None
        return (m.last_hidden(tokens, lengths, prefix=prefix),
                last_hidden_in_blocks(m, tokens, lengths, block=block, width_step=step, live=live, prefix=prefix))

    for f in (both, jax.jit(both)) if (block, step, with_prefix) == (3, 16, True) else (jax.jit(both),):
        want, got = (np.asarray(x) for x in f(st))
        np.testing.assert_allclose(got[np.asarray(live)], want[np.asarray(live)], atol=2e-5)
        np.testing.assert_array_equal(got[~np.asarray(live)], 0.0)


def test_a_block_never_reads_past_its_width(model):
    """One row per block, each row's length a multiple of the step: each row runs at exactly its length, so
    padding slots holding a NaN token (which would poison any query that reads them, even masked: 0 x NaN)
    never enter the computation."""
    gd, st = model
    tokens, _, _, pre, pre_len = _batch(0, pad_token=NAN_TOKEN)
    lengths = jnp.array([4, 20, 8, 12, 16, 4, 21], jnp.int32)
    tokens = jnp.where(jnp.arange(T)[None] < lengths[:, None], jnp.maximum(tokens, 1) % (V - 1), NAN_TOKEN)
    live = jnp.ones((B,), bool)
    clean = jnp.where(jnp.arange(T)[None] < lengths[:, None], tokens, 0)

    def both(s):
        m = nnx.merge(gd, s)
        prefix = m.encode_prefix(pre, pre_len)
        return (m.last_hidden(clean, lengths, prefix=prefix),
                last_hidden_in_blocks(m, tokens, lengths, block=1, width_step=4, live=live, prefix=prefix))

    want, got = (np.asarray(x) for x in jax.jit(both)(st))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[np.asarray(live)], want[np.asarray(live)], atol=2e-5)


class _Recorder:
    """A model whose `last_hidden` records (rows, width) of every block it runs (`jax.debug.callback`)."""

    def __init__(self, m, log):
        self.m, self.log = m, log

    def last_hidden(self, tokens, lengths, prefix=None):
        jax.debug.callback(lambda: self.log.append(tokens.shape))
        return self.m.last_hidden(tokens, lengths, prefix=prefix)


def test_work_follows_the_live_rows_and_their_lengths(model):
    """Blocks run: ceil(live / block), longest rows first, each at the first multiple of the step (or T) that
    covers its longest row; with no live row nothing runs and every row is zero."""
    gd, st = model
    tokens, lengths, live, _, _ = _batch(1, pad_token=0)
    log = []
    f = jax.jit(lambda s, lv: last_hidden_in_blocks(_Recorder(nnx.merge(gd, s), log), tokens, lengths, block=2,
                                                    width_step=8, live=lv))
    jax.block_until_ready(f(st, live))
    # live lengths sorted: 21, 16, 12, 3, 0 -> blocks (21, 16), (12, 3), (0) -> widths 21, 16, 8
    assert log == [(2, 21), (2, 16), (2, 8)]
    log.clear()
    out = jax.block_until_ready(f(st, jnp.zeros((B,), bool)))
    assert log == [] and not np.asarray(out).any()
