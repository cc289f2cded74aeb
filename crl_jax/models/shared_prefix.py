"""One encoding per distinct prefix: the rollouts of a group share their head.

The K rollouts of a GRPO group start with the same text: the same task and, on the free rows, no tip (the
guided rows share theirs when they retrieved the same entry). `encode_unique_prefixes` finds the distinct rows
of a batch of right-padded prefixes and encodes only those, then hands every row the keys and values of its
representative, so a batch of G groups x K identical heads costs G encodings instead of G x K.

Shapes stay static: the distinct rows are moved to the front (`unique_rows`) and encoded `block` rows at a
time by a `fori_loop` whose trip count is ceil(distinct / block), so the work follows the number of distinct
prefixes while every buffer keeps the batch's size. Row equality is exact (every token up to the length, and
the length), so the result equals `Transformer.encode_prefix` on the whole batch up to float32 order.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from crl_jax.models.transformer import PrefixKV, Transformer


def unique_rows(tokens, lengths):
    """Distinct right-padded rows tokens [B, L] (lengths [B]; padding ignored) -> (order [B], compact [B], n []).

    order: row indices with the first row of each distinct prefix first (in row order), then the others;
    compact [B]: for each row, the position in `order` of its first equal row; n: the number of distinct rows.
    """
    chex.assert_rank([tokens, lengths], [2, 1])
    B, L = tokens.shape
    live = jnp.arange(L)[None, :] < lengths[:, None]
    x = jnp.where(live, tokens, -1)
    eq = jnp.all(x[:, None, :] == x[None, :, :], axis=-1) & (lengths[:, None] == lengths[None, :])  # [B, B]
    first = jnp.argmax(eq, axis=1)  # the first row equal to each row (itself at the latest)
    rep = first == jnp.arange(B)
    rank = jnp.cumsum(rep.astype(jnp.int32)) - 1  # a representative's place among the representatives
    order = jnp.argsort(~rep, stable=True).astype(jnp.int32)
    return order, rank[first].astype(jnp.int32), rep.sum().astype(jnp.int32)


def encode_unique_prefixes(model: Transformer, tokens, lengths, block: int) -> PrefixKV:
    """`model.encode_prefix(tokens, lengths)`, computed once per distinct row, `block` rows per encoding."""
    chex.assert_rank([tokens, lengths], [2, 1])
    B, L = tokens.shape
    block = max(1, min(int(block), B))
    order, compact, n = unique_rows(tokens, lengths)
    nb = -(-B // block)
    order = jnp.concatenate([order, jnp.zeros((nb * block - B,), jnp.int32)])  # whole blocks (extra rows: row 0)
    one = jax.eval_shape(model.encode_prefix, tokens[:block], lengths[:block]).k  # [layers, block, L, Hkv, D]
    shape, dt = (one.shape[0], nb * block) + one.shape[2:], one.dtype

    def body(j, kv):
        rows = jax.lax.dynamic_slice_in_dim(order, j * block, block)
        pk = model.encode_prefix(tokens[rows], lengths[rows])
        return (jax.lax.dynamic_update_slice_in_dim(kv[0], pk.k, j * block, axis=1),
                jax.lax.dynamic_update_slice_in_dim(kv[1], pk.v, j * block, axis=1))

    k, v = jax.lax.fori_loop(0, (n + block - 1) // block, body, (jnp.zeros(shape, dt), jnp.zeros(shape, dt)))
    return PrefixKV(k=k[:, compact], v=v[:, compact], valid=jnp.arange(L)[None, :] < lengths[:, None],
                    length=lengths.astype(jnp.int32))
