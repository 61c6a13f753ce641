"""Small helpers for the teaching notebooks: finding the shipped scenarios, running a scenario given as a dict,
and the few numbers and pictures the notebooks compute that the report does not.

The notebooks read ``SERVESIM_NOTEBOOK_FAST`` (see :func:`fast_mode`): the test suite sets it so that every
notebook runs on even smaller settings than its already small defaults.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sim.config.scenario import load_scenario, parse_scenario
from sim.loop.run import ScenarioRun, run_scenario
from sim.metrics.records import RunResult
from sim.output.report import TEMPLATE, color

FAST_ENV = "SERVESIM_NOTEBOOK_FAST"


def fast_mode() -> bool:
    """Whether notebooks should use their smallest settings (``SERVESIM_NOTEBOOK_FAST`` set to anything but
    empty, 0, false or no)."""
    return os.environ.get(FAST_ENV, "").strip().lower() not in ("", "0", "false", "no")


def find_scenario(name: str) -> Path:
    """The path of a shipped scenario, ``scenarios/NAME.yaml``, looked up from the working directory, its parent
    (a notebook runs in ``notebooks/``) and the checkout this package was loaded from."""
    file = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    here = Path.cwd()
    for base in (here, here.parent, Path(__file__).resolve().parents[2]):
        p = base / "scenarios" / file
        if p.is_file():
            return p
    raise FileNotFoundError(f"scenario {file!r} not found under scenarios/ of {here}, its parent or the checkout")


def run_shipped(name: str, overrides: dict[str, Any] | None = None) -> ScenarioRun:
    """Run a shipped scenario with overrides (dotted keys, as ``servesim run --set``)."""
    scenario, raw = load_scenario(find_scenario(name), overrides)
    return run_scenario(scenario, raw)


def simulate(raw: dict[str, Any]) -> ScenarioRun:
    """Validate a scenario written as a dict (the YAML file's content) and run every variant on its workload."""
    return run_scenario(parse_scenario(raw, source="notebook"), raw)


def result_named(run: ScenarioRun, name: str) -> RunResult:
    for r in run.results:
        if r.name == name:
            return r
    raise KeyError(f"no variant {name!r}; the run has {[r.name for r in run.results]}")


def throughput_ratio(run: ScenarioRun, numerator: str, denominator: str, key: str = "output_throughput") -> float:
    """summary[key] of one variant over another's (output tokens per second by default)."""
    return float(run.summaries[numerator][key]) / float(run.summaries[denominator][key])


def output_lengths(result: RunResult) -> np.ndarray:
    """The target output length of every request of a run, in request id order."""
    reqs = sorted(result.requests, key=lambda r: r.id)
    return np.array([r.target_output_tokens for r in reqs], dtype=np.int64)


def length_spread(lengths: Sequence[int] | np.ndarray) -> float:
    """Coefficient of variation of the lengths: standard deviation over mean (0 when all are equal; 1 for an
    exponential distribution)."""
    x = np.asarray(lengths, dtype=np.float64)
    return float(x.std() / x.mean()) if len(x) and x.mean() > 0 else float("nan")


def static_batching_estimate(lengths: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """Back-of-envelope gain of refilling slots over static batches, from the output lengths alone.

    Static batching cuts the requests into batches of ``batch_size`` in order and runs each batch for as many
    decode steps as its longest request needs, so it spends sum(rows x longest) row-steps. A server that refills
    every freed row at once spends sum(lengths) row-steps, plus nothing. If every decode step cost the same, the
    throughput ratio would be the quotient. It ignores prefill, the cost of bigger batches and the tail of the
    run, so it is an upper bound rather than a forecast."""
    x = np.asarray(lengths, dtype=np.float64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not len(x):
        return float("nan")
    spent = sum(len(b) * b.max() for b in np.array_split(x, np.arange(batch_size, len(x), batch_size)))
    return float(spent / x.sum())


def fig_ratio_by_spread(
    spread: Sequence[float],
    series: dict[str, Sequence[float]],
    labels: Sequence[str] | None = None,
    bands: dict[str, tuple[float, float]] | None = None,
    title: str = "Throughput of continuous over naive batching against the spread of output lengths",
) -> go.Figure:
    """One line per series of ratios against the coefficient of variation of the output lengths, with optional
    shaded bands (published ranges) and a point label per spread value."""
    fig = go.Figure()
    for j, (name, (low, high)) in enumerate((bands or {}).items()):
        fig.add_hrect(
            y0=low,
            y1=high,
            fillcolor=color(7 + j),
            opacity=0.12,
            line_width=0,
            annotation_text=name,
            annotation_position="top left",
        )
    order = np.argsort(np.asarray(spread, dtype=np.float64), kind="stable")
    xs = np.asarray(spread, dtype=np.float64)[order]
    text = None if labels is None else [labels[i] for i in order]
    for i, (name, ys) in enumerate(series.items()):
        fig.add_trace(
            go.Scatter(
                name=name,
                x=xs,
                y=np.asarray(ys, dtype=np.float64)[order],
                mode="lines+markers",
                line=dict(color=color(i), dash="dot" if "estimate" in name else None),
                text=text,
                hovertemplate="%{text}<br>spread %{x:.2f}: %{y:.2f}x<extra>" + name + "</extra>",
            )
        )
    fig.add_hline(y=1.0, line=dict(color="#999999", width=1))
    fig.update_layout(
        template=TEMPLATE,
        height=450,
        hovermode="closest",
        title=title,
        xaxis_title="spread of output lengths (standard deviation / mean)",
        yaxis_title="throughput ratio (x)",
        yaxis_rangemode="tozero",
    )
    return fig


def fig_metric_panels(summaries: dict, metrics: Sequence[tuple[str, str]], title: str = "") -> go.Figure:
    """One bar panel per metric side by side, one bar per variant in each: metrics with different units get their
    own axis each. (Two metrics' bars on twin y axes of one panel are drawn over each other, and the second one
    hid the first.) ``metrics``: (summary key, axis title) pairs."""
    from plotly.subplots import make_subplots

    names = list(summaries)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[label for _, label in metrics],
                        horizontal_spacing=0.12)
    for col, (key, label) in enumerate(metrics, start=1):
        ys = [float(summaries[n][key]) for n in names]
        fig.add_trace(go.Bar(name=label, x=names, y=ys, marker_color=color(col - 1), showlegend=False,
                             text=[f"{y:,.0f}" for y in ys], textposition="outside"), row=1, col=col)
        fig.update_yaxes(title_text=label, rangemode="tozero", row=1, col=col)
    fig.update_layout(template=TEMPLATE, height=420, title=title)
    return fig
