"""Error classes shared by modules that do not otherwise import each other (a leaf module)."""


class CheckpointError(RuntimeError, ValueError):
    """A checkpoint (run-folder Orbax state or model file) cannot be read, does not match the run, or was
    not written; the message names the directory or file. The one class the CLI reports as one line
    (exit 2). Also a ValueError, as the model loaders' errors were before they shared this class.
    Re-exported by `crl_jax.infra.checkpoint` (which raises it for Orbax checkpoints) and the model loaders."""
