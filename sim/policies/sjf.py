"""Shortest job first on a predicted output length (SGLang's and BLIS's ``sjf``; Qiu et al., "Efficient
Interactive LLM Serving with Proxy Model-based Sequence Length Prediction", 2024, for predicted lengths).

The waiting queue is ordered by the predictor's output length (``sim.policies.predictors``: an oracle, the oracle
with lognormal noise, or length buckets), ties by arrival and id. Non-preemptive, as in those systems: a running
request keeps its slot. ``shortest_remaining`` (SRPT) ranks by the predicted tokens still to generate instead, and
lets a waiting request displace a running one predicted to need more.
"""

from __future__ import annotations

from sim.policies.api import RequestView
from sim.policies.queue import QueuePolicy


def _predicted(req: RequestView) -> int:
    p = req.predicted_output_len
    if p is None:
        raise ValueError("shortest-job-first needs a predicted output length: set the policy's predictor")
    return p


class ShortestJobFirst(QueuePolicy):
    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute",
                 shortest_remaining: bool = False) -> None:
        super().__init__(enable_chunked_prefill, preemption_mode)
        self.shortest_remaining = bool(shortest_remaining)
        self.preempt_for_waiting = self.shortest_remaining

    def rank(self, req: RequestView) -> tuple[int, float, int]:
        left = _predicted(req) - (req.num_output_tokens if self.shortest_remaining else 0)
        return (max(left, 0), req.arrival, req.id)
