"""Reader for GuideLLM's benchmark report (``guidellm benchmark --output-path benchmarks.json``; vllm-project/guidellm,
``GenerativeBenchmarksReport``): one BenchRun per entry of ``benchmarks`` (a GuideLLM sweep is a load sweep).

Field facts (guidellm/benchmark/schemas): each metric under ``metrics`` is a status distribution
``{"successful": {"mean", "median", "std_dev", "percentiles": {"p50", "p90", "p99", ...}, ...}, "errored": ...}``;
``time_to_first_token_ms``, ``inter_token_latency_ms``, ``time_per_output_token_ms`` in ms, ``request_latency`` in
seconds. The definitions differ from vLLM's and are kept apart: GuideLLM's ``inter_token_latency_ms`` is per
request (last token - first token) / (output - 1), its statistics weighted by output - 1 (so its mean is vLLM's
pooled ITL mean); its ``time_per_output_token_ms`` is (last token - request start) / output, TTFT included,
weighted by output. These compare as ``gl_itl`` and ``gl_tpot`` against the simulated run's same quantities.
Per-request lengths come from ``requests.successful[*].prompt_tokens`` / ``output_tokens``; the load from the
benchmark's strategy (``config.strategy`` or, in older reports, ``args.strategy``: ``type_`` synchronous,
concurrent with ``streams``, constant or poisson with ``rate``, throughput). Rates per second there are
distributions over time with no exact simulated counterpart and are listed as skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.output.benchfiles.common import BenchFileError, BenchRun, read_bench_json

METRICS = {  # GuideLLM metric -> (servesim key, seconds per unit)
    "time_to_first_token_ms": ("ttft", 1e-3),
    "inter_token_latency_ms": ("gl_itl", 1e-3),
    "time_per_output_token_ms": ("gl_tpot", 1e-3),
    "request_latency": ("e2el", 1.0),
}
RATES = ("requests_per_second", "output_tokens_per_second", "tokens_per_second")


def is_guidellm(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _strategy(bench: dict) -> dict:
    for parent in ("config", "args", "scheduler"):
        s = bench.get(parent)
        if isinstance(s, dict) and isinstance(s.get("strategy"), dict):
            return s["strategy"]
    return {}


def _one(p: Path, i: int, bench: Any) -> BenchRun:
    where = f"benchmarks[{i}]"
    run = BenchRun(source=str(p), format="guidellm", label=where)
    skip = run.skipped.append
    if not isinstance(bench, dict):
        raise BenchFileError(f"{p}: {where}: expected an object")
    metrics = bench.get("metrics")
    if not isinstance(metrics, dict):
        raise BenchFileError(f"{p}: {where}.metrics: missing or not an object")
    for name, (key, scale) in METRICS.items():
        dist = metrics.get(name)
        ok = dist.get("successful") if isinstance(dist, dict) else None
        if not isinstance(ok, dict):
            skip(f"{p}: {where}.metrics.{name}.successful: missing or not an object")
            continue
        stats = {"mean": ok.get("mean"), "median": ok.get("median"), "std": ok.get("std_dev")}
        pct = ok.get("percentiles")
        if isinstance(pct, dict):
            stats.update({k: v for k, v in pct.items() if k in ("p50", "p90", "p95", "p99")})
        for stat, value in stats.items():
            if value is None:
                continue
            v = _num(value)
            if v is None or v < 0:
                skip(f"{p}: {where}.metrics.{name}.successful.{stat}: not a non-negative number")
            else:
                run.aggregates[f"{'median' if stat == 'p50' else stat}_{key}"] = v * scale
    for name in RATES:
        if name in metrics:
            skip(f"{p}: {where}.metrics.{name}: a rate distribution over time; not compared")
    reqs = bench.get("requests")
    ok_reqs = reqs.get("successful") if isinstance(reqs, dict) else None
    if isinstance(ok_reqs, list) and ok_reqs:
        ins = [r.get("prompt_tokens") if isinstance(r, dict) else None for r in ok_reqs]
        outs = [r.get("output_tokens") if isinstance(r, dict) else None for r in ok_reqs]
        good = all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in ins + outs)
        if good:
            run.input_lens, run.output_lens = list(ins), list(outs)  # type: ignore[arg-type]
        else:
            skip(f"{p}: {where}.requests.successful: prompt_tokens / output_tokens not all positive integers; "
                 "lengths unknown")
    else:
        skip(f"{p}: {where}.requests.successful: missing or empty; lengths unknown")
    strat = _strategy(bench)
    kind = strat.get("type_") or strat.get("type")
    if kind == "synchronous":
        run.max_concurrency = 1
    elif kind == "concurrent" and isinstance(strat.get("streams"), int) and strat["streams"] > 0:
        run.max_concurrency = int(strat["streams"])
    elif kind in ("constant", "poisson") and (_num(strat.get("rate")) or 0) > 0:
        run.request_rate = float(strat["rate"])
        run.burstiness = 1.0 if kind == "poisson" else math.inf  # constant: evenly spaced
    elif kind == "throughput":
        run.request_rate = None  # all requests at once
    elif kind == "concurrent":  # a known type whose parameter is wrong: name the parameter, not the type
        skip(f"{p}: {where}.config.strategy: concurrent needs streams, a positive integer (got "
             f"{strat.get('streams')!r}); simulated as all at once")
    elif kind in ("constant", "poisson"):
        skip(f"{p}: {where}.config.strategy: {kind} needs rate, a positive number (got {strat.get('rate')!r}); "
             "simulated as all at once")
    else:
        skip(f"{p}: {where}.config.strategy: missing or unknown type {kind!r}; simulated as all at once")
    if not run.aggregates:
        raise BenchFileError(f"{p}: {where}: no metrics readable")
    return run


def read_guidellm(path: str | Path, data: Any = None) -> list[BenchRun]:
    p = Path(path)
    if data is None:
        data = read_bench_json(p)
    if not is_guidellm(data) or not data["benchmarks"]:
        raise BenchFileError(f"{p}: benchmarks: missing or empty")
    return [_one(p, i, b) for i, b in enumerate(data["benchmarks"])]
