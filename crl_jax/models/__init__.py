"""Models: the decoder transformer, checkpoint loaders and embedders."""

from crl_jax.models.pretrained import from_pretrained  # noqa: F401  (Hugging Face folders and .gguf files)
from crl_jax.models.transformer import Transformer, TransformerConfig, create, init_cache, tiny_config  # noqa: F401
