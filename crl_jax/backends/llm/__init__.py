"""The LLM path: pretrained instruct models as actor and extractor, chat prompts, free-text actions,
JSON operations (METHOD.md §2 with real language models).

Its Runtime comes from the one entry `crl_jax.loop.runtime.build(cfg)` (LLM configs: `runtime.is_llm_config`,
built by `runtime.py`, the path's pieces in `rt.llm`); it runs the one iteration of `crl_jax.loop`
(`init_state`, `compiled_chunk`) on the LLM backend (`backend.py`). `dry_run.dry_run(cfg)`: parameter /
optimizer shapes without weights. This package's `__init__` imports nothing: `crl_jax.backends.base`
reads the prompt-piece types of `prompt_pieces.py` without pulling in the loop.
"""
