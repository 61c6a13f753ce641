"""Deliberately bad policies, whose only purpose is to prove that the anomaly detectors (``sim.metrics.anomalies``)
fire,
as BLIS ships reverse-priority and always-busiest ones for its own detectors. Never use them to serve.

- ``ReversePriority``: the largest priority value (the least important) first, and it displaces more important
  running work: every pair of a more important request waiting beside a less important one is inverted.
- ``NewestFirst``: last come, first served: the waiting requests in reverse arrival order (inversions by arrival,
  and the oldest request of a long queue starves).
- ``AlwaysBusiest``: the replica with the most outstanding requests gets every arrival (head-of-line blocking on
  one replica while the others idle).

Name them in a scenario by module, e.g. ``policy: {type: custom, cls: "sim.policies.pathological:NewestFirst"}``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.policies.api import RequestView
from sim.policies.gates import ReplicaView, Router
from sim.policies.queue import QueuePolicy


class ReversePriority(QueuePolicy):
    preempt_for_waiting = True

    def rank(self, req: RequestView) -> tuple[int, float, int]:
        return (-req.priority, req.arrival, req.id)


class NewestFirst(QueuePolicy):
    def rank(self, req: RequestView) -> tuple[float, int]:
        return (-req.arrival, -req.id)


class AlwaysBusiest(Router):
    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        return max(replicas, key=lambda r: (r.num_outstanding, -r.index)).index
