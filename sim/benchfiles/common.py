"""The common shape every benchmark reader produces.

All latencies are held in SECONDS, with servesim's definitions: TTFT from arrival to the first token, TPOT over the
output tokens after the first, ITL per gap between tokens, E2EL from arrival to the last token. Readers convert
explicitly from their source's units (vllm bench serve writes aggregates in ms and per-request lists in s).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class BenchFileError(ValueError):
    """A file that cannot be read at all; the message names the file and the field."""


@dataclass
class BenchRun:
    source: str
    model: str | None = None
    request_rate: float | None = None  # requests/s; None for "inf" (all at once)
    burstiness: float | None = None  # gamma shape of inter-arrival times; 1.0 is Poisson
    max_concurrency: int | None = None
    duration_s: float | None = None
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    arrival_times_s: list[float] | None = None
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[list[float]] = field(default_factory=list)
    # Aggregates keyed "<stat>_<metric>" in seconds, e.g. "mean_ttft", "p99_e2el".
    aggregates: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "file: field: why" for what could not be read
