"""The common shape every benchmark reader produces.

All latencies are held in SECONDS, with servesim's definitions: TTFT from arrival to the first token, TPOT over the
output tokens after the first, ITL per gap between tokens, E2EL from arrival to the last token. Readers convert
explicitly from their source's units (vllm bench serve writes aggregates in ms and per-request lists in s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config.files import read_text_capped

# A benchmark file's size at most: vllm bench serve --save-detailed keeps every request's token gaps, about 20 kB a
# request of 1,000 tokens, so 512 MiB holds some 25,000 of them. Unread, /dev/zero was read without end.
MAX_BENCH_BYTES = 512 << 20


class BenchFileError(ValueError):
    """A file that cannot be read at all; the message names the file and the field."""


def read_bench_json(path: str | Path) -> Any:
    """A benchmark (or knobs) file's JSON value; BenchFileError naming the file for one that is missing, too large
    (``MAX_BENCH_BYTES``), not UTF-8, not JSON or nested past the parser's depth (a RecursionError traceback)."""
    p = Path(path)
    try:
        text = read_text_capped(p, MAX_BENCH_BYTES, "a benchmark file")
    except FileNotFoundError:
        raise BenchFileError(f"{p}: file not found") from None
    except OSError as e:
        raise BenchFileError(f"{p}: not readable JSON ({e})") from None
    except ValueError as e:  # too large, or not UTF-8: the message names the file
        raise BenchFileError(str(e)) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise BenchFileError(f"{p}: not readable JSON (nested too deeply)") from None
    except ValueError as e:
        raise BenchFileError(f"{p}: not readable JSON ({e})") from None


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
