"""Longest prefix match first, as SGLang's ``--schedule-policy lpm`` (``python/sglang/srt/managers/schedule_policy.py``)
does it, with the two fixes its users asked for.

The waiting request whose prompt the prefix cache holds most of goes first (``KVView.num_cached_tokens``: a cache
hit is prompt that need not be computed, and admitting it before the cached blocks are evicted keeps the hit).
Without prefix caching every request shows 0 cached tokens and the order is first come first served.

- **Bounded cost**: SGLang falls back to FCFS when more than 128 requests wait, because matching every waiting
  prompt against the radix tree each step cost too much (sgl-project/sglang#1896). ``max_waiting`` is that bound.
- **Aging**: plain LPM starves cache-cold requests behind a stream of warm ones (TTFT tails of 20-60 s,
  sgl-project/sglang#31954). A request's score is its cached tokens plus ``aging`` tokens for every second it has
  waited, so a cold request eventually outranks a warm newcomer; ``aging: 0`` is SGLang's plain LPM.

Ties go to the earlier arrival, then the lower id. Running requests are preempted latest-admitted first, as FCFS.
The order can change only when something arrives or finishes (the cache's contents, the queue), and the waiting
order matters only when a request can be admitted, when the core asks: so ``depends_on`` stays arrivals and
finishes (the aging term is read from the clock when asked).
"""

from __future__ import annotations

import math

from sim.policies.api import KVView, Plan, PolicyView, RequestView
from sim.policies.queue import QueuePolicy


class LongestPrefixMatch(QueuePolicy):
    """SGLang's ``lpm`` with a bound on the queue it sorts and an aging term (module docstring)."""

    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute",
                 max_waiting: int = 128, aging: float = 16.0) -> None:
        super().__init__(enable_chunked_prefill, preemption_mode)
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an int >= 0 (requests), got {max_waiting!r}")
        if isinstance(aging, bool) or not isinstance(aging, int | float) or not (math.isfinite(aging) and aging >= 0):
            raise ValueError(f"aging must be a finite number >= 0 (tokens per second waited), got {aging!r}")
        self.max_waiting, self.aging = max_waiting, float(aging)
        self._kv: KVView | None = None  # set while this step sorts by prefix match; None: FCFS
        self._now = 0.0
        self._admitted: dict[int, int] = {}  # running request id -> its place in admission order

    def describe(self) -> str:
        return f"LongestPrefixMatch(max_waiting={self.max_waiting}, aging={self.aging:g} tokens/s)"

    def schedule(self, view: PolicyView) -> Plan:
        self._kv = view.kv if len(view.waiting) <= self.max_waiting else None
        self._now = view.now
        self._admitted = {r.id: i for i, r in enumerate(view.running)}
        return super().schedule(view)

    def rank(self, req: RequestView) -> tuple[float, float, int] | None:
        if self._kv is None:
            return None  # first come first served
        i = self._admitted.get(req.id)
        if i is not None:
            return (math.inf, 0.0, i)  # a preemption victim: the latest admitted
        score = self._kv.num_cached_tokens(req) + self.aging * (self._now - req.arrival)
        return (-score, req.arrival, req.id)
