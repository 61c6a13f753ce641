"""Fair sharing between tenants with the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024, Algorithm 2).

Each tenant has a counter of the service it has received, in weighted tokens: ``input_weight`` per prompt token
(the paper's w_p, charged when the request is admitted) plus ``output_weight`` per generated token (w_q, charged as
the tokens come out). The waiting request served next is the earliest one of the tenant with the smallest counter,
and after each admission that tenant's counter grows by its prompt, so one step's admissions alternate between
tenants as the paper's loop does. A tenant that becomes backlogged (a request of it waits where none did) has its
counter lifted to the smallest counter of the tenants already waiting, or, if none waits, to the counter of the
last tenant that left the queue: time spent idle earns no credit, so a tenant cannot save service up and then
starve the others.

With ``tenant_weights`` (the paper's weighted VTC) a tenant's counter grows by its weighted tokens divided by its
weight, so backlogged tenants receive service in proportion to their weights (tenants not named weigh 1).

The paper bounds the gap this leaves: for any two tenants backlogged throughout an interval, the weighted service
they receive in it differs by at most 2U, U = max(w_p * L_input, w_q * M), with L_input the longest prompt and M
the most tokens a running batch holds (its Theorem 4.4; ``tests/test_fair_schedulers.py`` checks it after every
step). Requests without a tenant share the tenant "". Running requests are preempted (when KV runs out) from the
tenant with the largest counter, latest arrival first.

The counters are read from the requests themselves when the policy is asked (output tokens so far), so the core may
take decode stretches without asking (``depends_on``): the waiting order matters only when a request can be
admitted, which takes an arrival, a finish or a shortage of blocks, when the core always asks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from itertools import filterfalse
from typing import Any

from sim.policies.api import Plan, PolicyView, RequestView
from sim.policies.queue import QueuePolicy


def tenant_weights_problem(weights: Mapping[str, float], requests: Iterable[Any],
                           declared: Iterable[str] = ()) -> str | None:
    """Why ``tenant_weights`` does not fit the workload, or None: a tenant it names that neither a class declares
    nor a request has (a typo of one that is there) would leave every tenant at weight 1, and the run would say
    nothing. A declared tenant that a small draw happened to miss is fine; a tenant not named weighs 1."""
    if not weights:
        return None
    tenants = {r.tenant for r in requests} | set(declared)
    missing = sorted(set(weights) - tenants)
    if not missing:
        return None
    have = ", ".join(repr(t) for t in sorted(tenants - {""})) or "none: give a class a tenant:, or a trace a " \
        "tenant column"
    return f"policy.tenant_weights: no request has the tenant {missing[0]!r} (the workload's tenants: {have})"


class VirtualTokenCounter(QueuePolicy):
    """VTC fair queuing over tenants (module docstring); ``input_weight`` and ``output_weight`` are w_p and w_q,
    ``tenant_weights`` each tenant's share (default 1)."""

    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute",
                 input_weight: float = 1.0, output_weight: float = 2.0,
                 tenant_weights: dict[str, float] | None = None) -> None:
        super().__init__(enable_chunked_prefill, preemption_mode)
        for name, w in (("input_weight", input_weight), ("output_weight", output_weight)):
            if isinstance(w, bool) or not isinstance(w, int | float) or not (math.isfinite(w) and w >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (service per token), got {w!r}")
        if input_weight == output_weight == 0:
            raise ValueError("input_weight and output_weight are both 0: no service would ever be counted")
        self.input_weight, self.output_weight = float(input_weight), float(output_weight)
        self.tenant_weights: dict[str, float] = {}
        for t, w in (tenant_weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not (math.isfinite(w) and w > 0):
                raise ValueError(f"tenant_weights[{t!r}] must be a finite number > 0 (its share), got {w!r}")
            self.tenant_weights[str(t)] = float(w)
        self.counters: dict[str, float] = {}  # tenant -> weighted tokens received (lifted as the paper says)
        self._charged: set[int] = set()  # requests whose prompt was charged (a recomputed prompt is not again)
        self._tracked: dict[int, tuple[RequestView, int]] = {}  # admitted, unfinished: (view, outputs charged)
        self._backlogged: set[str] = set()  # tenants with a waiting request after the last plan
        self._last_left = 0.0  # counter of the last tenant that stopped waiting
        # The waiting queue, kept from step to step (a step changes it by a few arrivals, admissions and rejections;
        # rebuilding it and ordering all of it at every ask made VTC linear in the queue per step: 20 s of CPU for
        # one run of tests/test_fair_schedulers.py), and VTC's admission loop over it, run only as far as read.
        self._tenant_of: dict[RequestView, str] = {}  # each waiting request's tenant
        self._ids: dict[int, RequestView] = {}  # waiting request id -> its view
        self._queues: dict[str, list[RequestView]] = {}  # tenant -> its waiting requests in the core's order
        self._last: tuple[RequestView, ...] = ()  # the waiting queue the last plan left: the next ask's, but for
        # requests put in front of it (preempted by recompute) or after it (arrivals)
        self._loop: dict[str, list[RequestView]] = {}  # the queues this step's loop reads (a plan's removals
        # replace a queue's list, so the loop can still run to its end for rank())
        self._heap: list[tuple[float, int, float, int, str]] = []  # the loop's tenants: (counter, turn, head)
        self._taken: list[RequestView] = []  # the requests the loop took this step, in order
        self._order: dict[int, int] = {}  # request id -> its place in ``_taken``

    def check_tenants(self, requests: Iterable[Any], declared: Iterable[str] = ()) -> str | None:
        """Why this policy's ``tenant_weights`` do not fit the workload, or None (:func:`tenant_weights_problem`)."""
        return tenant_weights_problem(self.tenant_weights, requests, declared)

    def describe(self) -> str:
        return f"VirtualTokenCounter(w_p={self.input_weight:g}, w_q={self.output_weight:g})"

    def rank(self, req: RequestView) -> tuple[float, float, int]:
        pos = self._order.get(req.id)
        if pos is None and req.id in self._ids:  # a waiting request the admission loop has not reached yet
            while self._take():
                pass
            pos = self._order.get(req.id)
        if pos is not None:
            return (float(pos), 0.0, req.id)
        # a running request as a preemption victim: the most served tenant's latest request goes first
        return (self.counters.get(req.tenant, 0.0), req.arrival, req.id)

    def schedule(self, view: PolicyView) -> Plan:
        self._charge_outputs()
        self._sync(view.waiting)
        self._lift()
        self._start()
        plan = super().schedule(view)
        for r, _ in plan.scheduled:
            if r.id not in self._charged:
                self._charged.add(r.id)
                self.counters[r.tenant] = self.counters.get(r.tenant, 0.0) + self._cost(r.tenant, r.prompt_len, 0)
                self._tracked[r.id] = (r, r.num_output_tokens)
        before = set(self._queues)
        self._remove({r.id for r, _ in plan.scheduled} | {r.id for r, _ in plan.rejected}, view.waiting)
        still = set(self._queues)
        left = sorted(before - still)
        if left:
            self._last_left = max(self.counters.get(t, 0.0) for t in left)
        self._backlogged = still
        return plan

    def _in_order(self, view: PolicyView, waiting: tuple[RequestView, ...]) -> Iterable[RequestView]:
        """The waiting requests in VTC's order, taken from its admission loop as the admissions read them."""
        if type(self).rank is not VirtualTokenCounter.rank:  # a subclass's own order
            return super()._in_order(view, waiting)
        queue = self._in_vtc_order()
        if waiting is not view.waiting:  # refuse() took some out: the others keep their places (they are sorted)
            kept = set(waiting)
            queue = (r for r in queue if r in kept)
        return queue

    def _cost(self, tenant: str, prompt: int, outputs: int) -> float:
        """What ``prompt`` tokens and ``outputs`` generated tokens add to ``tenant``'s counter: the weighted tokens
        over its share (1 unless ``tenant_weights`` names it)."""
        return (self.input_weight * prompt + self.output_weight * outputs) / self.tenant_weights.get(tenant, 1.0)

    def _charge_outputs(self) -> None:
        """Add the tokens generated since the last call (the views read their requests' current state)."""
        done = []
        for rid, (r, seen) in self._tracked.items():
            n = r.num_output_tokens
            if n != seen:
                self.counters[r.tenant] += self._cost(r.tenant, 0, n - seen)
                self._tracked[rid] = (r, n)
            if r.status == "finished":
                done.append(rid)
        for rid in done:
            del self._tracked[rid]

    def _sync(self, waiting: tuple[RequestView, ...]) -> None:
        """Bring the per-tenant queues up to ``waiting``, each tenant's in ``waiting``'s order (the core's: requests
        preempted by recompute first, then by arrival). The usual ask finds the queue the last plan left with
        requests before it (preempted) and after it (arrivals): one comparison in C, and the tenants of the new
        requests read. Anything else (a request the core took out, a queue reordered) goes the general way."""
        last = self._last
        n = len(last)
        k = waiting.index(last[0]) if n and last[0] in waiting else 0
        if waiting[k:k + n] != last:
            self._resync(waiting)
            return
        queues, tenant_of, ids = self._queues, self._tenant_of, self._ids
        front: dict[str, list[RequestView]] = {}
        for v in waiting[:k]:
            t = tenant_of[v] = v.tenant
            ids[v.id] = v
            front.setdefault(t, []).append(v)
        for t, f in front.items():
            queues[t] = f + queues.get(t, [])
        for v in waiting[k + n:]:
            t = tenant_of[v] = v.tenant
            ids[v.id] = v
            queues.setdefault(t, []).append(v)
        self._last = waiting

    def _resync(self, waiting: tuple[RequestView, ...]) -> None:
        """:meth:`_sync` for any change: drop the requests that left, add the new ones, and sort each tenant's
        queue by ``waiting``'s order. The index, the set differences and the sorts of nearly sorted lists run in
        C; the Python work is per request that came or went."""
        tenant_of, ids, queues = self._tenant_of, self._ids, self._queues
        index = dict(zip(waiting, range(len(waiting)), strict=True))
        changed: set[str] = set()
        for v in tenant_of.keys() - index.keys():
            changed.add(tenant_of.pop(v))
            del ids[v.id]
        for v in index.keys() - tenant_of.keys():
            t = tenant_of[v] = v.tenant
            ids[v.id] = v
            queues.setdefault(t, []).append(v)
        for t in changed:
            queues[t] = list(filter(index.__contains__, queues[t]))
        for t in [t for t, q in queues.items() if not q]:
            del queues[t]
        for q in queues.values():
            q.sort(key=index.__getitem__)
        self._last = waiting

    def _remove(self, gone: set[int], waiting: tuple[RequestView, ...]) -> None:
        """Take the requests of ``gone`` (ids: admitted or rejected by the plan) out of the queues of ``waiting``,
        which leaves the queue the next ask expects. Each changed queue gets a new list (the loop keeps the old)."""
        views = {self._ids.pop(i) for i in gone if i in self._ids}
        if not views:
            return
        queues = self._queues
        for t in {self._tenant_of.pop(v) for v in views}:
            q = list(filterfalse(views.__contains__, queues[t]))
            if q:
                queues[t] = q
            else:
                del queues[t]
        self._last = tuple(filterfalse(views.__contains__, waiting))

    def _lift(self) -> None:
        """Lift the counter of each tenant that became backlogged since the last plan, in order of arrival (of its
        first waiting request)."""
        queues = self._queues
        first = {t: q[0].arrival for t, q in queues.items() if t not in self._backlogged}
        waiting = {t for t in self._backlogged if t in queues}
        for t in sorted(first, key=lambda t: (first[t], t)):
            floor = min(self.counters.get(u, 0.0) for u in waiting) if waiting else self._last_left
            self.counters[t] = max(self.counters.get(t, 0.0), floor)
            waiting.add(t)

    def _start(self) -> None:
        """Set up this step's VTC admission loop: each tenant's turn comes by its counter (ties: its earlier turns
        in this step, then the arrival and id of its head)."""
        self._taken, self._order, self._loop = [], {}, dict(self._queues)
        self._heap = [(self.counters.get(t, 0.0), 0, q[0].arrival, q[0].id, t) for t, q in self._queues.items()]
        heapq.heapify(self._heap)

    def _take(self) -> bool:
        """One turn of the loop: the earliest request of the tenant with the smallest counter, that counter then
        raised by the prompt (not again for a prompt already charged); False when every request was taken."""
        if not self._heap:
            return False
        c, i, _, _, t = heapq.heappop(self._heap)
        q = self._loop[t]
        r = q[i]
        self._order[r.id] = len(self._taken)
        self._taken.append(r)
        if r.id not in self._charged:
            c += self._cost(t, r.prompt_len, 0)
        if i + 1 < len(q):
            nxt = q[i + 1]
            heapq.heappush(self._heap, (c, i + 1, nxt.arrival, nxt.id, t))
        return True

    def _in_vtc_order(self) -> Iterator[RequestView]:
        """The waiting requests in the loop's order, each turn run when the caller reads that far."""
        taken, k = self._taken, 0
        while k < len(taken) or self._take():
            yield taken[k]
            k += 1
