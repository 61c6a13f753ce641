"""A simulated run as a `vllm bench serve --save-result --save-detailed` JSON, so that users' plotting scripts and
dashboards read simulated runs as they read measured ones.

Field names and units follow vllm/benchmarks/serve.py: aggregates ``<stat>_<metric>_ms`` in milliseconds, the
per-request lists (``input_lens``, ``output_lens``, ``ttfts``, ``latencies``, ``start_times``, ``errors``) in
seconds, failed requests kept in the lists with output 0 and a non-empty error. ``start_times`` are the simulated
arrival times (vLLM writes perf_counter() values; readers use them relative to the first). The file has no
per-request ``itls`` lists, with or without ``keep_token_times`` (the request records keep no token times); the ITL
aggregates come from the run's pooled gaps, which are exact.

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
from collections.abc import Callable
from functools import partial
from typing import IO, Any

import numpy as np

from sim.costs.energy import run_energy
from sim.metrics.records import RunResult, has_classes
from sim.metrics.request_table import as_table, by_id
from sim.output.benchfiles.stats import (
    DEFAULT_PERCENTILES,
    LATENCY_METRICS,
    LIST_KEYS,
    bench_stats,
    list_rows,
    p_word,
    run_stats,
)

BACKEND = "servesim"


def _model_of(result: RunResult) -> str | None:
    dep = (result.config or {}).get("deployment") or {}
    model = dep.get("model")
    return model if isinstance(model, str) else None


def vllm_bench_result(result: RunResult, *, request_rate: float | None = None, burstiness: float = 1.0,
                      max_concurrency: int | None = None, percentiles=DEFAULT_PERCENTILES,
                      request_goodput: float | None = None) -> dict[str, Any]:
    """The result dict; ``request_rate`` None writes vLLM's "inf"; ``request_goodput``: the run's goodput against
    its SLOs (summary.json's ``goodput``; None without SLOs, as vLLM without --goodput)."""
    out = _result(result, request_rate, burstiness, max_concurrency, percentiles, request_goodput)
    return {k: v.rows(slice(None)) if isinstance(v, _Rows) else v for k, v in out.items()}


class _Rows:
    """A per-request list of the result, made a block of requests at a time when written (a long run's lists as
    Python values and JSON text were the largest part of the write phase: some 200 bytes a request)."""

    def __init__(self, n: int, rows: Callable[[slice], list]) -> None:
        self.n, self.rows = n, rows

    def write(self, f: IO[str], block: int) -> None:
        """``json.dumps`` of the whole list, to the byte: its blocks' items joined by the same ", "."""
        f.write("[")
        for lo in range(0, self.n, block):
            f.write(", " if lo else "")
            f.write(json.dumps(self.rows(slice(lo, lo + block)))[1:-1])
        f.write("]")


def _result(result: RunResult, request_rate: float | None, burstiness: float, max_concurrency: int | None,
            percentiles, request_goodput: float | None = None) -> dict[str, Any]:
    """vllm_bench_result with its per-request lists as ``_Rows``."""
    stats = run_stats(result, percentiles)
    t = as_table(by_id(result.requests))  # the lists' order: request id
    n = len(t)
    done = t.outcome_is("completed")
    completed = int(done.sum())
    out: dict[str, Any] = {
        "date": "",  # nothing depends on the clock: equal runs give equal files
        "endpoint_type": BACKEND,
        "backend": BACKEND,
        "label": result.name,
        "model_id": _model_of(result),
        "tokenizer_id": _model_of(result),
        "num_prompts": n,
        "request_rate": "inf" if request_rate is None else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": float(result.duration),
        "completed": completed,
        "failed": n - completed,
        "total_input_tokens": int(t.column("prompt_tokens")[done].sum()),  # the lists' sums (errors: not done)
        "total_output_tokens": int(t.column("output_tokens")[done].sum()),
        "request_goodput": request_goodput,
    }
    del done
    for k in ("request_throughput", "output_throughput", "total_token_throughput"):
        out[k] = stats.get(k, 0.0)
    out.update({k: _Rows(n, partial(list_rows, t, k)) for k in LIST_KEYS})
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
        ids = as_table(result.requests).column("id")
        joules = energy.request_energy_j  # in result.requests' order; the lists' is by id
        if not bool(np.all(ids[1:] > ids[:-1])):
            joules = joules[np.argsort(ids, kind="stable")]
        out["energies_j"] = _Rows(n, lambda rows: joules[rows].tolist())
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


# requests per block of a list written (its Python values and text: a few MB)
LIST_ROWS = 1 << 15


def vllm_bench_writer(result: RunResult, *, request_rate: float | None = None, burstiness: float = 1.0,
                      max_concurrency: int | None = None, percentiles=DEFAULT_PERCENTILES,
                      rows: int = LIST_ROWS, request_goodput: float | None = None) -> Callable[[IO[str]], None]:
    """What writes ``json.dumps`` of vllm_bench_result's dict into a file, to the byte, with its per-request lists
    made ``rows`` requests at a time as they are written. Everything else (statistics, energy) is computed here."""
    data = _result(result, request_rate, burstiness, max_concurrency, percentiles, request_goodput)
    # json cannot write NaN portably; vLLM never writes it either
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}

    def write(f: IO[str]) -> None:
        f.write("{")
        for i, (k, v) in enumerate(clean.items()):
            f.write(f"{', ' if i else ''}{json.dumps(k)}: ")
            if isinstance(v, _Rows):
                v.write(f, rows)
            else:
                f.write(json.dumps(v))
        f.write("}")

    return write
