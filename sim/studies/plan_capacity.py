"""The most requests per second a planned deployment serves, measured by simulating it with a backlog.

A finite run can meet the SLOs on a deployment that cannot keep up: when the run ends before the queue has
grown (plan-chat at 100 requests, 6 s of arrivals: one L40S with max_num_seqs 256 met p99 TTFT and TPOT, while at
2,000 requests it scheduled 14.6 of the 16.1 req/s arriving, its queue grew to 135 and its p99 TTFT was 14 s).
Neither the analytic throughput bound (a lower bound on the work, which this deployment passes) nor the second
half of so short a window tells it. What does is the deployment's service rate: with more requests waiting than
it can run, every step is as full as its batch limits and KV memory let it be, and the rate at which it completes
requests there is the most it can serve of this mix. An offered rate above it is utilisation above 1: the queue
grows without bound, whatever a short run shows.

The backlog is the workload's own requests (their lengths, prefixes and classes), repeated until there are
``BACKLOG_PER_SLOT`` for each batch slot of the deployment (and at least all of them), every one arriving at 0;
each copy's sessions and prefix ids are its own, but for the prefixes requests of several sessions share (a system
prompt), which every copy hits as the workload's requests do. The rate is taken between the quarter
and three quarters of the completions: the batch is full by the first (its prompts computed), and at least three
quarters of the requests still wait behind it until the last of them (the drain is left out).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sim.config.slos import SLO_WARN_ABOVE, SLOs
from sim.metrics.records import RunResult
from sim.serving.request import RequestSpec
from sim.workload.generator import GeneratedWorkload

BACKLOG_PER_SLOT = 4  # backlog requests per batch slot (max_num_seqs x replicas): the batch stays full to 3/4
# Arrival window the SLOs are judged on, in lifetimes of a request at the SLOs: with Poisson arrivals from an empty
# server the batch holds 1 - exp(-t / lifetime) of its steady-state size at t (exponential lifetimes), 95% at 3
STEADY_LIFETIMES = 3.0


def _shared_hashes(reqs: list[RequestSpec]) -> set[int]:
    """The prefix ids that requests of more than one session hold (a request without a session is one of its
    own): content common to the workload, a system prompt, rather than one conversation's."""
    owner: dict[int, object] = {}
    shared: set[int] = set()
    for r in reqs:
        who = ("s", r.session_id) if r.session_id is not None else ("r", r.id)
        for h in r.hash_ids:
            if owner.setdefault(h, who) != who:
                shared.add(h)
    return shared


def _repeat(reqs: list[RequestSpec], copies: int, shift: float | None) -> tuple[RequestSpec, ...]:
    """``copies`` copies of the requests, copy k arriving ``k x shift`` later (all at 0 when ``shift`` is None),
    each copy with sessions of its own and prefix ids of its own except those shared across sessions
    (``_shared_hashes``): a copy's request does not hit its own prompt in another copy, and every copy hits the
    workload's common prefixes as its requests do. (Copies of those too cost a 40-request workload with a
    2,048-token system prompt, backlogged on one L40S, 26 misses of it instead of one: 8.93 req/s, not 9.05.)"""
    top_hash = max((h for r in reqs for h in r.hash_ids), default=-1) + 1
    top_session = max((r.session_id for r in reqs if r.session_id is not None), default=-1) + 1
    shared = _shared_hashes(reqs)
    out: list[RequestSpec] = []
    for k in range(copies):
        for r in reqs:
            out.append(dataclasses.replace(
                r, id=len(out), arrival=0.0 if shift is None else r.arrival + k * shift,
                hash_ids=tuple(h if h in shared else h + k * top_hash for h in r.hash_ids),
                session_id=None if r.session_id is None else r.session_id + k * top_session))
    return tuple(out)


def backlog_workload(workload: GeneratedWorkload, slots: int) -> GeneratedWorkload:
    """The workload's requests repeated to at least ``BACKLOG_PER_SLOT x slots`` (all of them at least once),
    every one arriving at 0, each copy with prefix ids and sessions of its own."""
    reqs = list(workload.requests)
    return GeneratedWorkload(_repeat(reqs, max(1, -(-BACKLOG_PER_SLOT * slots // len(reqs))), None))


def slo_lifetime(slos: SLOs, mean_output: float) -> float | None:
    """The longest mean time a request lasts on a deployment that meets the SLOs (TTFT + mean output gaps x
    TPOT, or E2EL), in seconds; None when neither TPOT nor E2EL is bounded. An SLO above ``SLO_WARN_ABOVE`` (the
    milliseconds of ``vllm bench serve --goodput`` written as seconds, warned about) bounds nothing here: plan-chat
    with ``slos: {ttft: 500}`` sized its window to 3 x 507 s, 24,000 requests a deployment, and ran for minutes
    with no output (``tpot: 30`` too: 380,000 requests); the plan measures the lifetime instead (TTFT alone)."""
    ttft, tpot, e2el = (None if v is None or v > SLO_WARN_ABOVE[k] else v
                        for k, v in (("ttft", slos.ttft), ("tpot", slos.tpot), ("e2el", slos.e2el)))
    bounds = [] if e2el is None else [e2el]
    if tpot is not None:
        bounds.append((ttft or 0.0) + max(mean_output - 1.0, 0.0) * tpot)
    return min(bounds) if bounds else None


def steady_workload(workload: GeneratedWorkload, window: float) -> GeneratedWorkload:
    """The open-loop workload's requests repeated, each copy one arrival window plus a mean gap after the last,
    until the arrivals span at least ``window`` seconds (the workload itself when they do already)."""
    reqs = list(workload.requests)
    arrivals = [r.arrival for r in reqs]
    span = max(arrivals) - min(arrivals)
    if span <= 0 or span >= window:
        return workload
    shift = span * len(reqs) / (len(reqs) - 1)  # the span and one mean gap: the copies keep the offered rate
    copies = 1 + math.ceil((window - span) / shift)
    return dataclasses.replace(workload, requests=_repeat(reqs, copies, shift))


def backlog_rate(result: RunResult) -> float:
    """Requests per second completed between the quarter and three quarters of the completions of a backlog run
    (NaN when fewer than 4 completed)."""
    finish = np.sort(np.array([r.finish for r in result.requests if r.outcome == "completed"], dtype=np.float64))
    n = len(finish)
    if n < 4:
        return float("nan")
    a, b = n // 4, (3 * n) // 4
    span = finish[b - 1] - finish[a - 1]
    return (b - a) / span if span > 0 else float("inf")
