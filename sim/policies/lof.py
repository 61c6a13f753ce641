"""Longest output first, as SGLang's ``--schedule-policy lof`` (``python/sglang/srt/managers/schedule_policy.py``:
the waiting queue sorted by ``-max_new_tokens``).

SGLang orders by the output budget the client declared; a servesim request carries no declared maximum, so the
order is the configured predictor's output length (``RequestView.predicted_output_len``; the config's default is
the oracle, the true length, which is what a client sending an exact ``max_tokens`` declares). Longest first:
starting the long generations early shortens the tail of an offline batch (the makespan), at the cost of the
short requests' latency; the opposite of ``sjf``. Ties by arrival, then id. SGLang's other cache-aware order,
``dfs-weight`` (a depth-first walk of its radix tree weighted by the requests under each node), does not apply:
a policy sees how much of a prompt is cached (``KVView.num_cached_tokens``), not the tree.
"""

from __future__ import annotations

from sim.policies.api import RequestView
from sim.policies.queue import QueuePolicy


class LongestOutputFirst(QueuePolicy):
    def rank(self, req: RequestView) -> tuple[int, float, int]:
        p = req.predicted_output_len
        if p is None:
            raise ValueError("longest-output-first needs a predicted output length: set the policy's predictor")
        return (-p, req.arrival, req.id)
