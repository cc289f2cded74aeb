"""Preemption: SIGTERM (what schedulers and preemptible VMs send) and SIGINT (Ctrl-C) stop a run at the next
chunk boundary with a checkpoint of the last completed step, instead of killing it mid-write.

`stop_requests()` is a context manager that, for its duration (main thread only; nested uses share one
installation), replaces the two handlers by one that records the signal. The training loops ask
`requested()` after every chunk; when it names a signal they save a checkpoint of the step they reached and
raise `Stopped`, which the CLI reports as one line and exits with 128 + the signal number (143 for SIGTERM,
130 for SIGINT), the shell's convention for "ended by this signal". A second signal while a stop is pending
raises `KeyboardInterrupt` at once (the old Ctrl-C behaviour: no checkpoint of the current chunk).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []  # signals received while installed (the first one decides)
_depth = 0


class Stopped(Exception):
    """The run stopped at a chunk boundary for a signal: `step` = the step its checkpoint holds."""

    def __init__(self, step: int, signum: int, saved: bool = True):
        self.step, self.signum = step, signum
        self.exit_code = 128 + signum
        what = "checkpoint saved; rerun the same command to resume" if saved else \
            "before its first step; rerun the same command to start"
        super().__init__(f"stopped at step {step} ({signal.Signals(signum).name}), {what}")


def _handler(signum, frame):
    del frame
    if _pending:  # a second signal: stop now
        raise KeyboardInterrupt
    _pending.append(signum)
    print(f"crl-jax: {signal.Signals(signum).name} received: stopping at the end of the current chunk (send it "
          "again to stop at once, without saving it)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_requests():
    """Record SIGTERM / SIGINT instead of dying for the duration of the block (no-op off the main thread)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {} if _depth else {s: signal.signal(s, _handler) for s in SIGNALS}
    if not _depth:
        _pending.clear()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, h in previous.items():
            signal.signal(s, h)
        if not _depth:
            _pending.clear()


def requested() -> int | None:
    """The signal number of a pending stop request, else None."""
    return _pending[0] if _pending else None


def requested_by_any() -> int | None:
    """`requested()` of any process of a multi-process job (one all-gather per call; no collective for one
    process): checkpoints are collective, so every process must stop at the same chunk boundary even when the
    scheduler's signals reach them at different times."""
    import jax

    if jax.process_count() == 1:
        return requested()
    import numpy as np
    from jax.experimental import multihost_utils

    got = np.asarray(multihost_utils.process_allgather(np.int32(requested() or 0)))
    return int(got.max()) or None
