"""Run metrics: one flat dictionary per variant, with the names and definitions of `vllm bench serve`.

Latencies are taken over completed requests only:

- TTFT = first_token - arrival; E2EL = finish - arrival; queueing delay = first_scheduled - arrival;
- TPOT = (E2EL - TTFT) / (output_tokens - 1), one value per request with more than one output token;
- ITL = every gap between consecutive tokens, pooled. The run stores the gaps as (gap, count) pairs, so the
  percentiles are weighted; they equal ``np.percentile`` of the expanded multiset exactly.

Each latency holds mean, p50, p90, p95 and p99 in seconds (numpy's default linear interpolation); over more than
``EXACT_MAX`` values (a run of more than a million requests) the percentiles come from a quantile sketch, within
0.5% of the exact ones, and the summary's ``latency_sketch`` names the figures read that way. Step-level
figures (KV usage, batch size, ...) are weighted by step duration, i.e. averaged over the time the GPU computed.
An undefined value (no completed request, no steps, no SLO given) is NaN here and ``null`` in summary.json.

KV token utilisation is a share in [0, 1]: per step, the tokens stored over the token slots of the blocks in use
(kv_blocks_used x block_size), time-weighted. A token in a block shared by prefix caching is stored once but read
by several requests; the per-request count is capped at the slots in use, which reads shared blocks as full
(they are: only whole prompt blocks are shared). Without prefix caching the figure is exact.

A run whose requests carry classes (the workload's ``classes`` or a trace's columns) also gets ``classes``: the
figures above for each class (``slo_class``), its goodput and SLO attainment against its own SLOs (the run's
goodput then counts each request against its own class's SLOs too, so it is the sum of the classes'); and, when
requests name tenants, ``tenants`` and ``fairness`` (Jain's index of the service the tenants received while
backlogged, sim/metrics/fairness.py; see :func:`tenant_fairness`).

Statistics only: formatting lives in ``sim.output.run_folder`` and plotting in ``sim.output.report``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.config.errors import ScenarioError
from sim.config.slos import SLOs
from sim.costs.energy import energy_summary
from sim.metrics.anomalies import anomalies as run_anomalies
from sim.metrics.fairness import OUTPUT_WEIGHT, WINDOWS, backlogged_jain, jain_index
from sim.metrics.records import NO_CLASS, RequestRecord, RunResult, has_classes
from sim.metrics.registry import Metric, plugin_metrics
from sim.metrics.request_table import RequestTable, as_table, by_id
from sim.metrics.sketch import RELATIVE_ACCURACY, QuantileSketch
from sim.metrics.step_figures import step_figures
from sim.metrics.sums import dot
from sim.metrics.verdict import limit_inputs, rank_limits, rejection_reasons, waiting_spans
from sim.serving.request import Outcome
from sim.serving.spec_decode import summarize_spec

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
LATENCY_KEYS: tuple[str, ...] = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el", "queue")

# Every key of a summary, in the order summary.json writes them. Tests pin this list.
SUMMARY_KEYS: tuple[str, ...] = (
    "num_requests",
    "num_completed",
    "num_rejected",
    "num_failed",
    "num_preemptions",
    "num_steps",
    "num_replicas",
    "duration",  # seconds
    "total_input_tokens",  # prompt tokens of completed requests
    "total_output_tokens",  # output tokens of completed requests
    "request_throughput",  # completed requests / s
    "output_throughput",  # output tokens / s
    "total_token_throughput",  # (prompt + output) tokens / s
    "goodput",  # completed requests meeting every SLO (a request's own class SLOs first) / s; null without SLOs
    "slo_attainment",  # fraction of all requests that completed within every SLO; null without SLOs
    "slos",  # the thresholds used, seconds, or null
    "ttft",
    "tpot",
    "itl",
    "e2el",
    "queue",
    "kv_usage",  # {mean, max} of kv_blocks_used / kv_capacity_blocks
    "kv_token_utilization",  # share of the token slots of allocated blocks holding a token (shared ones once)
    "busy_fraction",  # time the GPU computed / duration
    "mfu",  # model FLOPs utilisation over the whole run
    "mean_batch_size",  # requests per step, weighted by step duration
    "padding_fraction",  # padding tokens / all computed tokens
    "limits",  # what the verdict reads: offered vs served rate, queue trend, slot fill, MFU while busy
    # (sim.metrics.verdict)
    "rejections",  # why requests were rejected: {reason: requests}, most first ({} for none; sim.metrics.verdict)
    "energy",  # joules and watts (sim/costs/energy.py): energy_j, j_per_output_token, mean_power_w...; null: not
    # modelled
)

NAN = float("nan")
# Enum.value is a slow property: read once
_COMPLETED, _REJECTED, _FAILED = Outcome.COMPLETED.value, Outcome.REJECTED.value, Outcome.FAILED.value

# Keys of each class's block in summary.json (``classes``), in order. Tests pin this list.
CLASS_SUMMARY_KEYS: tuple[str, ...] = (
    "num_requests",
    "num_completed",
    "num_rejected",
    "num_failed",
    "priority",  # the class's priority when all its requests share one, else null
    "tenant",  # likewise its tenant
    "slos",  # the thresholds its goodput counts: its own TTFT/TPOT SLOs, else the scenario's; null: none
    "total_output_tokens",
    "request_throughput",  # its completed requests / the run's duration
    "output_throughput",
    "goodput",  # its completed requests within its SLOs / the run's duration
    "slo_attainment",  # its requests that completed within its SLOs / its requests
    "ttft",
    "tpot",
    "itl",  # percentiles only when the run kept token times (keep_token_times); the mean always
    "e2el",
    "queue",
)


def weighted_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.percentile(np.repeat(values, counts), q)`` (linear method), without expanding the array.

    Reproduces numpy's arithmetic step for step (virtual index ``(n - 1) * q/100`` and its two-sided lerp), so
    the result is bit-identical, not merely close. Entries with a count of zero or less are ignored.
    """
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    if values.size == 0:
        return NAN
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(counts[order])
    n = int(cum[-1])
    virtual = (n - 1) * (float(q) / 100.0)
    if virtual >= n - 1:  # numpy takes the maximum here
        return float(values[-1])
    if virtual < 0:
        return float(values[0])
    lo = math.floor(virtual)
    gamma = virtual - lo
    # element k of the expanded sorted array lies in the first group whose cumulative count exceeds k
    a, b = values[np.searchsorted(cum, [lo, lo + 1], side="right")]
    a, b = float(a), float(b)
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


# Per-request values of one latency figure (TTFT, TPOT, E2EL, queue) kept exact. Past this many (a run of more than
# a million requests), its percentiles come from a QuantileSketch (sim/metrics/sketch.py: within RELATIVE_ACCURACY
# of the exact ones) and summary.json says so in ``latency_sketch``; every run up to this size keeps the exact
# figures it always had. The ITL is pooled as (gap, count) pairs, compact already, and stays exact.
EXACT_MAX = 1_000_000
_SKETCH_CHUNK = 1 << 20  # values added to a sketch at a time (its temporaries stay a few MB)


def _sketch_stats(values: np.ndarray) -> dict[str, float]:
    sketch = QuantileSketch(RELATIVE_ACCURACY)
    for lo in range(0, values.size, _SKETCH_CHUNK):
        sketch.add(values[lo : lo + _SKETCH_CHUNK])
    return sketch.stats(PERCENTILES)


def latency_stats(values: np.ndarray, counts: np.ndarray | None = None) -> dict[str, float]:
    """{mean, p50, p90, p95, p99} of the values (weighted by counts when given); NaN for no values. Over more than
    ``EXACT_MAX`` values given one by one (a request's each), read from a quantile sketch (percentiles within
    ``RELATIVE_ACCURACY``). Weighted values (the pooled inter-token gaps) are already compact: always exact."""
    values = np.asarray(values, dtype=np.float64)
    if counts is None and values.size > EXACT_MAX and not (values < 0).any():  # a sketch takes latencies >= 0
        return _sketch_stats(values)
    if counts is None:
        if values.size == 0:
            return {k: NAN for k in LATENCY_KEYS}
        out = {"mean": float(np.mean(values))}
        pcts = np.percentile(values, PERCENTILES)
        out.update({f"p{q}": float(p) for q, p in zip(PERCENTILES, pcts, strict=True)})
        return out
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts[counts > 0].sum()) if counts.size else 0
    if total == 0:
        return {k: NAN for k in LATENCY_KEYS}
    pos = counts > 0
    out = {"mean": dot(values[pos], counts[pos].astype(np.float64)) / total}
    out.update({f"p{q}": weighted_percentile(values, counts, q) for q in PERCENTILES})
    return out


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else NAN


def _time_weighted_mean(x: np.ndarray, w: np.ndarray) -> float:
    total = float(w.sum()) if w.size else 0.0
    return dot(x, w) / total if total > 0 else NAN


def num_replicas(result: RunResult) -> int:
    """Replicas of the run, as seen in the request records (at least 1). Busy fraction and MFU divide by it."""
    replica = as_table(result.requests, keep=True).column("replica")
    return int(replica.max()) + 1 if replica.size else 1


def kv_usage_per_step(result: RunResult, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The KV usage share of each step that has a KV capacity and those steps' durations, and the blocks used in
    every step. A step logged without its capacity (0) uses the run's."""
    s = result.steps
    cap = np.asarray(s["kv_capacity_blocks"], dtype=np.float64)
    cap = np.where(cap > 0, cap, float(result.kv_capacity_blocks))
    used = np.asarray(s["kv_blocks_used"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        usage = np.where(cap > 0, used / cap, np.nan)
    has_cap = ~np.isnan(usage)
    if not has_cap.all():  # a masked copy only where some step has no capacity (long runs: memory)
        return usage[has_cap], dur[has_cap], used
    return usage, dur, used


def summarize(result: RunResult, slos: SLOs | None = None) -> dict:
    """The metrics of one run, keyed as SUMMARY_KEYS. See the module docstring for the definitions."""
    if slos is not None and slos.empty:
        slos = None
    table = as_table(result.requests, keep=True)  # read as columns (a long run's requests are kept so)
    # the readers below (energy, anomalies, the verdict's inputs) take result.requests as columns too: a list of
    # records is turned into columns once, here, not once by each of them (8 times, 10 ms of a 1,000-request run)
    caller = result
    result = replace(result, requests=table)
    reqs = table
    done = table.outcome_is(_COMPLETED)
    duration = float(result.duration)
    total_out = int(table.column("output_tokens", done).sum())
    replicas = num_replicas(result)
    # replica-seconds the fleet was up: an autoscaled cluster's replicas come and go
    up = result.cluster["replica_seconds"] if result.cluster else duration * replicas
    # energy before the latencies: its attribution and the latencies are each several arrays a request, and were
    # held at once (a long run's summary peak: 122 bytes a request above the rest, bench_million, tracemalloc)
    # of the caller's result: the one whose energy a scenario keeps for its run folder (ScenarioRun.energy)
    energy = energy_summary(result, total_out, duration, up, caller)
    # every step's figures in one pass of blocks (a long run's whole columns are 160 MB each at 20 M steps), and
    # the verdict's inputs from them, also before the latencies (several arrays a request each)
    fig = step_figures(result.steps, result.kv_capacity_blocks, result.block_size)
    limits = limit_inputs(result, fig)
    lat = _Latencies.of_table(table, done)
    ttft, e2el, multi, tpot_all = lat.ttft, lat.e2el, lat.multi, lat.tpot_all
    n_done = int(done.sum())
    total_in = int(table.column("prompt_tokens", done).sum())

    goodput = slo_attainment = NAN
    if (table.column("ttft_slo") >= 0).any() or (table.column("tpot_slo") >= 0).any():  # classes with own SLOs
        own_ttft, own_tpot = table.column("ttft_slo")[done], table.column("tpot_slo")[done]
        good = _within_slos(own_ttft, own_tpot, lat, slos)  # so the run's figure is the sum of its classes'
        goodput = _ratio(int(good.sum()), duration)
        slo_attainment = _ratio(int(good.sum()), len(reqs))
        del good, own_ttft, own_tpot
    elif slos is not None:
        good = np.ones(n_done, dtype=bool)
        for limit, vals in ((slos.ttft, ttft), (slos.tpot, tpot_all), (slos.e2el, e2el)):
            if limit is not None:
                good &= vals <= limit
        goodput = _ratio(int(good.sum()), duration)
        slo_attainment = _ratio(int(good.sum()), len(reqs))
        del good, vals
    # each latency's figures now, and its array dropped: what follows (rejections, anomalies, classes) reads the
    # table again, and held beside it a long run's latencies were 41 bytes a request
    lat_stats = {"ttft": latency_stats(ttft), "tpot": latency_stats(tpot_all[multi]), "e2el": latency_stats(e2el),
                 "queue": latency_stats(lat.queue)}
    sketched = [k for k, n in (("ttft", ttft.size), ("tpot", int(multi.sum())), ("e2el", e2el.size),
                               ("queue", lat.queue.size)) if n > EXACT_MAX]
    del lat, ttft, e2el, multi, tpot_all

    kv_usage = {"mean": fig.kv_usage_mean, "max": fig.kv_usage_max}
    # A share of the token slots of the blocks in use that hold a token. kv_tokens counts a token once per
    # request that reads it, so a block shared by prefix caching counts several times (174% was seen); shared
    # blocks are full prompt blocks, so the stored tokens are capped at the slots in use: the share stays in
    # [0, 1] and is exact without prefix caching. Each value is at most 1; the weighted mean can round to 1 + 2e-16.
    kv_tok_util = min(fig.kv_token_share, 1.0)

    busy, flops, computed, padding = fig.busy, fig.flops, fig.computed_tokens, fig.padding_tokens
    mean_batch = fig.batch_dot / busy if busy > 0 else NAN
    num_steps = fig.num_steps
    out = {
        "num_requests": len(table),
        "num_completed": n_done,
        "num_rejected": int(table.outcome_is(_REJECTED).sum()),
        "num_failed": int(table.outcome_is(_FAILED).sum()),
        "num_preemptions": int(table.column("num_preemptions").sum()),
        "num_steps": num_steps,
        "num_replicas": replicas,
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _ratio(n_done, duration),
        "output_throughput": _ratio(total_out, duration),
        "total_token_throughput": _ratio(total_in + total_out, duration),
        "goodput": goodput,
        "slo_attainment": slo_attainment,
        "slos": None if slos is None else slos.as_dict(),
        "ttft": lat_stats["ttft"],
        "tpot": lat_stats["tpot"],
        "itl": latency_stats(result.itl_gaps, result.itl_counts),
        "e2el": lat_stats["e2el"],
        "queue": lat_stats["queue"],
        "kv_usage": kv_usage,
        "kv_token_utilization": kv_tok_util,
        # a share: steps back to back from the first arrival to the last finish sum to 1 + 2e-16 of the run
        "busy_fraction": min(_ratio(busy, up), 1.0),
        "mfu": _ratio(flops, up * result.peak_flops) if result.peak_flops > 0 else NAN,
        "mean_batch_size": mean_batch,
        "padding_fraction": _ratio(padding, computed),
        "limits": limits,
        "rejections": rejection_reasons(reqs),
        # watts and joules (sim/costs/energy.py); null where the run has no power model (RunResult.power says when)
        "energy": energy,
    }
    assert tuple(out) == SUMMARY_KEYS
    if sketched:  # a run too long for exact percentiles: which figures are sketched, and their bound
        out["latency_sketch"] = {"metrics": sketched, "relative_accuracy": RELATIVE_ACCURACY,
                                 "exact_max": EXACT_MAX}
    if has_classes(reqs):  # request classes: each class's figures, and the tenants' when requests name them
        out["classes"] = class_summaries(reqs, duration, slos, result.class_itl)
        if any(table.text("tenant")[1]):  # some request names a tenant
            out["tenants"], out["fairness"] = tenant_fairness(reqs)
    indices = [p["replica"] for p in result.cluster["per_replica"]] if result.cluster else list(range(replicas))
    anomalies = run_anomalies(reqs, duration, indices)  # computed for every run, written when it has something to say
    if anomalies is not None:
        out["anomalies"] = anomalies
    if result.cluster:  # several replicas: what the fleet cost
        c = result.cluster
        fleet = {k: c[k] for k in ("router", "replicas_start", "replicas_max", "replicas_mean", "gpu_hours",
                                   "cost_usd", "price_per_replica_hour")}
        fleet["cost_per_million_output_tokens"] = _ratio(c["cost_usd"] * 1e6, total_out)
        out["cluster"] = fleet
    if result.spec_decode:  # speculative decoding: acceptance and the proposer's share of the busy time
        out["spec_decode"] = summarize_spec(result.spec_decode, busy)
    if result.pipeline:  # pipeline stages (sim/serving/pipeline.py)
        out["pipeline"] = dict(result.pipeline)
    if result.host_kv:  # the prefix cache's host tier (sim/serving/host_kv_tier.py)
        out["host_kv"] = dict(result.host_kv)
    for key, section in (result.summary_sections or {}).items():  # e.g. prefill/decode pools (sim/loop/disagg/pools.py)
        out[key] = section(result)
    for metric in plugin_metrics():  # plugins' metrics (sim/metrics/registry.py), after every built-in key
        if metric.key in out:
            raise ScenarioError(f"metric {metric.key!r} (a plugin's): summary.json already has that key")
        out[metric.key] = _plugin_value(metric, result)
    return out


def _plugin_value(metric: Metric, result: RunResult) -> float:
    """A plugin metric's value as a float (NaN, null in summary.json, where undefined); its failure one clear
    error naming it."""
    try:
        return float(metric.compute(result))  # type: ignore[misc]
    except Exception as e:  # the plugin's code: one line naming the metric rather than a traceback
        raise ScenarioError(f"metric {metric.key!r} (a plugin's) failed: {type(e).__name__}: {e}") from None


def bottleneck(summary: dict) -> str:
    """One line naming what limits the run, with the numbers behind it: the top of ``sim.metrics.verdict.rank_limits``
    (overload first when requests pile up, then the strongest of batch-slot cap, KV memory, padding and the step
    roofline: compute- or bandwidth-bound)."""
    return rank_limits(summary).text


@dataclass(frozen=True, slots=True, eq=False)
class _Latencies:
    """Per-request latencies of completed requests, with summarize's definitions (seconds)."""

    ttft: np.ndarray
    e2el: np.ndarray
    queue: np.ndarray
    multi: np.ndarray  # requests with more than one output token (those that have a TPOT)
    tpot_all: np.ndarray  # TPOT, 0 for single-token requests (vLLM's goodput reading)
    out_tok: np.ndarray

    @classmethod
    def of(cls, done: Sequence[RequestRecord]) -> _Latencies:
        table = as_table(done)
        return cls.of_table(table, np.ones(len(table), dtype=bool))

    @classmethod
    def of_table(cls, table: RequestTable, done: np.ndarray) -> _Latencies:
        """The latencies of the requests ``done`` selects (completed ones) of a table."""
        arrival = table.column("arrival", done)
        ttft = table.column("first_token", done) - arrival
        e2el = table.column("finish", done) - arrival
        scheduled = table.column("first_scheduled", done)
        # a request observed from outside (servesim observe) has no first scheduled step: no queueing delay
        queue = (scheduled - arrival)[scheduled >= 0]
        del arrival, scheduled  # each a value a request: a long run's summary holds what it keeps, no more
        out_tok = table.column("output_tokens", done)
        multi = out_tok > 1
        tpot_all = np.zeros(len(out_tok))  # vLLM scores single-token requests as TPOT 0 for goodput
        tpot_all[multi] = (e2el[multi] - ttft[multi]) / (out_tok[multi] - 1)
        return cls(ttft, e2el, queue, multi, tpot_all, out_tok)


def _one(values: set) -> object:
    return next(iter(values)) if len(values) == 1 else None


def _class_slos(first: RequestRecord, slos: SLOs | None) -> dict[str, float | None] | None:
    """The thresholds the class is held to: its requests' own TTFT/TPOT SLOs (its ``first`` request's: a class's
    requests share them), else the scenario's; E2EL the scenario's. None when no metric is bounded."""
    run = slos if slos is not None else SLOs()
    out = {"ttft": first.ttft_slo if first.ttft_slo >= 0 else run.ttft,
           "tpot": first.tpot_slo if first.tpot_slo >= 0 else run.tpot,
           "e2el": run.e2el}
    return None if all(v is None for v in out.values()) else out


def _within_slos(ttft_slo: np.ndarray, tpot_slo: np.ndarray, lat: _Latencies, slos: SLOs | None) -> np.ndarray:
    """Which completed requests met every SLO they are held to: their own TTFT/TPOT bounds (``ttft_slo``,
    ``tpot_slo``; -1: none) where they carry one, else the scenario's (a request with no bound at all meets them
    trivially)."""
    run = slos if slos is not None else SLOs()
    good = np.ones(len(lat.ttft), dtype=bool)
    for own, default, vals in ((ttft_slo, run.ttft, lat.ttft), (tpot_slo, run.tpot, lat.tpot_all)):
        limit = np.where(own >= 0, own, np.inf if default is None else default)
        good &= vals <= limit
    if run.e2el is not None:
        good &= lat.e2el <= run.e2el
    return good


def class_summaries(reqs: Sequence[RequestRecord], duration: float, slos: SLOs | None = None,
                    itl: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, dict]:
    """Each class's figures (``CLASS_SUMMARY_KEYS``), keyed by class name in sorted order (requests without a
    name under ``NO_CLASS``). Latencies over the class's completed requests, as summarize's; throughputs and
    goodput over the whole run's duration, so the classes' figures add up to the run's. Goodput counts a
    request against its own TTFT/TPOT SLOs, or the scenario's where it has none; null when the class is held to
    no SLO at all. ITL: its mean from the records (exact), its percentiles only from ``itl``, the class's pooled
    gaps (``RunResult.class_itl``, kept with the token times), else null."""
    table = as_table(by_id(reqs))  # read as columns, in id order
    groups: dict[str, np.ndarray] = {}
    for value, mask in table.groups("slo_class").items():
        if not mask.any():
            continue
        key = value or NO_CLASS
        groups[key] = groups[key] | mask if key in groups else mask
    out: dict[str, dict] = {}
    for name in sorted(groups):
        group = table.select(groups[name])
        done = group.outcome_is(_COMPLETED)
        lat = _Latencies.of_table(group, done)
        bounds = _class_slos(group[0], slos)
        goodput = attainment = NAN
        if bounds is not None:
            own_ttft, own_tpot = group.column("ttft_slo")[done], group.column("tpot_slo")[done]
            n_good = int(_within_slos(own_ttft, own_tpot, lat, slos).sum())
            goodput, attainment = _ratio(n_good, duration), _ratio(n_good, len(group))
        if itl is not None and name in itl:
            itl_stats = latency_stats(*itl[name])
        else:
            gaps = int((lat.out_tok - 1).sum()) if done.any() else 0
            itl_stats = {k: NAN for k in LATENCY_KEYS}
            # the mean of a class's pooled gaps is exact: its requests' gaps sum to finish - first token
            itl_stats["mean"] = _ratio(float((lat.e2el - lat.ttft).sum()), gaps)
        total_out = int(lat.out_tok.sum())
        block = {
            "num_requests": len(group),
            "num_completed": int(done.sum()),
            "num_rejected": int(group.outcome_is(_REJECTED).sum()),
            "num_failed": int(group.outcome_is(_FAILED).sum()),
            "priority": _one(set(group.column("priority").tolist())),
            "tenant": _one({v for v, mask in group.groups("tenant").items() if mask.any()}),
            "slos": bounds,
            "total_output_tokens": total_out,
            "request_throughput": _ratio(int(done.sum()), duration),
            "output_throughput": _ratio(total_out, duration),
            "goodput": goodput,
            "slo_attainment": attainment,
            "ttft": latency_stats(lat.ttft),
            "tpot": latency_stats(lat.tpot_all[lat.multi]),
            "itl": itl_stats,
            "e2el": latency_stats(lat.e2el),
            "queue": latency_stats(lat.queue),
        }
        assert tuple(block) == CLASS_SUMMARY_KEYS
        out[name] = block
    return out


def tenant_fairness(reqs: Sequence[RequestRecord]) -> tuple[dict[str, dict], dict]:
    """Each tenant's service and Jain's fairness index over the tenants (requests without a tenant are left out).

    The index (``jain_index``) compares the service the tenants received while backlogged (sim/metrics/fairness.py:
    it tells VTC from FCFS, where every request completes under both). A tenant's ``service`` beside it is the
    output tokens its completed requests received divided by the output tokens all its requests asked for
    (``target_output_tokens``): the share of its demand that was served, which measures who got served at all
    (rejections, failures, admission rules); ``served_share_jain_index`` is :func:`jain_index` of those shares.
    ``jain_index`` is the lower of the two: a request rejected at arrival never waits, so a tenant whose every
    request is refused is never backlogged and the windows alone would call its starvation fair (1.0).
    How long each tenant waited is in its TTFT and E2EL.
    """
    table = as_table(by_id(reqs))  # read as columns, in id order
    groups = {name: mask for name, mask in table.groups("tenant").items() if name and mask.any()}
    tenants: dict[str, dict] = {}
    for name in sorted(groups):
        group = table.select(groups[name])
        done = group.outcome_is(_COMPLETED)
        lat = _Latencies.of_table(group, done)
        served = int(lat.out_tok.sum())
        demand = int(group.column("target_output_tokens").sum())
        tenants[name] = {
            "num_requests": len(group),
            "num_completed": int(done.sum()),
            "output_tokens_served": served,
            "output_tokens_demanded": demand,
            "service": _ratio(served, demand),
            "ttft": latency_stats(lat.ttft),
            "e2el": latency_stats(lat.e2el),
        }
    shares = [t["service"] for t in tenants.values()]
    backlogged, windows = backlogged_jain(table, groups, waiting_spans(table))
    served_share = jain_index(shares)
    fairness = {"jain_index": backlogged if math.isnan(served_share) else min(backlogged, served_share),
                "over": f"tenants' service (prompt + {OUTPUT_WEIGHT:g} x output tokens) in the windows where two or "
                        "more were backlogged, or served_share_jain_index where lower (a tenant refused is never "
                        "backlogged) (sim/metrics/fairness.py)",
                "num_tenants": len(tenants), "backlogged_windows": windows, "windows": WINDOWS,
                "served_share_jain_index": served_share}
    return tenants, fairness
