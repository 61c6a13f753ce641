"""Figures over time and latency: CDFs, utilisation per replica, KV memory and throughput."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.request_table import as_table
from sim.metrics.step_columns import StepColumns
from sim.output.report.common import (
    KEEP_EVENTS_MAX,
    MAX_POINTS,
    TEMPLATE,
    _count_trace,
    _kv_capacity,
    _sorted_steps,
    _state_trace,
    _windowed,
    amount_per_window,
    color,
    ecdf_points,
    held_until,
    run_end,
    window_edges,
)
from sim.output.report.timeline_blocks import TimelineSeries, amount_in_blocks, timeline_series
from sim.serving.request import Outcome

# --- figures ---------------------------------------------------------------------------------------------------


def latencies(result: RunResult) -> dict[str, np.ndarray]:
    """TTFT, TPOT and E2EL of the completed requests (seconds)."""
    return latencies_of(result.requests)


def latencies_of(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """TTFT, TPOT and E2EL of the completed requests among ``records`` (seconds)."""
    table = as_table(records)  # read as columns
    done = table.outcome_is("completed")
    arr, ft, fin, out = (table.column(k)[done] for k in ("arrival", "first_token", "finish", "output_tokens"))
    multi = out > 1
    return {
        "ttft": ft - arr,
        "tpot": (fin[multi] - ft[multi]) / (out[multi] - 1),
        "e2el": fin - arr,
    }


CDF_PANELS = (("ttft", "TTFT (ms)", 1e3), ("tpot", "TPOT (ms)", 1e3), ("e2el", "E2EL (s)", 1.0))
MARKED_PERCENTILES = (50, 95, 99)
CDF_LOG_SPAN = 100.0  # a panel whose values span more than this ratio (two decades) gets a log x axis
# where each marked percentile's label sits beside its marker: p99 above and p95 below, both to its right (0.04 apart
# on the y axis, side by side they covered each other)
PERCENTILE_TEXT = {50: "middle right", 95: "bottom right", 99: "top right"}
CDF_Y_RANGE = [-0.06, 1.12]  # above 1: room for "p99" over its marker; below 0: "0" clears the x axis's tick labels


def cdf_x_range(xs: Sequence[float], log: bool) -> list[float] | None:
    """An x axis range over ``xs`` (log10 units on a log axis) with room on the right for a "p99" label beside the
    rightmost marker; None with nothing to draw."""
    v = [float(x) for x in xs if x is not None and (x > 0 or not log)]
    if not v:
        return None
    lo, hi = (math.log10(min(v)), math.log10(max(v))) if log else (min(v), max(v))
    span = (hi - lo) or 1.0
    return [lo - 0.03 * span, hi + 0.16 * span]


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
    return _cdf_figure([(res.name, latencies(res)) for res in results], "Latency CDFs (completed requests)",
                       max_points)


def fig_class_latency_cdfs(result: RunResult, max_points: int = MAX_POINTS,
                           scale_over: list[RunResult] | None = None) -> go.Figure:
    """One variant's TTFT, TPOT and E2EL CDFs with one curve per request class (sorted by name, as summary.json
    keys them), p50/p95/p99 marked. ``scale_over``: the runs whose latencies choose each axis's scale (log or
    linear), so that every variant's per-class panels read on the same scale (default: this run alone)."""
    from sim.metrics.summary import NO_CLASS

    groups: dict[str, list[RequestRecord]] = {}
    for r in result.requests:
        groups.setdefault(r.slo_class or NO_CLASS, []).append(r)
    curves = [(name, latencies_of(groups[name])) for name in sorted(groups)]
    over = [latencies(r) for r in scale_over] if scale_over else None
    return _cdf_figure(curves, f"Latency CDFs per class: {result.name} (completed requests)", max_points, over)


def _cdf_figure(curves: list[tuple[str, dict[str, np.ndarray]]], title: str, max_points: int,
                scale_over: list[dict[str, np.ndarray]] | None = None) -> go.Figure:
    """CDF_PANELS side by side, one curve per (name, latencies), with p50/p95/p99 marked; each axis on a log scale
    where the latencies of ``scale_over`` (default: the curves') span decades."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in CDF_PANELS], horizontal_spacing=0.07)
    lats = [lat for _, lat in curves]
    xs: dict[int, list[float]] = {}
    for i, (name, lat) in enumerate(curves):
        for col, (key, label, scale) in enumerate(CDF_PANELS, start=1):
            v = lat[key] * scale
            if len(v) == 0:
                continue
            fig.add_trace(
                go.Scatter(
                    name=name,
                    legendgroup=name,
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
            xs.setdefault(col, []).extend((float(v.min()), float(v.max())))
            fig.add_trace(
                go.Scatter(
                    x=pct,
                    y=[q / 100 for q in MARKED_PERCENTILES],
                    # the last curve's markers labelled, the others' told apart by the y axis and their hover:
                    # several curves' p50s side by side covered each other's labels
                    mode="markers+text" if i == len(curves) - 1 else "markers",
                    text=[f"p{q}" for q in MARKED_PERCENTILES],
                    textposition=[PERCENTILE_TEXT[q] for q in MARKED_PERCENTILES],
                    marker=dict(color=color(i), size=7, symbol="diamond"),
                    name=f"{name} percentiles",
                    legendgroup=name,
                    showlegend=False,
                    hovertemplate=f"%{{text}} {label}: %{{x:.4g}}<extra>{html.escape(name)}</extra>",
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(title_text=label, row=1, col=col)
    for col, (key, label, scale) in enumerate(CDF_PANELS, start=1):
        log = spans_decades([lat[key] * scale for lat in (scale_over if scale_over is not None else lats)])
        if log:
            fig.update_xaxes(type="log", title_text=f"{label}, log scale", row=1, col=col)
        # room on the right for the labels: at the axis's autoscaled end a slow variant's p99 was cut in two
        fig.update_xaxes(range=cdf_x_range(xs.get(col, []), log), row=1, col=col)
    fig.update_yaxes(range=CDF_Y_RANGE, tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=380, title=title, hovermode="closest")
    return fig


REPLICA_LINES = 8  # replicas drawn one line each in the utilisation panels; more: their mean with a min-max band


def replica_label(result: RunResult, replica: int) -> str:
    """'replica 2', with its pool in a disaggregated run ('replica 2 (decode)'): the legends and the cluster table
    numbered a 2P2D run's replicas 0 to 3 without saying which pool each served."""
    for p in (result.cluster or {}).get("per_replica") or []:
        if p.get("replica") == replica and p.get("pool"):
            return f"replica {replica} ({p['pool']})"
    return f"replica {replica}"


def _replica_lines(fig: go.Figure, edges: np.ndarray, series: list[np.ndarray], name: str, colour: str,
                   row: int, labels: list[str] | None = None) -> None:
    """Per-window fractions of one GPU, one series per replica: a line each (one unnamed replica: a plain line),
    or beyond REPLICA_LINES the mean over replicas within a band from the least to the most loaded one.
    ``labels``: each series' replica (default 'replica i')."""
    if len(series) == 1:
        fig.add_trace(go.Scatter(name=name, line=dict(color=colour), **_windowed(edges, series[0])), row=row, col=1)
        return
    if len(series) <= REPLICA_LINES:
        for i, y in enumerate(series):
            label = labels[i] if labels is not None else f"replica {i}"
            fig.add_trace(go.Scatter(name=f"{name}: {label}", line=dict(color=color(i), width=1),
                                     legendgroup=label, **_windowed(edges, y)), row=row, col=1)
        return
    stack = np.stack(series)
    lo, hi = stack.min(axis=0), stack.max(axis=0)
    fig.add_trace(go.Scatter(name=f"{name}: least loaded replica", line=dict(color=colour, width=0),
                             showlegend=False, **_windowed(edges, lo)), row=row, col=1)
    fig.add_trace(go.Scatter(name=f"{name}: min-max over {len(series)} replicas", line=dict(color=colour, width=0),
                             fill="tonexty", **_windowed(edges, hi)), row=row, col=1)
    fig.add_trace(go.Scatter(name=f"{name}: mean over replicas", line=dict(color=colour),
                             **_windowed(edges, stack.mean(axis=0))), row=row, col=1)


def fig_timeline(result: RunResult, max_points: int = MAX_POINTS, x_end: float | None = None,
                 device: str = "GPU") -> go.Figure:
    """One variant's utilisation on a shared time axis: GPU busy fraction and MFU per window (per replica, on a 0-1
    axis), KV usage, queue length, and cumulative rejections and preemptions. ``x_end``: the end of the time
    axis (default: the run's end); the report passes the latest end over the variants, so they line up.
    ``device``: what ran the steps, for the busy panel's title ("CPU" for an engine run on a CPU, whose summary
    records ``device: cpu``; the title said "GPU busy" beside the table's "CPU busy")."""
    s = _sorted_steps(result)
    n = s.num_steps if isinstance(s, StepColumns) else len(s["start"])
    own_end = run_end(result)
    x_end = own_end if x_end is None else max(float(x_end), own_end)
    edges = window_edges(x_end, n, max_points)
    width = edges[1] - edges[0]
    # a long run's log: its series a block of steps at a time (the same values), not as whole columns
    series = timeline_series(result, s, edges) if isinstance(s, StepColumns) and n > max(max_points,
                                                                                              KEEP_EVENTS_MAX) else None
    fig = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        subplot_titles=(
            f"{device} busy (fraction of each window, per replica)",
            "MFU (per window, per replica)",
            "KV usage (fraction of capacity; per-window peak)",
            "requests (per-window peak)",
            "cumulative rejections and preemptions",
        ),
    )
    if series is not None:
        _timeline_of(fig, series, edges, result, x_end, max_points, own_end)
        return fig
    t = s["start"]
    # Per replica: each replica's steps run in parallel with the others', so their busy time over a window can sum
    # to several windows; a fraction of one GPU is only meaningful replica by replica.
    rep = np.asarray(s["replica"], dtype=np.int64) if "replica" in s else np.zeros(n, dtype=np.int64)
    per_busy, per_mfu = [], []
    # each line named by the replica that ran its steps (a replica that ran none has no line: the lines were
    # numbered 0, 1, 2... whatever their replicas), with its pool in a disaggregated run
    labels = [replica_label(result, int(r)) for r in np.unique(rep)]
    for r in np.unique(rep):
        on = rep == r
        every = bool(on.all())  # one replica: no masked copies of a long run's columns (the same values)
        t_on, d_on = (t, s["duration"]) if every else (t[on], s["duration"][on])
        per_busy.append(amount_per_window(t_on, d_on, d_on, edges) / width)
        if result.peak_flops > 0:
            per_mfu.append(amount_per_window(t_on, d_on, s["flops"] if every else s["flops"][on], edges)
                           / (width * result.peak_flops))
        del t_on, d_on
    fleet = _fleet_of(t, rep) if len(per_busy) > 1 else None
    del rep
    if fleet is not None:  # the panels' titles say whose figures they are
        fig.layout.annotations[2].text = "KV usage (fraction of the fleet's capacity; per-window peak)"
        fig.layout.annotations[3].text = "requests on the fleet, replicas summed (per-window peak)"
    _replica_lines(fig, edges, per_busy, "busy", color(0), row=1, labels=labels)
    if per_mfu:
        _replica_lines(fig, edges, per_mfu, "MFU", color(1), row=2, labels=labels)
    cap = _kv_capacity(s, result)
    # kv_blocks_used counts reserved-but-empty blocks already (sim/metrics/records.py): "KV used" is the table's KV
    # usage,
    # and the dotted line under it is what is left without the reservations
    blocks_used, reserved = s["kv_blocks_used"], s["kv_blocks_reserved"]
    if fleet is not None:  # the fleet's blocks over the fleet's capacity, each replica at its latest step
        blocks_used, reserved, cap = fleet(blocks_used), fleet(reserved), fleet(cap)
    with np.errstate(divide="ignore", invalid="ignore"):
        used = blocks_used / cap
        filled = (blocks_used - reserved) / cap
    fig.add_trace(
        go.Scatter(name="KV used", line=dict(color=color(2)),
                   **_state_trace(t, used, edges, "max", max_points, own_end)),
        row=3,
        col=1,
    )
    if np.any(s["kv_blocks_reserved"] > 0):
        fig.add_trace(
            go.Scatter(
                name="KV used, reserved-empty blocks left out",
                line=dict(color=color(2), dash="dot"),
                **_state_trace(t, filled, edges, "max", max_points, own_end),
            ),
            row=3,
            col=1,
        )
    for j, (col, label) in enumerate(_QUEUES):
        if col == "num_swapped" and not np.any(s[col] > 0):
            continue
        fig.add_trace(
            go.Scatter(name=label, line=dict(color=color(3 + j)),
                       **_state_trace(t, s[col] if fleet is None else fleet(s[col]), edges, "max", max_points,
                                      own_end)),
            row=4,
            col=1,
        )
    pre = s["num_preempted"] > 0
    _count_lines(fig, result, t[pre], s["num_preempted"][pre], edges, max_points)
    _timeline_layout(fig, result, x_end)
    return fig


_QUEUES = (("num_waiting", "waiting"), ("num_running", "running"), ("num_swapped", "swapped"))


def _fleet_of(t: np.ndarray, rep: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """What turns a step column (in start order) into the fleet's figure at each step: the sum over replicas of
    each one's value at its latest step started by then (0 before its first). A replica's step carries its own
    queue and KV only, and drawn one after another the replicas' figures made a zigzag that was the fleet's at no
    time (running 1, 2, 1, 2 on three replicas). Each replica's change at its step, summed in start order; steps
    that start together all count at once, so no partial sum between them shows as a peak."""
    order = np.argsort(rep, kind="stable")  # each replica's steps, in start order
    firsts = np.r_[True, rep[order][1:] != rep[order][:-1]]
    last_of_tie = np.searchsorted(t, t, side="right") - 1

    def fleet(values: np.ndarray) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)[order]
        change = np.diff(v, prepend=0.0)
        change[firsts] = v[firsts]
        delta = np.empty_like(change)
        delta[order] = change
        return np.cumsum(delta)[last_of_tie]
    return fleet


def _count_lines(fig: go.Figure, result: RunResult, pre_t: np.ndarray, pre_n: np.ndarray, edges: np.ndarray,
                 max_points: int) -> None:
    """The cumulative rejections (from the requests) and preemptions (the preempting steps' starts and counts)."""
    rejected = Outcome.REJECTED.value  # once: Enum.value is a slow property
    table = as_table(result.requests)
    rej_t = table.column("finish")[table.outcome_is(rejected)]
    fig.add_trace(
        go.Scatter(
            name="rejections", line=dict(color=color(6)), **_count_trace(rej_t, np.ones_like(rej_t), edges, max_points)
        ),
        row=5,
        col=1,
    )
    fig.add_trace(
        go.Scatter(name="preemptions", line=dict(color=color(7)), **_count_trace(pre_t, pre_n, edges, max_points)),
        row=5,
        col=1,
    )


def _timeline_layout(fig: go.Figure, result: RunResult, x_end: float) -> None:
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_yaxes(range=[0, 1], row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], row=3, col=1)
    fig.update_xaxes(title_text="time (s)", row=5, col=1)
    fig.update_xaxes(range=[0.0, x_end])
    fig.update_layout(template=TEMPLATE, height=900, title=f"Utilisation over time: {result.name}")


def _timeline_of(fig: go.Figure, series: TimelineSeries, edges: np.ndarray, result: RunResult, x_end: float,
                 max_points: int, own_end: float) -> None:
    """fig_timeline's traces from a long run's series read in blocks (``timeline_series``): the same traces, in
    the same order, as from the whole columns."""
    _replica_lines(fig, edges, [series.busy], "busy", color(0), row=1)
    if series.mfu is not None:
        _replica_lines(fig, edges, [series.mfu], "MFU", color(1), row=2)
    fig.add_trace(go.Scatter(name="KV used", line=dict(color=color(2)),
                             **_windowed(edges, held_until(edges, series.kv_used, own_end))),
                  row=3, col=1)
    if series.any_reserved:
        fig.add_trace(go.Scatter(name="KV used, reserved-empty blocks left out", line=dict(color=color(2), dash="dot"),
                                 **_windowed(edges, held_until(edges, series.kv_filled, own_end))), row=3, col=1)
    for j, (col, label) in enumerate(_QUEUES):
        if col == "num_swapped" and not series.any_swapped:
            continue
        fig.add_trace(go.Scatter(name=label, line=dict(color=color(3 + j)),
                                 **_windowed(edges, held_until(edges, series.queues[col], own_end))),
                      row=4, col=1)
    _count_lines(fig, result, series.preempt_t, series.preempt_n, edges, max_points)
    _timeline_layout(fig, result, x_end)


def fig_kv_memory(result: RunResult, max_points: int = MAX_POINTS) -> go.Figure:
    """KV cache memory over time (per-window means): blocks holding tokens and blocks reserved but empty, stacked
    so that their top is the blocks used (kv_blocks_used counts both), and the capacity. In GiB when the run
    knows the bytes per block, else in blocks."""
    s = _sorted_steps(result)
    edges = window_edges(run_end(result), len(s["start"]), max_points)
    scale, unit = (result.kv_bytes_per_block / 2**30, "GiB") if result.kv_bytes_per_block > 0 else (1.0, "blocks")
    t = s["start"]
    fig = go.Figure()
    reserved = s["kv_blocks_reserved"]
    for blocks, label, c in ((s["kv_blocks_used"] - reserved, "holding tokens", color(2)),
                             (reserved, "reserved, empty", color(4))):
        fig.add_trace(
            go.Scatter(
                name=label,
                stackgroup="kv",
                line=dict(color=c),
                **_state_trace(t, blocks * scale, edges, "mean", max_points),
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
        n = s.num_steps if isinstance(s, StepColumns) else len(s["start"])
        edges = window_edges(run_end(res), n, max_points)
        width = edges[1] - edges[0]
        for row, col in ((1, "decode_tokens"), (2, "prefill_tokens")):
            # a long run's log a block at a time (the same values), not as three whole columns
            amount = amount_in_blocks(s, col, edges) if isinstance(s, StepColumns) and n > KEEP_EVENTS_MAX else None
            if amount is None:
                amount = amount_per_window(s["start"], s["duration"], s[col], edges)
            rate = amount / width
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
        table = as_table(res.requests)
        fin = table.column("finish")[table.outcome_is("completed")]
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
