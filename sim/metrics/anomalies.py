"""Scheduling anomalies and service over time, from a run's request records (summary.json's ``anomalies``).

Each detector has a stated definition, and ``sim.policies.pathological`` holds policies built to trip it:

- **Inversions** (after BLIS's priority-inversion counter): a pair of requests (a, b) started by the same replica
  (the scheduler's decisions; which replica a request waits at is the router's) where a should have gone first,
  because it arrived no later and has no lower priority (a lower value, vLLM's convention, is more important; at
  least one of the two strictly better), yet a was first scheduled more than ``tolerance`` seconds after b.
  ``by_priority`` counts the pairs where a had the strictly higher priority, ``by_arrival`` those of equal
  priority. The time compared is the first scheduling (the scheduler's decision), not the first token: under
  chunked prefill a short prompt's first token overtakes a long one's that started earlier, which no scheduler
  causes. FCFS and vLLM's priority order have none by construction; SJF, LPM and VTC have them by design (a fair
  or cache-aware order is not arrival order), so the count says how far a policy departs from that order.
- **Head-of-line blocking per replica** (as BLIS's cluster detector): a replica whose mean number of waiting
  requests (Little's law: the sum of its requests' waits over the run's duration) is more than ``HOL_FACTOR``
  times the fleet's mean, and at least one request: arrivals pile up behind its queue's head while others serve.
  Only with two replicas or more.
- **Starvation**: the longest wait of any request for its first scheduling (to its end for one never scheduled),
  overall and per class (``slo_class``; ``(no class)`` for requests without one), with the request's id.
- **Service over time per tenant**: output tokens each tenant has received at ``SERVICE_POINTS`` evenly spaced
  times, a request's tokens spread evenly from its first token to its finish (the report charts it); the
  tenants' Jain's index is ``fairness`` beside it (``sim.metrics.summary.tenant_fairness``).

The section is written only when it has something to say (requests with classes, or an inversion or a blocked
replica found), so a classless run's summary.json is what it was before the detectors existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import numpy as np

from sim.metrics.records import NO_CLASS, RequestRecord, has_classes
from sim.metrics.request_table import RequestTable, as_table

INVERSION_TOLERANCE = 0.01  # seconds: first schedulings closer than this are not counted as out of order
HOL_FACTOR = 2.0  # a replica's mean queue over the fleet's mean above which it counts as head-of-line blocked
SERVICE_POINTS = 21  # times at which each tenant's service is sampled (every 5% of the run)


def _start(r: RequestRecord) -> float:
    return r.first_scheduled


def _wait(r: RequestRecord) -> float:
    """Seconds it waited for its first scheduling (to its end if it never ran)."""
    return (r.first_scheduled if r.first_scheduled >= 0 else r.finish) - r.arrival


class _Fenwick:
    __slots__ = ("tree",)

    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int) -> None:  # position i (0-based) gains one
        i += 1
        t = self.tree
        while i < len(t):
            t[i] += 1
            i += i & -i

    def prefix(self, k: int) -> int:  # how many at positions < k
        t, s = self.tree, 0
        while k > 0:
            s += t[k]
            k -= k & -k
        return s


def inversions(reqs: Sequence[RequestRecord], tolerance: float = INVERSION_TOLERANCE) -> dict:
    """The inversion counts of the module docstring, over the pairs each replica served, in O(n log n) per
    priority level."""
    out: dict = {"count": 0, "by_priority": 0, "by_arrival": 0, "tolerance": tolerance}
    if _in_priority_order(as_table(reqs)):  # FCFS: no pair can be inverted (what _count finds, from the columns)
        return out
    replicas: dict[int, list[RequestRecord]] = {}
    for r in reqs:
        if r.first_scheduled >= 0:
            replicas.setdefault(r.replica, []).append(r)
    worst: tuple[float, int, int] | None = None
    for i in sorted(replicas):
        started = sorted(replicas[i], key=lambda r: (r.arrival, r.id))
        by_priority, by_arrival = _count(started, tolerance)
        out["by_priority"] += by_priority
        out["by_arrival"] += by_arrival
        w = _worst_pair(started, tolerance) if by_priority + by_arrival else None
        if w is not None and (worst is None or w[0] > worst[0]):
            worst = w
    out["count"] = out["by_priority"] + out["by_arrival"]
    if worst is not None:
        out["worst"] = {"request": worst[1], "overtaken_by": worst[2], "late_by": worst[0]}
    return out


def _in_priority_order(table: RequestTable) -> bool:
    """Whether every replica first scheduled its requests in the order of their arrival, then priority (then id):
    then no pair is inverted. Arrival then id would not do: of two requests that arrive at once, the one with
    the higher priority (lower value) may be scheduled later, an inversion, though in id order."""
    sched = table.column("first_scheduled")
    keep = sched >= 0
    if table.one_value("replica") and table.one_value("priority") and table.in_id_order():
        # one replica, one priority: the order below is arrival then id, the table's own order when the arrivals
        # never decrease in it (a generated workload's), so no sort and its five arrays a request are needed
        sched, arrival = sched[keep], table.column("arrival")[keep]
        if bool(np.all(arrival[1:] >= arrival[:-1])):
            return bool(np.all(sched[1:] >= sched[:-1]))
        sched = table.column("first_scheduled")
    replica, sched = table.column("replica")[keep], sched[keep]
    order = np.lexsort((table.column("id")[keep], table.column("priority")[keep], table.column("arrival")[keep],
                        replica))
    replica, sched = replica[order], sched[order]
    same = replica[1:] == replica[:-1]  # consecutive pairs within one replica
    return bool(np.all(sched[1:][same] >= sched[:-1][same]))


def _count(started: list[RequestRecord], tolerance: float) -> tuple[int, int]:
    """(by_priority, by_arrival) among ``started``, sorted by arrival then id."""
    order = np.array([_start(r) for r in started], dtype=np.float64)
    # scheduled in arrival, then priority order (FCFS): no pair can be inverted (the count below is O(n log n));
    # arrival then id is not enough: requests that arrive at once are inverted by priority (_in_priority_order)
    by_rank = np.array([_start(r) for r in sorted(started, key=lambda r: (r.arrival, r.priority, r.id))])
    if np.all(by_rank[1:] >= by_rank[:-1]):
        return 0, 0
    levels = sorted({r.priority for r in started})
    values = np.sort(order)
    trees = {p: _Fenwick(len(values)) for p in levels}
    counts = dict.fromkeys(levels, 0)
    by_priority = by_arrival = 0
    for _, group_iter in groupby(started, key=lambda r: r.arrival):
        group = list(group_iter)
        for b in group:
            k = int(np.searchsorted(values, _start(b) + tolerance, side="right"))
            for p in levels:
                if p > b.priority:
                    break
                n = counts[p] - trees[p].prefix(k)  # earlier arrivals of priority p scheduled after b + tolerance
                if p < b.priority:
                    by_priority += n
                else:
                    by_arrival += n
            for a in group:  # the same arrival time: only a strictly higher priority puts a first
                if a.priority < b.priority and _start(a) > _start(b) + tolerance:
                    by_priority += 1
        for a in group:
            i = int(np.searchsorted(values, _start(a), side="left"))
            trees[a.priority].add(i)
            counts[a.priority] += 1
    return by_priority, by_arrival


def _worst_pair(started: list[RequestRecord], tolerance: float) -> tuple[float, int, int] | None:
    """The inverted pair with the largest gap between the two schedulings, b's scheduling minus a's being most
    negative: for each b, the latest-scheduled request that should have gone before it (a running maximum per
    priority level over earlier arrivals)."""
    best: tuple[float, int, int] | None = None
    latest: dict[int, RequestRecord] = {}  # per priority: the latest-scheduled request of an earlier arrival
    for _, group_iter in groupby(started, key=lambda r: r.arrival):
        group = list(group_iter)
        for b in group:
            cands = [a for p, a in latest.items() if p <= b.priority]
            cands += [a for a in group if a.priority < b.priority]
            for a in cands:
                late = _start(a) - _start(b)
                if late > tolerance and (best is None or late > best[0]):
                    best = (late, a.id, b.id)
        for a in group:
            cur = latest.get(a.priority)
            if cur is None or _start(a) > _start(cur):
                latest[a.priority] = a
    return best


def head_of_line(reqs: Sequence[RequestRecord], duration: float, replicas: Sequence[int]) -> dict | None:
    """Each of ``replicas``' mean queue (Little's law) and maximum wait, and the replicas blocked by the
    definition of the module docstring; None with fewer than two replicas."""
    if len(replicas) < 2 or duration <= 0:
        return None
    waits: dict[int, list[float]] = {i: [] for i in replicas}
    for r in reqs:
        waits.setdefault(r.replica, []).append(_wait(r))
    per = [{"replica": i, "requests": len(w), "mean_waiting": sum(w) / duration, "max_wait": max(w, default=0.0)}
           for i, w in sorted(waits.items())]
    fleet = sum(p["mean_waiting"] for p in per) / len(per)
    blocked = [p["replica"] for p in per if p["mean_waiting"] >= 1 and p["mean_waiting"] > HOL_FACTOR * fleet]
    return {"blocked_replicas": blocked, "factor": HOL_FACTOR, "per_replica": per}


def starvation(reqs: Sequence[RequestRecord]) -> dict | None:
    """The longest wait for a first scheduling, overall and per class (module docstring)."""
    if not reqs:
        return None
    per: dict[str, dict] = {}
    for r in sorted(reqs, key=lambda r: r.id):
        name = r.slo_class or NO_CLASS
        w = _wait(r)
        if name not in per or w > per[name]["longest_wait"]:
            per[name] = {"longest_wait": w, "request": r.id}
    top = max(per, key=lambda n: (per[n]["longest_wait"], n))
    return {"longest_wait": per[top]["longest_wait"], "request": per[top]["request"], "class": top,
            "per_class": {n: per[n] for n in sorted(per)}}


def service_over_time(reqs: Sequence[RequestRecord], duration: float, points: int = SERVICE_POINTS) -> dict | None:
    """Output tokens received per tenant at ``points`` evenly spaced times from 0 to the last finish, each request's
    tokens spread evenly from its first token to its finish; None without tenants."""
    tenants = sorted({r.tenant for r in reqs if r.tenant})
    if not tenants or duration <= 0:
        return None
    end = max(duration, max(r.finish for r in reqs))  # the run's duration may start at the first arrival
    t = np.linspace(0.0, end, points)
    out = {}
    for name in tenants:
        got = np.zeros(points)
        for r in reqs:
            if r.tenant != name or r.first_token < 0 or r.output_tokens <= 0:
                continue
            span = r.finish - r.first_token
            share = np.clip((t - r.first_token) / span, 0, 1) if span > 0 else (t >= r.first_token).astype(float)
            got += r.output_tokens * share
        out[name] = [round(float(x), 1) for x in got]
    return {"t": [float(x) for x in t], "output_tokens": out}


def anomalies(reqs: Sequence[RequestRecord], duration: float, replicas: Sequence[int]) -> dict | None:
    """The ``anomalies`` section of a run's summary, or None when it would say nothing (module docstring);
    ``replicas`` are the indices of every replica the run had (one that got no request counts too)."""
    inv = inversions(reqs)
    hol = head_of_line(reqs, duration, replicas)
    classes = has_classes(reqs)
    if not (classes or inv["count"] or (hol is not None and hol["blocked_replicas"])):
        return None
    out: dict = {"inversions": inv}
    if hol is not None:
        out["head_of_line"] = hol
    out["starvation"] = starvation(reqs)
    svc = service_over_time(reqs, duration)
    if svc is not None:
        out["service_over_time"] = svc
    return out
