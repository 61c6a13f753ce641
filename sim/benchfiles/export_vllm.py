"""A simulated run as a `vllm bench serve --save-result --save-detailed` JSON, so that users' plotting scripts and
dashboards read simulated runs as they read measured ones.

Field names and units follow vllm/benchmarks/serve.py: aggregates ``<stat>_<metric>_ms`` in milliseconds, the
per-request lists (``input_lens``, ``output_lens``, ``ttfts``, ``latencies``, ``start_times``, ``errors``) in
seconds, failed requests kept in the lists with output 0 and a non-empty error. ``start_times`` are the simulated
arrival times (vLLM writes perf_counter() values; readers use them relative to the first). The per-request
``itls`` lists need each token's time, which a run keeps only with ``keep_token_times``; without them the file has
no ``itls`` list, and the ITL aggregates come from the run's pooled gaps, which are exact.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sim.benchfiles.stats import DEFAULT_PERCENTILES, LATENCY_METRICS, p_word, run_lists, run_stats
from sim.records import RunResult

BACKEND = "servesim"


def _model_of(result: RunResult) -> str | None:
    dep = (result.config or {}).get("deployment") or {}
    model = dep.get("model")
    return model if isinstance(model, str) else None


def vllm_bench_result(result: RunResult, *, request_rate: float | None = None, burstiness: float = 1.0,
                      max_concurrency: int | None = None, percentiles=DEFAULT_PERCENTILES) -> dict[str, Any]:
    """The result dict; ``request_rate`` None writes vLLM's "inf"."""
    stats = run_stats(result, percentiles)
    lists = run_lists(result)
    completed = sum(1 for e in lists["errors"] if not e)
    out: dict[str, Any] = {
        "date": "",  # nothing depends on the clock: equal runs give equal files
        "endpoint_type": BACKEND,
        "backend": BACKEND,
        "label": result.name,
        "model_id": _model_of(result),
        "tokenizer_id": _model_of(result),
        "num_prompts": len(lists["errors"]),
        "request_rate": "inf" if request_rate is None else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": float(result.duration),
        "completed": completed,
        "failed": len(lists["errors"]) - completed,
        "total_input_tokens": sum(n for n, e in zip(lists["input_lens"], lists["errors"], strict=True) if not e),
        "total_output_tokens": sum(lists["output_lens"]),
        "request_goodput": None,
    }
    for k in ("request_throughput", "output_throughput", "total_token_throughput"):
        out[k] = stats.get(k, 0.0)
    out.update(lists)
    for m in LATENCY_METRICS:
        for stat in ("mean", "median", "std", *(p_word(p) for p in percentiles)):
            out[f"{stat}_{m}_ms"] = stats[f"{stat}_{m}"] * 1000.0
    return out


def vllm_bench_json(result: RunResult, **kw: Any) -> str:
    data = vllm_bench_result(result, **kw)
    # json cannot write NaN portably; vLLM never writes it either
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
    return json.dumps(clean, indent=None)
