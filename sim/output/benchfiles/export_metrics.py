"""A simulated run as an OpenMetrics text exposition under vLLM's metric names (vllm/v1/metrics/loggers.py), so
that the dashboards and queries users have for a real server's ``/metrics`` read a simulated one.

Gauges are time series: one timestamped sample per step (thinned to at most ``max_points`` per engine), the
timestamp being the simulated time in seconds since the start of the run (not a Unix time). ``engine`` is the
replica index, as vLLM labels data-parallel engines. The KV usage is written under both of vLLM's names
(``kv_cache_usage_perc`` in v1, ``gpu_cache_usage_perc`` before; a fraction in [0, 1] despite the name, as in
vLLM). Histograms and the preemption counter are the state at the end of the run; the counter is also a series.
TPOT is written under v1's per-request name (``request_time_per_output_token_seconds``); ITL (pooled gaps) under
``inter_token_latency_seconds`` and, as vLLM does, under the deprecated ``time_per_output_token_seconds``.

Power and energy (sim/costs/energy.py), where the GPU has power figures, go under the names NVIDIA's DCGM exporter gives
them, so that GPU dashboards read them: ``DCGM_FI_DEV_POWER_USAGE`` (W of one GPU of the engine, per sampled
step) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ of one GPU since the start of the run, idle time at idle
power), labelled ``gpu`` with the engine's index and ``modelName`` with the GPU's name (DCGM's label for the GPU
model, not the served one). Both are gauges here (DCGM's energy is a counter without the
``_total`` suffix OpenMetrics requires of a counter's samples).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from sim.costs.energy import run_energy
from sim.costs.energy_time import running_energy
from sim.metrics.block_sums import PairwiseSum
from sim.metrics.records import RunResult
from sim.metrics.request_table import RequestTable, as_table, latency_blocks
from sim.metrics.step_columns import StepColumns, continues_ascending, step_blocks
from sim.metrics.sums import dot
from sim.output.benchfiles.export_vllm import _model_of
from sim.output.benchfiles.stats import expanded_sum, itls_expand
from sim.serving.spec_decode import openmetrics_lines

# vLLM's bucket boundaries (seconds) for these histograms
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(x: float) -> str:
    return repr(float(x))


def _histogram(lines: list[str], name: str, help_: str, labels: str, values: np.ndarray, buckets: Sequence[float],
               ts: str, weights: np.ndarray | None = None, total: float | None = None) -> None:
    """``weights``: how many times each value counts (pooled ITLs as (gap, count) pairs); ``total``: the values'
    sum when given."""
    v = np.asarray(values, dtype=np.float64)
    w = None if weights is None else np.asarray(weights, dtype=np.int64)
    counts = _bucket_counts(buckets, v, w)
    size = v.size if w is None else int(w.sum())
    if total is None:
        total = v.sum() if w is None else dot(v, w.astype(np.float64))
    _histogram_lines(lines, name, help_, labels, buckets, np.cumsum(counts), size, total, ts)


def _bucket_counts(buckets: Sequence[float], v: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """How many values (weighted by ``w``) fall in each bucket, the last past every bound."""
    # each value's bucket by a search of the few bounds (not a sort of the values: millions of inter-token gaps in
    # a long run); the cumulative sum of these is then the number of values <= each bound, as OpenMetrics wants
    bounds = np.asarray(buckets, dtype=np.float64)
    return np.bincount(np.searchsorted(bounds, v, side="left"), weights=w, minlength=bounds.size + 1)


class _Histogram:
    """One per-request latency's histogram (bucket counts, count and sum to the bit) fed a block of requests at a
    time, so that a long run's latencies are never held whole (they were some 150 bytes a request at once)."""

    def __init__(self, buckets: Sequence[float], n: int) -> None:
        self.buckets = buckets
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)
        self.n = n
        self.sum = PairwiseSum(n)  # v.sum() of the whole array, to the bit

    def add(self, v: np.ndarray) -> None:
        self.counts += _bucket_counts(self.buckets, v).astype(np.int64)
        self.sum.add(v)

    def write(self, lines: list[str], name: str, help_: str, labels: str, ts: str) -> None:
        _histogram_lines(lines, name, help_, labels, self.buckets, np.cumsum(self.counts), self.n, self.sum.value(),
                         ts)


def _request_histograms(table: RequestTable) -> tuple[_Histogram, _Histogram, _Histogram]:
    """The TTFT, TPOT and E2EL histograms of the completed requests, read a block at a time (two passes: the
    first counts the values, which the exact sums need up front)."""
    n_done = n_multi = 0
    for _, _, out_tok in latency_blocks(table):
        n_done += len(out_tok)
        n_multi += int(np.count_nonzero(out_tok > 1))
    ttft, tpot, e2el = _Histogram(TTFT_BUCKETS, n_done), _Histogram(TPOT_BUCKETS, n_multi), \
        _Histogram(E2E_BUCKETS, n_done)
    for t, e, out_tok in latency_blocks(table):
        multi = out_tok > 1
        ttft.add(t)
        tpot.add((e[multi] - t[multi]) / (out_tok[multi] - 1))
        e2el.add(e)
    return ttft, tpot, e2el


def _histogram_lines(lines: list[str], name: str, help_: str, labels: str, buckets: Sequence[float],
                     counts: np.ndarray, size: int, total: float, ts: str) -> None:
    """``counts[j]``: the values <= ``buckets[j]``."""
    lines += [f"# TYPE {name} histogram", f"# HELP {name} {help_}", f"# UNIT {name} seconds"] \
        if name.endswith("_seconds") else [f"# TYPE {name} histogram", f"# HELP {name} {help_}"]
    for b, c in zip(buckets, counts, strict=False):
        lines.append(f'{name}_bucket{{{labels},le="{_num(b)}"}} {int(c)}{ts}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {size}{ts}')
    lines.append(f"{name}_count{{{labels}}} {size}{ts}")
    lines.append(f"{name}_sum{{{labels}}} {_num(total)}{ts}")


def _thin(idx: np.ndarray, max_points: int) -> np.ndarray:
    if idx.size <= max_points:
        return idx
    return idx[_thin_range(idx.size, max_points)]


def _thin_range(count: int, max_points: int) -> np.ndarray:
    """``_thin(np.arange(count), max_points)`` without the arange: one index per distinct step end, 8 bytes a
    step (72 MB at 450,000 requests of bench_million), was the OpenMetrics export's largest array."""
    if count <= max_points:
        return np.arange(count)
    return np.linspace(0, count - 1, max_points).round().astype(np.int64)


def _gpu_name(result: RunResult) -> str:
    """The GPU the run recorded (a preset's name, or an inline GPU's), for DCGM's ``modelName`` label."""
    from sim.hardware.gpu import resolve_gpu

    gpu = ((result.config or {}).get("deployment") or {}).get("gpu")
    if gpu is None:
        return "unknown"
    try:
        return resolve_gpu(gpu).name
    except (KeyError, ValueError, TypeError, AttributeError):  # not one this version resolves
        return "unknown"


def _power_lines(result: RunResult, picked: list[tuple[int, np.ndarray, np.ndarray]],
                 ends: list[np.ndarray], end: np.ndarray | None) -> list[str]:
    """DCGM's power and energy series at the sampled steps (see the module docstring); none without power."""
    energy = run_energy(result)
    pm = result.power
    if energy is None or pm is None:
        return []
    gpu = _esc(_gpu_name(result))  # DCGM's modelName is the GPU's product name, not the served model's
    t0 = as_table(result.requests).least("arrival")
    power, energy_mj = [], []
    whole: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # read once, for every engine
    for j, (e, rows, _) in enumerate(picked):
        pm_e = pm.for_replica(e)  # engine e's GPUs (a disaggregated run's pools differ)
        steps = result.steps
        if isinstance(steps, StepColumns) and (end is None or (len(picked) == 1 and bool(np.all(end[1:] >= end[:-1])))):
            # one engine's log in end order: the running sums read where sampled, a block at a time; each sampled
            # step is the last to end at its time, so it is where the search of its end lands
            at = rows
            busy_j, busy_s, power_w = running_energy(pm_e, steps, at, rows)
            busy_j /= pm_e.gpus  # one GPU's, to the end of each step
            at = np.arange(len(rows))
        else:
            assert end is not None  # the whole columns' sampling
            if whole is None:
                dur = np.asarray(result.steps["duration"], dtype=np.float64)
                step_power_w = energy.step_power_w  # computed when read
                whole = (np.asarray(result.steps["replica"], dtype=np.int64), dur, step_power_w, step_power_w * dur)
            replica, dur, step_power_w, step_energy_j = whole
            mine = np.flatnonzero(replica == e)
            mine = mine[np.argsort(end[mine], kind="stable")]
            busy_j = np.cumsum(step_energy_j[mine]) / pm_e.gpus  # one GPU's, to the end of each step
            busy_s = np.cumsum(dur[mine])
            at = np.searchsorted(end[mine], end[rows], side="right") - 1  # each sampled row in the engine's order
            power_w = step_power_w[rows]
        idle_s = np.maximum(ends[j] - t0 - busy_s[at], 0.0)
        lab = f'gpu="{e}",modelName="{gpu}"'
        for k in range(len(rows)):
            t = f" {_num(ends[j][k])}"
            power.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} {_num(power_w[k] / pm_e.gpus)}{t}")
            mj = 1000.0 * (busy_j[at[k]] + idle_s[k] * pm_e.idle_w)
            energy_mj.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{lab}}} {_num(mj)}{t}")
    return ["# TYPE DCGM_FI_DEV_POWER_USAGE gauge", "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
            *power, "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION gauge",
            "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).", *energy_mj]


_Sampled = tuple[list[tuple[int, np.ndarray, np.ndarray]], list[np.ndarray], dict[str, list[np.ndarray]], float]
_GAUGES = {"num_running": np.int64, "num_waiting": np.int64, "kv_capacity_blocks": np.float64,
           "kv_blocks_used": np.float64}


def _sampled(s: Mapping[str, np.ndarray], max_points: int) -> tuple[np.ndarray, _Sampled]:
    """The steps the text samples, from the whole columns: every step's end, and (per engine: its number, the
    sampled rows, the cumulative preemptions there), the sampled rows' ends and gauges, and the last end."""
    # A long run has millions of steps and the text only samples max_points of them per engine: the full
    # columns are read one at a time and only the sampled rows kept (a copy of every column was 1.5 GB at
    # 300,000 requests).
    end = np.asarray(s["start"], dtype=np.float64) + np.asarray(s["duration"], dtype=np.float64)
    replica = np.asarray(s["replica"], dtype=np.int64)
    engines = np.unique(replica).tolist() or [0]
    preempt = np.asarray(s["num_preempted"], dtype=np.int64)
    picked: list[tuple[int, np.ndarray, np.ndarray]] = []  # (engine, step rows, cumulative preemptions there)
    for e in engines:
        # one engine's steps: all of them, read in place (no index or copy of a long run's columns)
        mine: np.ndarray | None = np.flatnonzero(replica == e) if len(engines) > 1 else None
        at = end if mine is None else end[mine]
        if at.size > 1 and not bool(np.all(at[1:] >= at[:-1])):  # in order already: the stable sort is a no-op
            order = np.argsort(at, kind="stable")
            mine, at = (order if mine is None else mine[order]), at[order]
        # one sample per distinct timestamp (the last step ending then), times strictly increasing
        pos = np.flatnonzero(np.r_[at[1:] != at[:-1], True]) if at.size else np.zeros(0, dtype=np.int64)
        del at
        pos = _thin(pos, max_points)
        picked.append((e, pos if mine is None else mine[pos],
                       np.cumsum(preempt if mine is None else preempt[mine])[pos]))
    del replica, preempt
    gauges = {}
    for key, dtype in _GAUGES.items():
        col: np.ndarray = np.asarray(s[key], dtype=dtype)
        gauges[key] = [col[rows] for _, rows, _ in picked]
    ends = [end[rows] for _, rows, _ in picked]
    return end, (picked, ends, gauges, float(end.max()) if end.size else 0.0)


def _last_of_each_end(s: StepColumns, keys: tuple[str, ...]
                      ) -> Iterator[tuple[int, dict[str, np.ndarray], np.ndarray, np.ndarray] | None]:
    """Block by block: (first row, the block's columns, its steps' ends, which step is the last to end at its
    time), one block ahead so that a block's last step is compared with the next block's first; None (and
    nothing more) when the ends are out of order."""
    prev: tuple[int, dict[str, np.ndarray], np.ndarray] | None = None
    for lo, b in step_blocks(s, ("start", "duration", *keys)):
        end = np.asarray(b["start"], dtype=np.float64) + np.asarray(b["duration"], dtype=np.float64)
        if not continues_ascending(end, None if prev is None else prev[2][-1]):
            yield None
            return
        if prev is not None:
            yield prev[0], prev[1], prev[2], np.r_[prev[2][1:] != prev[2][:-1], prev[2][-1] != end[0]]
        prev = (lo, b, end)
    if prev is not None:
        yield prev[0], prev[1], prev[2], np.r_[prev[2][1:] != prev[2][:-1], True]


def _sampled_in_blocks(s: StepColumns, max_points: int) -> _Sampled | None:
    """``_sampled`` of one engine's log whose steps end in order, a block of steps at a time in two passes (how
    many distinct ends, then the sampled rows' values) instead of five whole columns and an index per step."""
    count = 0
    for part in _last_of_each_end(s, ()):
        if part is None:
            return None
        count += int(part[3].sum())
    want = _thin_range(count, max_points)  # which of the distinct ends are sampled
    rows, ends, cum = [], [], []
    gauges: dict[str, list[np.ndarray]] = {k: [] for k in _GAUGES}
    seen = carry = 0  # distinct ends before the block; preemptions before it
    last_end = 0.0
    for part in _last_of_each_end(s, ("num_preempted", *_GAUGES)):
        assert part is not None
        lo, b, end, last = part
        pos = np.flatnonzero(last)
        a, z = np.searchsorted(want, [seen, seen + len(pos)], side="left")
        mine = pos[want[a:z] - seen]  # the block's sampled rows
        seen += len(pos)
        preempt = np.cumsum(np.asarray(b["num_preempted"], dtype=np.int64))
        rows.append(lo + mine)
        ends.append(end[mine])
        cum.append(carry + preempt[mine])
        carry += int(preempt[-1])
        for key, dtype in _GAUGES.items():
            gauges[key].append(np.asarray(b[key], dtype=dtype)[mine])
        last_end = float(np.max([last_end, end.max()])) if lo else float(end.max())
    if not rows:  # no steps: the whole (empty) columns' sampling
        return None
    picked = [(s.replica, np.concatenate(rows), np.concatenate(cum))]
    return picked, [np.concatenate(ends)], {k: [np.concatenate(v)] for k, v in gauges.items()}, last_end


def openmetrics_text(result: RunResult, *, max_points: int = 2000) -> str:
    model = _esc(_model_of(result) or result.name)
    s = result.steps
    sampled = _sampled_in_blocks(s, max_points) if isinstance(s, StepColumns) else None
    end: np.ndarray | None = None
    if sampled is None:
        end, sampled = _sampled(s, max_points)
    picked, ends, gauges, last_end = sampled
    running, waiting = gauges["num_running"], gauges["num_waiting"]
    caps = [np.where(c > 0, c, float(result.kv_capacity_blocks)) for c in gauges["kv_capacity_blocks"]]
    usages = [np.divide(u, c, out=np.zeros_like(u), where=c > 0)
              for u, c in zip(gauges["kv_blocks_used"], caps, strict=True)]
    series: dict[str, list[str]] = {k: [] for k in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc",
        "num_preemptions")}
    for j, (e, rows, cum) in enumerate(picked):
        lab = f'model_name="{model}",engine="{e}"'
        for k in range(len(rows)):
            t = f" {_num(ends[j][k])}"
            usage = usages[j][k]
            series["num_requests_running"].append(f"vllm:num_requests_running{{{lab}}} {int(running[j][k])}{t}")
            series["num_requests_waiting"].append(f"vllm:num_requests_waiting{{{lab}}} {int(waiting[j][k])}{t}")
            series["kv_cache_usage_perc"].append(f"vllm:kv_cache_usage_perc{{{lab}}} {_num(usage)}{t}")
            series["gpu_cache_usage_perc"].append(f"vllm:gpu_cache_usage_perc{{{lab}}} {_num(usage)}{t}")
            series["num_preemptions"].append(f"vllm:num_preemptions_total{{{lab}}} {int(cum[k])}{t}")
    helps = {
        "num_requests_running": ("gauge", "Number of requests in model execution batches."),
        "num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
        "kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
        "gpu_cache_usage_perc": ("gauge", "GPU KV-cache usage. 1 means 100 percent usage (older name)."),
        "num_preemptions": ("counter", "Cumulative number of preemption from the engine."),
    }
    lines: list[str] = []
    for key, (kind, help_) in helps.items():
        lines += [f"# TYPE vllm:{key} {kind}", f"# HELP vllm:{key} {help_}", *series[key]]
    table = as_table(result.requests)  # read as columns
    ttft, tpot, e2el = _request_histograms(table)
    # the end of the run: its last step's end, or a later finish (a rejection after it; every request rejected
    # and no step ran: stamped 0.0, before the first arrival)
    ts = f" {_num(max(last_end, table.most('finish')))}"
    lab = f'model_name="{model}",engine="0"'
    ttft.write(lines, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, ts)
    tpot.write(lines, "vllm:request_time_per_output_token_seconds",
               "Histogram of time_per_output_token_seconds per request.", lab, ts)
    # the sum of the expanded gaps to the bit (a long run's: the pairs' dot product)
    itl_sum = expanded_sum(result.itl_gaps, result.itl_counts) if itls_expand(result) else None
    _histogram(lines, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab,
               result.itl_gaps, TPOT_BUCKETS, ts, result.itl_counts, itl_sum)
    # vLLM observes every token gap here too (its count is requests x (output tokens - 1)), not the per-request
    # TPOT: a dashboard reading its mean as ITL would otherwise get the per-request mean
    _histogram(lines, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds. "
               "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", lab,
               result.itl_gaps, TPOT_BUCKETS, ts, result.itl_counts, itl_sum)
    e2el.write(lines, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, ts)
    if result.spec_decode:  # speculative decoding's counters, at the end of the run
        lines += openmetrics_lines(result.spec_decode, lab, ts)
    lines += _power_lines(result, picked, ends, end)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
