"""Architecture shapes of real checkpoints, for dry runs and benchmarks with random weights.

Values follow each model's published `config.json`. Loading real weights goes through
`crl_jax.models.from_pretrained`; these presets let a machine without the files (the benchmark GPU,
`jax.eval_shape` dry runs) build the same shapes.
"""

from __future__ import annotations

from crl_jax.models.transformer import TransformerConfig

PRESETS = {
    # HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
                         max_position_embeddings=8192, family="llama"),
    # Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                         attention_bias=True, max_position_embeddings=32768, family="qwen2"),
    # Qwen/Qwen2.5-7B-Instruct (the paper's actor)
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=False,
                       attention_bias=True, max_position_embeddings=32768, family="qwen2"),
    # Qwen/Qwen3-4B-Thinking-2507 (the paper's extractor)
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                     num_kv_heads=8, head_dim=128, rope_theta=5000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                     qk_norm=True, max_position_embeddings=262144, family="qwen3"),
}


def preset_config(name: str, **overrides) -> TransformerConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return TransformerConfig(**{**PRESETS[name], **overrides})
