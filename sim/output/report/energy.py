"""Report section of power and energy (summary.json's ``energy``, sim/costs/energy.py): the fleet's power over time and
each completed request's energy, per run, with a table of the run's joules and watts. No section when no run has
power figures."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.costs.energy import run_energy
from sim.costs.energy_time import power_over_time
from sim.metrics.records import RunResult
from sim.metrics.request_table import as_table
from sim.output.report.common import TEMPLATE, Section, color, ecdf_points, legend_below
from sim.output.report.pipeline import _table
from sim.output.table import FORMATTERS as fmt

POWER_BINS = 200  # time bins of the power chart per run

NOTE = (
    "Power over time: the mean draw of the run's GPUs in each of 200 time bins (steps at the power their compute and "
    "memory use give, idle gaps at idle power, capped at the board's limit). Energy per request: its share of each "
    "step's energy by the tokens it had computed there, the idle energy shared alike, over completed requests. "
    "The model and its sources are in sim/costs/energy.py."
)


def fig_energy(results: list[RunResult]) -> go.Figure | None:
    """Power over time (left) and the distribution of energy per completed request (right), one colour per run.
    None when no run has power figures."""
    runs = [(i, r) for i, r in enumerate(results) if r.power is not None]
    if not runs:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("power over time", "energy per request (CDF)"))
    for i, r in runs:
        name = html.escape(r.name)
        curve = power_over_time(r, POWER_BINS)
        if curve is not None:
            t, w = curve
            fig.add_trace(go.Scatter(x=t, y=w, mode="lines", name=r.name, legendgroup=r.name,
                                     line={"color": color(i)},
                                     hovertemplate="%{x:.1f} s: %{y:.0f} W<extra>" + name + "</extra>"), row=1, col=1)
        e = run_energy(r)
        done = as_table(r.requests).outcome_is("completed")
        if e is not None and done.any():
            pts = ecdf_points(np.sort(e.request_energy_j[done]))
            fig.add_trace(go.Scatter(**pts, mode="lines", name=r.name, legendgroup=r.name, showlegend=False,
                                     line={"color": color(i)},
                                     hovertemplate="%{x:.1f} J: %{y:.1%}<extra>" + name + "</extra>"), row=1, col=2)
    legend_below(fig.update_layout(template=TEMPLATE), 400)  # under the x axis titles
    fig.update_xaxes(title_text="time (s)", row=1, col=1)
    fig.update_yaxes(title_text="W (all GPUs)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="J per request", row=1, col=2)
    fig.update_yaxes(title_text="share of requests", range=[0, 1.02], row=1, col=2)
    return fig


def _cell(kind: str, x: float | None) -> str:
    """A figure in the summary table's format, "-" where it is undefined as there (a run in which no step ran has
    no peak step power: the cell read "nan")."""
    return fmt[kind](x) if x is not None and np.isfinite(x) else "-"


def _limit(e: dict, replicas: object) -> str:
    """The board limit times the fleet's GPUs: the mean power beside it is the fleet's (3 replicas of one GPU
    drew 816 W beside a limit read "400 x 1"); a disaggregated run's pool by pool."""
    if "pools" in e:
        return " + ".join(f"{p['power_limit_w']:g} x {int(p['gpus_per_replica']) * p['replicas']} ({role})"
                          for role, p in e["pools"].items())
    gpus = int(e["gpus_per_replica"])
    n = replicas if isinstance(replicas, int) and replicas > 1 else 1
    return f"{e['power_limit_w']:g} x {gpus * n}" + (f" ({n} replicas of {gpus})" if n > 1 else "")


def _peak(e: dict, replicas: object) -> str:
    """The most power a step drew: one replica's (its GPUs'), said so beside a fleet's mean, which it can sit
    under (4 replicas: mean 1,150 W, peak step 700 W)."""
    cell = _cell("int", e["peak_step_power_w"])
    return cell + " (one replica)" if isinstance(replicas, int) and replicas > 1 and cell != "-" else cell


def energy_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    fig = fig_energy(results)
    if fig is None:
        return []
    rows = []
    for name, s in summaries.items():
        e = s.get("energy")
        if not e:
            continue
        idle_share = e["idle_energy_j"] / e["energy_j"] if e["energy_j"] > 0 else 0.0
        # the summary table's formats (sim/output/table.py) for the figures it shows too: this table read
        # 0.8827 J and 2121 W where it read 0.883 and 2,121
        rows.append([name, _cell("s", e["energy_j"] / 1000), _cell("sig", e["j_per_output_token"]),
                     _cell("int", e["mean_power_w"]), _peak(e, s.get("num_replicas")),
                     _cell("sig", e["j_per_request"]["median"]), _cell("sig", e["j_per_request"]["p99"]),
                     _cell("pct", idle_share), _limit(e, s.get("num_replicas"))])
    table = _table(("run", "energy (kJ)", "J / output token", "mean power (W)", "peak step power (W)",
                    "J / request p50", "J / request p99", "idle share", "limit (W x GPUs)"), rows)
    return [Section("Power and energy", fig, f'<p class="note">{html.escape(NOTE)}</p>' + table)]
