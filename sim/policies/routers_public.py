"""Routers written only against the public router API (``servesim.Router``: a request and frozen
``ReplicaView`` snapshots in, a replica's index out), the ones cluster schedulers compare:

- ``PowerOfTwoChoices``: two replicas drawn at random, the less loaded of the two gets the request (Mitzenmacher,
  "The Power of Two Choices in Randomized Load Balancing", 2001; the default of Envoy's and NGINX's
  least-request balancers). Seeded: the same seed draws the same pairs.
- ``CacheLoadScorer``: a weighted sum of scores in [0, 1] per replica, the highest wins, as llm-d's inference
  scheduler combines its prefix-cache, queue and KV-cache-utilization scorers (llm-d ``inference-scheduler``,
  ``pkg/plugins/scorer``): the share of the prompt the replica's prefix cache holds, the queue length scaled
  between the shortest and longest queue of the fleet (shortest 1), and the free share of its KV cache.
- ``SLOAwareRouter``: predicts each replica's TTFT for the request and prefers those that meet the request's TTFT
  SLO, among them the one that holds most of its prompt in cache (least outstanding on a tie); when none meets it,
  or the request has no TTFT SLO, the replica of the smallest predicted TTFT, least outstanding on a tie (after
  llm-d's SLO-aware routing on predicted latency). The prediction is a stated linear estimate, not a learned
  model: the prompt tokens ahead of it (waiting requests times the mean prompt this router has routed) plus its
  own uncached prompt, divided by ``prefill_tokens_per_s``, plus ``step_s`` for each running request's decode
  step it shares the GPU with.

Ties go to the lower index, so a run is reproducible. A router object serves one run (the scenario builds a fresh
one per run, so a seeded router draws the same pairs in every variant).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.policies.api import RequestView
from sim.policies.gates import ReplicaView, Router


def _number(name: str, x: float, low: float = 0.0, strict: bool = False) -> float:
    bad = isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x)
    if bad or x < low or (strict and x == low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {x!r}")
    return float(x)


class PowerOfTwoChoices(Router):
    """Two distinct replicas at random (seeded), the one with fewer outstanding requests (then lower KV usage,
    then the lower index) gets the request."""

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        if len(replicas) == 1:
            return replicas[0].index
        i, j = self._rng.choice(len(replicas), size=2, replace=False)
        a, b = replicas[int(i)], replicas[int(j)]
        return min(a, b, key=lambda r: (r.num_outstanding, r.kv_usage, r.index)).index


class CacheLoadScorer(Router):
    """llm-d's weighted scorers (module docstring): ``prefix_weight`` x cached share of the prompt +
    ``queue_weight`` x scaled queue score + ``kv_weight`` x free KV share; the highest total wins."""

    def __init__(self, prefix_weight: float = 2.0, queue_weight: float = 1.0, kv_weight: float = 1.0) -> None:
        self.prefix_weight = _number("prefix_weight", prefix_weight)
        self.queue_weight = _number("queue_weight", queue_weight)
        self.kv_weight = _number("kv_weight", kv_weight)
        if self.prefix_weight == self.queue_weight == self.kv_weight == 0:
            raise ValueError("prefix_weight, queue_weight and kv_weight are all 0: every replica would tie")

    def scores(self, request: RequestView, replicas: Sequence[ReplicaView]) -> list[float]:
        """Each replica's total score, in the order given."""
        queues = [r.num_waiting for r in replicas]
        lo, hi = min(queues), max(queues)
        out = []
        for r in replicas:
            prefix = r.cached_tokens / request.prompt_len
            queue = 1.0 if hi == lo else 1 - (r.num_waiting - lo) / (hi - lo)
            out.append(self.prefix_weight * prefix + self.queue_weight * queue + self.kv_weight * (1 - r.kv_usage))
        return out

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        s = self.scores(request, replicas)
        best = max(range(len(replicas)), key=lambda k: (s[k], -replicas[k].index))
        return replicas[best].index


class SLOAwareRouter(Router):
    """The replica predicted to meet the request's TTFT SLO that holds most of its prompt (module docstring)."""

    def __init__(self, prefill_tokens_per_s: float = 10_000.0, step_s: float = 0.0) -> None:
        self.prefill_tokens_per_s = _number("prefill_tokens_per_s", prefill_tokens_per_s, strict=True)
        self.step_s = _number("step_s", step_s)
        self._prompt_sum = 0
        self._routed = 0

    def predicted_ttft(self, request: RequestView, r: ReplicaView) -> float:
        """Seconds to the request's first token on replica ``r`` by the linear estimate of the module docstring."""
        mean_prompt = self._prompt_sum / self._routed if self._routed else request.prompt_len
        ahead = r.num_waiting * mean_prompt + (request.prompt_len - r.cached_tokens)
        return ahead / self.prefill_tokens_per_s + r.num_running * self.step_s

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        ttft = [self.predicted_ttft(request, r) for r in replicas]
        slo = request.deadline - request.arrival
        meet = [k for k in range(len(replicas)) if ttft[k] <= slo] if math.isfinite(slo) else []
        if meet:
            k = min(meet, key=lambda k: (-replicas[k].cached_tokens, replicas[k].num_outstanding, replicas[k].index))
        else:
            k = min(range(len(replicas)), key=lambda k: (ttft[k], replicas[k].num_outstanding, replicas[k].index))
        self._prompt_sum += request.prompt_len
        self._routed += 1
        return replicas[k].index
