"""The bank's functions with their hyperparameters bound once (flashbax's `make_*_buffer`, purejaxrl's
`make_train`). Exported by `crl_jax.bank`.

`init`, `add`, `prune`, `retrieve`, ... take their hyperparameters as arguments (the public API, docs/ARCHITECTURE.md);
`make_bank_ops(...)` binds them into a `BankOps` whose functions take data only (a Runtime's
`rt.bank_ops`, from the `bank.*` config: `crl_jax.backends.base.bank_ops`).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax

from crl_jax.bank.retrieve import make_retriever
from crl_jax.bank.state import ExperienceBank, init
from crl_jax.bank.transitions import _EVICTIONS, add, add_many, credit, prune, size, update


class BankOps(NamedTuple):
    """The bank's functions with the hyperparameters bound (`make_bank_ops`):

    - `init()` -> an empty bank of the bound capacity, entry length and key dimension;
    - `add(bank, tokens [L], length, key [D], task, step, source, rng=None)` -> (bank, slot) and
      `add_many(bank, tokens [M,L], lengths, keys, task, step, source, mask, rng=None)` -> (bank, slots),
      with the bound eviction policy;
    - `update(bank, slot, tokens, length, step, source, key=None, expect_order=None)` -> bank;
    - `credit(bank, entry_sum [N], entry_count [N])` -> bank (nothing bound);
    - `prune(bank, reward [N], credited [N])` -> (bank, number removed) below the bound threshold;
    - `size(bank)` -> [] valid entries;
    - `retrieve` / `best`: the `Retriever`'s (`make_retriever`)."""

    init: Callable[[], ExperienceBank]
    add: Callable[..., tuple[ExperienceBank, jax.Array]]
    add_many: Callable[..., tuple[ExperienceBank, jax.Array]]
    update: Callable[..., ExperienceBank]
    credit: Callable[..., ExperienceBank]
    prune: Callable[..., tuple[ExperienceBank, jax.Array]]
    size: Callable[[ExperienceBank], jax.Array]
    retrieve: Callable[..., tuple[ExperienceBank, jax.Array, jax.Array]]
    best: Callable[..., tuple[jax.Array, jax.Array]]


def make_bank_ops(*, capacity: int, entry_len: int, key_dim: int, eviction: str = "fifo", prune_below=0.0,
                  **retrieval) -> BankOps:
    """A `BankOps`: `init` with capacity, entry_len and key_dim bound, `add` / `add_many` with `eviction`,
    `prune` with its threshold `prune_below`, and `retrieve` / `best` bound by `make_retriever(**retrieval)`
    (top_k, candidates, diversity_lambda, recent_steps, demote_p, min_similarity, shared_ties, used_bonus,
    credit_bonus: their meaning is in `retrieve` / `retrieve_best`)."""
    if eviction not in _EVICTIONS:
        raise ValueError(f"eviction must be one of {_EVICTIONS}, got {eviction!r}")
    r = make_retriever(**retrieval)
    bind = functools.partial
    return BankOps(init=bind(init, capacity, entry_len, key_dim), add=bind(add, eviction=eviction),
                   add_many=bind(add_many, eviction=eviction), update=update, credit=credit,
                   prune=bind(prune, threshold=prune_below), size=size, retrieve=r.retrieve, best=r.best)
