"""The experience extractor (METHOD.md §2 steps 5-8): what it reads, what it writes, how it learns.

- `ops.py`: distillation prompts and the operations (`<ADD>` / `<UPDATE>` / `<RETURN>`) in token space (jit-able);
- `ops_json.py`: the LLM path's JSON operations, parsed on the host (`parse_operations` never raises);
- `distill.py`: extractor generation per episode, operations applied to bank and buffer in episode order;
- `merge.py`, `merge_step.py`: the periodic merge walk over the bank and its wiring to the extractor;
- `buffer.py`: the extractor's sample buffer awaiting reward (CISPO batches, repeat weights).
"""

from crl_jax.extractor.ops_json import (  # noqa: F401
    MAX_OPS, Operation, ParseStats, parse_operations, parse_operations_with_stats,
)
