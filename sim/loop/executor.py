"""What runs a step: the one seam between the serving loop (``sim.loop.simulator``) and whatever executes batches.

The loop asks the serving core for a batch, hands it to an executor, lets its clock advance by the duration the
executor returns, and completes the batch. Two executors:

- ``CostExecutor`` (here): a cost model prices the batch; nothing runs. It alone can take many steps at once
  (the core's fast path), since only a model of the step time can be asked about steps not taken yet.
- ``realengine.executor.EngineExecutor``: the batch runs on a real model and the executor returns the measured
  duration; an out-of-memory step reports ``failure``, and the loop turns it into aborts through the core.

This module imports neither torch nor simpy.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sim.costs.costmodel import CostModel
from sim.serving.core import Batch, ServingCore


@runtime_checkable
class Executor(Protocol):
    """Runs (or prices) one step at a time for one replica."""

    @property
    def peak_flops(self) -> float:
        """FLOP/s the model-FLOPs utilisation is measured against (0: not reported)."""
        ...

    @property
    def failure(self) -> str | None:
        """Why the step just executed produced nothing (an out-of-memory forward pass), else None: the loop then
        fails every request of that step through the core."""
        ...

    @property
    def cost(self) -> CostModel | None:
        """The cost model behind a priced executor (the fast path needs one); None for a measured executor."""
        ...

    def resume(self) -> None:
        """The replica's loop has just resumed: host work from here on (completing the previous step, taking
        failures, scheduling) belongs to its next step. A measured executor starts that step's clock here."""
        ...

    def execute(self, batch: Batch) -> float:
        """Run (or price) the batch; the seconds the step takes."""
        ...

    def step_flops(self, batch: Batch) -> float:
        """Useful floating-point operations of the step just executed, for model FLOPs utilisation."""
        ...


class CostExecutor:
    """A cost model as an executor: a step takes what the model predicts for its shape."""

    __slots__ = ("cost", "peak_flops", "failure", "_model", "_step_time", "_step_flops")

    def __init__(self, cost: CostModel) -> None:
        self.cost: CostModel | None = cost
        self._model = cost  # the same, typed as present: the fast path prices with it
        self.peak_flops = float(cost.peak_flops)
        self.failure: str | None = None  # a priced step never runs out of memory
        self._step_time = cost.step_time
        self._step_flops = cost.step_flops

    def resume(self) -> None:
        pass  # a priced step's duration does not depend on the host's work

    def execute(self, batch: Batch) -> float:
        return float(self._step_time(batch.shape))

    def step_flops(self, batch: Batch) -> float:
        return float(self._step_flops(batch.shape))

    def fast_forward(self, core: ServingCore, now: float, horizon: float, *, finishes: bool,
                     overshoot: bool, overshoot_finish: bool = True) -> tuple[list[float], float] | None:
        """The core's fast path, priced by this executor's cost model (see ``ServingCore.fast_forward``)."""
        return core.fast_forward(now, horizon, self._model, finishes=finishes, overshoot=overshoot,
                                 overshoot_finish=overshoot_finish)


def as_executor(x: Executor | CostModel) -> Executor:
    """An executor as it is, a cost model wrapped in a ``CostExecutor``."""
    return x if isinstance(x, Executor) else CostExecutor(x)
