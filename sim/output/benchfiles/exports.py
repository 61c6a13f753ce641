"""The export files a run folder holds per variant (issue 14): ``<variant>.vllm-bench.json`` in `vllm bench serve`'s
result format and ``<variant>.metrics.prom`` in OpenMetrics text under vLLM's metric names. Flat names beside
summary.json, so that the folder's atomic write (sim/config/files.py) covers them too."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import IO, Any

from sim.metrics.records import RunResult
from sim.output.benchfiles.export_metrics import openmetrics_text
from sim.output.benchfiles.export_vllm import vllm_bench_writer

BENCH_SUFFIX = ".vllm-bench.json"
METRICS_SUFFIX = ".metrics.prom"


def file_stem(name: str) -> str:
    """A variant name as a file name: sweep labels such as ``cb[rate=4.0]`` keep their readable parts. No leading
    dot: ``../x`` or ``.`` made ``.._x.metrics.prom`` and ``..metrics.prom``, files ``ls`` does not show."""
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", name).lstrip("._").rstrip("_") or "variant"


def file_stems(names: list[str]) -> list[str]:
    """Each variant's stem of its export files, in order. Names that read alike as files ("a/b" and "a b", or "A"
    and "a" on a disk blind to case) shared one pair of files, the later variant's overwriting the earlier's
    without a word: the later gets a number."""
    out: list[str] = []
    taken: set[str] = set()
    for name in names:
        stem = base = file_stem(name)
        k = 2
        while stem.lower() in taken:
            stem, k = f"{base}-{k}", k + 1
        taken.add(stem.lower())
        out.append(stem)
    return out


def export_names(names: list[str]) -> list[str]:
    """The export files variants of these names get, in order."""
    return [stem + suffix for stem in file_stems(names) for suffix in (BENCH_SUFFIX, METRICS_SUFFIX)]


def _arrival_hints(scenario: dict[str, Any] | None) -> dict[str, Any]:
    """request_rate / burstiness / max_concurrency as vLLM would have written them for this workload."""
    arrival = ((scenario or {}).get("workload") or {}).get("arrival") or {}
    kind = arrival.get("type")
    if kind == "poisson":
        return {"request_rate": arrival.get("rate"), "burstiness": 1.0}
    if kind == "gamma":
        cv = arrival.get("cv") or 1.0
        return {"request_rate": arrival.get("rate"), "burstiness": 1.0 / cv**2}  # vLLM's burstiness: gamma shape
    if kind == "constant":
        return {"request_rate": arrival.get("rate"), "burstiness": float("inf")}
    if kind == "closed_loop":
        return {"max_concurrency": arrival.get("num_users")}
    return {}


def export_files(results: list[RunResult], scenario: dict[str, Any] | None = None,
                 summaries: dict[str, dict] | None = None) -> dict[str, str | Callable[[IO[str]], None]]:
    """Each variant's export files: text, or what writes it (the vllm-bench JSON's per-request lists are made a
    block of requests at a time as the file is written; its figures are computed here). ``summaries``: each
    variant's summary, whose goodput (against the scenario's SLOs) is the file's ``request_goodput``."""
    out: dict[str, str | Callable[[IO[str]], None]] = {}
    for r, stem in zip(results, file_stems([r.name for r in results]), strict=True):
        # the run's own workload (a variant's, a sweep point's) when it recorded one, else the scenario's
        hints = _arrival_hints(r.config if (r.config or {}).get("workload") else scenario)
        if hints.get("burstiness") == float("inf"):
            hints["burstiness"] = "inf"  # JSON has no infinity; a string as vLLM's request_rate uses
        goodput = ((summaries or {}).get(r.name) or {}).get("goodput")  # NaN without SLOs: written null
        out[stem + BENCH_SUFFIX] = vllm_bench_writer(r, **hints, request_goodput=goodput)
        out[stem + METRICS_SUFFIX] = openmetrics_text(r)
    return out
