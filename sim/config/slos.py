"""Service-level objectives: configuration (a scenario's ``slos`` section, sim/config/scenario.py) that the metrics
judge
requests against (goodput, SLO attainment, sim/metrics/summary.py). Below both, so that reading a scenario needs no
metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SLOs:
    """Service-level objectives in seconds, as `vllm bench serve --goodput` takes them (it takes ms). A request
    meets an objective when its value is at most the threshold; None means no bound on that metric."""

    ttft: float | None = None
    tpot: float | None = None  # requests with a single output token have TPOT 0, as in vLLM
    e2el: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "e2el"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO {name} must be > 0 seconds, got {v}")

    @property
    def empty(self) -> bool:
        return self.ttft is None and self.tpot is None and self.e2el is None

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft": self.ttft, "tpot": self.tpot, "e2el": self.e2el}
