"""Progress of a run in simulated requests and simulated time, and a line per phase (writing the outputs).

The simulator reports each finished request with the simulated clock (``Simulation(progress=...)``); a
:class:`Progress` turns those into a bar. :class:`BarProgress` is the terminal one (tqdm on stderr, its rate and ETA
counted in requests, the simulated clock and its speed against the wall clock as a postfix); tests pass their own
recorder (any object with these methods).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Protocol


class Progress(Protocol):
    """What run_scenario and the writers report while they work."""

    def begin(self, name: str, num_requests: int) -> None:
        """A run (one variant at one sweep point) starts, with this many requests."""
        ...

    def advance(self, n: int, now: float) -> None:
        """``n`` more requests finished; the simulated clock reads ``now`` seconds."""
        ...

    def end(self) -> None:
        """The current run is over."""
        ...

    def phase(self, what: str) -> None:
        """A step outside the simulation starts (``writing report.html``)."""
        ...

    def close(self) -> None:
        """Everything is done."""
        ...


class BarProgress:
    """One tqdm bar over every request of every run. The bar itself is updated in batches (tqdm costs about a
    microsecond a call, which ten million requests would feel)."""

    def __init__(self, total_requests: int, desc: str, *, file: IO[str] | None = None, updates: int = 1000) -> None:
        from tqdm import tqdm

        self._file = file if file is not None else sys.stderr
        self._bar: Any = tqdm(total=total_requests, desc=desc, unit="req", leave=False, file=self._file,
                              dynamic_ncols=True)
        self._step = max(1, total_requests // updates)
        self._pending = 0
        self._name = ""
        self._now = 0.0
        self._wall0 = time.perf_counter()
        self._phase_t0: float | None = None

    def begin(self, name: str, num_requests: int) -> None:
        self._name, self._now, self._wall0 = name, 0.0, time.perf_counter()
        self._show()

    def advance(self, n: int, now: float) -> None:
        self._pending += n
        if now > self._now:  # replicas of a cluster finish requests out of clock order
            self._now = now
        if self._pending >= self._step:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._bar.update(self._pending)
            self._pending = 0
            self._show()

    def _show(self) -> None:
        wall = max(time.perf_counter() - self._wall0, 1e-9)
        self._bar.set_postfix_str(f"{self._name} sim {self._now:,.0f} s ({self._now / wall:,.0f}x real time)",
                                  refresh=False)

    def end(self) -> None:
        self._flush()

    def phase(self, what: str) -> None:
        self._flush()
        self._bar.clear()
        self._end_phase()
        self._bar.write(f"{what} ...", file=self._file)
        self._phase_t0 = time.perf_counter()

    def _end_phase(self) -> None:
        if self._phase_t0 is not None:
            self._bar.write(f"  done in {time.perf_counter() - self._phase_t0:.1f} s", file=self._file)
            self._phase_t0 = None

    def close(self) -> None:
        self._flush()
        self._end_phase()
        self._bar.close()
