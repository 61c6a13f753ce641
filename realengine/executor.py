"""The real engine as an executor of the serving loop (``sim.loop.executor.Executor``): a batch runs on the model and
the step lasts what it measurably took.

Two clocks (``clock``):

- ``"virtual"``: the loop's clock is a ``simpy.Environment`` that advances by the measured durations alone, so
  idle gaps cost nothing and the run is as fast as the machine. A step's duration is counted from the moment the
  replica's loop resumed after its previous step (the core completing that step, failures, the policy's
  ``schedule``) to the end of the forward pass and sampling: on CPU in the serving thread's CPU time
  (``time.thread_time``), which other processes on a shared machine cannot lengthen (torch must then run one
  intra-op thread, or the other threads' work goes uncounted); on CUDA in synchronised ``perf_counter`` time
  (the GPU's work is not the thread's CPU time).
- ``"wall"``: the loop's clock is a ``simpy.rt.RealtimeEnvironment`` and a step lasts from its start on that
  clock to the wall-clock moment it ended: the host's work, the forward pass and any lateness (the OS waking the
  engine after an idle gap) are all in it, as in a live server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from realengine.runner import ModelRunner
from sim.costs.costmodel import CostModel
from sim.serving.core import Batch

CLOCKS = ("virtual", "wall")


class EngineExecutor:
    """Runs each batch on a ``ModelRunner``; ``oom_steps``: indices (0-based, counting executed steps) of steps
    whose forward pass is made to run out of memory (``sim.serving.failures``). ``price``: a cost model whose
    ``step_flops`` and ``peak_flops`` report model FLOPs utilisation (CUDA runs; on CPU none is reported)."""

    def __init__(self, runner: ModelRunner, *, clock: str = "virtual", price: Any = None,
                 oom_steps: frozenset[int] = frozenset(),
                 timer: Callable[[], float] | None = None) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be 'virtual' or 'wall', got {clock!r}")
        self.runner = runner
        self.clock = clock
        self.is_cuda = runner.device.type == "cuda"
        self.cost: CostModel | None = None  # measured, not priced: no fast path
        self._price = price
        self.peak_flops = float(price.peak_flops) if price is not None else 0.0
        self.failure: str | None = None
        self.oom_steps = oom_steps
        self.steps = 0  # steps executed
        self.on_step: Callable[[int], None] | None = None  # called with the step count after each step
        # the virtual clock's step timer (see the module's docstring); ``timer`` replaces it (calibration's wake-up
        # measurement times steps by the wall clock)
        self.timer = timer or (time.perf_counter if self.is_cuda else time.thread_time)
        self._mark = self.timer()
        self.env: Any = None  # the wall clock's RealtimeEnvironment (set by whoever builds the loop)

    def resume(self, at: float | None = None) -> None:
        """The step's clock starts now (or at ``at``, a reading of ``timer``)."""
        self._mark = self.timer() if at is None else at

    def execute(self, batch: Batch) -> float:
        self.failure = _run(self.runner, batch, self.steps in self.oom_steps)
        if self.is_cuda:
            torch.cuda.synchronize(self.runner.device)
            if self.failure is not None:
                torch.cuda.empty_cache()
        if self.clock == "virtual":
            duration = self.timer() - self._mark
        else:
            env = self.env
            # the wall-clock time since the step's start on the real-time clock: lateness included
            duration = (time.monotonic() - env.real_start) / env.factor - (env.now - env.env_start)
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.steps)
        return duration

    def step_flops(self, batch: Batch) -> float:
        if self._price is None or self.failure is not None:
            return 0.0
        return float(self._price.step_flops(batch.shape))


def _run(runner: ModelRunner, batch: Batch, inject_oom: bool) -> str | None:
    """Run the step; on out-of-memory (real, or injected just before the forward pass) return its message."""
    if inject_oom:
        runner.fault = _raise_oom
    try:
        runner.execute(batch)
    except torch.OutOfMemoryError as e:
        return str(e).splitlines()[0] if str(e) else "OutOfMemoryError"
    finally:
        runner.fault = None
    return None


def _raise_oom(batch: Batch) -> None:
    raise torch.OutOfMemoryError("injected: the step's activations did not fit")
