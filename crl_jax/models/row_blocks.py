"""A turn's forward over the rows that matter, a block of rows at a time, each block only as wide as it needs
(the agentic rollout).

`Transformer.last_hidden` over a batch of right-padded prompts computes every row at the batch's packed width.
The slots past each row's length are computed and thrown away, and so are the rows of episodes that have
already ended (the rollout keeps every episode in lock-step until the last turn). In the agentic benchmark's
text view a turn's packed prompt is ~1.5x its longest real one (the observation segment is sized for the
longest message), and at 10 turns about 3 in 10 turn rows belong to finished episodes.

`last_hidden_in_blocks` returns the same hidden states for the live rows and computes only those:

- live rows go to the front, longest first, so each block holds rows of similar length;
- a while loop runs ceil(live / block) blocks: the work follows the live rows, every buffer keeps the batch's
  static shape;
- a block runs `last_hidden` over its first w slots, w being the smallest of the static widths step, 2 step,
  ..., T that covers the block's longest row (`lax.switch` over one compiled forward per width). This is
  exact: padding is right of every real token, and under the causal mask a row's last position never sees a
  slot past it.

The saving is the skipped work: on the 2-core CPU every variant runs at the same rate, and the agentic turn is
x1.6 (8 episodes) to x2.4 (64) faster (`experiments/bench/turn_blocks.py`). Rows that are not live
get zeros.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from crl_jax.models.transformer import PrefixKV, Transformer


def block_widths(width: int, step: int) -> tuple[int, ...]:
    """The static widths a block's forward can take: step, 2 step, ... below `width`, then `width` itself."""
    if width < 1 or step < 1:
        raise ValueError(f"block_widths: width and step must be >= 1, got {width}, {step}")
    return tuple(range(step, width, step)) + (width,)


def _take_prefix(prefix: PrefixKV | None, rows) -> PrefixKV | None:
    if prefix is None:
        return None
    return PrefixKV(k=prefix.k[:, rows], v=prefix.v[:, rows], valid=prefix.valid[rows], length=prefix.length[rows])


def last_hidden_in_blocks(model: Transformer, tokens, lengths, *, block: int, width_step: int, live=None,
                          prefix: PrefixKV | None = None):
    """`model.last_hidden(tokens, lengths, prefix=prefix)` [B, H] for the rows where `live` [B] (default all),
    zeros elsewhere; computed `block` rows at a time, each block over the first multiple of `width_step` (or
    all T) slots that covers its longest row. Equal to the one-batch forward up to float32 summation order."""
    chex.assert_rank([tokens, lengths], [2, 1])
    B, T = tokens.shape
    block = max(1, min(int(block), B))
    widths = block_widths(T, int(width_step))
    live = jnp.ones((B,), bool) if live is None else live.astype(bool)
    chex.assert_shape(live, (B,))
    # Live rows first, longest first (dead rows sort last: key -1); a stable sort keeps ties in row order.
    order = jnp.argsort(-jnp.where(live, lengths, -1), stable=True).astype(jnp.int32)
    n = live.sum().astype(jnp.int32)
    nb = -(-B // block)
    order = jnp.concatenate([order, jnp.full((nb * block - B,), B, jnp.int32)])  # whole blocks; B = no row
    one = jax.eval_shape(lambda: model.last_hidden(tokens[:block], lengths[:block],
                                                   _take_prefix(prefix, jnp.arange(block))))

    def forward(width):
        return lambda tok, ln, pre: model.last_hidden(tok[:, :width], ln, prefix=pre)

    branches = [forward(w) for w in widths]

    def body(j, out):
        slot = j * block + jnp.arange(block)
        rows = jax.lax.dynamic_slice_in_dim(order, j * block, block)
        ok = slot < n  # the block's last rows may be dead ones (or none): computed at length 0, never written
        src = jnp.minimum(rows, B - 1)
        ln = jnp.where(ok, lengths[src], 0)
        at = jnp.searchsorted(jnp.asarray(widths, jnp.int32), ln.max()).astype(jnp.int32)  # first width >= it
        h = jax.lax.switch(at, branches, tokens[src], ln, _take_prefix(prefix, src))
        return out.at[jnp.where(ok, rows, B)].set(h, mode="drop")

    return jax.lax.fori_loop(0, (n + block - 1) // block, body, jnp.zeros((B,) + one.shape[1:], one.dtype))
