"""Requests that end badly on purpose: cancellations, per-request errors and out-of-memory steps.

A ``FailurePlan`` says, before a run starts, which requests a client cancels (and how long after arrival),
which requests hit an error (after how many output tokens), and at which steps the forward pass runs out of
memory. It is drawn from the run's seeded generator, so every compared variant meets the same faults. An
executor applies it through the serving core's one way out for a request mid-flight, ``ServingCore.abort``
(outcome ``failed``, every block released): the point of injecting faults is to prove that this path leaves
nothing behind, the failure mode the seed documents warn about most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.serving.request import RequestSpec


@dataclass(frozen=True)
class FailurePlan:
    """``cancel_after[id]``: seconds after its arrival when the client of request ``id`` disconnects (taken
    between steps, as a server notices a closed connection). ``error_after[id]``: the request fails in the step
    that would give it its next token once it has this many output tokens (0: in its prefill); the step's other
    requests go on. ``oom_steps``: indices of the steps (0-based, counting executed steps) whose forward pass runs
    out of memory: every request in such a step fails. A scenario's ``workload.failures`` section gives timed
    failures only (``cancel_after``, named ``cancel_reason``), which both executors apply; the token- and
    step-indexed faults are the real engine's, for its tests."""

    cancel_after: dict[int, float] = field(default_factory=dict)
    error_after: dict[int, int] = field(default_factory=dict)
    oom_steps: frozenset[int] = frozenset()
    cancel_reason: str = "cancelled by the client"  # what a timed failure is called in the records

    def __post_init__(self) -> None:
        bad = {i: t for i, t in self.cancel_after.items() if not t >= 0}
        if bad:
            raise ValueError(f"cancel_after must be >= 0 seconds, got {bad}")
        bad_n = {i: n for i, n in self.error_after.items() if n < 0}
        if bad_n:
            raise ValueError(f"error_after must be >= 0 output tokens, got {bad_n}")
        if any(s < 0 for s in self.oom_steps):
            raise ValueError(f"oom_steps must be >= 0, got {sorted(self.oom_steps)}")

    @property
    def empty(self) -> bool:
        return not (self.cancel_after or self.error_after or self.oom_steps)

    @classmethod
    def draw(
        cls,
        specs: Sequence[RequestSpec],
        rng: np.random.Generator,
        *,
        cancel_fraction: float = 0.0,
        cancel_after: tuple[float, float] = (0.0, 1.0),
        error_fraction: float = 0.0,
        oom_steps: Sequence[int] = (),
    ) -> FailurePlan:
        """Cancel ``cancel_fraction`` of the requests, each a uniform ``cancel_after`` seconds after arrival;
        fail ``error_fraction`` of the others, each after a uniform number of its output tokens."""
        for name, f in (("cancel_fraction", cancel_fraction), ("error_fraction", error_fraction)):
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {f}")
        lo, hi = cancel_after
        if not 0.0 <= lo <= hi:
            raise ValueError(f"cancel_after must be (low, high) with 0 <= low <= high, got {cancel_after}")
        ids = np.array([s.id for s in specs], dtype=np.int64)
        outs = {s.id: s.output_len for s in specs}
        n_cancel = round(cancel_fraction * len(ids))
        n_error = round(error_fraction * len(ids))
        order = rng.permutation(ids)
        cancelled = order[:n_cancel]
        erroring = order[n_cancel : n_cancel + n_error]
        delays = rng.uniform(lo, hi, size=len(cancelled))
        return cls(
            cancel_after={int(i): float(d) for i, d in zip(cancelled, delays, strict=True)},
            error_after={int(i): int(rng.integers(0, outs[int(i)])) for i in erroring},
            oom_steps=frozenset(int(s) for s in oom_steps),
        )
