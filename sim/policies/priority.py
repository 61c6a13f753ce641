"""Priority scheduling as vLLM's ``--scheduling-policy priority`` does it.

Waiting requests are served by (priority, arrival), a lower priority value first (vLLM's convention); when blocks
run out the running request with the largest (priority, arrival) is preempted first; and a waiting request that
finds no free KV or no free slot preempts running requests of a lower priority (larger value) than its own
(vLLM v0's ``_schedule_priority_preemption``). Ties end with the request id, so the order is total.
"""

from __future__ import annotations

from sim.policies.api import RequestView
from sim.policies.queue import QueuePolicy


class PriorityPolicy(QueuePolicy):
    preempt_for_waiting = True

    def rank(self, req: RequestView) -> tuple[int, float, int]:
        return (req.priority, req.arrival, req.id)
