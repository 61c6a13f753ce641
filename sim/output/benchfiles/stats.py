"""vLLM's serving-benchmark statistics, computed the way `vllm bench serve` computes them (vllm/benchmarks/serve.py,
``calculate_metrics``), from measured lists or from a simulated run. Both sides of a comparison go through here,
so "the same definitions" holds by construction.

Definitions (all over completed requests only): TTFT per request; TPOT = (E2EL - TTFT) / (output - 1) over requests
with more than one output token; ITL pooled over every gap of every request; E2EL per request. Statistics: mean,
median, std (numpy's population std, as vLLM) and pNN with numpy's default linear interpolation. Throughputs divide
by the benchmark duration. Keys are ``<stat>_<metric>`` in seconds, and the throughput names of the result JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from sim.metrics.block_sums import PairwiseSum
from sim.metrics.records import RunResult
from sim.metrics.request_table import RequestTable, as_table, by_id
from sim.metrics.sums import dot

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)  # vllm bench serve's --metric-percentiles default
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")


def p_word(p: float) -> str:
    """vLLM's percentile key: 99 -> "p99", 99.9 -> "p99.9"."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def _describe(name: str, values: np.ndarray, percentiles: Iterable[float]) -> dict[str, float]:
    v = values if values.size else np.zeros(1)  # vLLM's ``np.mean(x or 0)``: an empty list reads as 0
    out = {f"mean_{name}": float(np.mean(v)), f"median_{name}": float(np.median(v)), f"std_{name}": float(np.std(v))}
    for p in percentiles:
        out[f"{p_word(p)}_{name}"] = float(np.percentile(v, p))
    return out


def bench_stats(
    ttfts: Sequence[float],
    e2els: Sequence[float],
    output_lens: Sequence[int],
    input_lens: Sequence[int],
    itls: np.ndarray,
    duration: float,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
) -> dict[str, float]:
    """The statistics of completed requests (one entry per request in each list; ``itls`` pooled gaps)."""
    ttft = np.asarray(ttfts, dtype=np.float64)
    e2el = np.asarray(e2els, dtype=np.float64)
    out_len = np.asarray(output_lens, dtype=np.int64)
    multi = out_len > 1
    tpot = (e2el[multi] - ttft[multi]) / (out_len[multi] - 1)
    pct = tuple(percentiles)
    stats: dict[str, float] = {}
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", np.asarray(itls, dtype=np.float64)), ("e2el", e2el)):
        stats.update(_describe(name, vals, pct))
    if duration > 0:
        total_out, total_in = int(out_len.sum()), int(np.asarray(input_lens, dtype=np.int64).sum())
        stats["request_throughput"] = len(ttft) / duration
        stats["output_throughput"] = total_out / duration
        stats["total_token_throughput"] = (total_in + total_out) / duration
    return stats


# run_lists' keys, in the result JSON's order
LIST_KEYS = ("input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors")


def run_lists(result: RunResult) -> dict[str, list]:
    """Per-request lists of a simulated run in the result JSON's order (request id) and units (seconds)."""
    t = as_table(by_id(result.requests))  # read as columns
    return {k: list_rows(t, k, slice(None)) for k in LIST_KEYS}


def list_rows(t: RequestTable, key: str, rows: slice) -> list:
    """The ``rows`` of run_lists' list ``key``, from the run's requests as columns in id order (a long run's
    lists are written a block of requests at a time: sim.output.benchfiles.export_vllm)."""
    if key == "input_lens":
        return t.column("prompt_tokens")[rows].tolist()
    if key == "start_times":
        return t.values("arrival", rows)
    done = t.outcome_is("completed", rows)
    if key == "output_lens":
        return np.where(done, t.column("output_tokens")[rows], 0).tolist()
    if key == "errors":
        (reason, reasons), (outcome, outcomes) = t.text("reason"), t.text("outcome")
        return ["" if ok else (reasons[r] or outcomes[o])
                for ok, r, o in zip(done.tolist(), reason[rows].tolist(), outcome[rows].tolist(), strict=True)]
    end = t.column({"ttfts": "first_token", "latencies": "finish"}[key])[rows]
    return np.where(done, end - t.column("arrival")[rows], 0.0).tolist()


# Gaps (tokens) up to which the pooled ITLs' statistics are those of one value per token, as vLLM's lists are
# (describe_pooled: computed without expanding them); past it
# (a long run: 1,000,000 Azure requests are 260 M tokens, 2 GB as float64) the statistics are taken from the
# (gap, count) pairs: percentiles bit-identical (sim.metrics.summary.weighted_percentile), mean and std equal to
# rounding.
ITL_EXPAND_MAX = 1 << 24


_LEAF = 1 << 20  # expanded values summed by numpy at a time (8 MB), a node of numpy's own summation tree


def expanded_sum(values: np.ndarray, counts: np.ndarray, mean: float | None = None) -> float:
    """``np.sum(x)`` of ``x = np.repeat(values, counts)`` (with ``mean``: ``np.sum((x - mean) ** 2)``, what
    ``np.std`` sums) to the bit, holding at most ``_LEAF`` expanded values: fed a part at a time to a
    ``PairwiseSum``, which follows numpy's pairwise summation tree down to parts of ``_LEAF`` values and has numpy
    sum those (tests/test_long_runs.py compares it with numpy on 25 M values)."""
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    cum = np.cumsum(counts)
    starts = cum - counts
    n = int(cum[-1]) if cum.size else 0
    total = PairwiseSum(n, _LEAF)
    hi = 0
    for part in total.parts():  # elements [lo, hi) of x, one part of the tree: summed without a copy
        lo, hi = hi, hi + part
        i0, i1 = int(np.searchsorted(cum, lo, side="right")), int(np.searchsorted(cum, hi - 1, side="right"))
        reps = np.minimum(cum[i0 : i1 + 1], hi) - np.maximum(starts[i0 : i1 + 1], lo)
        x = np.repeat(values[i0 : i1 + 1], reps)
        if mean is not None:
            x -= mean
            x *= x
        total.add(x)
    return total.value()


def _kth(values: np.ndarray, counts: np.ndarray, ks: list[int]) -> list[float]:
    """The ``ks``-th (0-based) of the sorted expanded values."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(counts[order])
    return [float(v) for v in values[order][np.searchsorted(cum, ks, side="right")]]


def describe_pooled(name: str, values: np.ndarray, counts: np.ndarray, percentiles: Iterable[float]
                    ) -> dict[str, float]:
    """``_describe`` of ``np.repeat(values, counts)`` to the bit, without expanding it: a run's pooled ITLs are
    tens of millions of gaps (the expanded copy and numpy's sort of it were 250 MB at 100,000 requests)."""
    from sim.metrics.summary import weighted_percentile

    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    n = int(counts.sum())
    if n == 0:
        return _describe(name, np.zeros(0), percentiles)
    mean = expanded_sum(values, counts) / n  # np.mean: the sum over the count
    if n % 2:  # np.median: the middle value, or the mean of the two middle ones (0. + a + b, over 2)
        median = _kth(values, counts, [n // 2])[0]
    else:
        a, b = _kth(values, counts, [n // 2 - 1, n // 2])
        median = (0.0 + a + b) / 2
    out = {f"mean_{name}": mean, f"median_{name}": median,
           f"std_{name}": math.sqrt(expanded_sum(values, counts, mean) / n)}  # np.std: ddof 0
    for p in percentiles:
        out[f"{p_word(p)}_{name}"] = weighted_percentile(values, counts, p)
    return out


def itls_expand(result: RunResult) -> bool:
    """Whether the run's pooled ITLs are few enough to expand (``ITL_EXPAND_MAX``)."""
    return int(np.sum(np.asarray(result.itl_counts, dtype=np.int64))) <= ITL_EXPAND_MAX


def _describe_weighted(name: str, values: np.ndarray, counts: np.ndarray, percentiles: Iterable[float]
                       ) -> dict[str, float]:
    from sim.metrics.summary import weighted_percentile

    w = counts.astype(np.float64)
    total = float(w.sum())
    mean = dot(values, w) / total
    out = {f"mean_{name}": mean, f"median_{name}": weighted_percentile(values, counts, 50),
           f"std_{name}": math.sqrt(dot((values - mean) ** 2, w) / total)}
    for p in percentiles:
        out[f"{p_word(p)}_{name}"] = weighted_percentile(values, counts, p)
    return out


def run_stats(result: RunResult, percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """:func:`bench_stats` of a simulated run (its duration: first arrival to last completion)."""
    t = as_table(result.requests)  # read as columns
    done = t.outcome_is("completed")
    arrival = t.column("arrival")[done]
    expand = itls_expand(result)
    stats = bench_stats(
        t.column("first_token")[done] - arrival,
        t.column("finish")[done] - arrival,
        t.column("output_tokens")[done],
        t.column("prompt_tokens")[done],
        np.zeros(0),  # the ITL statistics below replace these (in place: the keys keep their order)
        float(result.duration),
        percentiles,
    )
    if expand:  # the statistics of the expanded gaps, to the bit
        stats.update(describe_pooled("itl", result.itl_gaps, result.itl_counts, tuple(percentiles)))
    else:
        counts = np.asarray(result.itl_counts, dtype=np.int64)
        keep = counts > 0
        gaps = np.asarray(result.itl_gaps, dtype=np.float64)[keep]
        stats.update(_describe_weighted("itl", gaps, counts[keep], tuple(percentiles)))
    return stats


def _weighted(name: str, values: np.ndarray, weights: np.ndarray, percentiles: Iterable[float]) -> dict[str, float]:
    """GuideLLM-style weighted statistics: mean exact; median/pNN the first value whose cumulative weight reaches
    the fraction (GuideLLM's own interpolation may differ slightly at small counts)."""
    keep = weights > 0
    v, w = values[keep], weights[keep].astype(np.float64)
    if not v.size:
        return {}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w) / w.sum()
    mean = float(np.sum(v * w) / w.sum())
    out = {f"mean_{name}": mean, f"std_{name}": float(np.sqrt(np.sum(w * (v - mean) ** 2) / w.sum()))}
    for key, q in (("median", 0.5), *((p_word(p), p / 100.0) for p in percentiles)):
        out[f"{key}_{name}"] = float(v[min(int(np.searchsorted(cum, q - 1e-12)), v.size - 1)])
    return out


def guidellm_stats(result: RunResult, percentiles: Iterable[float] = (50.0, 90.0, 95.0, 99.0)) -> dict[str, float]:
    """GuideLLM's ITL and TPOT (see sim/output/benchfiles/guidellm.py) of a simulated run, keyed gl_itl / gl_tpot."""
    done = [r for r in result.requests if r.outcome == "completed"]
    ttft = np.array([r.first_token - r.arrival for r in done], dtype=np.float64)
    e2el = np.array([r.finish - r.arrival for r in done], dtype=np.float64)
    out = np.array([r.output_tokens for r in done], dtype=np.int64)
    multi = out > 1
    itl = np.zeros(len(done))
    itl[multi] = (e2el[multi] - ttft[multi]) / (out[multi] - 1)
    tpot = np.divide(e2el, out, out=np.zeros(len(done)), where=out > 0)
    pct = tuple(percentiles)
    return {**_weighted("gl_itl", itl, np.where(multi, out - 1, 0), pct), **_weighted("gl_tpot", tpot, out, pct)}
