"""Re-exports `crl_jax.errors` (the errors moved below every package that raises them)."""

from crl_jax.errors import CheckpointError, read_json  # noqa: F401
