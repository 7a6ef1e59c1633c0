"""Ctrl-C (SIGINT) and SIGTERM during a run: the first stops it at the next step boundary (metrics
flushed, a checkpoint written), a second one at once.

Handlers are installed only where the signal has its default handler and only in the main thread:
a host that handles them itself (submitit's preemption handling in a sweep job, which bypasses
SIGTERM and requeues on SIGUSR2) keeps its own.

A signal that stops at once raises where the main thread happens to be. Where that is a finalizer (a
weak reference's callback, a collector's callback), Python only reports the exception and goes on:
while the handlers are installed, such a report is turned into the same signal again, delivered
a moment later (after the finalizer) by :func:`_thread.interrupt_main`, so the stop is not lost.
Once stopped at once, the finalizers of the library code the signal cut short (SQLAlchemy's half-done
session in MLflow's store) report errors of their own as the process exits; :func:`quiet_finalizers`
leaves them out.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
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
        self._hook = None  # the unraisable hook before ours, while ours is installed
        self._at_once = False  # a signal was raised to stop at once

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                    self._old[sig] = signal.signal(sig, self._handle)
            if self._old:
                self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if self._hook is not None:
            sys.unraisablehook, self._hook = self._hook, None

    def _unraisable(self, report) -> None:
        """An :class:`Interrupted` raised inside a finalizer was dropped: send the signal again."""
        if isinstance(report.exc_value, Interrupted):
            redeliver = threading.Timer(0.01, _thread.interrupt_main, args=(report.exc_value.signum,))
            redeliver.daemon = True
            redeliver.start()
        elif self._hook is not None and not self._at_once:  # else: of the code the stop cut short
            self._hook(report)

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
                self._at_once = True
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
        self._at_once = True
        raise Interrupted(signum)


def quiet_finalizers() -> None:
    """For a process that stopped at once and now exits: errors that finalizers report (of the
    library code the signal cut short) are left out instead of printed as tracebacks."""
    sys.unraisablehook = lambda report: None
