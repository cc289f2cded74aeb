"""Models: the decoder transformer, checkpoint loaders and embedders."""

from crl_jax.models.transformer import Transformer, TransformerConfig, create, init_cache, tiny_config  # noqa: F401


def from_pretrained(path, *, dtype="float32"):
    """(model, tokenizer) from a Hugging Face folder or a .gguf file. See `crl_jax.models.loading`."""
    from crl_jax.models.loading import from_pretrained as _fp

    return _fp(path, dtype=dtype)
