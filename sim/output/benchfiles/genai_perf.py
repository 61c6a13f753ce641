"""Reader for genai-perf's ``profile_export_genai_perf.json`` (triton-inference-server/perf_analyzer, genai-perf).

Field facts: each metric is an object ``{"unit": ..., "avg", "min", "max", "std", "p1".."p99"}``; latencies
``time_to_first_token``, ``inter_token_latency``, ``request_latency`` in ms; ``request_throughput``
(requests/sec) and ``output_token_throughput`` (tokens/sec) with ``avg``; ``input_sequence_length`` and
``output_sequence_length`` (tokens) as statistics, with no per-request lengths; the run's settings under
``input_config`` (``concurrency``, ``request_rate``, ``model``; newer versions nest the load under
``perf_analyzer.stimulus``). genai-perf's inter-token latency is per request (request latency - TTFT) /
(output tokens - 1), the statistics over requests: vLLM's TPOT, so it is compared as ``tpot``. Its p50 is the
median.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.config.limits import MAX_REQUESTS, too_many_requests
from sim.output.benchfiles.common import BenchFileError, BenchRun, read_bench_json

LATENCIES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2el"}
THROUGHPUTS = {"request_throughput": "request_throughput", "output_token_throughput": "output_throughput"}
_UNIT = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "us": 1e-6, "ns": 1e-9}


def is_genai_perf(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("time_to_first_token") or data.get("request_latency"), dict)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _stat_key(stat: str) -> str | None:
    if stat == "avg":
        return "mean"
    if stat == "p50":
        return "median"
    if stat == "std":
        return "std"
    if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit():
        return stat
    return None


def _dig(data: dict, *path: str) -> Any:
    v: Any = data
    for k in path:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


def read_genai_perf(path: str | Path, data: Any = None) -> BenchRun:
    p = Path(path)
    if data is None:
        data = read_bench_json(p)
    if not isinstance(data, dict):
        raise BenchFileError(f"{p}: top level: expected an object")
    run = BenchRun(source=str(p), format="genai-perf")
    skip = run.skipped.append
    for field, metric in LATENCIES.items():
        obj = data.get(field)
        if obj is None:
            continue
        if not isinstance(obj, dict):
            skip(f"{p}: {field}: not an object")
            continue
        scale = _UNIT.get(str(obj.get("unit", "ms")))
        if scale is None:
            skip(f"{p}: {field}.unit: unknown unit {obj.get('unit')!r}")
            continue
        for stat, value in obj.items():
            key = _stat_key(stat)
            if key is None:
                continue
            v = _num(value)
            if v is None or v < 0:
                skip(f"{p}: {field}.{stat}: not a non-negative number")
            else:
                run.aggregates[f"{key}_{metric}"] = v * scale
    for field, key in THROUGHPUTS.items():
        obj = data.get(field)
        if obj is None:
            continue
        v = _num(obj.get("avg")) if isinstance(obj, dict) else None
        if v is None or v < 0:
            skip(f"{p}: {field}.avg: not a non-negative number")
        else:
            run.aggregates[key] = v
    for field, attr in (("input_sequence_length", "input_len_stats"), ("output_sequence_length", "output_len_stats")):
        obj = data.get(field)
        stats = {k: _num(obj.get(k)) for k in ("avg", "std", "min", "max")} if isinstance(obj, dict) else {}
        if stats.get("avg") is None or (stats["avg"] or 0) < 1:
            skip(f"{p}: {field}.avg: missing or not a positive number; lengths unknown")
            continue
        setattr(run, attr, {k: v for k, v in stats.items() if v is not None})
    raw_cfg = data.get("input_config")
    cfg: dict[str, Any] = raw_cfg if isinstance(raw_cfg, dict) else {}
    model = cfg.get("model")
    run.model = model[0] if isinstance(model, list) and model and isinstance(model[0], str) else \
        model if isinstance(model, str) else None
    conc = cfg.get("concurrency", _dig(cfg, "perf_analyzer", "stimulus", "concurrency"))
    rate = cfg.get("request_rate", _dig(cfg, "perf_analyzer", "stimulus", "request_rate"))
    if isinstance(conc, int) and not isinstance(conc, bool) and conc > 0:
        run.max_concurrency = conc
    elif (r := _num(rate)) is not None and r > 0:
        run.request_rate = r
        run.burstiness = 1.0  # perf_analyzer's --request-rate with its default Poisson distribution
    else:
        skip(f"{p}: input_config.concurrency / request_rate: neither is set; load unknown, simulated as a closed "
             "loop of 1")
        run.max_concurrency = 1
    count = data.get("request_count")
    n = _num(count.get("avg")) if isinstance(count, dict) else _num(count)
    run.num_requests = int(n) if n is not None and n >= 1 else None
    if run.num_requests is not None and run.num_requests > MAX_REQUESTS:  # drawn and simulated: hours, then memory
        raise BenchFileError(f"{p}: request_count: {too_many_requests(run.num_requests)}")
    if not run.aggregates:
        raise BenchFileError(f"{p}: no metrics: no readable time_to_first_token / request_latency / throughput")
    return run
