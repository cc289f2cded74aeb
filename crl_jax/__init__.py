"""crl_jax: Complementary RL in JAX/Flax NNX (see README.md and docs/ARCHITECTURE.md)."""

__version__ = "0.3.0"
