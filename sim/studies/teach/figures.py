"""The teaching page's figures: the report's own (batch slots, memory stack, latency CDFs, imported from
``sim.output.report`` as they are) laid out for the page's width, and one compact utilisation panel that puts the runs
side by side.

The report lays its figures out for a wide page; here they also have to read on a phone. Each function takes
``narrow`` (the browser's window is narrower than ``NARROW_PX``): side-by-side panels are stacked, long titles are
broken into lines, and the space for those lines is counted in pixels. Every figure keeps its legend below its
plot in a bottom margin sized for it, with the axes' tick labels and titles pushing margins of their own
(``automargin``), so that no text box overlaps another (tests/test_teach_browser.py measures it in Chromium).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics.records import RunResult
from sim.output.report import TEMPLATE, color, fig_batch_slots, fig_latency_cdfs, fig_memory_stack
from sim.output.report.common import wrap_lines
from sim.studies.teach.knobs import TEACH_REQUESTS

__all__ = ["NARROW_PX", "fig_latency_cdfs_page", "fig_memories", "fig_slots", "fig_utilisation"]

# Window width (CSS px) below which the page stacks its panels: three CDF panels side by side need about 300 px
# each beside the 320 px of knobs.
NARROW_PX = 1200
# Characters per line of a title (17 px font) and of a subplot title (16 px) on a narrow page, whose figures are
# 330 to 370 px wide (phones 360 to 400 px); on a wide one (about 1,000 px) a subplot title breaks after WIDE_CHARS.
NARROW_TITLE_CHARS = 30
NARROW_HEAD_CHARS = 34
WIDE_CHARS = 100
MODEBAR_PX = 32  # the band at the top where plotly shows its mode bar (zoom, pan, ...) on hover or tap
LINE_PX = 22  # one line of a (subplot) title, leading included
LEGEND_ROW_PX = 24  # one row of a horizontal legend
AXIS_PX = 48  # an x axis below a plot: its tick labels and its title

UTILISATION_BARS = (
    ("busy_fraction", "GPU busy"),
    ("mfu", "MFU"),
    ("kv_mean", "KV usage (mean)"),
    ("kv_max", "KV usage (peak)"),
    ("kv_token_utilization", "KV slots holding a token"),
)


def _wrap(text: str, chars: int) -> str:
    return wrap_lines(text, chars)


def _lines(text: str) -> int:
    return text.count("<br>") + 1


def _legend_rows(names: list[str], narrow: bool) -> int:
    """Rows a horizontal legend takes: about 7 px a character plus 40 px of symbol and gap per entry."""
    width = 330 if narrow else 950
    rows, used = 1, 0.0
    for n in names:
        w = 7.0 * len(n) + 40
        if used and used + w > width:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def _tidy(fig: go.Figure, title: str, narrow: bool, head_px: float = 0.0) -> None:
    """Title broken into lines on a narrow page, a top margin for it (and ``head_px`` of subplot titles below it), a
    legend below the plot in a bottom margin of its own, axes that push the margins for their labels."""
    title = _wrap(title, NARROW_TITLE_CHARS) if narrow else title
    legend = [t.name for t in fig.data if t.showlegend is not False and t.name]
    rows = _legend_rows(legend, narrow) if legend and len(fig.data) > 1 else 0  # plotly shows none for one trace
    top = MODEBAR_PX + LINE_PX * _lines(title) + head_px + 12
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    fig.update_layout(
        # the title just above the subplot titles, below the mode bar's band
        # (plotly anchors a title's first line: its further lines hang below it, into the padding)
        title=dict(text=title, x=0.01, xanchor="left", y=1.0, yref="paper", yanchor="bottom",
                   pad=dict(b=head_px + 6 + LINE_PX * (_lines(title) - 1)), automargin=False),
        # the legend at the figure's bottom edge, in a margin that holds it and the x axis above it
        legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0.0, xanchor="left"),
        margin=dict(t=top, b=AXIS_PX + LEGEND_ROW_PX * rows + 10, l=70, r=30),
    )


def fig_slots(results: list[RunResult], narrow: bool = False) -> go.Figure:
    """The report's batch-slot chart, at most the page's own TEACH_REQUESTS per variant (what start-up says), its
    panel titles broken into lines and the panels spaced for them."""
    fig = fig_batch_slots(results, max_requests=TEACH_REQUESTS)
    if not results:
        return fig
    heads = list(fig.layout.annotations)
    for a in heads:
        a.text = _wrap(a.text, NARROW_HEAD_CHARS if narrow else WIDE_CHARS)
    head_px = [LINE_PX * _lines(a.text) + 6 for a in heads]
    # the report's height is 140 px of margins and titles plus the panels' rows
    plot_px = float(fig.layout.height) - 140
    _tidy(fig, fig.layout.title.text, narrow, head_px=head_px[0])
    # the panels' heights in proportion to their rows, as the report has them; the gap above each panel but the
    # first holds its title
    names = [f"yaxis{i if i > 1 else ''}" for i in range(1, len(results) + 1)]
    weights = [fig.layout[n].domain[1] - fig.layout[n].domain[0] for n in names]
    margin = fig.layout.margin
    height = margin.t + margin.b + plot_px + sum(head_px[1:])
    plot = height - margin.t - margin.b
    y = 1.0
    for i, (n, w) in enumerate(zip(names, weights, strict=True)):
        if i:
            y -= head_px[i] / plot
        top = y
        y -= plot_px * w / sum(weights) / plot
        fig.layout[n].domain = [max(0.0, y), top]
        heads[i].y = top
    fig.update_layout(height=int(height))
    return fig


def fig_memories(results: list[RunResult], narrow: bool = False) -> go.Figure:
    """The report's GPU memory stack of each run on one figure with a shared memory axis: side by side on a wide
    page, one above the other on a narrow one."""
    parts = [fig_memory_stack(r) for r in results]
    n = max(len(parts), 1)
    rows, cols = (n, 1) if narrow else (1, n)
    head_px = LINE_PX + 6
    panel_px = 260 if narrow else 280
    # each run on its own time axis, as side by side: a short run is not squeezed into a long one's
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=not narrow, subplot_titles=[r.name for r in results],
                        horizontal_spacing=0.05, vertical_spacing=(head_px + AXIS_PX) / (rows * panel_px))
    for i, part in enumerate(parts, start=1):
        row, col = (i, 1) if narrow else (1, i)
        for trace in part.data:
            trace.showlegend = i == 1
            # stack groups are per axis pair in plotly: keep each run's layers stacking on its own panel
            if getattr(trace, "stackgroup", None):
                trace.stackgroup = f"memory{i}"
            fig.add_trace(trace, row=row, col=col)
        fig.update_xaxes(title_text="time (s)", row=row, col=col)
        fig.update_yaxes(title_text=parts[0].layout.yaxis.title.text if narrow or i == 1 else None,
                         rangemode="tozero", row=row, col=col)
    fig.update_layout(template=TEMPLATE)
    _tidy(fig, "GPU memory: weights, KV holding tokens, reserved, free", narrow, head_px=head_px)
    fig.update_layout(height=int(fig.layout.margin.t + fig.layout.margin.b + rows * panel_px))
    return fig


def _bar_value(summary: dict, key: str) -> float:
    if key == "kv_mean":
        v = summary["kv_usage"]["mean"]
    elif key == "kv_max":
        v = summary["kv_usage"]["max"]
    else:
        v = summary[key]
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0


def fig_utilisation(summaries: dict[str, dict], narrow: bool = False) -> go.Figure:
    """Busy fraction against MFU against KV usage, one group of bars per run (all shares of 1)."""
    fig = go.Figure()
    # a category label broken into lines where five of them share a phone's width
    labels = [_wrap(label, 7) if narrow else label for _, label in UTILISATION_BARS]
    for i, (name, s) in enumerate(summaries.items()):
        values = [_bar_value(s, key) for key, _ in UTILISATION_BARS]
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=values,
                marker_color=color(i),
                text=[f"{100 * v:.0f}%" for v in values],
                textposition="outside",
                hovertemplate="%{x}: %{y:.1%}<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(template=TEMPLATE, barmode="group", height=360 if narrow else 340,
                      yaxis=dict(range=[0, 1.15], tickformat=".0%"))
    _tidy(fig, "Utilisation: busy vs MFU vs KV", narrow)
    if narrow:  # level labels (plotly turns them upright when they crowd), with room for their extra lines
        fig.update_xaxes(tickangle=0, tickfont=dict(size=11))
        fig.update_layout(margin=dict(b=fig.layout.margin.b + 3 * LINE_PX))
    return fig


def fig_latency_cdfs_page(results: list[RunResult], narrow: bool = False) -> go.Figure:
    """The report's latency CDFs (side by side on a wide page, stacked on a narrow one) with the percentile
    labels of the current run (the last) kept apart and inside their panel: p99 above its marker, p95 below, both
    to its right, with room made for them on the right of the x axis and above 1 on the y axis."""
    src = fig_latency_cdfs(results)
    panels = [a.text for a in src.layout.annotations]
    n = len(panels)
    head_px = LINE_PX + 6
    panel_px = 240
    fig = make_subplots(rows=n if narrow else 1, cols=1 if narrow else n, subplot_titles=panels,
                        horizontal_spacing=0.09, vertical_spacing=(head_px + AXIS_PX) / (n * panel_px))
    for trace in src.data:  # the report labels the current run's (the last) percentiles, with room made for them
        k = int((trace.xaxis or "x")[1:] or 1)
        fig.add_trace(trace, row=k if narrow else 1, col=1 if narrow else k)
    for k in range(1, n + 1):
        old = src.layout[f"xaxis{k if k > 1 else ''}"]
        row, col = (k, 1) if narrow else (1, k)
        fig.update_xaxes(row=row, col=col, title_text=old.title.text, type=old.type, range=old.range)
        y = src.layout[f"yaxis{k if k > 1 else ''}"]
        fig.update_yaxes(range=y.range, row=row, col=col, tickvals=y.tickvals,
                         title_text="fraction of requests" if narrow or k == 1 else None)
    fig.update_layout(template=TEMPLATE, hovermode="closest")
    _tidy(fig, src.layout.title.text, narrow, head_px=head_px)
    fig.update_layout(height=int(fig.layout.margin.t + fig.layout.margin.b + (n if narrow else 1) * panel_px))
    return fig
