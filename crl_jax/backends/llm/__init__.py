"""The LLM path: pretrained instruct models as actor and extractor, chat prompts, free-text actions,
JSON operations (METHOD.md §2 with real language models).

Entry points used by `crl_jax.infra.run`:
- `build(cfg) -> LLMRuntime` (cached; hashed by identity),
- `init_state(rt, key, cfg) -> crl_jax.loop.LoopState` and `compiled_chunk(rt, n)` -> jitted
  `(state, last_step) -> (state, metrics [n])`: `crl_jax.loop`'s, on the LLM backend (`crl_jax.backends.llm.backend`),
- `is_llm_config(cfg)`; and `dry_run(cfg)` (parameter / optimizer shapes without weights).
"""

from crl_jax.backends.llm.dry_run import dry_run  # noqa: F401
from crl_jax.loop import compiled_chunk, init_state, iteration  # noqa: F401  (one iteration for every path)
from crl_jax.backends.llm.runtime import LLMRuntime, build, is_llm_config  # noqa: F401
