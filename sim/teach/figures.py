"""The teaching page's figures: the report's own (batch slots, memory stack, latency CDFs, imported from
``sim.report`` as they are) and one compact utilisation panel that puts the runs side by side."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.records import RunResult
from sim.report import TEMPLATE, color, fig_batch_slots, fig_latency_cdfs, fig_memory_stack

__all__ = ["fig_batch_slots", "fig_latency_cdfs", "fig_memories", "fig_utilisation"]

UTILISATION_BARS = (
    ("busy_fraction", "GPU busy"),
    ("mfu", "MFU"),
    ("kv_mean", "KV usage (mean)"),
    ("kv_max", "KV usage (peak)"),
    ("kv_token_utilization", "KV slots holding a token"),
)


def _bar_value(summary: dict, key: str) -> float:
    if key == "kv_mean":
        v = summary["kv_usage"]["mean"]
    elif key == "kv_max":
        v = summary["kv_usage"]["max"]
    else:
        v = summary[key]
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0


def fig_utilisation(summaries: dict[str, dict]) -> go.Figure:
    """Busy fraction against MFU against KV usage, one group of bars per run (all shares of 1)."""
    fig = go.Figure()
    labels = [label for _, label in UTILISATION_BARS]
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
    fig.update_layout(
        template=TEMPLATE,
        barmode="group",
        height=320,
        title="Utilisation: busy vs MFU vs KV",
        yaxis=dict(range=[0, 1.15], tickformat=".0%"),
        margin=dict(t=60),
    )
    return fig


def fig_memories(results: list[RunResult]) -> go.Figure:
    """The report's GPU memory stack of each run, side by side on one figure (a shared memory axis)."""
    parts = [fig_memory_stack(r) for r in results]
    fig = make_subplots(rows=1, cols=len(parts), shared_yaxes=True, subplot_titles=[r.name for r in results],
                        horizontal_spacing=0.05)
    for col, part in enumerate(parts, start=1):
        for trace in part.data:
            trace.showlegend = col == 1
            # stack groups are per axis pair in plotly: keep each run's layers stacking on its own panel
            if getattr(trace, "stackgroup", None):
                trace.stackgroup = f"memory{col}"
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text="time (s)", row=1, col=col)
    fig.update_yaxes(title_text=parts[0].layout.yaxis.title.text if parts else "", rangemode="tozero", row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=380, title="GPU memory: weights, KV holding tokens, reserved, free",
                      legend=dict(orientation="h", y=-0.2))
    return fig
