"""Priority scheduling as vLLM's ``--scheduling-policy priority`` does it, with one rule taken from vLLM V0.

Waiting requests are served by (priority, arrival), a lower priority value first (vLLM's convention); when blocks
run out the running request with the largest (priority, arrival) is preempted first (vLLM V1's
``Scheduler.schedule``). A waiting request that finds no free KV or no free slot preempts running requests of a
lower priority (larger value) than its own: vLLM V0's ``_schedule_priority_preemption``, which V1 does not have
(there a high-priority arrival waits for a slot; ``preempt_for_waiting=False`` gives V1's rule). Ties end with the
request id, so the order is total.
docs/policies.md ("How fcfs and priority follow vLLM") lists the differences; tests/test_vllm_parity.py checks them.
"""

from __future__ import annotations

from sim.policies.api import RequestView
from sim.policies.queue import QueuePolicy


class PriorityPolicy(QueuePolicy):
    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute",
                 preempt_for_waiting: bool = True) -> None:
        super().__init__(enable_chunked_prefill, preemption_mode)
        if not isinstance(preempt_for_waiting, bool):
            raise ValueError(f"preempt_for_waiting must be true or false, got {preempt_for_waiting!r}")
        self.preempt_for_waiting = preempt_for_waiting  # False: vLLM V1's rule (preempt only when blocks run out)

    def rank(self, req: RequestView) -> tuple[int, float, int]:
        return (req.priority, req.arrival, req.id)
