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
    format: str = "vllm-bench"  # vllm-bench | guidellm | genai-perf
    label: str | None = None  # which benchmark of a file holding several (GuideLLM's sweeps)
    model: str | None = None
    request_rate: float | None = None  # requests/s; None for "inf" (all at once)
    burstiness: float | None = None  # gamma shape of inter-arrival times; 1.0 is Poisson
    max_concurrency: int | None = None
    duration_s: float | None = None
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    arrival_times_s: list[float] | None = None  # relative to the first request's
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[list[float]] | None = None  # None: the file holds no per-request ITLs
    latencies_s: list[float] | None = None  # E2EL per request, where the file has it
    num_failed: int = 0  # requests the file lists as failed (left out of the per-request lists)
    # Aggregates keyed "<stat>_<metric>" in seconds, e.g. "mean_ttft", "p99_e2el"; throughputs under vLLM's names
    # (request_throughput in req/s, output_throughput and total_token_throughput in tokens/s).
    aggregates: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "file: field: why" for what could not be read
    num_requests: int | None = None  # requests of the run, where only aggregates are known
    # mean/std/min/max of the lengths where the file has no per-request lengths (genai-perf's export)
    input_len_stats: dict[str, float] | None = None
    output_len_stats: dict[str, float] | None = None

    @property
    def load(self) -> float | None:
        """The x of a load sweep: the request rate, else the max concurrency."""
        if self.request_rate is not None:
            return self.request_rate
        return float(self.max_concurrency) if self.max_concurrency is not None else None
