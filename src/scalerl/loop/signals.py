"""Ctrl-C (SIGINT) and SIGTERM during a run: the first stops it at the next step boundary (metrics
flushed, a checkpoint written), a second one at once.

Handlers are installed only where the signal has its default handler and only in the main thread:
a host that handles them itself (submitit's preemption handling in a sweep job, which bypasses
SIGTERM and requeues on SIGUSR2) keeps its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """A signal that stops the run at once (a second one, or one outside the step loop)."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(signum)
        self.signum = int(signum)
        self.detail = detail


class StopSignals:
    """``with StopSignals() as stop:`` ... ``stop.graceful = True`` inside the step loop, where
    ``stop.signum`` (the first signal received, or None) is checked at each step boundary."""

    def __init__(self):
        self.signum: int | None = None
        self.graceful = False
        self._old: dict[int, object] = {}
        self._held: list[int] | None = None  # while the stopped run is marked: the signal that waits

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    @contextlib.contextmanager
    def marking(self):
        """While a run that ended closes and marks its MLflow run (FINISHED, KILLED ...): one signal
        waits until that is done and is raised then, so that a second Ctrl-C landing just after a
        stop at a step boundary still leaves the run marked (not RUNNING for ever in the UI); a
        further one stops at once."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                raise Interrupted(held[0])

    def _handle(self, signum: int, frame) -> None:
        if self._held is not None and not self._held:
            self._held.append(signum)
            name = signal.Signals(signum).name
            os.write(2, f"[scalerl] {name}: closing the run first ({name} again stops at once)\n".encode())
            return
        if self.graceful and self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            again = "Ctrl-C" if signum == signal.SIGINT else name
            # os.write: a print here could re-enter a print the signal interrupted
            os.write(
                2, f"[scalerl] {name}: stopping after this step ({again} again stops at once)\n".encode()
            )
            return
        raise Interrupted(signum)
