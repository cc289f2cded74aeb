"""One-line errors and warnings for every `crl-jax` command and experiments/sweep.py: bad input (config,
checkpoint, model folder, run folder, files) exits 2 with one `PROG: error: ...` line, never a traceback."""

from __future__ import annotations

import sys


def _one_line_warnings() -> None:
    """Warnings (e.g. a bank file's `BankFileWarning`) as one `crl-jax: warning:` line each, each text once
    (the runtime of a run is built more than once, and each build would warn again)."""
    import warnings

    warnings.formatwarning = lambda message, category, *a, **k: f"crl-jax: warning: {message}\n"
    shown = warnings.showwarning
    seen: set[str] = set()

    def once(message, category, filename, lineno, file=None, line=None):
        if str(message) not in seen:
            seen.add(str(message))
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = once


def _os_message(e: OSError) -> str:
    """An OSError as one line naming its file(s): 'PATH: Is a directory' (or the message it was raised with)."""
    if e.filename is None or not e.strerror:
        return str(e)
    names = repr(e.filename) + (f" -> {e.filename2!r}" if e.filename2 is not None else "")
    return f"{names}: {e.strerror}"


def _token_renderer_error(e: Exception) -> bool:
    """The tokenizer of an LLM checkpoint does not round-trip an environment's text (`make_token_renderer`)."""
    return isinstance(e, ValueError) and str(e).startswith("make_token_renderer:")


def report_errors(fn, *args, prog: str = "crl-jax"):
    """Call `fn(*args)`; bad input (config, checkpoint, model folder, run folder, files) exits 2 with one
    `PROG: error: ...` line, a run stopped for non-finite updates exits 3, a run stopped by a signal exits 128 +
    its number (SIGINT 130, SIGTERM 143), a second Ctrl-C 130. Shared by
    `crl-jax` and experiments/sweep.py."""
    from crl_jax.config import ConfigError
    from crl_jax.infra.errors import CheckpointError
    from crl_jax.infra.preempt import Stopped

    try:
        return fn(*args)
    except Stopped as e:  # SIGTERM / SIGINT: checkpoint of the step reached saved; exit 128 + signal number
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (ConfigError, CheckpointError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # missing files, a file where a folder is needed (or the reverse), permissions
        print(f"{prog}: error: {_os_message(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # run.Interrupted carries the step and checkpoint; else before the first step
        print(f"{prog}: {e}" if str(e) else f"{prog}: interrupted; rerun the same command to resume",
              file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        from crl_jax.infra.run import Interrupted, NonFiniteError

        if isinstance(e, Interrupted):
            print(f"{prog}: {e}", file=sys.stderr)
            sys.exit(130)
        if isinstance(e, NonFiniteError):
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(3)
        if _token_renderer_error(e):
            print(f"{prog}: error: actor.preset / extractor.preset: {e}", file=sys.stderr)
            sys.exit(2)
        if isinstance(e, ValueError) and str(e).startswith("build_distill_prompt: budget"):  # traced, after checks
            print(f"{prog}: error: extraction.prompt_len: {e}", file=sys.stderr)
            sys.exit(2)
        raise
