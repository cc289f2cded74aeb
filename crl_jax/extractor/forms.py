"""The entry forms of the tiny extractor (`extraction.forms`): what an entry says, chosen after the op token.

With the option the constrained response is

    <op> <form> entry... [EOS]

where `<form>` is one of `form_ids = (<MOVES>, <FACT>)`:
- `<MOVES>`: the entry is the episode's moves (action tokens), the plan a tip shows move by move;
- `<FACT>`: the entry is the abstract fact of the episode, its end cell `<r{i}> <c{j}>` (the compact view's
  row and column tokens, `crl_jax.envs.compact`), which the actor's tip shows at every turn.

The form token is sampled like the op token and trained with it (it is a response token of the CISPO loss);
which form helps is left to RL. The stored entry carries no form token: a FACT entry is recognised by its
first token being a row token (`crl_jax.envs.compact.is_fact`), so MOVES entries are the same token sequences as
without forms.

`parse_form` is lenient about what follows a well-formed entry: a MOVES entry is the leading run of action
tokens after the form token, a FACT entry the first two tokens when they are a row and a column token; the
rest of the response is ignored. Anything else (no op token first, an add / update without a form token or
with an empty or malformed entry) is (return, invalid), as `ops.parse_constrained` treats a malformed reply.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from crl_jax.extractor.ops import ADD, RETURN, UPDATE

MOVES, FACT = 0, 1
FORM_NAMES = ("moves", "fact")


def _member(tok, ids):
    """tok [...] in ids [K] -> bool [...]."""
    return (jnp.asarray(tok)[..., None] == jnp.asarray(ids, jnp.int32)).any(-1)


def parse_form(response, length, op_ids, form_ids, action_ids, row_ids, col_ids, eos_id: int, entry_len: int,
               pad_id: int = 0):
    """One operation with its form from response [R] -> (op, form, entry [entry_len], entry_len, valid).

    op: 0 add, 1 update, 2 return; form: 0 moves, 1 fact (0 where nothing is written). See the module
    docstring for what is valid; an invalid reply is (2, 0, zeros, 0, False), a well-formed `<RETURN>`
    (whatever follows it) is (2, 0, zeros, 0, True)."""
    response = jnp.asarray(response, jnp.int32)
    chex.assert_rank(response, 1)
    R = response.shape[0]
    i = jnp.arange(R, dtype=jnp.int32)
    stop = (response == eos_id) | (i >= jnp.asarray(length, jnp.int32))
    end = jnp.where(stop.any(), jnp.argmax(stop), R).astype(jnp.int32)
    hits = response[0] == jnp.asarray(op_ids, jnp.int32)
    k = jnp.where((end > 0) & hits.any(), jnp.argmax(hits), -1)
    fhits = response[jnp.minimum(1, R - 1)] == jnp.asarray(form_ids, jnp.int32)
    has_form = (end > 1) & fhits.any()
    form = jnp.where(has_form, jnp.argmax(fhits), MOVES).astype(jnp.int32)
    body = response[jnp.clip(2 + jnp.arange(entry_len), 0, R - 1)]  # [entry_len] tokens after the form
    inside = 2 + jnp.arange(entry_len) < end
    # MOVES: the leading run of action tokens
    act = _member(body, action_ids) & inside
    n_moves = jnp.where(act.all(), entry_len, jnp.argmin(act)).astype(jnp.int32)
    # FACT: a row token then a column token
    fact_ok = _member(body[0], row_ids) & _member(body[jnp.minimum(1, entry_len - 1)], col_ids) & inside[1]
    n = jnp.where(form == FACT, jnp.where(fact_ok, 2, 0), n_moves).astype(jnp.int32)
    writes = ((k == ADD) | (k == UPDATE)) & has_form & (n > 0)
    valid = (k == RETURN) | writes
    j = jnp.arange(entry_len)
    entry = jnp.where(writes & (j < n), body, pad_id).astype(jnp.int32)
    return (jnp.where(writes, k, RETURN).astype(jnp.int32), jnp.where(writes, form, MOVES).astype(jnp.int32), entry,
            jnp.where(writes, n, 0).astype(jnp.int32), valid)

