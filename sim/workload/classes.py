"""Request classes of a scenario's workload (interactive, batch...): each with its share of the arrivals, priority,
tenant, SLOs and, optionally, its own length distributions; and how each request is given its class.

A request's class is drawn with the classes' shares from a child stream of its own, spawned only when classes are
given, so that a workload without classes draws exactly what it drew before they existed.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from sim.config.input_model import SLO_UNIT_HELP as _UNIT
from sim.config.input_model import Float, FrozenInputModel, Int, SLOSeconds
from sim.workload.lengths import LengthDistribution, fmt_g
from sim.workload.trace_columns import ClassColumns

_SHARE_TOLERANCE = 1e-6  # shares written as decimals (0.1 + 0.2 + 0.7) sum to 1 only within rounding


class ClassSLO(FrozenInputModel):
    """A class's service-level objectives, in seconds (vLLM's ``--goodput`` takes the same metrics, in ms)."""

    ttft: SLOSeconds | None = Field(
        default=None, gt=0, description=f"TTFT bound in seconds{_UNIT}; none: no bound."
    )
    tpot: SLOSeconds | None = Field(
        default=None, gt=0,
        description=f"TPOT bound in seconds per output token after the first{_UNIT}; none: no bound.",
    )


class RequestClass(FrozenInputModel):
    """One class of requests: its share of the arrivals, who sends it, how urgent it is and what it must meet.

    The classes split the workload's one arrival process by share. With Poisson arrivals that is the same as an
    arrival process per class: each class's arrivals are an independent Poisson process of rate share x rate
    (thinning), so classes of rates r1 and r2 are ``rate: r1 + r2`` with shares r1/(r1 + r2) and r2/(r1 + r2).
    """

    name: str = Field(min_length=1, description="The class's name (requests.csv's slo_class column).")
    share: Float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of the arrivals in this class; the classes' shares sum to 1. None (every class): "
        "each request's class is named by its trace's slo_class column.",
    )
    priority: Int = Field(
        default=0, ge=-(2**62), le=2**62, description="Scheduling priority; lower is served sooner (vLLM's convention)."
    )
    tenant: str = Field(default="", description="Tenant (customer, team) the class's requests belong to; '' none.")
    slo: ClassSLO = Field(default_factory=ClassSLO, description="The SLOs the class's requests are held to.")
    prompt_len: LengthDistribution | None = Field(
        default=None, description="Prompt length in tokens for this class; none: the workload's."
    )
    output_len: LengthDistribution | None = Field(
        default=None, description="Output tokens for this class; none: the workload's."
    )

    def describe(self) -> str:
        parts = [self.name if self.share is None else f"{self.name} {fmt_g(100 * self.share)}%"]
        if self.priority:
            parts.append(f"priority {self.priority}")
        if self.tenant:
            parts.append(f"tenant {self.tenant}")
        for label, v in (("TTFT", self.slo.ttft), ("TPOT", self.slo.tpot)):
            if v is not None:
                parts.append(f"{label} <= {fmt_g(v)} s")
        for label, dist in (("prompt", self.prompt_len), ("output", self.output_len)):
            if dist is not None:
                parts.append(f"{label} {dist.describe()}")
        return " ".join(parts[:1]) + ("" if len(parts) == 1 else f" ({', '.join(parts[1:])})")


def check_classes(classes: list[RequestClass]) -> None:
    if not classes:
        raise ValueError("classes: give at least one class, or leave classes out")
    names = [c.name for c in classes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"classes: names must be unique; {', '.join(map(repr, twice))} appear more than once")
    given = [c.share is not None for c in classes]
    if any(given) and not all(given):
        raise ValueError("classes: give every class a share, or none (then a trace's slo_class column names them)")
    if all(given):
        total = sum(c.share for c in classes if c.share is not None)
        if abs(total - 1.0) > _SHARE_TOLERANCE:
            raise ValueError(f"classes: shares must sum to 1, got {total:g}")


def class_fields(classes: list[RequestClass], which: np.ndarray, trace: ClassColumns | None,
                 n: int) -> list[tuple[int, str, str, float | None, float | None]]:
    """(priority, tenant, slo_class, ttft_slo, tpot_slo) of each request: its class's, where a trace's own
    priority or tenant column, if any, wins over the class's."""
    per_class = [(c.priority, c.tenant, c.name, c.slo.ttft, c.slo.tpot) for c in classes]
    rows = [per_class[k] for k in which.tolist()]
    if trace is not None and trace.priority is not None:
        rows = [(p, *r[1:]) for p, r in zip(trace.priority[:n].tolist(), rows, strict=True)]
    if trace is not None and trace.tenant is not None:
        rows = [(r[0], t, *r[2:]) for t, r in zip(trace.tenant[:n], rows, strict=True)]
    return rows


def trace_fields(trace: ClassColumns, n: int) -> list[tuple[int, str, str, float | None, float | None]]:
    """The request-class fields a trace's own columns give, without ``classes``: no SLOs."""
    prio = [0] * n if trace.priority is None else trace.priority[:n].tolist()
    tenant = ("",) * n if trace.tenant is None else trace.tenant[:n]
    name = ("",) * n if trace.slo_class is None else trace.slo_class[:n]
    return [(p, t, c, None, None) for p, t, c in zip(prio, tenant, name, strict=True)]

