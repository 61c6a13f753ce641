"""Every metric of the comparison table declared once: its summary.json key, its label, unit and definition, and
its name in vLLM where vLLM has one. The table (sim/output/table.py), ``servesim compare``, the sweep page and
the docs read this list.

A plugin (sim/plugins.py) adds a metric of its own with :func:`register_metric`, giving ``compute``: a function
of the run's records (a ``sim.metrics.records.RunResult``) returning a number. Such a metric is computed for
every run after the built-in ones, written to summary.json under its key and shown as a row of the table, with
nothing else edited. The built-in metrics are computed together in sim/metrics/summary.py (they share their
passes over the records), so their ``compute`` is None.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# how a value is shown: milliseconds from seconds, seconds, a rate, a share as a percentage, a count, 3 digits
FORMATS = ("ms", "s", "rate", "pct", "int", "sig")


@dataclass(frozen=True)
class Metric:
    key: str  # summary.json key, dotted for nesting (ttft.p99 is summary["ttft"]["p99"])
    label: str  # the table's row label
    fmt: str  # one of FORMATS
    unit: str
    definition: str
    vllm_name: str | None = None  # vllm bench serve's JSON key or vLLM's Prometheus name, where vLLM has one
    compute: Callable[[Any], float] | None = None  # a plugin's: the value from the run's RunResult

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"metric {self.key!r}: fmt must be one of {', '.join(FORMATS)}, got {self.fmt!r}")


def _m(key: str, label: str, fmt: str, unit: str, definition: str, vllm: str | None = None) -> Metric:
    return Metric(key, label, fmt, unit, definition, vllm)


_LAT = "over completed requests"
BUILTIN_METRICS: tuple[Metric, ...] = (
    _m("ttft.mean", "TTFT mean (ms)", "ms", "s", f"time to first token, first_token - arrival, mean {_LAT}",
       "mean_ttft_ms"),
    _m("ttft.p50", "TTFT p50 (ms)", "ms", "s", f"time to first token, median {_LAT}", "median_ttft_ms"),
    _m("ttft.p99", "TTFT p99 (ms)", "ms", "s", f"time to first token, 99th percentile {_LAT}", "p99_ttft_ms"),
    _m("tpot.mean", "TPOT mean (ms)", "ms", "s", "time per output token after the first, (E2EL - TTFT) / "
       "(output_tokens - 1), mean over requests with more than one output token", "mean_tpot_ms"),
    _m("tpot.p50", "TPOT p50 (ms)", "ms", "s", "time per output token after the first, median", "median_tpot_ms"),
    _m("tpot.p99", "TPOT p99 (ms)", "ms", "s", "time per output token after the first, 99th percentile",
       "p99_tpot_ms"),
    _m("itl.p50", "ITL p50 (ms)", "ms", "s", "inter-token latency, every gap between consecutive tokens pooled, "
       "median", "median_itl_ms"),
    _m("itl.p99", "ITL p99 (ms)", "ms", "s", "inter-token latency, 99th percentile of the pooled gaps",
       "p99_itl_ms"),
    _m("e2el.p50", "E2EL p50 (s)", "s", "s", f"end-to-end latency, finish - arrival, median {_LAT}",
       "median_e2el_ms"),
    _m("e2el.p99", "E2EL p99 (s)", "s", "s", f"end-to-end latency, 99th percentile {_LAT}", "p99_e2el_ms"),
    _m("queue.p99", "queue p99 (s)", "s", "s", f"queueing delay, first_scheduled - arrival, 99th percentile {_LAT}"),
    _m("output_throughput", "output tok/s", "rate", "tokens/s", "output tokens of completed requests / duration",
       "output_throughput"),
    _m("total_token_throughput", "total tok/s", "rate", "tokens/s", "prompt + output tokens of completed "
       "requests / duration", "total_token_throughput"),
    _m("request_throughput", "req/s (completed)", "rate", "requests/s", "completed requests / duration",
       "request_throughput"),
    _m("goodput", "goodput (req/s)", "rate", "requests/s", "completed requests within every SLO / duration",
       "request_goodput"),
    _m("slo_attainment", "SLO attainment", "pct", "share", "requests within every SLO / all requests"),
    _m("kv_usage.mean", "KV usage mean", "pct", "share", "KV blocks in use / KV blocks, weighted by step duration",
       "vllm:kv_cache_usage_perc"),
    _m("kv_usage.max", "KV usage max", "pct", "share", "KV blocks in use / KV blocks, largest step"),
    _m("kv_token_utilization", "KV token util", "pct", "share", "tokens stored / token slots of the blocks in use, "
       "weighted by step duration"),
    _m("busy_fraction", "GPU busy", "pct", "share", "time the GPU computed steps / duration"),
    _m("mfu", "MFU", "pct", "share", "model FLOPs utilisation over the whole run: model FLOP/s achieved / the "
       "GPUs' dense peak"),
    _m("mean_batch_size", "mean batch", "s", "requests", "requests per step, weighted by step duration"),
    _m("padding_fraction", "padding", "pct", "share", "padding tokens / all computed tokens (static batching)"),
    _m("num_preemptions", "preemptions", "int", "count", "requests preempted (recompute or swap)",
       "vllm:num_preemptions_total"),
    _m("num_rejected", "rejected", "int", "count", "requests rejected (never served)"),
    _m("num_completed", "completed", "int", "count", "requests that produced every output token", "completed"),
    _m("num_requests", "requests", "int", "count", "requests offered", "num_prompts"),
)

_plugins: list[Metric] = []
_KEY = re.compile(r"[a-z][a-z0-9_]*")


def register_metric(metric: Metric) -> Metric:
    """Add a plugin's metric: it needs ``compute`` and a plain lowercase key that no built-in summary.json key or
    earlier metric uses (summarize refuses one that a run's own sections take). Registering the same metric
    again is a no-op."""
    if metric in _plugins:
        return metric
    if metric.compute is None or not callable(metric.compute):
        raise ValueError(f"metric {metric.key!r}: a plugin's metric needs compute(result) -> number")
    if not _KEY.fullmatch(metric.key):
        raise ValueError(f"metric {metric.key!r}: its key must be lowercase letters, digits and _ (no dots)")
    if metric.key in {m.key.split(".")[0] for m in BUILTIN_METRICS + tuple(_plugins)}:
        raise ValueError(f"metric {metric.key!r}: that summary.json key is already taken")
    _plugins.append(metric)
    return metric


def plugin_metrics() -> tuple[Metric, ...]:
    """The metrics plugins registered (loading the plugins first)."""
    from sim.plugins import load_plugins

    load_plugins()
    return tuple(_plugins)


def all_metrics() -> tuple[Metric, ...]:
    """The table's metrics: the built-in ones, then the plugins'."""
    return BUILTIN_METRICS + plugin_metrics()
