"""A simulated run as a `vllm bench serve --save-result --save-detailed` JSON, so that users' plotting scripts and
dashboards read simulated runs as they read measured ones.

Field names and units follow vllm/benchmarks/serve.py: aggregates ``<stat>_<metric>_ms`` in milliseconds, the
per-request lists (``input_lens``, ``output_lens``, ``ttfts``, ``latencies``, ``start_times``, ``errors``) in
seconds, failed requests kept in the lists with output 0 and a non-empty error. ``start_times`` are the simulated
arrival times (vLLM writes perf_counter() values; readers use them relative to the first). The per-request
``itls`` lists need each token's time, which a run keeps only with ``keep_token_times``; without them the file has
no ``itls`` list, and the ITL aggregates come from the run's pooled gaps, which are exact.

A run with request classes adds ``per_class`` (vLLM's format has no classes; readers skip keys they do not know):
per class name, its ``completed``, throughputs, ``request_goodput`` against the class's own TTFT/TPOT SLOs (null
when it has none) and the TTFT, TPOT and E2EL aggregates under the same ``<stat>_<metric>_ms`` names. No ITL:
the run pools its gaps over all requests.

A run whose GPU has power figures (sim/costs/energy.py) adds ``energy_j``, ``j_per_output_token``, ``mean_power_w`` and
the per-request list ``energies_j`` (joules, in the lists' order), as servesim's own keys beside vLLM's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from sim.costs.energy import run_energy
from sim.metrics.records import RunResult, has_classes
from sim.metrics.request_table import as_table
from sim.output.benchfiles.stats import DEFAULT_PERCENTILES, LATENCY_METRICS, bench_stats, p_word, run_lists, run_stats

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
    if has_classes(result.requests):
        out["per_class"] = _per_class(result, tuple(percentiles))
    energy = run_energy(result)
    if energy is not None:  # vLLM has no energy keys: these are servesim's (sim/costs/energy.py), skipped by its
    # readers
        total = energy.energy_j
        out["energy_j"] = total
        out["j_per_output_token"] = total / out["total_output_tokens"] if out["total_output_tokens"] else None
        out["mean_power_w"] = total / float(result.duration) if result.duration > 0 else None
        order = np.argsort(as_table(result.requests).column("id"), kind="stable")  # the lists' order
        out["energies_j"] = energy.request_energy_j[order].tolist()
    return out


def _per_class(result: RunResult, percentiles: tuple[float, ...]) -> dict[str, dict[str, Any]]:
    """Each class's figures in the result JSON's names (see the module docstring), keyed as summary.json's."""
    from sim.metrics.summary import NO_CLASS, class_summaries

    goodput = {name: c["goodput"] for name, c in class_summaries(result.requests, float(result.duration)).items()}
    out: dict[str, dict[str, Any]] = {}
    for name in goodput:
        done = [r for r in result.requests if r.completed and (r.slo_class or NO_CLASS) == name]
        stats = bench_stats([r.first_token - r.arrival for r in done], [r.finish - r.arrival for r in done],
                            [r.output_tokens for r in done], [r.prompt_tokens for r in done], np.zeros(0),
                            float(result.duration), percentiles)
        c: dict[str, Any] = {"completed": len(done), "request_goodput": goodput[name]}
        for k in ("request_throughput", "output_throughput", "total_token_throughput"):
            c[k] = stats.get(k, 0.0)
        for m in ("ttft", "tpot", "e2el"):
            for stat in ("mean", "median", "std", *(p_word(p) for p in percentiles)):
                c[f"{stat}_{m}_ms"] = stats[f"{stat}_{m}"] * 1000.0
        out[name] = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in c.items()}
    return out


def vllm_bench_json(result: RunResult, **kw: Any) -> str:
    data = vllm_bench_result(result, **kw)
    # json cannot write NaN portably; vLLM never writes it either
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
    return json.dumps(clean, indent=None)
