"""Decision traces and counterfactual routing regret (``servesim run --trace decisions``).

A trace records, as the run goes, every decision the serving stack takes with the candidates it had and why:

- ``admission``: an arrival accepted or refused by the core's admission check, or a waiting request the policy
  rejected (its reason);
- ``schedule``: a step the policy planned while requests waited: those it admitted and those it left waiting,
  with the reason inferred from the plan (token budget spent, ``max_num_seqs`` reached, free KV blocks short,
  else the policy's own order);
- ``preemption``: a running request the policy preempted, by recompute or swap;
- ``route``: the replica a router chose, each candidate's load as the router saw it, and the router's rule.

Rows are JSON lines written as they come (``decisions.jsonl``), up to ``max_rows`` (the counts in the summary
cover every decision, written or not), so a long run stays bounded. Tracing wraps the policy, its admission check
and the router; it needs the core's step-by-step path (the decode fast path takes steps without asking the
policy), so a traced run is slower than an untraced one (measured, one replica, 2,000 requests: 0.15 s of CPU
with the fast path, 0.95 s step by step, 0.99 s traced).

Routing regret is counterfactual: for decision i, the run is simulated again with request i sent to each of the
top-k alternatives (ranked by the estimate below) and every other routing decision replayed as it was taken.
Regret is the run's total E2E latency (all completed requests) under the chosen replica minus the best
alternative's, clipped at 0. The total, not the routed request's own E2E: a choice that serves its request well
but queues the requests behind it is a bad one, and a single shared objective makes a router with zero regret
exist (``best_response_routes`` finds one by coordinate descent, which then ends because every change lowers the
total). The routed request's own E2E difference is recorded beside it. A simulation cannot be copied at a
dispatch (its SimPy processes are generators, which ``copy.deepcopy`` refuses), so each counterfactual re-runs
from the start: n decisions x k alternatives runs, quadratic in the run's length, hence ``REGRET_MAX_REQUESTS``.
Past it, only the cheap estimate is given: the prefill tokens queued ahead of the request on the chosen replica
minus on the best alternative (waiting prompts and running prefills not yet computed, the request's own prompt
less what that replica has cached), clipped at 0; its agreement with re-simulation is reported where both ran.
It is a weak predictor: on 200 requests over 3 replicas (12 requests/s, round robin and least_outstanding) it
agreed with re-simulation on 43% and 45% of decisions where 57% had regret, since at that load queues drain
between arrivals and regret comes from decode steps shared with a prefill (fewest outstanding or lowest KV
pressure did no better: 44% to 65%).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from sim.policies.base import Plan, View
from sim.policies.routers import Router, kv_pressure, outstanding
from sim.serving.kv_manager import cdiv
from sim.serving.request import Outcome, Request

DECISIONS_FILE = "decisions.jsonl"  # in the run folder, with --trace decisions
DEFAULT_MAX_ROWS = 200_000  # rows written per run folder; decisions past it are counted, not written
# routed requests up to which regret is re-simulated: n x k + 1 runs of n requests (measured: 200 requests on 3
# replicas with k=2, 401 runs, about 60 s of CPU per variant)
REGRET_MAX_REQUESTS = 200
DEFAULT_TOP_K = 2  # alternatives re-simulated per routing decision
NOT_ADMITTED_LISTED = 8  # waiting request ids listed per schedule row (the count is always given)
WORST_LISTED = 5  # worst decisions named in the summary


def pending_prefill(core: Any) -> int:
    """Prompt tokens queued on a replica and not yet computed: its waiting requests' and its running prefills'."""
    n = 0
    for r in core.waiting:
        n += max(r.prompt_len - r.num_computed_tokens, 0)
    for r in core.running:
        n += max(r.prompt_len - r.num_computed_tokens, 0)
    return n


def route_estimate(req: Request, core: Any) -> int:
    """The cheap estimate of how long ``req`` would wait on a replica, in prefill tokens ahead of its first token
    there: the queued prefill plus its own prompt less what the replica's prefix cache holds of it."""
    cached = 0 if core.kv.holds(req) else core.kv.num_cached_tokens(req)
    return pending_prefill(core) + max(req.prompt_len - cached, 0)


# what each built-in router's rule is, for the route rows' reason
ROUTER_RULES = {
    "round_robin": "in turn",
    "least_outstanding": "fewest requests outstanding",
    "least_kv": "lowest KV pressure",
    "prefix_affinity": "most of the prompt cached",
}


@dataclass(slots=True)
class RouteDecision:
    """One routing decision, kept for the regret pass (a few numbers per request)."""

    index: int  # dispatch order: the position the replay router answers for
    request: int
    time: float
    chosen: int
    estimates: tuple[int, ...]  # route_estimate per candidate position

    def alternatives(self, k: int) -> list[int]:
        """The top-k other candidates, lowest estimate first (ties by position)."""
        order = sorted(range(len(self.estimates)), key=lambda i: (self.estimates[i], i))
        return [i for i in order if i != self.chosen][:k]


@dataclass(slots=True)
class DecisionTrace:
    """Where a run's decisions go: JSON lines into ``sink`` (or kept in ``rows`` without one), at most
    ``max_rows`` of them; every decision counted by kind and reason."""

    sink: IO[str] | None = None
    max_rows: int = DEFAULT_MAX_ROWS
    variant: str = ""
    rows: list[dict] = field(default_factory=list)
    rows_written: int = 0  # by every run so far: the cap is the file's
    rows_before: int = 0  # rows_written when this run began (its own rows are the difference)
    counts: Counter = field(default_factory=Counter)
    reasons: dict[str, Counter] = field(default_factory=dict)
    routes: list[RouteDecision] = field(default_factory=list)
    k: int = DEFAULT_TOP_K  # alternatives re-simulated per routing decision
    regret_rows: list[dict] | None = None  # the last run's re-simulated regret, where it was computed

    def begin(self, variant: str) -> None:
        """A new run: the counts and routes start again (the rows written so far stay)."""
        self.variant = variant
        self.rows_before = self.rows_written
        self.counts = Counter()
        self.reasons = {}
        self.routes = []
        self.regret_rows = None

    def write(self, kind: str, row: dict) -> None:
        """A row that is not a decision (a decision's regret), under the same cap, not counted."""
        if self.rows_written >= self.max_rows:
            return
        self.rows_written += 1
        full = {"variant": self.variant, "kind": kind, **row}
        if self.sink is None:
            self.rows.append(full)
        else:
            self.sink.write(json.dumps(full, allow_nan=False) + "\n")

    def record(self, kind: str, reason: str, row: dict) -> None:
        self.counts[kind] += 1
        self.reasons.setdefault(kind, Counter())[reason] += 1
        self.write(kind, {"reason": reason, **row})

    # ---- the hooks -----------------------------------------------------------------------------------------
    def on_arrival(self, replica: int, req: Request, now: float, why: str | None, waiting: int) -> None:
        self.record("admission", why or "accepted", {"t": now, "replica": replica, "request": req.id,
                                                      "admitted": why is None, "waiting": waiting})

    def on_plan(self, replica: int, view: View, waiting: list[Request], plan: Plan) -> None:
        now = view.now
        for r, why in plan.reject:
            self.record("admission", why, {"t": now, "replica": replica, "request": r.id, "admitted": False,
                                           "waiting": len(waiting)})
        for r, mode in plan.preempt:
            self.record("preemption", mode, {"t": now, "replica": replica, "request": r.id, "mode": mode,
                                             "computed": r.num_computed_tokens, "running": len(view.running)})
        if not waiting and not plan.swap_in:
            return  # nothing to choose from: a step of the running requests only
        planned = {r.id for r, _ in plan.scheduled}
        refused = {r.id for r, _ in plan.reject}
        admitted = [r.id for r in waiting if r.id in planned]
        left = [r for r in waiting if r.id not in planned and r.id not in refused]
        reason = "all admitted" if not left else _held_reason(view, plan, left[0])
        self.record("schedule", reason, {
            "t": now, "replica": replica, "admitted": admitted, "swapped_in": [r.id for r in plan.swap_in],
            "num_not_admitted": len(left), "not_admitted": [r.id for r in left[:NOT_ADMITTED_LISTED]],
            "batch": len(plan.scheduled), "tokens": sum(n for _, n in plan.scheduled),
        })

    def on_route(self, router: str, req: Request, now: float, replicas: Sequence[Any], chosen: int) -> None:
        est = tuple(route_estimate(req, rep.core) for rep in replicas)
        self.routes.append(RouteDecision(len(self.routes), req.id, now, chosen, est))
        cands = [{"replica": rep.index, "waiting": len(rep.core.waiting), "running": len(rep.core.running),
                  "outstanding": outstanding(rep.core), "kv_pressure": round(kv_pressure(rep.core), 6),
                  "est_tokens": e} for rep, e in zip(replicas, est, strict=True)]
        self.record("route", f"{router}: {ROUTER_RULES.get(router, 'its own rule')}",
                    {"t": now, "request": req.id, "chosen": replicas[chosen].index, "candidates": cands})


def _held_reason(view: View, plan: Plan, head: Request) -> str:
    """Why the first waiting request left out was not admitted, as far as the plan shows it."""
    limits = view.limits
    tokens = sum(n for _, n in plan.scheduled)
    if tokens >= limits.max_num_batched_tokens:
        return "token budget spent (max_num_batched_tokens)"
    if len(plan.scheduled) >= limits.max_num_seqs:
        return "max_num_seqs reached"
    if plan.preempt or cdiv(max(head.num_remaining, 1), view.kv.block_size) > view.kv.num_free_blocks:
        return "free KV blocks short"
    return "the policy's order"


class TracingPolicy:
    """A core's policy with each plan reported to a trace; every other member is the policy's own."""

    def __init__(self, inner: Any, core: Any, trace: DecisionTrace) -> None:
        self.inner, self.core, self.trace = inner, core, trace

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def schedule(self, view: View) -> Plan:
        waiting = list(view.waiting)  # a copy per step: part of what tracing costs
        plan = self.inner.schedule(view)
        self.trace.on_plan(self.core.replica, view, waiting, plan)
        return plan

    def wake_time(self, view: View) -> float | None:
        return self.inner.wake_time(view)


class TracingAdmission:
    """A core's admission check (or none: then everyone is accepted) with each arrival reported to a trace."""

    def __init__(self, inner: Any, core: Any, trace: DecisionTrace) -> None:
        self.inner, self.core, self.trace = inner, core, trace

    def on_arrival(self, req: Request, view: View) -> str | None:
        why = self.inner.on_arrival(req, view) if self.inner is not None else None
        self.trace.on_arrival(self.core.replica, req, view.now, why, len(view.waiting))
        return why

    def deadline(self, waiting: Any) -> float | None:
        return self.inner.deadline(waiting) if self.inner is not None else None

    def rejections(self, view: View) -> list[tuple[Request, str]]:
        return self.inner.rejections(view) if self.inner is not None else []


class TracingRouter:
    """A router whose every answer is reported to a trace."""

    def __init__(self, inner: Router, name: str, trace: DecisionTrace, now: Callable[[], float]) -> None:
        self.inner, self.name, self.trace, self.now = inner, name, trace, now

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        i = self.inner(req, replicas)
        self.trace.on_route(self.name, req, self.now(), replicas, i)
        return i


def trace_core(core: Any, trace: DecisionTrace) -> None:
    """Report a core's plans and arrivals to ``trace`` (the core must step without its fast path: it would take
    decode steps without asking the policy, which no trace needs, but also plan decode groups the trace cannot
    see member by member)."""
    core.policy = TracingPolicy(core.policy, core, trace)
    # the core took the policy's quick plan for a lone arrival when it was built: a plan from there would pass by
    # the wrapper, so every plan now comes from ``schedule``, which the trace sees
    core.schedule_arrival = None
    core.admission = TracingAdmission(core.admission, core, trace)


def trace_simulation(sim: Any, trace: DecisionTrace, router_name: str) -> None:
    """Report every replica's decisions and, with more than one replica, the router's to ``trace``."""
    for rep in sim.replicas:
        trace_core(rep.core, trace)
    sim.router = TracingRouter(sim.router, router_name, trace, lambda: sim.env.now)


# ---- counterfactual regret -------------------------------------------------------------------------------------
class ReplayRouter:
    """Routes the n-th arrival to ``routes[n]``, except the one ``override`` = (n, replica) names."""

    def __init__(self, routes: Sequence[int], override: tuple[int, int] | None = None) -> None:
        self.routes, self.override, self.n = routes, override, 0

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        n = self.n
        self.n += 1
        if self.override is not None and self.override[0] == n:
            return self.override[1]
        return self.routes[n]


def e2e_by_request(requests: Sequence[Request]) -> dict[int, float]:
    """Each completed request's E2E latency (finish minus arrival)."""
    return {r.id: r.finish - r.arrival for r in requests if r.outcome is Outcome.COMPLETED}


RunWithRouter = Callable[[Router], Sequence[Request]]  # simulate the run again with this router; its requests


def resimulated_regret(run: RunWithRouter, decisions: Sequence[RouteDecision], k: int = DEFAULT_TOP_K
                       ) -> list[dict]:
    """One regret row per routing decision, by re-running ``run`` with the decision sent to each of its top-k
    alternatives and the others replayed. Regret in seconds of total E2E (see the module's docstring)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    routes = [d.chosen for d in decisions]
    base = e2e_by_request(run(ReplayRouter(routes)))
    base_total = sum(base.values())
    out = []
    for d in decisions:
        tried: list[dict[str, Any]] = []
        for a in d.alternatives(k):
            e2e = e2e_by_request(run(ReplayRouter(routes, (d.index, a))))
            tried.append({"replica": a, "total_e2e": sum(e2e.values()), "completed": len(e2e),
                          "own_e2e": e2e.get(d.request)})
        row: dict[str, Any] = {"request": d.request, "t": d.time, "chosen": d.chosen, "total_e2e": base_total,
                               "own_e2e": base.get(d.request), "alternatives": tried,
                               "est_regret_tokens": estimated_regret(d, k)}
        if tried:
            best = min(tried, key=lambda x: (x["total_e2e"], x["replica"]))
            row["best_alternative"] = best["replica"]
            row["regret"] = max(base_total - float(best["total_e2e"]), 0.0)
            own, alt = base.get(d.request), best["own_e2e"]
            row["own_regret"] = None if own is None or alt is None else max(own - alt, 0.0)
        else:  # a single replica: nothing else could have been chosen
            row["best_alternative"], row["regret"], row["own_regret"] = None, 0.0, 0.0
        out.append(row)
    return out


def estimated_regret(d: RouteDecision, k: int = DEFAULT_TOP_K) -> int:
    """The cheap estimate: prefill tokens ahead on the chosen replica minus on the best top-k alternative."""
    alts = d.alternatives(k)
    if not alts:
        return 0
    return max(d.estimates[d.chosen] - min(d.estimates[a] for a in alts), 0)


def best_response_routes(run: RunWithRouter, routes: Sequence[int], num_replicas: int, max_passes: int = 20
                         ) -> list[int]:
    """Routes that no single change improves: coordinate descent on the total E2E, each decision in turn set to
    the replica that gives the lowest total with the others held (ties keep the current one). Each change lowers
    the total, so it ends; ``max_passes`` bounds it anyway. A router replaying them has zero regret at any k."""
    best = list(routes)
    current = sum(e2e_by_request(run(ReplayRouter(best))).values())
    for _ in range(max_passes):
        changed = False
        for i in range(len(best)):
            for a in range(num_replicas):
                if a == best[i]:
                    continue
                total = sum(e2e_by_request(run(ReplayRouter(best, (i, a)))).values())
                if total < current:
                    best[i], current, changed = a, total, True
        if not changed:
            return best
    return best


def agreement(rows: Sequence[dict]) -> dict[str, Any]:
    """How well the cheap estimate tells the decisions with regret from those without: the share of decisions
    on which both say regret or both say none, and the correlation of the two over the decisions."""
    if not rows:
        return {"decisions": 0, "sign_agreement": None, "correlation": None}
    same = sum((r["regret"] > 0) == (r["est_regret_tokens"] > 0) for r in rows)
    xs = [float(r["est_regret_tokens"]) for r in rows]
    ys = [float(r["regret"]) for r in rows]
    return {"decisions": len(rows), "sign_agreement": same / len(rows), "correlation": _pearson(xs, ys)}


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None  # one of them constant: no correlation to speak of
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sxx * syy) ** 0.5


def summary(trace: DecisionTrace, regret_rows: Sequence[dict] | None, k: int = DEFAULT_TOP_K) -> dict[str, Any]:
    """The trace of one run in a few numbers: decisions per kind, the top reasons per kind, and the routing
    regret (re-simulated where ``regret_rows`` are given, else the estimate only), with the worst decisions."""
    out: dict[str, Any] = {
        "rows_written": trace.rows_written - trace.rows_before, "max_rows": trace.max_rows,
        "counts": dict(sorted(trace.counts.items())),
        "top_reasons": {kind: [[why, n] for why, n in sorted(c.items(), key=lambda x: (-x[1], x[0]))[:5]]
                        for kind, c in sorted(trace.reasons.items())},
    }
    if not trace.routes:
        return out
    est = [estimated_regret(d, k) for d in trace.routes]
    reg: dict[str, Any] = {"k": k, "decisions": len(trace.routes),
                           "estimate": {"unit": "prefill tokens", "positive": sum(e > 0 for e in est),
                                        "total": sum(est), "mean": sum(est) / len(est)}}
    if regret_rows is not None:
        vals = [r["regret"] for r in regret_rows]
        worst = sorted(regret_rows, key=lambda r: (-r["regret"], r["request"]))[:WORST_LISTED]
        reg.update(method="re-simulation", unit="s of total E2E", positive=sum(v > 0 for v in vals),
                   total=sum(vals), mean=sum(vals) / len(vals) if vals else 0.0,
                   worst=[{"request": r["request"], "t": r["t"], "chosen": r["chosen"],
                           "best_alternative": r["best_alternative"], "regret": r["regret"]}
                          for r in worst if r["regret"] > 0],
                   agreement=agreement(regret_rows))
    else:
        reg["method"] = (f"estimate only (re-simulation runs up to {REGRET_MAX_REQUESTS} routed requests, "
                         "without an autoscaler or failures)")
    out["routing_regret"] = reg
    return out
