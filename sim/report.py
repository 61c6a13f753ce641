"""The offline HTML report: a summary table, a bottleneck verdict per variant and plotly figures.

The figures, in page order: the rows of the batch over time (``fig_batch_slots``), GPU memory as a stack of
weights and KV (``fig_memory_stack``), utilisation on one time axis (``fig_timeline``), latency CDFs
(``fig_latency_cdfs``), throughput and tail latency against the swept parameter when the run is a sweep
(``fig_sweep``), and throughput over time (``fig_throughput``).

Each figure comes from a ``fig_*`` function, so a notebook can show the same pictures. The page embeds
plotly.js once (the first figure) and the later figures refer to it, so the file opens without a network.

Long runs are reduced before plotting, never drawn point by point: quantities that accumulate (busy time,
FLOPs, tokens) are integrated exactly over at most ``max_points`` windows; states (KV usage, queue length) take
their maximum (timeline) or mean (memory) per window; CDFs are sampled at evenly spaced probabilities; the slot
chart draws one window in which no variant starts more than ``SLOT_REQUESTS`` requests. Window series are
written with ``x0``/``dx`` and float32 values, which keeps a 600k-step run well under 5 MB, plotly.js included.

To add a section, write a builder ``(results, summaries) -> list[Section]`` and append it to ``SECTIONS`` (or
pass ``sections=`` to ``build_report``).
"""

from __future__ import annotations

import heapq
import html
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import yaml
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from sim.files import write_atomically
from sim.metrics import bottleneck, summarize
from sim.records import RunResult
from sim.request import Outcome
from sim.table import table_cells
from sim.verdict import rank_limits

MAX_POINTS = 1000  # most points a plotted series may have
MIN_WINDOWS = 20  # fewest windows a timeline uses, however short the run

# A small template: plotly's named ones add about 7 kB of JSON to every figure.
TEMPLATE = go.layout.Template(
    layout=dict(
        paper_bgcolor="white",
        plot_bgcolor="white",
        font=dict(family="sans-serif", size=12),
        xaxis=dict(gridcolor="#e5e5e5", zerolinecolor="#cccccc", showline=True, linecolor="#999999"),
        yaxis=dict(gridcolor="#e5e5e5", zerolinecolor="#cccccc", showline=True, linecolor="#999999"),
        hovermode="x unified",
        margin=dict(l=70, r=30, t=50, b=50),
    )
)
COLORS = qualitative.Plotly


def color(i: int) -> str:
    """The colour of the i-th variant, the same in every figure."""
    return COLORS[i % len(COLORS)]


# --- reducing long series --------------------------------------------------------------------------------------


def common_end(results: list[RunResult]) -> float:
    """One time axis for the per-variant charts: the latest end over the runs, so the variants line up."""
    return max((run_end(r) for r in results), default=1.0)


def run_end(result: RunResult) -> float:
    """The end of the run's time axis: the last step's end, the last finish or the duration, whichever is last."""
    s = result.steps
    ends = [float(result.duration)]
    if len(s["start"]):
        ends.append(float(np.max(s["start"] + s["duration"])))
    ends += [r.finish for r in result.requests]
    return max(ends)


def window_edges(t_end: float, n_steps: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Edges of equal windows over [0, t_end]: about one window per four steps, between MIN_WINDOWS and
    max_points windows."""
    n = int(min(max_points, max(MIN_WINDOWS, n_steps // 4)))
    return np.linspace(0.0, max(t_end, 1e-9), n + 1)


def amount_per_window(starts: np.ndarray, durations: np.ndarray, amounts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Sum of each step's amount that falls in each window, the amount spread evenly over the step's duration
    (a zero-length step counts at its start; windows are half-open [a, b), the last one closed). Exact for
    overlapping steps too (several replicas)."""
    starts = np.asarray(starts, dtype=np.float64)
    durations = np.asarray(durations, dtype=np.float64)
    amounts = np.asarray(amounts, dtype=np.float64)
    cum = np.zeros(len(edges))
    point = durations <= 0
    if point.any():
        order = np.argsort(starts[point], kind="stable")
        t, a = starts[point][order], amounts[point][order]
        idx = np.searchsorted(t, edges, side="left")
        idx[-1] = np.searchsorted(t, edges[-1], side="right")  # the last window is closed
        cum += np.concatenate(([0.0], np.cumsum(a)))[idx]
    if (~point).any():
        s, d, a = starts[~point], durations[~point], amounts[~point]
        rate = a / d
        times = np.concatenate((s, s + d))
        order = np.argsort(times, kind="stable")
        times = times[order]
        rate_after = np.cumsum(np.concatenate((rate, -rate))[order])  # rate on [times[i], times[i+1])
        at_times = np.concatenate(([0.0], np.cumsum(np.diff(times) * rate_after[:-1])))
        cum += np.interp(edges, times, at_times)  # the cumulative amount is linear between those times
    return np.diff(cum)


def state_per_window(t: np.ndarray, values: np.ndarray, edges: np.ndarray, how: str = "max") -> np.ndarray:
    """Per window, the maximum (how="max") or mean (how="mean") of the values whose time t (sorted) falls in
    it. A window without any keeps the previous window's value: the state holds while nothing runs."""
    nb = len(edges) - 1
    out = np.full(nb, np.nan)
    if len(t) == 0:
        return out
    values = np.asarray(values, dtype=np.float64)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1)
    uniq, first = np.unique(b, return_index=True)
    if how == "max":
        agg = np.maximum.reduceat(values, first)
    elif how == "mean":
        agg = np.add.reduceat(values, first) / np.diff(np.append(first, len(values)))
    else:
        raise ValueError(f"how must be 'max' or 'mean', got {how!r}")
    out[uniq] = agg
    idx = np.where(np.isnan(out), 0, np.arange(nb))
    np.maximum.accumulate(idx, out=idx)
    return out[idx]


def _windowed(edges: np.ndarray, y: np.ndarray) -> dict:
    """Trace arguments for per-window values: implicit x (x0, dx), float32 y, drawn as steps."""
    return dict(x0=float(edges[0]), dx=float(edges[1] - edges[0]), y=np.asarray(y, dtype=np.float32), line_shape="hv")


def _state_trace(t: np.ndarray, v: np.ndarray, edges: np.ndarray, how: str, max_points: int) -> dict:
    """A state series: the raw points when there are few, else one value per window."""
    if len(t) <= max_points:
        return dict(x=np.asarray(t, dtype=np.float64), y=np.asarray(v, dtype=np.float32), line_shape="hv")
    return _windowed(edges, state_per_window(t, v, edges, how))


def _count_trace(times: np.ndarray, weights: np.ndarray, edges: np.ndarray, max_points: int) -> dict:
    """A cumulative count of events: exact steps when few, else its value at each window's end."""
    order = np.argsort(times, kind="stable")
    times = np.asarray(times, dtype=np.float64)[order]
    cum = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    if len(times) <= max_points:
        x = np.concatenate(([0.0], times, [edges[-1]]))
        y = np.concatenate(([0.0], cum, [cum[-1] if len(cum) else 0.0]))
        return dict(x=x, y=y.astype(np.float32), line_shape="hv")
    at_end = np.concatenate(([0.0], cum))[np.searchsorted(times, edges[1:], side="right")]
    return dict(x0=float(edges[1]), dx=float(edges[1] - edges[0]), y=at_end.astype(np.float32), line_shape="hv")


def ecdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> dict:
    """Trace arguments for an empirical CDF: x = values (float32: plenty for a picture), y implicit (y0, dy).
    Every value when there are at most max_points; else the quantiles at max_points evenly spaced
    probabilities from 0 to 1."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = len(v)
    if n <= max_points:
        return dict(x=v.astype(np.float32), y0=1.0 / max(n, 1), dy=1.0 / max(n, 1), line_shape="hv")
    p = np.linspace(0.0, 1.0, max_points)
    return dict(x=np.quantile(v, p).astype(np.float32), y0=0.0, dy=1.0 / (max_points - 1))


def trace_points(fig: go.Figure) -> int:
    """The most points any trace of the figure holds (for tests of the downsampling)."""
    most = 0
    for tr in fig.data:
        for attr in ("x", "y"):
            v = getattr(tr, attr, None)
            if v is not None:
                most = max(most, len(v))
    return most


# --- figures ---------------------------------------------------------------------------------------------------


def latencies(result: RunResult) -> dict[str, np.ndarray]:
    """TTFT, TPOT and E2EL of the completed requests (seconds)."""
    done = [r for r in result.requests if r.completed]
    arr = np.array([r.arrival for r in done], dtype=np.float64)
    ft = np.array([r.first_token for r in done], dtype=np.float64)
    fin = np.array([r.finish for r in done], dtype=np.float64)
    out = np.array([r.output_tokens for r in done], dtype=np.int64)
    multi = out > 1
    return {
        "ttft": ft - arr,
        "tpot": (fin[multi] - ft[multi]) / (out[multi] - 1),
        "e2el": fin - arr,
    }


CDF_PANELS = (("ttft", "TTFT (ms)", 1e3), ("tpot", "TPOT (ms)", 1e3), ("e2el", "E2EL (s)", 1.0))
MARKED_PERCENTILES = (50, 95, 99)
CDF_LOG_SPAN = 100.0  # a panel whose values span more than this ratio (two decades) gets a log x axis


def spans_decades(values: list[np.ndarray], ratio: float = CDF_LOG_SPAN) -> bool:
    """Whether the positive values span more than ``ratio`` (max over min): on a linear axis the small ones
    collapse into a vertical line (a 0.3 s TTFT next to a 700 s one)."""
    pos = [v[v > 0] for v in values if len(v)]
    pos = [v for v in pos if len(v)]
    if not pos:
        return False
    lo, hi = min(float(v.min()) for v in pos), max(float(v.max()) for v in pos)
    return hi > ratio * lo


def fig_latency_cdfs(results: list[RunResult], max_points: int = MAX_POINTS) -> go.Figure:
    """CDFs of TTFT, TPOT and E2EL side by side, one curve per variant, with p50/p95/p99 marked."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in CDF_PANELS], horizontal_spacing=0.07)
    lats = [latencies(res) for res in results]
    for i, (res, lat) in enumerate(zip(results, lats, strict=True)):
        for col, (key, label, scale) in enumerate(CDF_PANELS, start=1):
            v = lat[key] * scale
            if len(v) == 0:
                continue
            fig.add_trace(
                go.Scatter(
                    name=res.name,
                    legendgroup=res.name,
                    showlegend=col == 1,
                    mode="lines",
                    line=dict(color=color(i)),
                    hovertemplate=f"{label}: %{{x:.4g}}<br>fraction: %{{y:.3f}}",
                    **ecdf_points(v, max_points),
                ),
                row=1,
                col=col,
            )
            pct = np.percentile(v, MARKED_PERCENTILES)
            fig.add_trace(
                go.Scatter(
                    x=pct,
                    y=[q / 100 for q in MARKED_PERCENTILES],
                    mode="markers+text",
                    text=[f"p{q}" for q in MARKED_PERCENTILES],
                    textposition="middle right",
                    marker=dict(color=color(i), size=7, symbol="diamond"),
                    name=f"{res.name} percentiles",
                    legendgroup=res.name,
                    showlegend=False,
                    hovertemplate=f"%{{text}} {label}: %{{x:.4g}}<extra>{html.escape(res.name)}</extra>",
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(title_text=label, row=1, col=col)
    for col, (key, label, scale) in enumerate(CDF_PANELS, start=1):
        if spans_decades([lat[key] * scale for lat in lats]):
            fig.update_xaxes(type="log", title_text=f"{label}, log scale", row=1, col=col)
    fig.update_yaxes(title_text="fraction of requests", range=[0, 1.02], row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=380, title="Latency CDFs (completed requests)", hovermode="closest")
    return fig


def _sorted_steps(result: RunResult) -> dict[str, np.ndarray]:
    s = result.steps
    order = np.argsort(s["start"], kind="stable")
    return {k: np.asarray(v)[order] for k, v in s.items()}


def _kv_capacity(s: dict[str, np.ndarray], result: RunResult) -> np.ndarray:
    cap = s["kv_capacity_blocks"].astype(np.float64)
    return np.where(cap > 0, cap, float(result.kv_capacity_blocks))


REPLICA_LINES = 8  # replicas drawn one line each in the utilisation panels; more: their mean with a min-max band


def _replica_lines(fig: go.Figure, edges: np.ndarray, series: list[np.ndarray], name: str, colour: str,
                   row: int) -> None:
    """Per-window fractions of one GPU, one series per replica: a line each (one unnamed replica: a plain line),
    or beyond REPLICA_LINES the mean over replicas within a band from the least to the most loaded one."""
    if len(series) == 1:
        fig.add_trace(go.Scatter(name=name, line=dict(color=colour), **_windowed(edges, series[0])), row=row, col=1)
        return
    if len(series) <= REPLICA_LINES:
        for i, y in enumerate(series):
            fig.add_trace(go.Scatter(name=f"{name}: replica {i}", line=dict(color=color(i), width=1),
                                     legendgroup=f"replica {i}", **_windowed(edges, y)), row=row, col=1)
        return
    stack = np.stack(series)
    lo, hi = stack.min(axis=0), stack.max(axis=0)
    fig.add_trace(go.Scatter(name=f"{name}: least loaded replica", line=dict(color=colour, width=0),
                             showlegend=False, **_windowed(edges, lo)), row=row, col=1)
    fig.add_trace(go.Scatter(name=f"{name}: min-max over {len(series)} replicas", line=dict(color=colour, width=0),
                             fill="tonexty", **_windowed(edges, hi)), row=row, col=1)
    fig.add_trace(go.Scatter(name=f"{name}: mean over replicas", line=dict(color=colour),
                             **_windowed(edges, stack.mean(axis=0))), row=row, col=1)


def fig_timeline(result: RunResult, max_points: int = MAX_POINTS, x_end: float | None = None) -> go.Figure:
    """One variant's utilisation on a shared time axis: GPU busy fraction and MFU per window (per replica, on a 0-1
    axis), KV usage, queue length, and cumulative rejections and preemptions. ``x_end``: the end of the time
    axis (default: the run's end); the report passes the latest end over the variants, so they line up."""
    s = _sorted_steps(result)
    n = len(s["start"])
    x_end = run_end(result) if x_end is None else max(float(x_end), run_end(result))
    edges = window_edges(x_end, n, max_points)
    width = edges[1] - edges[0]
    t = s["start"]
    fig = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        subplot_titles=(
            "GPU busy (fraction of each window, per replica)",
            "MFU (per window, per replica)",
            "KV usage (fraction of capacity; per-window peak)",
            "requests (per-window peak)",
            "cumulative rejections and preemptions",
        ),
    )
    # Per replica: each replica's steps run in parallel with the others', so their busy time over a window can sum
    # to several windows; a fraction of one GPU is only meaningful replica by replica.
    rep = np.asarray(s["replica"], dtype=np.int64) if "replica" in s else np.zeros(n, dtype=np.int64)
    per_busy, per_mfu = [], []
    for r in np.unique(rep):
        on = rep == r
        per_busy.append(amount_per_window(t[on], s["duration"][on], s["duration"][on], edges) / width)
        if result.peak_flops > 0:
            per_mfu.append(amount_per_window(t[on], s["duration"][on], s["flops"][on], edges)
                           / (width * result.peak_flops))
    _replica_lines(fig, edges, per_busy, "busy", color(0), row=1)
    if per_mfu:
        _replica_lines(fig, edges, per_mfu, "MFU", color(1), row=2)
    cap = _kv_capacity(s, result)
    with np.errstate(divide="ignore", invalid="ignore"):
        used = s["kv_blocks_used"] / cap
        alloc = (s["kv_blocks_used"] + s["kv_blocks_reserved"]) / cap
    fig.add_trace(
        go.Scatter(name="KV used", line=dict(color=color(2)), **_state_trace(t, used, edges, "max", max_points)),
        row=3,
        col=1,
    )
    if np.any(s["kv_blocks_reserved"] > 0):
        fig.add_trace(
            go.Scatter(
                name="KV used + reserved",
                line=dict(color=color(2), dash="dot"),
                **_state_trace(t, alloc, edges, "max", max_points),
            ),
            row=3,
            col=1,
        )
    queues = (("num_waiting", "waiting"), ("num_running", "running"), ("num_swapped", "swapped"))
    for j, (col, label) in enumerate(queues):
        if col == "num_swapped" and not np.any(s[col] > 0):
            continue
        fig.add_trace(
            go.Scatter(name=label, line=dict(color=color(3 + j)), **_state_trace(t, s[col], edges, "max", max_points)),
            row=4,
            col=1,
        )
    rej_t = np.array([r.finish for r in result.requests if r.outcome == Outcome.REJECTED.value], dtype=np.float64)
    fig.add_trace(
        go.Scatter(
            name="rejections", line=dict(color=color(6)), **_count_trace(rej_t, np.ones_like(rej_t), edges, max_points)
        ),
        row=5,
        col=1,
    )
    pre = s["num_preempted"] > 0
    fig.add_trace(
        go.Scatter(
            name="preemptions",
            line=dict(color=color(7)),
            **_count_trace(t[pre], s["num_preempted"][pre], edges, max_points),
        ),
        row=5,
        col=1,
    )
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_yaxes(range=[0, 1], row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], row=3, col=1)
    fig.update_xaxes(title_text="time (s)", row=5, col=1)
    fig.update_xaxes(range=[0.0, x_end])
    fig.update_layout(template=TEMPLATE, height=900, title=f"Utilisation over time: {result.name}")
    return fig


def fig_kv_memory(result: RunResult, max_points: int = MAX_POINTS) -> go.Figure:
    """KV cache memory over time (per-window means): blocks holding data, blocks reserved but empty, and the
    capacity. In GiB when the run knows the bytes per block, else in blocks."""
    s = _sorted_steps(result)
    edges = window_edges(run_end(result), len(s["start"]), max_points)
    scale, unit = (result.kv_bytes_per_block / 2**30, "GiB") if result.kv_bytes_per_block > 0 else (1.0, "blocks")
    t = s["start"]
    fig = go.Figure()
    for col, label, c in (("kv_blocks_used", "used", color(2)), ("kv_blocks_reserved", "reserved, empty", color(4))):
        fig.add_trace(
            go.Scatter(
                name=label,
                stackgroup="kv",
                line=dict(color=c),
                **_state_trace(t, s[col] * scale, edges, "mean", max_points),
            )
        )
    cap = _kv_capacity(s, result) * scale
    cap_value = float(cap.max()) if len(cap) else result.kv_capacity_blocks * scale
    fig.add_trace(
        go.Scatter(
            name="capacity",
            x=[0.0, float(edges[-1])],
            y=[cap_value, cap_value],
            mode="lines",
            line=dict(color="black", dash="dash"),
        )
    )
    fig.update_layout(
        template=TEMPLATE,
        height=350,
        title=f"KV cache memory: {result.name}",
        xaxis_title="time (s)",
        yaxis_title=f"KV cache ({unit})",
    )
    return fig


def fig_throughput(results: list[RunResult], max_points: int = MAX_POINTS) -> go.Figure:
    """Throughput over time per variant: decode and prefill tokens computed per second, and completed requests
    per second, each averaged over windows."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("decode tokens/s", "prefill tokens/s", "completed requests/s"),
    )
    for i, res in enumerate(results):
        s = _sorted_steps(res)
        edges = window_edges(run_end(res), len(s["start"]), max_points)
        width = edges[1] - edges[0]
        for row, col in ((1, "decode_tokens"), (2, "prefill_tokens")):
            rate = amount_per_window(s["start"], s["duration"], s[col], edges) / width
            fig.add_trace(
                go.Scatter(
                    name=res.name,
                    legendgroup=res.name,
                    showlegend=row == 1,
                    line=dict(color=color(i)),
                    **_windowed(edges, rate),
                ),
                row=row,
                col=1,
            )
        fin = np.array([r.finish for r in res.requests if r.completed], dtype=np.float64)
        done = np.histogram(fin, bins=edges)[0] / width
        fig.add_trace(
            go.Scatter(
                name=res.name,
                legendgroup=res.name,
                showlegend=False,
                line=dict(color=color(i)),
                **_windowed(edges, done),
            ),
            row=3,
            col=1,
        )
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    fig.update_layout(template=TEMPLATE, height=650, title="Throughput over time")
    return fig


# --- batch slots ------------------------------------------------------------------------------------------------
#
# The records do not say which row of the batch a request occupied, only when it was first scheduled and when it
# finished. Rows are therefore reconstructed: each request holds a row over an interval, and intervals are packed
# into rows greedily in order of their start, each taking the lowest row free at that moment. That is the
# classic colouring of an interval graph, and it is optimal: a new row opens only when every open row is busy, so
# the number of rows equals the most intervals that overlap at any instant, and no assignment can use fewer.
#
# What interval a request holds depends on the policy, which the steps log reveals. Under static batching a
# finished request keeps its row as padding until the whole batch is done (steps log ``padded_rows > 0``); a batch
# is the set of requests first scheduled in the same step on the same replica, and it ends with its last finish.
# Without padded rows a request holds its row from its first scheduled step to its finish. A preempted request is
# drawn as if it held its row throughout: the records keep no times of its eviction and return.

SLOT_REQUESTS = 300  # most requests drawn per variant in the slot chart
SLOT_PANELS = 8  # most variants (or sweep points) the slot chart draws


@dataclass(frozen=True, slots=True)
class SlotLayout:
    """Every scheduled request of one run placed on a row of the batch. Arrays are aligned, one entry per span in
    which a request held a row (one per request, plus one per resume after a preemption), in requests.csv order."""

    ids: np.ndarray  # request ids
    start: np.ndarray  # first scheduled, or resumed (s)
    finish: np.ndarray  # last token, failure or preemption (s)
    held_until: np.ndarray  # when its row is free again (s): the batch's end under static batching, else finish
    row: np.ndarray  # 0-based row, replicas stacked one above the other
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    num_rows: int  # per replica the most requests holding a row at one instant, summed over replicas
    batch_held: bool  # whether rows were held to the end of a batch (padding inferred from the steps log)

    def padded_rows_at(self, t: np.ndarray) -> np.ndarray:
        """How many rows are padding (finished, still held) at each time t."""
        t = np.asarray(t, dtype=np.float64)
        done = np.searchsorted(np.sort(self.finish), t, side="right")
        freed = np.searchsorted(np.sort(self.held_until), t, side="right")
        return done - freed


def assign_slots(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A row for each half-open interval [start, end), no two overlapping intervals on one row, in the fewest rows
    possible (the most intervals alive at one instant). Greedy in order of start (ties in input order); each
    interval takes the lowest-numbered free row. An interval with end <= start holds its row for an instant: a
    later start frees it, one at the same instant does not."""
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    rows = np.empty(len(start), dtype=np.int64)
    busy: list[tuple[float, bool, int]] = []  # (end, zero length, row) of rows in use
    free: list[int] = []  # released rows, lowest first
    opened = 0
    for i in np.argsort(start, kind="stable").tolist():
        s = start[i]
        while busy and (busy[0][0] < s or (busy[0][0] == s and not busy[0][1])):
            heapq.heappush(free, heapq.heappop(busy)[2])
        if free:
            r = heapq.heappop(free)
        else:
            r = opened
            opened += 1
        rows[i] = r
        heapq.heappush(busy, (end[i], bool(end[i] == s), r))
    return rows


def slot_layout(result: RunResult) -> SlotLayout:
    """Rows of the batch for one run (see the comment above ``SLOT_REQUESTS``). A preempted request holds no row
    from its preemption to its resume, so it takes one entry per span it ran (``RequestRecord.kv_intervals``)."""
    spans = [(r, lo, hi) for r in result.requests if r.first_scheduled >= 0
             for lo, hi in r.kv_intervals(max(r.finish, r.first_scheduled))]
    reqs = [sp[0] for sp in spans]
    start = np.array([sp[1] for sp in spans], dtype=np.float64)
    finish = np.maximum(np.array([sp[2] for sp in spans], dtype=np.float64), start)
    replica = np.array([r.replica for r in reqs], dtype=np.int64)
    batch_held = bool(np.any(np.asarray(result.steps["padded_rows"]) > 0))
    held = finish.copy()
    if batch_held and len(reqs):
        # a batch: the requests first scheduled in one step of one replica; it ends with its last finish
        keys = np.stack([replica.astype(np.float64), start])
        _, group = np.unique(keys, axis=1, return_inverse=True)
        group = group.ravel()
        batch_end = np.full(group.max() + 1, -np.inf)
        np.maximum.at(batch_end, group, finish)
        held = batch_end[group]
    row = np.zeros(len(reqs), dtype=np.int64)
    offset = 0
    for rep in np.unique(replica):
        on = replica == rep
        row[on] = assign_slots(start[on], held[on]) + offset
        offset = int(row[on].max()) + 1
    return SlotLayout(
        ids=np.array([r.id for r in reqs], dtype=np.int64),
        start=start,
        finish=finish,
        held_until=held,
        row=row,
        prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
        num_rows=offset,
        batch_held=batch_held,
    )


def _policy(result: RunResult) -> dict:
    pol = (result.config or {}).get("policy")
    return pol if isinstance(pol, dict) else {}


def _slot_limit(result: RunResult) -> tuple[str, int] | None:
    """The configured number of rows, when the run recorded its policy: batch_size or max_num_seqs."""
    pol = _policy(result)
    for key in ("batch_size", "max_num_seqs"):
        if isinstance(pol.get(key), int):
            return key, pol[key]
    return None


def slot_window(layouts: list[SlotLayout], max_requests: int = SLOT_REQUESTS) -> float:
    """The end of the common time window [0, t] in which no run starts more than max_requests requests: the
    earliest time at which some run starts its request number max_requests + 1 (the end of the runs when none
    does)."""
    ends = [float(lay.held_until.max()) for lay in layouts if len(lay.start)]
    t_end = max(ends, default=1.0)
    for lay in layouts:
        if len(lay.start) > max_requests:
            t_end = min(t_end, float(np.sort(lay.start)[max_requests]))
    return t_end


SLOT_COLORS = qualitative.D3  # one colour per request, cycling: neighbours in a row differ
PAD_COLOR = "#bbbbbb"


def fig_batch_slots(
    results: list[RunResult], max_requests: int = SLOT_REQUESTS, t_end: float | None = None
) -> go.Figure:
    """Rows of the batch over time, one panel per variant on one shared time axis: a coloured bar per request
    from its first scheduled step to its finish, grey hatched bars where a finished request still holds its row
    (static batching's padding), blank where a row is idle. Draws the window [0, t_end] (default: the longest
    window in which no variant starts more than max_requests requests); bars are cut at its end."""
    if not results:
        return go.Figure(layout=dict(template=TEMPLATE, title="Batch slots: no runs"))
    layouts = [slot_layout(r) for r in results]
    t_end = slot_window(layouts, max_requests) if t_end is None else float(t_end)
    titles = []
    shown: list[np.ndarray] = []
    for res, lay in zip(results, layouts, strict=True):
        keep = lay.start < t_end
        shown.append(keep)
        rows = f"{lay.num_rows} rows at the busiest instant"
        limit = _slot_limit(res)
        if limit is not None:
            rows += f"; {limit[0]}={limit[1]}"
        titles.append(f"{res.name}: {int(keep.sum())} of {len(lay.start)} scheduled requests drawn; {rows}")
    heights = []
    for res, lay, keep in zip(results, layouts, shown, strict=True):
        top = int(lay.row[keep].max()) + 1 if keep.any() else 1
        limit = _slot_limit(res)
        if limit is not None and limit[0] == "batch_size":
            top = max(top, limit[1])  # the empty rows of a partial batch are idle slots too
        heights.append(top)
    fig = make_subplots(
        rows=len(results),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / max(len(results), 1)),
        subplot_titles=titles,
        row_heights=[h + 4 for h in heights],
    )
    for i, (lay, keep, top) in enumerate(zip(layouts, shown, heights, strict=True), start=1):
        s = lay.start[keep]
        f = np.minimum(lay.finish[keep], t_end)
        h = np.minimum(lay.held_until[keep], t_end)
        colors = [SLOT_COLORS[k % len(SLOT_COLORS)] for k in lay.ids[keep].tolist()]
        custom = np.stack(
            [lay.ids[keep], lay.prompt_tokens[keep], lay.output_tokens[keep]], axis=1
        ).astype(np.int32)
        fig.add_trace(
            go.Bar(
                name="request",
                legendgroup="request",
                showlegend=i == 1,
                orientation="h",
                base=s.astype(np.float32),
                x=(f - s).astype(np.float32),
                y=lay.row[keep].astype(np.int32),
                width=0.85,
                marker=dict(color=colors, line=dict(width=0)),
                customdata=custom,
                hovertemplate="request %{customdata[0]}: %{customdata[1]} prompt, %{customdata[2]} output tokens"
                "<br>%{base:.3f} s to %{x:.3f} s later<extra></extra>",
            ),
            row=i,
            col=1,
        )
        pad = h > f
        if pad.any():
            fig.add_trace(
                go.Bar(
                    name="padding: finished, row still held",
                    legendgroup="padding",
                    showlegend=True,
                    orientation="h",
                    base=f[pad].astype(np.float32),
                    x=(h[pad] - f[pad]).astype(np.float32),
                    y=lay.row[keep][pad].astype(np.int32),
                    width=0.85,
                    marker=dict(color="white", line=dict(width=0), pattern=dict(shape="/", fgcolor=PAD_COLOR)),
                    hovertemplate="padding row %{y}: %{x:.3f} s<extra></extra>",
                ),
                row=i,
                col=1,
            )
        fig.update_yaxes(
            title_text="row", range=[top - 0.5, -0.5], showgrid=False, zeroline=False, row=i, col=1
        )
    fig.update_xaxes(range=[0.0, t_end], row=len(results), col=1, title_text="time (s)")
    fig.update_layout(
        template=TEMPLATE,
        barmode="overlay",
        bargap=0,
        hovermode="closest",
        height=int(min(1600, 140 + sum(max(120.0, 9.0 * (h + 4)) for h in heights))),
        title=dict(
            text=f"Batch slots over the first {t_end:.4g} s (at most {max_requests} requests per variant)",
            x=0.01,
            xanchor="left",
        ),
        margin=dict(t=90),
        # below the plot: the modebar sits at the top right, where the legend used to be and covered it
        legend=dict(orientation="h", yref="container", y=0.005, yanchor="bottom", x=0.0, xanchor="left"),
    )
    return fig


# --- GPU memory stack -----------------------------------------------------------------------------------------

MEMORY_POINTS = MAX_POINTS // 2  # windows of the memory stack: five layers of them, and a smooth picture already

MEMORY_LAYERS = (
    ("weights", "model weights", "#7f7f7f"),
    ("kv_stored", "KV: tokens stored", "#1f77b4"),
    ("kv_slack", "KV: empty tail of partly filled blocks", "#9ecae1"),
    ("kv_reserved", "KV: reserved blocks, still empty", "#ff7f0e"),
    ("kv_free", "KV: free blocks", "#e8f4e8"),
)


def memory_layers(result: RunResult) -> tuple[dict[str, np.ndarray], float, str]:
    """Per step (sorted by start), the memory the run's GPUs hold, as the layers of ``MEMORY_LAYERS``; with the
    unit's scale and name (GiB when the run knows its bytes per block, else KV blocks with no weights layer).

    The KV pool splits exactly: stored tokens + the rest of their blocks + reserved empty blocks + free blocks =
    capacity. With prefix caching a shared token counts once per request that uses it, so the stored layer is
    capped at the room of the blocks that hold tokens."""
    s = _sorted_steps(result)
    bpb = float(result.kv_bytes_per_block)
    scale, unit = (bpb / 2**30, "GiB") if bpb > 0 else (1.0, "KV blocks")
    bs = max(int(result.block_size), 1)
    cap = _kv_capacity(s, result)
    used = np.minimum(s["kv_blocks_used"].astype(np.float64), cap)
    reserved = np.clip(s["kv_blocks_reserved"].astype(np.float64), 0.0, used)
    filled = used - reserved
    stored = np.minimum(s["kv_tokens"].astype(np.float64) / bs, filled)  # in blocks
    weights = float(result.weight_bytes) / bpb if bpb > 0 else 0.0  # in blocks
    layers = {
        "weights": np.full(len(used), weights),
        "kv_stored": stored,
        "kv_slack": filled - stored,
        "kv_reserved": reserved,
        "kv_free": cap - used,
    }
    return {k: v * scale for k, v in layers.items()}, scale, unit


def _gpu_total_bytes(result: RunResult) -> float | None:
    """Memory of the GPUs one replica runs on, when the run recorded a preset or inline GPU."""
    dep = (result.config or {}).get("deployment")
    if not isinstance(dep, dict):
        return None
    from sim.specs import resolve_gpu

    try:
        gpu = resolve_gpu(dep["gpu"])
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    return float(gpu.memory_bytes) * int(dep.get("tensor_parallel_size", 1) or 1)


def fig_memory_stack(result: RunResult, max_points: int = MEMORY_POINTS, x_end: float | None = None) -> go.Figure:
    """GPU memory over time as a stack (per-window means): the weights at the bottom, then KV holding tokens, the
    unfilled tail of their blocks, blocks reserved but still empty, and free blocks, up to the capacity line
    (weights + KV pool). Also the GPU's total memory when the run recorded which GPU it ran on: the gap is the
    activation reserve and the share gpu_memory_utilization keeps back. ``x_end`` as in ``fig_timeline``."""
    layers, scale, unit = memory_layers(result)
    s = _sorted_steps(result)
    t = s["start"]
    end = run_end(result) if x_end is None else max(float(x_end), run_end(result))
    edges = window_edges(end, len(t), max_points)
    fig = go.Figure()
    for key, label, c in MEMORY_LAYERS:
        v = layers[key]
        if key == "weights" and not np.any(v > 0):
            continue
        fig.add_trace(
            go.Scatter(
                name=label,
                stackgroup="memory",
                line=dict(color=c, width=0.5),
                fillcolor=c,
                hovertemplate=f"%{{y:.3f}} {unit}",
                **_state_trace(t, v, edges, "mean", max_points),
            )
        )
    cap = float(layers["weights"][0] + _kv_capacity(s, result).max() * scale) if len(t) else 0.0
    x_end = float(edges[-1])
    fig.add_trace(
        go.Scatter(
            name="capacity: weights + KV pool",
            x=[0.0, x_end],
            y=[cap, cap],
            mode="lines",
            line=dict(color="black", dash="dash"),
        )
    )
    total = _gpu_total_bytes(result)
    if total is not None and unit == "GiB":
        fig.add_trace(
            go.Scatter(
                name="GPU memory",
                x=[0.0, x_end],
                y=[total / 2**30] * 2,
                mode="lines",
                line=dict(color="#d62728", dash="dot"),
            )
        )
    fig.update_layout(
        template=TEMPLATE,
        height=380,
        title=f"GPU memory: {result.name}",
        xaxis_title="time (s)",
        xaxis_range=[0.0, x_end],
        yaxis_title=f"memory ({unit})",
        yaxis_rangemode="tozero",
    )
    return fig


REQUEST_KV_REQUESTS = 60  # most requests drawn as their own band in the per-request memory chart
REQUEST_KV_POINTS = 60  # time samples of that chart (evenly spaced, so the traces carry no x arrays)


def request_kv_window(result: RunResult, max_requests: int = REQUEST_KV_REQUESTS) -> float:
    """End of the window in which at most ``max_requests`` requests start computing: every request holding KV
    in ``[0, end)`` is then drawn."""
    starts = np.sort([r.first_scheduled for r in result.requests if r.first_scheduled >= 0])
    if len(starts) == 0:
        return 0.0
    if len(starts) > max_requests:
        return float(starts[max_requests])
    return max(r.finish for r in result.requests)


def request_kv_tokens(
    result: RunResult, t: np.ndarray, max_requests: int = REQUEST_KV_REQUESTS
) -> dict[int, np.ndarray]:
    """Per request id, the KV tokens it holds at the times ``t``: its prompt from its first step, then one more
    token per output token, spread evenly between its first token and its finish (the records keep no per-token
    times), nothing after it ends. A preempted request holds nothing from its preemption to its resume (the
    records keep both times), so the bands of a preempting run stay under the capacity."""
    out: dict[int, np.ndarray] = {}
    for r in sorted(result.requests, key=lambda r: (r.first_scheduled, r.id)):
        if r.first_scheduled < 0 or len(out) >= max_requests:
            continue
        end = r.finish if r.finish >= 0 else float("inf")
        alive = np.zeros(len(t), dtype=bool)
        for lo, hi in r.kv_intervals(end):
            alive |= (t >= lo) & (t < hi)
        tokens = np.where(alive, float(r.prompt_tokens), 0.0)
        if r.first_token >= 0 and r.output_tokens > 1 and end > r.first_token:
            frac = np.clip((t - r.first_token) / (end - r.first_token), 0.0, 1.0)
            tokens = tokens + np.where(alive & (t >= r.first_token), 1.0 + frac * (r.output_tokens - 1), 0.0)
        out[r.id] = tokens
    return out


REQUEST_KV_CAPACITY_IN_RANGE = 2.0  # the KV pool is drawn when it is at most this many times the peak drawn


def fig_memory_by_request(result: RunResult, max_requests: int = REQUEST_KV_REQUESTS,
                          points: int = REQUEST_KV_POINTS, x_end: float | None = None) -> go.Figure:
    """One band per active request's KV cache, stacked: every session's cache must stay resident, and the bands
    pile up towards the KV pool. The y axis spans the KV in use (a 1 GiB pile on a 70 GiB axis is invisible); the
    pool's capacity is drawn as a line when it is within REQUEST_KV_CAPACITY_IN_RANGE times the peak, else
    named in the title. The weights are not stacked: they are constant and named in the title. ``x_end``: the
    window's end (default: ``request_kv_window``); the report passes one end to every variant."""
    end = request_kv_window(result, max_requests) if x_end is None else float(x_end)
    t = np.linspace(0.0, end, points) if end > 0 else np.zeros(1)
    bpb = float(result.kv_bytes_per_block)
    bs = max(int(result.block_size), 1)
    scale, unit = (bpb / bs / 2**30, "GiB") if bpb > 0 else (1.0 / bs, "KV blocks")
    weights = float(result.weight_bytes) / 2**30 if bpb > 0 else 0.0
    fig = go.Figure()
    even = dict(x0=0.0, dx=float(t[1] - t[0]) if len(t) > 1 else 1.0)
    total = np.zeros(len(t))
    for i, (rid, tokens) in enumerate(request_kv_tokens(result, t, max_requests).items()):
        y = (tokens * scale).astype(np.float32)
        total += y
        fig.add_trace(go.Scatter(name=f"request {rid}", y=y, stackgroup="m", **even,
                                 line=dict(width=0.3, color=color(i)), fillcolor=color(i), showlegend=False,
                                 hovertemplate=f"request {rid}: %{{y:.3f}} {unit}<extra></extra>"))
    cap = float(result.kv_capacity_blocks) * (bpb / 2**30 if bpb > 0 else 1.0)
    peak = float(total.max()) if total.size else 0.0
    title = f"KV cache by request: {result.name} (first {end:.0f} s, at most {max_requests} requests, one band each"
    if weights > 0:
        title += f"; weights {weights:.1f} GiB not stacked"
    if cap > 0 and (peak <= 0 or cap <= REQUEST_KV_CAPACITY_IN_RANGE * peak):
        fig.add_trace(go.Scatter(name="KV pool capacity", x=[0.0, float(t[-1])], y=[cap, cap],
                                 mode="lines", line=dict(color="black", dash="dash")))
        top = cap
    else:
        title += f"; KV pool {cap:.1f} {unit}, off the scale"
        top = peak
    fig.update_layout(template=TEMPLATE, height=380, xaxis_title="time (s)", yaxis_title=f"KV cache ({unit})",
                      title=title + ")", yaxis_range=[0.0, 1.05 * top if top > 0 else 1.0],
                      xaxis_range=[0.0, float(t[-1])])
    return fig


def _request_memory_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    note = _p(
        "Every active request's KV cache as its own band: each session holds its cache until it finishes or is "
        "preempted, and the pile of bands is what meets the KV pool's capacity. Drawn from the request records "
        "(prompt at the first step, output tokens spread evenly to the finish, nothing while preempted), over the "
        "opening window."
    )
    results = results[:8]
    end = max((request_kv_window(r) for r in results), default=0.0)  # one time range for every variant
    return [Section(f"KV cache by request: {r.name}", fig_memory_by_request(r, x_end=end or None),
                    note if i == 0 else "")
            for i, r in enumerate(results)]


# --- sweeps -----------------------------------------------------------------------------------------------------

_SWEEP_NAME = re.compile(r"^(?P<variant>.*)\[(?P<params>[^\[\]]*)\]$")


def _parse_value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def sweep_params(result: RunResult) -> tuple[str, dict] | None:
    """(variant, {parameter: value}) of a sweep point: the run's recorded ``config['params']`` when it has them,
    else parsed from a name such as ``continuous[max_num_seqs=8,rate=2]``; None for a run outside a sweep."""
    cfg = result.config or {}
    params = cfg.get("params")
    if isinstance(params, dict) and params:
        return str(cfg.get("name", result.name)), {k.split(".")[-1]: v for k, v in params.items()}
    m = _SWEEP_NAME.match(result.name)
    if not m or "=" not in m["params"]:
        return None
    out = {}
    for part in m["params"].split(","):
        k, sep, v = part.partition("=")
        if not sep:
            return None
        out[k.strip()] = _parse_value(v.strip())
    return m["variant"], out


SWEEP_PANELS = (
    ("output_throughput", None, "output tokens/s", 1.0),
    ("ttft", "p99", "TTFT p99 (s)", 1.0),
    ("tpot", "p99", "TPOT p99 (ms)", 1e3),
    ("e2el", "p99", "E2EL p99 (s)", 1.0),
)


def _metric(summary: dict, key: str, sub: str | None) -> float:
    v = summary.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    return float("nan") if v is None else float(v)


def fig_sweep(results: list[RunResult], summaries: dict | None = None) -> go.Figure | None:
    """Throughput and tail latency against the first swept parameter, one line per variant (and per value of
    any other swept parameter). None when no run belongs to a sweep."""
    points = [(r, p) for r in results if (p := sweep_params(r)) is not None]
    if not points:
        return None
    summaries = summaries or {}
    x_key = next(iter(points[0][1][1]))
    lines: dict[str, list[tuple]] = {}
    for res, (variant, params) in points:
        if x_key not in params:
            continue
        rest = ",".join(f"{k}={v}" for k, v in params.items() if k != x_key)
        label = f"{variant}[{rest}]" if rest else variant
        summ = summaries.get(res.name) or summarize(res)
        lines.setdefault(label, []).append((params[x_key], summ))
    numeric = all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for pts in lines.values() for x, _ in pts
    )
    fig = make_subplots(
        rows=1, cols=len(SWEEP_PANELS), subplot_titles=[p[2] for p in SWEEP_PANELS], horizontal_spacing=0.06
    )
    for i, (label, pts) in enumerate(lines.items()):
        if numeric:
            pts = sorted(pts, key=lambda p: p[0])
        xs = [p[0] if numeric else str(p[0]) for p in pts]
        for col, (key, sub, title, scale) in enumerate(SWEEP_PANELS, start=1):
            fig.add_trace(
                go.Scatter(
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    x=xs,
                    y=[_metric(s, key, sub) * scale for _, s in pts],
                    mode="lines+markers",
                    line=dict(color=color(i)),
                    hovertemplate=f"{x_key}=%{{x}}<br>{title}: %{{y:.4g}}<extra>{html.escape(label)}</extra>",
                ),
                row=1,
                col=col,
            )
    xs_all = [x for pts in lines.values() for x, _ in pts]
    log_x = numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8
    ticks = sorted(set(xs_all)) if numeric and len(set(xs_all)) <= 12 else None
    for col in range(1, len(SWEEP_PANELS) + 1):
        fig.update_xaxes(title_text=x_key, type="log" if log_x else None, tickvals=ticks, row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(
        template=TEMPLATE, height=380, hovermode="closest", title=f"Throughput and tail latency against {x_key}"
    )
    return fig


# --- the page --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Section:
    """A heading with a figure and/or an HTML fragment (already escaped)."""

    title: str
    figure: go.Figure | None = None
    html: str = ""


def _p(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def per_run_points(num_results: int) -> int:
    """Points per series in figures drawn once per run: fewer when a sweep makes many runs, so that the page stays
    small (the full MAX_POINTS up to four runs)."""
    return MAX_POINTS if num_results <= 4 else max(200, MAX_POINTS * 4 // num_results)


def _slots_section(results: list[RunResult], summaries: dict) -> list[Section]:
    dropped = len(results) - SLOT_PANELS
    results = results[:SLOT_PANELS]
    layouts = [slot_layout(r) for r in results]
    notes = [
        f"The first {SLOT_PANELS} of {SLOT_PANELS + dropped} runs are drawn." if dropped > 0 else "",
        "One row per slot of the batch, one coloured bar per request from the step that first computed it to its "
        "last token. The records keep no slot numbers, so rows are rebuilt from those intervals: packed greedily "
        "in order of start, each into the lowest free row. That colouring of an interval graph is optimal, so the "
        "number of rows is the most requests that held a row at one instant. Blank space is an idle slot.",
    ]
    for res, lay in zip(results, layouts, strict=True):
        if lay.batch_held:
            s = _sorted_steps(res)
            match = float(np.mean(lay.padded_rows_at(s["start"]) == s["padded_rows"])) if len(s["start"]) else 1.0
            notes.append(
                f"{res.name}: the steps log records padded rows, so a batch (the requests first scheduled in the "
                f"same step) keeps all its rows until its last request finishes; grey hatching is a finished "
                f"request's row still computed as padding. The padding drawn agrees with the steps log's "
                f"padded_rows at {100 * match:.1f}% of the steps."
            )
    notes.append(
        "What to look at: under static batching whole batches wait for their longest request (hatched rows), and "
        "no new request starts until the batch is done; under continuous batching a freed row is refilled at the "
        "next step, so the rows stay full of colour."
    )
    return [Section("Batch slots", fig_batch_slots(results), "".join(_p(n) for n in notes if n))]


def _memory_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    note = _p(
        "The ceiling is memory: the weights sit at the bottom for the whole run, and every running request's KV "
        "cache must stay resident above them until it finishes. Reserved-but-empty blocks (contiguous reservation "
        "sets aside a request's maximum length up front) and the empty tails of partly filled blocks take room "
        "that holds no token. Values are means over short windows; the dashed line is the weights plus the KV "
        "pool, the dotted one the GPU's whole memory."
    )
    points = per_run_points(len(results))
    end = common_end(results)
    return [
        Section(f"GPU memory: {r.name}", fig_memory_stack(r, min(points, MEMORY_POINTS), x_end=end),
                note if i == 0 else "")
        for i, r in enumerate(results)
    ]


def _latency_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section("Latency", fig_latency_cdfs(results))]


def _timeline_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    points = per_run_points(len(results))
    end = common_end(results)
    return [Section(f"Utilisation: {r.name}", fig_timeline(r, points, x_end=end)) for r in results]


def _kv_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section(f"KV memory: {r.name}", fig_kv_memory(r)) for r in results]


def _sweep_section(results: list[RunResult], summaries: dict) -> list[Section]:
    fig = fig_sweep(results, summaries)
    if fig is None:
        return []
    note = _p(
        "Each point is one run of the sweep. Throughput usually climbs and then flattens as the batch limit or "
        "the load grows, while the p99 latencies stay low and then rise sharply: the knee is where more batching "
        "stops buying throughput and starts costing tail latency."
    )
    return [Section("Sweep", fig, note)]


def fig_replicas(results: list[RunResult]) -> go.Figure | None:
    """Replicas paid for over time (a step function: provisioning to release) per cluster run, with the
    autoscaler's signal on a second axis when there is one."""
    runs = [r for r in results if r.cluster]
    if not runs:
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for i, r in enumerate(runs):
        c = r.cluster
        assert c is not None  # runs holds cluster runs only
        t, n = list(c["replicas_over_time"]["t"]), list(c["replicas_over_time"]["n"])
        t.append(run_end(r))
        n.append(n[-1])
        fig.add_trace(go.Scatter(x=t, y=n, mode="lines", line={"shape": "hv", "color": color(i), "width": 2},
                                 name=f"{r.name}: replicas"), secondary_y=False)
        a = c.get("autoscaler")
        if a and a["times"]:
            fig.add_trace(go.Scatter(x=a["times"], y=a["values"], mode="lines", name=f"{r.name}: {a['signal']}",
                                     line={"color": color(i), "width": 1, "dash": "dot"}), secondary_y=True)
    fig.update_layout(height=380, margin={"t": 30}, legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="replicas paid for", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="autoscaler signal", rangemode="tozero", secondary_y=True)
    return fig


def _cluster_section(results: list[RunResult], summaries: dict) -> list[Section]:
    fig = fig_replicas(results)
    if fig is None:
        return []
    rows = []
    for r in results:
        if not r.cluster:
            continue
        for p in r.cluster["per_replica"]:
            cells = [r.name, p["replica"], f"{p['provisioned']:.0f}", f"{p['ready']:.0f}",
                     "" if p["released"] is None else f"{p['released']:.0f}", p["requests"],
                     "" if p["output_throughput"] is None else f"{p['output_throughput']:.0f}",
                     "" if p["kv_usage_mean"] is None else f"{100 * p['kv_usage_mean']:.1f}%"]
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "replica", "provisioned (s)", "serving from (s)",
                                              "released (s)", "requests", "output tok/s", "KV usage mean"))
    table = f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    note = _p(
        "Replicas paid for over time (solid) and the autoscaler's signal (dotted). A new replica is paid for "
        "from the moment it is ordered and serves after its provisioning delay; a drained one stops costing when "
        "its last request ends. The summary's cost rows add up the GPU-hours."
    )
    return [Section("Cluster", fig, note + table)]


def _throughput_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section("Throughput", fig_throughput(results, per_run_points(len(results))))]


SectionBuilder = Callable[[list[RunResult], dict], list[Section]]
# The GPU memory stack shows what fig_kv_memory shows (used, reserved, capacity) and more, so the report draws
# only the stack; fig_kv_memory stays for notebooks.
SECTIONS: list[SectionBuilder] = [
    _slots_section,
    _memory_sections,
    _request_memory_sections,
    _timeline_sections,
    _latency_section,
    _sweep_section,
    _throughput_section,
    _cluster_section,
]


def summary_table_html(summaries: dict) -> str:
    """The comparison table of ``sim.table.format_table`` as an HTML table."""
    header, rows = table_cells(summaries)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + f"<th>{html.escape(r[0])}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in r[1:]) + "</tr>"
        for r in rows
    )
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def bottlenecks_html(summaries: dict) -> str:
    """Per variant: the one-line verdict, then every limit found, strongest first, with its score and numbers."""
    items = []
    for name, s in summaries.items():
        ranked = "".join(
            f"<li>{html.escape(lim.name)} ({lim.score:.2f}): {html.escape(lim.evidence)}</li>"
            for lim in rank_limits(s).limits
        )
        items.append(f"<li><b>{html.escape(name)}</b>: {html.escape(bottleneck(s))}<ol>{ranked}</ol></li>")
    return f'<ul class="bottleneck">{"".join(items)}</ul>'


_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
table.summary { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.summary th, table.summary td { padding: 3px 12px; border-bottom: 1px solid #e5e5e5; }
table.summary td { text-align: right; }
table.summary tbody th { text-align: left; font-weight: normal; }
ul.bottleneck li { margin: 0.3em 0; }
p.note { max-width: 75em; line-height: 1.4; }
"""


def build_report(
    results: list[RunResult],
    summaries: dict,
    title: str,
    sections: list[SectionBuilder] | None = None,
) -> str:
    """The whole report as one self-contained HTML page. Deterministic: figure ids are numbered, not random."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Summary</h2>",
        summary_table_html(summaries),
        "<h2>What limits each variant</h2>",
        bottlenecks_html(summaries),
    ]
    n_fig = 0
    for builder in SECTIONS if sections is None else sections:
        for sec in builder(results, summaries):
            parts.append(f"<h2>{html.escape(sec.title)}</h2>")
            if sec.html:
                parts.append(sec.html)
            if sec.figure is not None:
                parts.append(
                    pio.to_html(
                        sec.figure,
                        include_plotlyjs=n_fig == 0,
                        full_html=False,
                        div_id=f"fig-{n_fig}",
                        config={"displaylogo": False, "responsive": True},
                    )
                )
                n_fig += 1
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(
    path: str | os.PathLike,
    results: list[RunResult],
    summaries: dict,
    title: str = "servesim report",
) -> Path:
    """Write build_report's page to path, atomically (a temporary file in the same folder, then a rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(p.parent, {p.name: build_report(results, summaries, title)})
    return p
