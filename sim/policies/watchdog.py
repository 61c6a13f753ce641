"""A user's policy that never returns: one clear error instead of a hang.

A call into a user's policy (``sim.policies.user.call_user``: ``schedule``, ``wake_time``, a router's ``route``, an
admission's ``admit``) that runs longer than ``limit_s()`` seconds of wall time is stopped: a watcher thread sends
the main thread SIGINT, and ``call_user`` turns the KeyboardInterrupt into a ``PolicyError`` that names the call and
the line of the user's code it was stopped in (the command line prints it and exits 2, as for any bad input).
A decision takes microseconds to milliseconds; the default of 60 s only catches a loop that never ends, on a busy
machine too. ``SERVESIM_POLICY_TIMEOUT_S`` changes it. ``servesim.evaluate`` has its own CPU-time budget per
evaluation (sim/studies/evaluate.py); this one covers ``servesim run``, sweeps, the engine and everything else.

The watch costs a call four attribute writes and a read; the watcher wakes at most once a second. It watches the
main thread only (the one signals reach); calls from other threads are not timed.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time

LIMIT_ENV = "SERVESIM_POLICY_TIMEOUT_S"
DEFAULT_LIMIT_S = 60.0


def limit_s() -> float:
    """Seconds a call into a user's policy may take: ``SERVESIM_POLICY_TIMEOUT_S`` or 60."""
    text = os.environ.get(LIMIT_ENV)
    if text is None:
        return DEFAULT_LIMIT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        from sim.config.errors import ScenarioError

        raise ScenarioError(f"{LIMIT_ENV} must be a number of seconds > 0, got {text!r}")
    return value


class Watch:
    """What the main thread is doing, as the watcher reads it: ``calls`` counts the calls begun, ``inside`` says
    one is running, ``fired`` says the watcher stopped it."""

    __slots__ = ("calls", "inside", "fired", "limit", "main", "_started")

    def __init__(self) -> None:
        self.calls = 0
        self.inside = False
        self.fired = False
        self.limit = DEFAULT_LIMIT_S
        self.main = threading.main_thread().ident
        self._started = False

    def arm(self) -> None:
        """Read the limit and start the watcher (once per process: a forked worker starts its own)."""
        self.limit = limit_s()
        before = signal.getsignal(signal.SIGINT)
        if before in (signal.SIG_IGN, signal.SIG_DFL) and threading.current_thread() is threading.main_thread():
            # SIGINT ignored (a run started in the background by a script, nohup) or left to the system (a script's
            # signal(SIGINT, SIG_DFL)): Python would drop the stop (_thread.interrupt_main does nothing then) and
            # the call would hang; a handler that stops only a watched call does to every other SIGINT what was done
            global _BEFORE
            _BEFORE = before
            signal.signal(signal.SIGINT, _stop_if_fired)
        if not self._started:
            self._started = True
            threading.Thread(target=self._watch, name="servesim-policy-watchdog", daemon=True).start()

    def _watch(self) -> None:
        seen, since = -1, 0.0
        while True:
            time.sleep(min(1.0, self.limit / 4))
            if not self.inside:
                seen = -1
                continue
            if self.calls != seen:  # a call begun since the last look: time it from now
                seen, since = self.calls, time.monotonic()
                continue
            if time.monotonic() - since >= self.limit and self.inside and self.calls == seen:
                self.fired = True
                since = time.monotonic()  # the user's code may catch the interrupt: stopped again a limit later
                if self.main is not None and signal.getsignal(signal.SIGINT) in (signal.default_int_handler,
                                                                                  _stop_if_fired):
                    # a real signal, not _thread.interrupt_main alone: it also ends a sleep or a blocking read
                    signal.pthread_kill(self.main, signal.SIGINT)
                else:  # another handler: Python's own path to it
                    _thread.interrupt_main()

    def reset_after_fork(self) -> None:
        # threads do not survive fork: a child of a watched parent starts its own watcher at once, at the parent's
        # limit (its calls may be into policies made before the fork, which nothing arms again)
        started, limit = self._started, self.limit
        self.__init__()  # type: ignore[misc]
        self.limit = limit
        if started:
            self._started = True
            threading.Thread(target=self._watch, name="servesim-policy-watchdog", daemon=True).start()


_BEFORE: object = signal.SIG_IGN  # what SIGINT did before ``_stop_if_fired`` took it


def _stop_if_fired(signum: int, frame: object) -> None:
    """SIGINT's handler where Python did not handle it: the watchdog's stop interrupts the main thread; any other
    SIGINT is ignored, or ends the process, as before."""
    if WATCH.fired and WATCH.inside:
        raise KeyboardInterrupt
    if _BEFORE is signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


WATCH = Watch()
os.register_at_fork(after_in_child=WATCH.reset_after_fork)
