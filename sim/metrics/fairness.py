"""Fairness between tenants: Jain's index of the service the tenants received while they were backlogged.

A tenant is backlogged while one of its requests waits for the GPU (arrived and not yet scheduled, or preempted
and not yet resumed): it would take more service if it were given some. This is the definition of Sheng et al.
("Fairness in Serving Large Language Models", OSDI 2024), whose VTC bounds the difference in service between two
tenants backlogged through an interval. A tenant that is not backlogged asks for no more than it gets, so it is
left out: comparing it with a flooding tenant would call the flood's larger share unfair.

The run, from its first arrival to its last finish, is cut into ``WINDOWS`` equal windows. In each window the
tenants backlogged throughout it are compared by the service they received in it, in the paper's weighted tokens
(``INPUT_WEIGHT`` per prompt token, ``OUTPUT_WEIGHT`` per output token, VTC's defaults): a request's prompt spread
evenly from its first step to its first token, its output from its first token to its finish (the records keep no
per-token times; a recomputed prompt counts once). The index is the mean of the windows' Jain's indices over the
windows with at least two backlogged tenants that received any service (``backlogged_windows``), and 1.0 where
no window had two: no tenant was held back while another was served (a fair scheduler that serves a small tenant
at once leaves it never backlogged). NaN without tenants. FCFS serves backlogged tenants in proportion to their
arrivals: examples/policies/fair_share.yaml (one tenant sending 80% of the requests, 1.4x overload) reads 0.77
over 15 of 20 windows under FCFS and 1.0 under fair share, where both complete every request. The windows must
be long against a request's life: a scheduler decides whom to admit, and the batch follows its admissions only as
the running requests finish, so in a short run a fair scheduler's index reads that lag (tests/test_fairness.py's
two tenants, one sending three times the other's requests: FCFS 0.80 and VTC 0.88 at 300 requests, 2.3 s windows;
FCFS 0.81 and VTC 0.995 at 1,000, 7.5 s windows).

``served_share_jain_index`` beside it is Jain's index of each tenant's output tokens served over those it asked
for: below 1 only where some tenant's requests were rejected or failed more than another's. The summary's
``jain_index`` is the lower of the two (``sim.metrics.summary.tenant_fairness``): a request rejected at arrival
never waits, so a tenant whose every request is refused is never backlogged, and the windows alone would read 1.0
for the policy that starves it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.metrics.request_table import RequestTable
from sim.metrics.sums import dot

WINDOWS = 20  # windows the run is cut into (the paper's figures sample 20 points)
INPUT_WEIGHT = 1.0  # service per prompt token (VTC's w_p)
OUTPUT_WEIGHT = 2.0  # service per output token (VTC's w_q)
NAN = float("nan")


def jain_index(x: Sequence[float] | np.ndarray) -> float:
    """Jain's fairness index of the amounts ``x`` (one per party, each >= 0): ``(sum x)^2 / (n * sum x^2)``.

    1.0 when every party gets the same amount, 1/n when one party gets everything and the others nothing; it is
    unchanged when every amount is scaled by the same factor. NaN for no parties or when nobody got anything.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return NAN
    if np.any(a < 0):
        raise ValueError(f"Jain's index takes amounts >= 0, got {a.min()}")
    sq = dot(a, a)
    return float(a.sum()) ** 2 / (a.size * sq) if sq > 0 else NAN


def _spread(lo: np.ndarray, hi: np.ndarray, amount: np.ndarray, a: float, b: float) -> np.ndarray:
    """Each amount spread evenly over [lo, hi], the part that falls in [a, b) (all of it at lo when hi <= lo)."""
    width = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        part = np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0.0, None) / width
    point = (lo >= a) & (lo < b)
    return amount * np.where(width > 0, part, point)


def _merged(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the spans [start, stop) as disjoint spans, in order (touching spans joined)."""
    if not len(starts):
        return starts, stops
    order = np.argsort(starts, kind="stable")
    lo, hi = starts[order], stops[order]
    new = np.r_[True, lo[1:] > np.maximum.accumulate(hi)[:-1]]
    at = np.flatnonzero(new)
    return lo[at], np.maximum.reduceat(hi, at)


def _covered(merged: tuple[np.ndarray, np.ndarray], a: float, b: float) -> bool:
    """Whether the disjoint spans ``merged`` (``_merged``'s) cover [a, b)."""
    lo, hi = merged
    i = int(np.searchsorted(lo, a, side="right")) - 1
    return i >= 0 and bool(hi[i] >= b)


def backlogged_jain(table: RequestTable, tenant_rows: dict[str, np.ndarray],
                    spans: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[float, int]:
    """(the index, the windows it averages) for the tenants' rows (masks of ``table``'s rows) and the waiting
    spans of ``table``'s requests (starts, stops, the row of each: ``sim.metrics.verdict.waiting_spans``)."""
    if not tenant_rows:
        return NAN, 0
    if len(tenant_rows) < 2:
        return 1.0, 0
    arrival, finish = table.column("arrival"), table.column("finish")
    first, token = table.column("first_scheduled"), table.column("first_token")
    t0, t1 = float(arrival.min()), float(np.max(np.maximum(finish, arrival)))
    if not t1 > t0:
        return 1.0, 0
    ran = (first >= 0) & (token >= 0)
    end = np.where(finish >= token, finish, token)
    prompt = np.where(ran, INPUT_WEIGHT * table.column("prompt_tokens"), 0.0)
    output = np.where(ran, OUTPUT_WEIGHT * table.column("output_tokens"), 0.0)
    starts, stops, owner = spans
    waits = {name: _merged(starts[rows[owner]], stops[rows[owner]]) for name, rows in tenant_rows.items()}
    edges = np.linspace(t0, t1, WINDOWS + 1)
    indices = []
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        backlogged = [name for name, merged in waits.items() if _covered(merged, a, b)]
        if len(backlogged) < 2:
            continue
        service = _spread(first, token, prompt, a, b) + _spread(token, end, output, a, b)
        j = jain_index([float(service[tenant_rows[name]].sum()) for name in backlogged])
        if j == j:  # NaN: no backlogged tenant was served in it (the GPU on another tenant's work)
            indices.append(j)
    return (float(np.mean(indices)) if indices else 1.0), len(indices)
