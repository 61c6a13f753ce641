"""The CPU engine's step clocks under the virtual clock (``run_engine(clock="virtual", cpu_clock=...)``).

- ``"thread"`` (default): the serving thread's CPU time (``time.thread_time``). Other processes cannot lengthen it
  by taking the core away, but they still slow the thread while it runs (shared caches, memory bandwidth, the
  caches refilled after every switch): on this project's 2-core VM one fixed llama-57m decode step's median moved
  1.19x across a few minutes with 0-2 CPU-bound neighbours (``benchmarks/bench_clock.py``, docs/benchmarks.md).
- ``"reference"``: the thread's CPU time in the units of a reference speed: between steps, now and then
  (``ReferenceClock.period`` seconds of thread time), the model's forward pass over one token without a cache (the
  steps' own mix of operators and weight reads) is timed on the thread clock, and the thread time since the last
  reading is scaled by ``base / median(the last few references)``. A neighbour that slows the step slows the
  reference alike, so the scaled reading holds still (the same step: 1.075x). ``base`` is the reference's time
  at the speed the readings are expressed in: a profile records the one it was measured at
  (``provenance.reference_seconds``), and an engine run validated against the profile reads its steps at that
  speed. The reference's own time is never in a reading.

No hardware counter is used: retired instructions or cycles of the thread (``perf_event_open``) would be the
natural clock, but a VM without a virtual PMU refuses them (``benchmarks/bench_clock.py`` reports the refusal).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from realengine.attention import build_metadata
from realengine.model import LlamaModel

CPU_CLOCKS = ("thread", "reference")


class ReferenceClock:
    """A monotonic reading (seconds) of the calling thread's CPU time at the reference speed (module docstring).

    ``probe``: the reference, returning its own duration in thread seconds. ``base``: the reference's time at the
    speed to read in (None: the median of the first ``window`` probes, i.e. this machine now). ``period``: thread
    seconds between probes; ``window``: probes in the speed estimate; ``thread_time``: the thread clock (tests
    give their own)."""

    def __init__(self, probe: Callable[[], float], *, base: float | None = None, period: float = 0.25,
                 window: int = 5, thread_time: Callable[[], float] = time.thread_time) -> None:
        if base is not None and not base > 0:
            raise ValueError(f"reference base must be > 0 seconds, got {base!r}")
        if period <= 0 or window < 1:
            raise ValueError(f"period must be > 0 and window >= 1, got {period!r}, {window!r}")
        self.probe = probe
        self.thread_time = thread_time
        self.period = period
        self.recent: deque[float] = deque((probe() for _ in range(window)), maxlen=window)
        self.base = float(np.median(self.recent)) if base is None else float(base)
        self.scale = self.base / float(np.median(self.recent))
        self.probes = window
        self._reading = 0.0
        self._since = 0.0
        self._last = thread_time()

    def __call__(self) -> float:
        now = self.thread_time()
        spent = now - self._last
        self._reading += spent * self.scale
        self._since += spent
        if self._since >= self.period:
            self.recent.append(self.probe())
            self.probes += 1
            self.scale = self.base / float(np.median(self.recent))
            self._since = 0.0
            now = self.thread_time()  # the probe's own time is in no reading
        self._last = now
        return self._reading


def model_probe(model: LlamaModel) -> Callable[[], float]:
    """The reference of ``ReferenceClock`` for an engine's model: its forward pass over one token without a
    cache, in thread seconds."""
    meta = build_metadata([0], [1], device=model.device)
    ids = torch.zeros(1, dtype=torch.int64, device=model.device)

    def probe() -> float:
        t = time.thread_time()
        with torch.inference_mode():
            model(ids, meta.positions, meta, None)
        return time.thread_time() - t

    return probe


def cpu_step_timer(cpu_clock: str, model: LlamaModel, base: float | None = None) -> Callable[[], float]:
    """The virtual clock's step timer on CPU: ``time.thread_time`` or a ``ReferenceClock`` on ``model``."""
    if cpu_clock not in CPU_CLOCKS:
        raise ValueError(f"cpu_clock must be one of {', '.join(CPU_CLOCKS)}, got {cpu_clock!r}")
    if cpu_clock == "thread":
        return time.thread_time
    return ReferenceClock(model_probe(model), base=base)
