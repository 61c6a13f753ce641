"""The offline HTML report: a summary table, a bottleneck verdict per variant and plotly figures.

Each figure comes from a ``fig_*`` function, so a notebook can show the same pictures. The page embeds
plotly.js once (the first figure) and the later figures refer to it, so the file opens without a network.

Long runs are reduced before plotting, never drawn point by point: quantities that accumulate (busy time,
FLOPs, tokens) are integrated exactly over at most ``max_points`` windows; states (KV usage, queue length) take
their maximum (timeline) or mean (KV memory) per window; CDFs are sampled at evenly spaced probabilities. Window
series are written with ``x0``/``dx`` and float32 values, which keeps a 600k-step run well under 5 MB, plotly.js
included.

To add a section, write a builder ``(results, summaries) -> list[Section]`` and append it to ``SECTIONS`` (or
pass ``sections=`` to ``build_report``).
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from sim.metrics import bottleneck
from sim.output import _write_atomically, table_cells
from sim.records import RunResult
from sim.request import Outcome

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


def _latencies(result: RunResult) -> dict[str, np.ndarray]:
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


def fig_latency_cdfs(results: list[RunResult], max_points: int = MAX_POINTS) -> go.Figure:
    """CDFs of TTFT, TPOT and E2EL side by side, one curve per variant, with p50/p95/p99 marked."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in CDF_PANELS], horizontal_spacing=0.07)
    for i, res in enumerate(results):
        lat = _latencies(res)
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


def fig_timeline(result: RunResult, max_points: int = MAX_POINTS) -> go.Figure:
    """One variant's utilisation on a shared time axis: GPU busy fraction and MFU per window, KV usage, queue
    length, and cumulative rejections and preemptions."""
    s = _sorted_steps(result)
    n = len(s["start"])
    edges = window_edges(run_end(result), n, max_points)
    width = edges[1] - edges[0]
    t = s["start"]
    fig = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        subplot_titles=(
            "GPU busy (fraction of each window)",
            "MFU (per window)",
            "KV usage (fraction of capacity; per-window peak)",
            "requests (per-window peak)",
            "cumulative rejections and preemptions",
        ),
    )
    busy = amount_per_window(t, s["duration"], s["duration"], edges) / width
    fig.add_trace(go.Scatter(name="busy", line=dict(color=color(0)), **_windowed(edges, busy)), row=1, col=1)
    if result.peak_flops > 0:
        mfu = amount_per_window(t, s["duration"], s["flops"], edges) / (width * result.peak_flops)
        fig.add_trace(go.Scatter(name="MFU", line=dict(color=color(1)), **_windowed(edges, mfu)), row=2, col=1)
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
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], row=3, col=1)
    fig.update_xaxes(title_text="time (s)", row=5, col=1)
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


# --- the page --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Section:
    """A heading with a figure and/or an HTML fragment (already escaped)."""

    title: str
    figure: go.Figure | None = None
    html: str = ""


def _latency_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section("Latency", fig_latency_cdfs(results))]


def _timeline_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section(f"Utilisation: {r.name}", fig_timeline(r)) for r in results]


def _kv_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section(f"KV memory: {r.name}", fig_kv_memory(r)) for r in results]


def _throughput_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section("Throughput", fig_throughput(results))]


SectionBuilder = Callable[[list[RunResult], dict], list[Section]]
SECTIONS: list[SectionBuilder] = [_latency_section, _timeline_sections, _kv_sections, _throughput_section]


def summary_table_html(summaries: dict) -> str:
    """The comparison table of ``sim.output.format_table`` as an HTML table."""
    header, rows = table_cells(summaries)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + f"<th>{html.escape(r[0])}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in r[1:]) + "</tr>"
        for r in rows
    )
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def bottlenecks_html(summaries: dict) -> str:
    items = "".join(
        f"<li><b>{html.escape(name)}</b>: {html.escape(bottleneck(s))}</li>" for name, s in summaries.items()
    )
    return f'<ul class="bottleneck">{items}</ul>'


_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
table.summary { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.summary th, table.summary td { padding: 3px 12px; border-bottom: 1px solid #e5e5e5; }
table.summary td { text-align: right; }
table.summary tbody th { text-align: left; font-weight: normal; }
ul.bottleneck li { margin: 0.3em 0; }
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
    _write_atomically(p.parent, {p.name: build_report(results, summaries, title)})
    return p
