"""The experience bank (METHOD.md §2 steps 5-9): an immutable pytree of fixed-shape arrays with pure transitions.

- `state.py`: the `ExperienceBank` pytree, an empty one (`init`), key normalisation;
- `transitions.py`: add / update (one or many), the merge rewrite, credit, pruning, size;
- `retrieve.py`: retrieval with diversity re-ranking (training) and the best match (evaluation), and
  `make_retriever`, which binds their hyperparameters once;
- `ops.py`: `make_bank_ops`, which binds the hyperparameters of all of these once (`BankOps`);
- `io.py`: JSONL export / import and decoded inspection (host side).

This module is the public API (`crl_jax.bank.init / add / update / retrieve / ExperienceBank`; docs/ARCHITECTURE.md, "Public API").
"""

from crl_jax.bank.state import (  # noqa: F401
    ExperienceBank, init, normalize,
)
from crl_jax.bank.retrieve import (  # noqa: F401
    Retriever, make_retriever, retrieve, retrieve_best,
)
from crl_jax.bank.transitions import (  # noqa: F401
    add, add_many, can_update, update, update_many, apply_merge, credit, prune, size, family_counts,
)
from crl_jax.bank.ops import BankOps, make_bank_ops  # noqa: F401
