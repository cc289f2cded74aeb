"""Extractor sample buffer: fixed-capacity store of extractor generations awaiting reward (METHOD.md §2 6-7).

Shapes: C = capacity (> the extractor batch), P = prompt length, R = response length, M = rows added,
E = credit rows, B = batch.

Each extractor generation (prompt, response, behaviour log-probs) gets a monotone global `sample_id`; the
bank records that id as the `source` of the entries it writes, and rewards come back by id through
`credit`. A sample is trained when it has pending reward (reward_count > 0); `pop_batch` takes the oldest
such samples, resets their pending reward and leaves them in the buffer, so they can be credited and
trained again later (with the repeat weight `crl_jax.losses.repeat_weights`).

Accounting (all cumulative scalars):
- `overflow_count`: evictions of a sample that still had pending reward (reward_count > 0) or had never
  been trained (times_trained == 0) — i.e. a generation whose learning signal was lost because the
  buffer was full. Evicting an already-trained sample with no pending reward is normal and not counted.
- `dropped`: credit rows (mask True, id >= 0) whose sample id is no longer in the buffer; they are ignored.
Credit rows with id < 0 (an entry no generation wrote) are ignored without counting.

The functions below take their hyperparameters as arguments (the public API, docs/ARCHITECTURE.md);
`make_buffer_ops(...)` binds them once (flashbax's `make_*_buffer`) into a `BufferOps` whose functions take
data only (a Runtime's `rt.buffer_ops`).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import struct

from crl_jax.losses import repeat_weights  # re-exported: part of the buffer's public API

_INT_MAX = jnp.iinfo(jnp.int32).max


@struct.dataclass
class SampleBuffer:
    prompt: jax.Array  # [C, P] int32
    prompt_len: jax.Array  # [C] int32
    response: jax.Array  # [C, R] int32
    response_len: jax.Array  # [C] int32
    behavior_logp: jax.Array  # [C, R] float32 log-probs of the response tokens at generation time
    sample_id: jax.Array  # [C] int32 global id, -1 = empty slot
    created_step: jax.Array  # [C] int32
    reward_sum: jax.Array  # [C] float32 reward received since last trained
    reward_count: jax.Array  # [C] int32 number of credits since last trained
    total_uses: jax.Array  # [C] int32 all credits ever received
    times_trained: jax.Array  # [C] int32
    last_trained_step: jax.Array  # [C] int32, -1 = never
    valid: jax.Array  # [C] bool
    next_id: jax.Array  # [] int32
    overflow_count: jax.Array  # [] int32 (see module doc)
    dropped: jax.Array  # [] int32 (see module doc)

    @property
    def capacity(self) -> int:
        return self.valid.shape[-1]


def init(capacity: int, prompt_len: int, response_len: int) -> SampleBuffer:
    """An empty buffer of `capacity` samples."""
    if capacity < 1 or prompt_len < 1 or response_len < 1:
        raise ValueError(f"buffer capacity, prompt_len and response_len must be >= 1, got "
                         f"{capacity}, {prompt_len}, {response_len}")
    c = capacity
    zi = jnp.zeros((c,), jnp.int32)
    z = jnp.zeros((), jnp.int32)
    return SampleBuffer(
        prompt=jnp.zeros((c, prompt_len), jnp.int32), prompt_len=zi,
        response=jnp.zeros((c, response_len), jnp.int32), response_len=zi,
        behavior_logp=jnp.zeros((c, response_len), jnp.float32),
        sample_id=jnp.full((c,), -1, jnp.int32), created_step=zi,
        reward_sum=jnp.zeros((c,), jnp.float32), reward_count=zi, total_uses=zi, times_trained=zi,
        last_trained_step=jnp.full((c,), -1, jnp.int32), valid=jnp.zeros((c,), bool),
        next_id=z, overflow_count=z, dropped=z)


def _add_one(buf: SampleBuffer, row, step):
    prompt, plen, resp, rlen, logp, msk = row
    has_free = ~jnp.all(buf.valid)
    free = jnp.argmin(buf.valid).astype(jnp.int32)
    oldest = jnp.argmin(jnp.where(buf.valid, buf.sample_id, _INT_MAX)).astype(jnp.int32)
    slot = jnp.where(has_free, free, oldest)
    lost = (~has_free) & ((buf.reward_count[slot] > 0) | (buf.times_trained[slot] == 0))
    i32 = lambda v: jnp.asarray(v, jnp.int32)
    new = buf.replace(
        prompt=buf.prompt.at[slot].set(i32(prompt)), prompt_len=buf.prompt_len.at[slot].set(i32(plen)),
        response=buf.response.at[slot].set(i32(resp)), response_len=buf.response_len.at[slot].set(i32(rlen)),
        behavior_logp=buf.behavior_logp.at[slot].set(jnp.asarray(logp, jnp.float32)),
        sample_id=buf.sample_id.at[slot].set(buf.next_id), created_step=buf.created_step.at[slot].set(step),
        reward_sum=buf.reward_sum.at[slot].set(0.0), reward_count=buf.reward_count.at[slot].set(0),
        total_uses=buf.total_uses.at[slot].set(0), times_trained=buf.times_trained.at[slot].set(0),
        last_trained_step=buf.last_trained_step.at[slot].set(-1), valid=buf.valid.at[slot].set(True),
        next_id=buf.next_id + 1, overflow_count=buf.overflow_count + lost.astype(jnp.int32))
    new_id = buf.next_id
    buf = jax.tree.map(lambda a, b: jnp.where(msk, a, b), new, buf)
    return buf, jnp.where(msk, new_id, -1)


def add_many(buf: SampleBuffer, prompts, prompt_lens, responses, response_lens, logps, step, mask):
    """Store generations in index order: prompts [M,P], prompt_lens [M], responses [M,R], response_lens [M],
    logps [M,R], mask [M] -> (buf, ids [M]) with id -1 for masked-out rows.

    Slot = first free, else the oldest sample (smallest id) is evicted (see `overflow_count`).
    """
    chex.assert_rank([prompts, responses, logps], 2)
    chex.assert_rank([prompt_lens, response_lens, mask], 1)
    chex.assert_equal_shape([responses, logps])
    step = jnp.asarray(step, jnp.int32)
    xs = (prompts, prompt_lens, responses, response_lens, logps, jnp.asarray(mask, bool))
    return jax.lax.scan(lambda b, row: _add_one(b, row, step), buf, xs)


def credit(buf: SampleBuffer, sample_ids, rewards, counts, mask) -> SampleBuffer:
    """Add rewards [E] (a sum) and counts [E] to the samples with ids sample_ids [E] where mask [E].

    Several rows may name the same sample; all are added. Ids no longer in the buffer are ignored and
    counted in `dropped`.
    """
    chex.assert_rank([sample_ids, rewards, counts, mask], 1)
    ids = jnp.asarray(sample_ids, jnp.int32)
    live = jnp.asarray(mask, bool) & (ids >= 0)
    match = live[:, None] & buf.valid[None, :] & (buf.sample_id[None, :] == ids[:, None])  # [E,C]
    found = jnp.any(match, axis=1)
    r = jnp.asarray(rewards, jnp.float32)
    n = jnp.asarray(counts, jnp.int32)
    add_r = jnp.sum(jnp.where(match, r[:, None], 0.0), axis=0)
    add_n = jnp.sum(jnp.where(match, n[:, None], 0), axis=0)
    return buf.replace(
        reward_sum=buf.reward_sum + add_r, reward_count=buf.reward_count + add_n,
        total_uses=buf.total_uses + add_n,
        dropped=buf.dropped + jnp.sum((live & ~found).astype(jnp.int32)))


def pending(buf: SampleBuffer) -> jax.Array:
    """Number of samples with pending reward []."""
    return jnp.sum((buf.valid & (buf.reward_count > 0)).astype(jnp.int32), axis=-1)


def ready(buf: SampleBuffer, batch: int) -> jax.Array:
    """True [] when at least `batch` samples have pending reward."""
    return pending(buf) >= batch


def pop_batch(buf: SampleBuffer, batch: int, step, *, cooldown=1, power=0.5):
    """Take the `batch` oldest samples (smallest id) with pending reward -> (buf, batch dict).

    Batch fields (leading dim B = batch): prompt [B,P], prompt_len, response [B,R], response_len,
    behavior_logp [B,R], reward (reward_sum / reward_count), weight (repeat weight from the counts before
    this pop), sample_id, times_trained (before), valid [B] bool. When fewer samples are pending, the rest
    are padding rows with valid False and zeros (sample_id -1). The taken samples get times_trained + 1,
    last_trained_step = step and their pending reward reset; they stay in the buffer.
    """
    if not 1 <= batch <= buf.capacity:
        raise ValueError(f"need 1 <= batch <= buffer capacity; got batch={batch}, capacity={buf.capacity}")
    step = jnp.asarray(step, jnp.int32)
    eligible = buf.valid & (buf.reward_count > 0)
    # top_k of -id gives the smallest ids first; non-eligible slots sort last.
    _, slots = jax.lax.top_k(jnp.where(eligible, -buf.sample_id, -_INT_MAX), batch)
    ok = eligible[slots]

    def take(x, fill=0):
        v = x[slots]
        return jnp.where(ok.reshape(ok.shape + (1,) * (v.ndim - 1)), v, fill)

    weights = repeat_weights(buf.times_trained, buf.last_trained_step, step, cooldown=cooldown, power=power)
    out = dict(
        prompt=take(buf.prompt), prompt_len=take(buf.prompt_len), response=take(buf.response),
        response_len=take(buf.response_len), behavior_logp=take(buf.behavior_logp),
        reward=take(buf.reward_sum / jnp.maximum(buf.reward_count, 1).astype(jnp.float32)),
        weight=take(weights), sample_id=take(buf.sample_id, -1), times_trained=take(buf.times_trained),
        valid=ok)
    hit = jnp.zeros((buf.capacity,), bool).at[jnp.where(ok, slots, buf.capacity)].set(True, mode="drop")
    buf = buf.replace(
        times_trained=buf.times_trained + hit.astype(jnp.int32),
        last_trained_step=jnp.where(hit, step, buf.last_trained_step),
        reward_sum=jnp.where(hit, 0.0, buf.reward_sum),
        reward_count=jnp.where(hit, 0, buf.reward_count))
    return buf, out


class BufferOps(NamedTuple):
    """The buffer's functions with its hyperparameters bound (`make_buffer_ops`):

    - `init()` -> an empty `SampleBuffer` of the bound capacity and widths;
    - `add_many(buf, prompts, prompt_lens, responses, response_lens, logps, step, mask)` -> (buf, ids);
    - `credit(buf, sample_ids, rewards, counts, mask)` -> buf;
    - `ready(buf)` -> [] bool: a batch is pending;
    - `pop_batch(buf, step)` -> (buf, batch dict) with the bound batch size, cooldown and power."""

    init: Callable[[], SampleBuffer]
    add_many: Callable[..., tuple[SampleBuffer, jax.Array]]
    credit: Callable[..., SampleBuffer]
    ready: Callable[[SampleBuffer], jax.Array]
    pop_batch: Callable[[SampleBuffer, jax.Array], tuple[SampleBuffer, dict]]


def make_buffer_ops(*, capacity: int, prompt_len: int, response_len: int, batch: int, cooldown=1,
                    power=0.5) -> BufferOps:
    """A `BufferOps`: `init` with capacity and widths bound, `ready` and `pop_batch` with the batch size
    (and the repeat weights' cooldown and power) bound; `add_many` and `credit` have nothing to bind."""
    if not 1 <= batch <= capacity:
        raise ValueError(f"need 1 <= batch <= buffer capacity; got batch={batch}, capacity={capacity}")
    return BufferOps(
        init=functools.partial(init, capacity, prompt_len, response_len),
        add_many=add_many, credit=credit,
        ready=functools.partial(ready, batch=batch),
        pop_batch=lambda buf, step: pop_batch(buf, batch, step, cooldown=cooldown, power=power))
