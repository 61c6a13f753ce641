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

import numpy as np
import simpy

from sim import fast_path
from sim.costmodel import CostModel
from sim.executor import CostExecutor
from sim.fast_path import Timeline
from sim.request import Request
from sim.routers import kv_pressure, outstanding
from sim.simulator import Replica

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


class ParkingReplica(Replica):
    """A replica that, in a steady decode stretch, parks instead of waking at every step: it publishes what
    its next steps will look like (``sim.fast_path.Timeline``), so that a router reads its state at an arrival
    without running it, and it runs only when the stretch ends (its first finish, a block shortage, the policy's
    deadline, the end of what it priced) or when the router sends it a request (``submit``: it first takes its
    steps up to the arrival, in one call). Between those, no other replica and no router pays for its steps.

    For open-loop traffic without autoscaler, failures or limits, priced by a cost model (``ClusterSimulation``
    checks). Its loop keeps its own clock ``t``: after a park, SimPy's clock only wakes it, at about the right
    time; every time it records is computed as stepping one by one computes it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parked: Timeline | None = None
        self._t = 0.0  # the loop's clock while parked
        self._park_wake: simpy.Event | None = None
        self._woken: tuple[float, tuple | None] | None = None  # what submit's advance left: (clock, step in flight)
        ex = self.executor
        assert isinstance(ex, CostExecutor)
        self._cost: CostModel = ex._model

    # ---- what a router reads ---------------------------------------------------------------------------------
    def key(self, name: str, now: float) -> tuple:
        core = self.core
        tl = self.parked
        if tl is None:
            return KEYS[name](core)
        # parked: nothing waits or is swapped, and no member finishes before the timeline's end
        if name == "least_outstanding":
            return (len(core.running),)
        kv = core.kv
        return (tl.used_at(now, kv.num_used_blocks) / kv.num_blocks, len(core.running))

    # ---- the loop ----------------------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        if self.parked is not None:  # take the steps up to now first: the request arrives during or after them
            self.parked = None
            self._woken = self._run(self._t, self.env.now)
            ev = self._park_wake
            if ev is not None and not ev.triggered:
                ev.succeed()
        super().submit(req)

    def _run(self, t: float, horizon: float) -> tuple[float, tuple | None]:
        """Run from ``t`` as ``Replica._loop`` runs until ``horizon``: steps that end before it applied at once,
        a decode step without finishes across it applied too (overshoot); returns the clock and the step in
        flight at the horizon, if any, as (batch, end, flops)."""
        core = self.core
        cost = self._cost
        while True:
            g = core.group
            if g is not None and g.members:
                seg = fast_path.fast_forward(core, t, horizon, cost, overshoot=True, overshoot_finish=False)
                if seg is not None:
                    t = seg[1]
                    if core.overshot:
                        return t, None
                    continue
            batch = core.schedule(t)
            if batch is None:
                return t, None
            shape = batch.shape
            end = t + float(cost.step_time(shape))
            flops = float(cost.step_flops(shape))
            if end < horizon:
                core.complete(batch, end, flops)
                t = end
                continue
            return t, (batch, end, flops)

    def _loop(self):
        env, core = self.env, self.core
        horizon = self.horizon
        assert horizon is not None
        t = env.now
        woken: tuple[float, tuple | None] | None = None
        while True:
            if woken is None:
                t, inflight = self._run(t, horizon())
            else:
                (t, inflight), woken = woken, None
            if inflight is not None:
                batch, end, flops = inflight
                if end > env.now:
                    yield env.timeout(end - env.now)
                core.complete(batch, end, flops)
                t = end
                continue
            if t > env.now or core.overshot:
                if t > env.now:
                    yield env.timeout(t - env.now)
                if core.overshot:  # the last step's row must show the queue at its end, arrivals included
                    core.overshot = False
                    core.steps.set_last_waiting(len(core.waiting))
                if not self.closed:
                    tl = fast_path.timeline(core, t, self._cost)
                    if tl is not None and tl.expiry > horizon():
                        self.parked, self._t = tl, t
                        self._park_wake = env.event()
                        yield env.any_of([self._park_wake, env.timeout(max(tl.expiry - env.now, 0.0))])
                        self._park_wake = None
                        if self._woken is not None:  # submit took the steps up to its arrival
                            woken, self._woken = self._woken, None
                        self.parked = None
                continue
            if self.closed and not core.has_work:
                return
            # idle from t, as Replica._loop idles (it lands on t exactly; this clock is t)
            self._idle = idle = env.event()
            wake = core.wake_time(t) if core.has_work else None
            if wake is not None and wake > t:
                w = t + (wake - t)
                yield env.any_of([idle, env.timeout(max(w - env.now, 0.0))])
                t = env.now if idle.triggered else w
            else:
                yield idle
                t = env.now
            self._idle = None


class TimelineRouter:
    """``least_kv`` or ``least_outstanding`` by the full scan of ``sim.routers``, reading a parked replica's
    state from its timeline (``ParkingReplica.key``)."""

    def __init__(self, name: str, env: simpy.Environment) -> None:
        self.name = name
        self.env = env

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        now = self.env.now
        name = self.name
        return min(range(len(replicas)), key=lambda i: (*replicas[i].key(name, now), i))


def replica_figures(result: Any) -> tuple[float, float]:
    """A replica's output throughput and time-weighted mean KV usage, exactly as ``summarize`` computes them
    (the cluster's per-replica lines need only these; a whole summary per replica cost a tenth of the run)."""
    from sim.metrics import _ratio, _time_weighted_mean

    total_out = int(np.array([r.output_tokens for r in result.requests if r.completed], dtype=np.int64).sum())
    s = result.steps
    dur = np.asarray(s["duration"], dtype=np.float64)
    cap = np.asarray(s["kv_capacity_blocks"], dtype=np.float64)
    cap = np.where(cap > 0, cap, float(result.kv_capacity_blocks))
    used = np.asarray(s["kv_blocks_used"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        usage = np.where(cap > 0, used / cap, np.nan)
    has_cap = ~np.isnan(usage)
    return _ratio(total_out, float(result.duration)), _time_weighted_mean(usage[has_cap], dur[has_cap])
