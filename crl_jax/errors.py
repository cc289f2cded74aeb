"""Error classes shared by modules that do not otherwise import each other (a leaf module, below every package;
`crl_jax.infra.errors` re-exports it), and the one reader
of the JSON files a user may have damaged (model folders, run folders)."""

import json


class ConfigError(ValueError):
    """A bad configuration value; the message names the dotted key (or the file). Re-exported by
    `crl_jax.config`, where users meet it."""


class CheckpointError(RuntimeError, ValueError):
    """A checkpoint (run-folder Orbax state or model file) cannot be read, does not match the run, or was
    not written; the message names the directory or file. The one class the CLI reports as one line
    (exit 2). Also a ValueError, as the model loaders' errors were before they shared this class.
    Re-exported by `crl_jax.infra.checkpoint` (which raises it for Orbax checkpoints) and the model loaders."""


def read_json(path: str, *, error: type = CheckpointError, what: str = "", kind: type = dict):
    """The JSON file `path` (a model folder's config.json / index / tokenizer_config.json, a run folder's
    config.json) holding a `kind`; anything else (not JSON, not UTF-8, a folder, unreadable, another type)
    raises `error` with one line naming the file (`what` before it, e.g. "run config")."""
    name = f"{what} {path!r}" if what else repr(path)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (ValueError, OSError) as e:  # JSONDecodeError, UnicodeDecodeError, a folder, no permission
        raise error(f"{name} is not valid JSON or cannot be read: {e}") from None
    if not isinstance(d, kind):
        raise error(f"{name} must hold a JSON {'object' if kind is dict else kind.__name__}, got a {type(d).__name__}")
    return d
