"""Cluster speed-ups that change no result: replicas that do not pay for each other's steps.

In a cluster every arrival is an outside event for every replica: the router reads each one's state then. So a
replica stepping normally must stop at every arrival, and with 16 replicas at 16 times a trace's rate that is
nearly every step. Two things here remove that cost, with the results of stepping one by one (the tests compare):

- ``ParkingReplica``: in a steady decode stretch (only the decode group runs, nothing waits) a replica's next
  steps are known in advance (``sim.serving.fast_path.Timeline``: when each runs, how many KV blocks it holds). The
  replica parks; a router reads its state at an arrival from the timeline; it runs only when the stretch ends or
  when it gets a request, and then takes all its steps up to that moment in one call.
- ``TimelineRouter`` and ``BoundedRouter``: ``least_kv`` and ``least_outstanding`` reading parked replicas from
  their timelines; the first by a scan of the fleet, the second (past ``sim.loop.cluster.SCAN_MAX`` replicas) from a
  heap of lower bounds, so that an arrival reads only the replicas that could be the least loaded.
- ``Calendar``: one event calendar over the arrivals and every replica's next wake, in place of SimPy's
  environment, so that a replica waiting for its next event holds one heap entry and costs nothing else.

They need the routable set to be the whole fleet and nothing else reading replicas (no autoscaler: it reads busy
time and provisioning changes the fleet; no failures; open-loop arrivals).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Generator, Sequence
from math import inf as INF
from math import nextafter
from typing import Any, cast

import numpy as np

from sim.costs.costmodel import CostModel
from sim.loop.executor import CostExecutor
from sim.loop.simulator import Replica
from sim.policies.routers import kv_pressure, outstanding
from sim.serving import fast_path
from sim.serving.fast_path import Timeline
from sim.serving.request import Request

# the key each of these routers orders replicas by, without the index (as sim.policies.routers' scans, which append it)
KEYS: dict[str, Callable[[Any], tuple]] = {
    "least_kv": lambda core: (kv_pressure(core), outstanding(core)),
    "least_outstanding": lambda core: (outstanding(core),),
}


FROM_T = (0.0, None)  # ParkingReplica._woken: go on from the loop's clock (a marker, compared by identity)


class Calendar:
    """One event calendar for a parking fleet, in place of SimPy's environment: the arrivals and each replica's
    next wake in one heap. A replica holds one entry, for the end of its step in flight, of its park or of its
    policy's wake time, and none while it idles: it costs nothing until its next event. SimPy's events (a
    timeout, a condition over a timeout and a wake-up event, the condition's own turn) cost about a tenth of a
    run here.

    The processes are generators, as SimPy's: each yields ``(time, wakeable)`` (``timeout`` makes them), and
    resumes at ``time`` or, when ``wakeable``, earlier through ``wake``. Entries are taken in SimPy's order (time,
    then the order in which they were scheduled; processes start in the order they were added) and their times are
    computed as SimPy computes them (now + delay), so a run is the same to the bit."""

    __slots__ = ("now", "_heap", "_seq", "_gens", "_due", "_wakeable")

    def __init__(self) -> None:
        self.now: float = 0  # an int at first, as SimPy's clock (a request arriving then records 0, not 0.0)
        self._heap: list[tuple[float, int, int]] = []  # (time, order of scheduling, process)
        self._seq = 0
        self._gens: list[Generator[tuple[float, bool], None, None]] = []
        self._due: list[int] = []  # each process's live entry (its order of scheduling; -1: none)
        self._wakeable: list[bool] = []

    def process(self, gen: Generator[tuple[float, bool], None, None]) -> int:
        """Start a process now (SimPy's ``env.process``); returns its number (for ``wake``)."""
        k = len(self._gens)
        self._gens.append(gen)
        self._due.append(-1)
        self._wakeable.append(False)
        self._push(k, self.now)
        return k

    def timeout(self, delay: float, wakeable: bool = False) -> tuple[float, bool]:
        """What a process yields to wait ``delay`` seconds (``wakeable``: or until ``wake``)."""
        return (self.now + delay, wakeable)

    def wake(self, k: int) -> None:
        """Resume process ``k`` now, after what is already due now, if it waits wakeably (as SimPy's
        ``event.succeed()`` does for a process waiting on the event)."""
        if self._wakeable[k]:
            self._wakeable[k] = False
            self._push(k, self.now)

    def wake_at(self, k: int, t: float) -> None:
        """Move process ``k``'s wake to ``t`` (not before now), if it waits wakeably."""
        if self._wakeable[k]:
            self._wakeable[k] = False
            self._push(k, t)

    def _push(self, k: int, t: float) -> None:
        s = self._seq
        self._seq = s + 1
        self._due[k] = s
        heapq.heappush(self._heap, (t, s, k))

    def run(self) -> None:
        heap, due, gens, wakeable = self._heap, self._due, self._gens, self._wakeable
        pop, push = heapq.heappop, heapq.heappush
        inf = float("inf")
        while heap:
            t, s, k = pop(heap)
            if due[k] != s:
                continue  # superseded by a wake
            self.now = t
            due[k] = -1
            try:
                at, wakeable[k] = gens[k].send(None)
            except StopIteration:
                continue
            if at < inf:
                s = self._seq
                self._seq = s + 1
                due[k] = s
                push(heap, (at, s, k))


class ParkingReplica(Replica):
    """A replica that, in a steady decode stretch, parks instead of waking at every step: it publishes what
    its next steps will look like (``sim.serving.fast_path.Timeline``), so that a router reads its state at an arrival
    without running it, and it runs only when the stretch ends (its first finish, a block shortage, the policy's
    deadline, the end of what it priced) or when the router sends it a request (``submit``: it first takes its
    steps up to the arrival, in one call). Between those, no other replica and no router pays for its steps.

    For open-loop traffic without autoscaler, failures or limits, priced by a cost model (``ClusterSimulation``
    checks). Its loop keeps its own clock ``t``: after a park, SimPy's clock only wakes it, at about the right
    time; every time it records is computed as stepping one by one computes it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parked: Timeline | None = None
        # called whenever the loop is about to wait (its state then holds until it runs again, or, parked, is a
        # lower bound of what it will be): BoundedRouter keeps its key of the replica with it
        self.on_yield: Callable[[Replica], None] | None = None
        self._t = 0.0  # the loop's clock while parked
        # what submit left a parked loop: (clock, step in flight) to go on from, or FROM_T (go on from ``_t``)
        self._woken: tuple[float, tuple | None] | None = None
        # the end of the step the loop overshot into: until then an arrival joins the queue that step's row shows
        self._over_until = -1.0
        self._idling = False  # waiting for a request (or the policy's wake time)
        self._poked = False  # and one came
        cal = self.env
        assert isinstance(cal, Calendar), "a parking replica runs on its fleet's Calendar"
        self._cal: Calendar = cal
        self._k: int = cast(int, self.process)  # its process's number on the calendar (Calendar.process)
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
        cal = self._cal
        now = cal.now
        if self.parked is None:
            super().submit(req)
        elif self._t > now:  # parked during the step it overshot into: the request joins the queue at its end
            self.parked = None
            super().submit(req)
            self._woken = FROM_T
            cal.wake_at(self._k, self._t)
        else:  # take the steps up to now first: the request arrives during or after them
            self.parked = None
            t, inflight = self._run(self._t, now)
            super().submit(req)
            core, horizon = self.core, self.horizon
            assert horizon is not None
            if inflight is None and core.overshot and t > now and t != horizon():
                # the loop would only correct the step's row and wait for its end: done here, its wake moved there
                # (not when the next arrival falls at that end: the loop's own wake would come after it)
                core.overshot = False
                self._over_until, self._t, self._woken = t, t, FROM_T
                cal.wake_at(self._k, t)
            else:
                self._woken = (t, inflight)
                cal.wake(self._k)
        if self._over_until > now:  # the row of the step in flight shows the queue at its end
            self.core.steps.set_last_waiting(len(self.core.waiting))

    def poke(self) -> None:
        if self._idling and not self._poked:
            self._poked = True
            self._cal.wake(self._k)

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
        """``Replica._loop`` with parks: a replica with nothing to decide (a steady decode stretch) parks at once,
        wherever its clock is (also inside the step it overshot into, whose row arrivals then correct: ``submit``),
        and costs nothing until its timeline ends or a request comes, which takes its steps up to then in one
        call and, when the replica must then only wait for the step in flight, moves its wake there."""
        cal, core = self.env, self.core  # cal: the fleet's Calendar
        horizon = self.horizon
        assert horizon is not None
        t = cal.now
        report = self.on_yield
        woken: tuple[float, tuple | None] | None = None
        settled = False  # the core is at t with nothing in flight and its last row correct: it may park there
        while True:
            if settled and not self.closed:
                tl = fast_path.timeline(core, t, self._cost)
                if tl is not None and tl.expiry > horizon():
                    self.parked, self._t = tl, t
                    if report is not None:
                        report(self)
                    yield cal.timeout(max(tl.expiry - cal.now, 0.0), True)  # or a request (submit)
                    self.parked = None
                    woken, self._woken = self._woken, None
                    if woken is FROM_T:  # submit took the steps up to its arrival and the step in flight
                        t, woken = self._t, None
                    elif woken is None:  # the stretch ended: its steps up to now (no arrival fell in it)
                        # taken up to the timeline's end, which is now (its finish, its deadline, the end of what
                        # was priced): the replica stands there with nothing in flight and parks again from it.
                        # Running on to just past now took the next step too, in a second fast_forward call at
                        # each such wake (4.5% fewer instructions under callgrind, 16 replicas)
                        seg = fast_path.fast_forward(core, t, nextafter(cal.now, INF), self._cost, overshoot=True,
                                                     overshoot_finish=False)
                        if seg is None:
                            woken = self._run(t, nextafter(cal.now, INF))
                        elif core.overshot:
                            woken = (seg[1], None)
                        elif seg[1] == cal.now:
                            t = seg[1]
                            continue  # still settled: park again
                        else:
                            woken = self._run(seg[1], nextafter(cal.now, INF))
                elif t > cal.now and t >= horizon():  # arrivals may join the queue before it decides at t
                    if report is not None:
                        report(self)
                    yield cal.timeout(t - cal.now)
            settled = False
            if woken is None:
                t, inflight = self._run(t, horizon())
            else:
                (t, inflight), woken = woken, None
            if inflight is not None:
                batch, end, flops = inflight
                if report is not None:
                    report(self)
                if end > cal.now:
                    yield cal.timeout(end - cal.now)
                core.complete(batch, end, flops)
                t = end
                settled = True
                continue
            if core.overshot:  # its row shows the queue now; arrivals until its end correct it (submit)
                core.overshot = False
                core.steps.set_last_waiting(len(core.waiting))
                self._over_until = t
                settled = True
                continue
            if t > cal.now:  # steps taken ahead of the clock, then nothing to schedule: idle from t
                if report is not None:
                    report(self)
                yield cal.timeout(t - cal.now)
                continue
            if self.closed and not core.has_work:
                return
            # idle from t, as Replica._loop idles (it lands on t exactly; this clock is t)
            self._idling, self._poked = True, False
            if report is not None:
                report(self)
            wake = core.wake_time(t) if core.has_work else None
            if wake is not None and wake > t:
                w = t + (wake - t)
                yield cal.timeout(max(w - cal.now, 0.0), True)
                t = cal.now if self._poked else w
            else:
                yield cal.timeout(float("inf"), True)
                t = cal.now
            self._idling = False


class TimelineRouter:
    """``least_kv`` or ``least_outstanding`` by the full scan of ``sim.policies.routers``, reading a parked replica's
    state from its timeline (``ParkingReplica.key``)."""

    def __init__(self, name: str, env: Calendar) -> None:
        self.name = name
        self.env = env

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        now = self.env.now
        if self.name != "least_kv":
            name = self.name
            return min(range(len(replicas)), key=lambda i: (*replicas[i].key(name, now), i))
        # least_kv written out (it runs at every arrival over the fleet): ParkingReplica.key's two cases and
        # Timeline.used_at inline, and no key tuple per replica: the replicas come in index order, so a replica
        # replaces the best only when its (KV pressure, outstanding) is strictly smaller, which is the order of
        # the keys with the index appended (a whole tuple and three calls a replica were a tenth of a 16-replica
        # run)
        best, best_p, best_o = -1, INF, 0
        for i, rep in enumerate(replicas):
            core = rep.core
            kv = core.kv
            tl = rep.parked
            if tl is None:
                p = kv_pressure(core) if core.waiting else kv.num_used_blocks / kv.num_blocks
                if p > best_p:
                    continue
                o = len(core.waiting) + len(core.running) + len(core.swapped)
            else:
                o = tl.o
                k = bisect_left(tl.ends, now, o, o + tl.n + 1) - 1
                p = (kv.num_used_blocks if k < o else tl.used[k - o]) / kv.num_blocks
                if p > best_p:
                    continue
                o = len(core.running)
            if p < best_p or o < best_o:
                best, best_p, best_o = i, p, o
        return best


def replica_figures(result: Any) -> tuple[float, float]:
    """A replica's output throughput and time-weighted mean KV usage, exactly as ``summarize`` computes them
    (the cluster's per-replica lines need only these; a whole summary per replica cost a tenth of the run)."""
    from sim.metrics.summary import _ratio, _time_weighted_mean, kv_usage_per_step

    total_out = int(np.array([r.output_tokens for r in result.requests if r.completed], dtype=np.int64).sum())
    usage, usage_dur, _ = kv_usage_per_step(result, np.asarray(result.steps["duration"], dtype=np.float64))
    return _ratio(total_out, float(result.duration)), _time_weighted_mean(usage, usage_dur)


class BoundedRouter:
    """``least_kv`` or ``least_outstanding`` over parking replicas without scanning the fleet: a heap holding, for
    each replica, a lower bound of its key. A replica's key only falls through its own loop's work (a finish frees
    blocks, an admission trades a queued prompt's blocks for fewer), and the loop reports whenever it is about to
    wait (``ParkingReplica.on_yield``); a parked replica's key only grows until its timeline ends. So the key it
    has when it reports bounds it from below until it reports again, and it replaces the heap's entry only when it
    is below the entry's bound (a key that grew leaves the entry as it was: most reports push nothing). An
    arrival takes entries off the top in order, computing each one's key now and putting it back with that key
    as its bound (tighter), until the next entry's bound exceeds the best key found: the scan's choice, reading
    only the replicas that could be it."""

    def __init__(self, name: str, env: Calendar, replicas: Sequence[Any]) -> None:
        self.name = name
        self.env = env
        self._key = KEYS[name]
        self._kv = name == "least_kv"
        self._stamp = [0] * len(replicas)
        self._bound: list[tuple] = [(float("inf"),)] * len(replicas)  # each replica's live entry's bound
        self._heap: list[tuple] = []
        for rep in replicas:
            self.update(rep)

    def update(self, rep: Any) -> None:
        # called whenever a replica is about to wait (about 3 times a request), and most calls push nothing: the
        # key written out for least_kv, its KV pressure compared with the bound's before any tuple is made
        core = rep.core
        i = rep.index
        bound = self._bound[i]
        if self._kv:
            kv = core.kv
            p = kv_pressure(core) if core.waiting else kv.num_used_blocks / kv.num_blocks
            if p > bound[0]:
                return
            key: tuple = (p, len(core.waiting) + len(core.running) + len(core.swapped))
        else:
            key = self._key(core)
        if key < bound:
            self._push(i, key)

    def _push(self, i: int, key: tuple) -> None:
        s = self._stamp[i] + 1
        self._stamp[i] = s
        self._bound[i] = key
        heap = self._heap
        heapq.heappush(heap, (*key, i, s))
        # stale entries (a replica's earlier bounds) are dropped once they outnumber the live ones: every arrival
        # pops through the heap, and at 8n + 1024 entries (256 replicas: about 1,200 on average) its depth cost
        # more than the rebuilds
        if len(heap) > 2 * len(self._stamp) + 64:
            stamp = self._stamp
            self._heap = [e for e in heap if e[-1] == stamp[e[-2]]]
            heapq.heapify(self._heap)

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        heap, stamp = self._heap, self._stamp
        if len(replicas) != len(stamp):
            raise AssertionError("a bounded router routes over the whole fleet")
        now, name, kv_only = self.env.now, self.name, self._kv
        bound, replace = self._bound, heapq.heapreplace
        best: tuple | None = None
        while heap:
            top = heap[0]
            i = top[-2]
            s = stamp[i]
            if top[-1] != s:
                heapq.heappop(heap)
                continue
            if best is not None and top[:-1] >= best:
                # (an entry equal to the best is the best's own, put back below with its key: every other
                # entry's index differs)
                break
            rep = replicas[i]
            tl = rep.parked
            if tl is not None and kv_only:  # ParkingReplica.key's parked least_kv case, inline
                core = rep.core
                kv = core.kv
                o = tl.o
                k = bisect_left(tl.ends, now, o, o + tl.n + 1) - 1
                key = ((kv.num_used_blocks if k < o else tl.used[k - o]) / kv.num_blocks, len(core.running))
            else:
                key = rep.key(name, now)
            # its entry replaced in place by one with its key now (not below the bound it held: it sinks), in one
            # sift instead of a pop now and a push after the search
            stamp[i] = s + 1
            bound[i] = key
            replace(heap, (*key, i, s + 1))
            exact = (*key, i)
            if best is None or exact < best:
                best = exact
        assert best is not None
        return best[-1]
