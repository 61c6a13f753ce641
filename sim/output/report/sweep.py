"""Sweep figures: throughput and tail latency against the swept parameter."""

from __future__ import annotations

import html
import re

import plotly.graph_objects as go
import yaml
from plotly.subplots import make_subplots

from sim.metrics.records import RunResult
from sim.metrics.summary import summarize
from sim.output.report.common import (
    TEMPLATE,
    color,
)

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
        fig.update_xaxes(title_text=f"{x_key}, log scale" if log_x else x_key, type="log" if log_x else None,
                         tickvals=ticks, row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(
        template=TEMPLATE, height=380, hovermode="closest", title=f"Throughput and tail latency against {x_key}"
    )
    return fig
