"""Cluster speed-ups that change no result: a router that finds the least loaded replica without reading every one.

``least_kv`` and ``least_outstanding`` pick the replica with the smallest key (its KV pressure or outstanding
requests, then its index). Read at every arrival, that is a scan of the whole fleet per request: with 256
replicas the scan costs more than simulating. ``IndexedRouter`` keeps each replica's key in a heap instead,
refreshed whenever the replica's state can have changed: when its step loop is about to wait (``Replica.on_yield``:
its state then holds until it runs again) and when a request is submitted to it. An arrival then pops stale
entries off the heap's top until the top is current: the same choice as the scan, in O(log n) per change.

It needs the routable set to be the whole fleet (no autoscaler: provisioning and draining replicas are left out
of a router's choice, and their indices would no longer be list positions).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from sim.request import Request
from sim.routers import kv_pressure, outstanding

# the key each indexed router orders replicas by, without the index (the scan in sim.routers appends it)
KEYS: dict[str, Callable[[Any], tuple]] = {
    "least_kv": lambda core: (kv_pressure(core), outstanding(core)),
    "least_outstanding": lambda core: (outstanding(core),),
}


class IndexedRouter:
    """``least_kv`` or ``least_outstanding`` over a fixed fleet, with a heap of the replicas' keys (see the module
    docstring). Call ``update(replica)`` after anything that changes what the key reads."""

    def __init__(self, name: str, replicas: Sequence[Any]) -> None:
        self.name = name
        self._key = KEYS[name]
        self._stamp = [0] * len(replicas)  # the heap entry of replica i that is current carries stamp[i]
        self._heap: list[tuple] = []
        for rep in replicas:
            self.update(rep)

    def update(self, rep: Any) -> None:
        i = rep.index
        s = self._stamp[i] + 1
        self._stamp[i] = s
        heap = self._heap
        heapq.heappush(heap, (*self._key(rep.core), i, s))
        if len(heap) > 8 * len(self._stamp) + 1024:
            # stale entries pile up under the top: keep the current ones only
            stamp = self._stamp
            self._heap = [e for e in heap if e[-1] == stamp[e[-2]]]
            heapq.heapify(self._heap)

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        heap, stamp = self._heap, self._stamp
        if len(replicas) != len(stamp):
            raise AssertionError("an indexed router routes over the whole fleet")
        while heap[0][-1] != stamp[heap[0][-2]]:
            heapq.heappop(heap)
        return heap[0][-2]
