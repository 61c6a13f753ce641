"""Earliest deadline first on TTFT SLOs (Liu and Layland's EDF, applied to first tokens as in SLO-aware LLM
schedulers such as "Andes" (Liu et al., 2024) and BLIS's SLO-based priority).

A request's deadline is its arrival plus its class's TTFT SLO, else the scenario's (``RequestView.deadline``; no
SLO: never due, served after every request that has one, by arrival). The waiting queue is ordered by deadline.
With ``reject_late`` a waiting request whose deadline has passed before it ever ran is rejected (it can no longer
meet its SLO, and serving it would only delay others); the policy then asks to be woken at the next deadline of the
queue.
"""

from __future__ import annotations

from sim.policies.api import PolicyView, RequestView
from sim.policies.queue import QueuePolicy


class EarliestDeadlineFirst(QueuePolicy):
    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute",
                 reject_late: bool = False) -> None:
        super().__init__(enable_chunked_prefill, preemption_mode)
        if not isinstance(reject_late, bool):
            raise ValueError(f"reject_late must be true or false, got {reject_late!r}")
        self.reject_late = reject_late

    def rank(self, req: RequestView) -> tuple[float, float, int]:
        return (req.deadline, req.arrival, req.id)

    def refuse(self, req: RequestView, view: PolicyView) -> str | None:
        if self.reject_late and req.first_scheduled is None and view.now >= req.deadline:
            return f"TTFT deadline {req.deadline:.3f} s passed before it could start"
        return None

    def wake_time(self, view: PolicyView) -> float | None:
        if not self.reject_late:
            return None
        due = [r.deadline for r in view.waiting if r.first_scheduled is None and r.deadline > view.now]
        return min(due) if due else None
