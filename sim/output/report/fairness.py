"""Report section of fairness and scheduling anomalies (summary.json's ``anomalies``, see ``sim.metrics.anomalies``):
service received over time per tenant, and a table of inversions, head-of-line blocking and starvation per
variant. No section when no run has the ``anomalies`` block."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from sim.metrics.anomalies import HOL_FACTOR, INVERSION_TOLERANCE
from sim.output.report.common import TEMPLATE, Section, color, legend_below
from sim.output.report.pipeline import _table

if TYPE_CHECKING:
    from sim.metrics.records import RunResult

DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # one per variant; colour: the tenant


def fig_service_over_time(summaries: dict) -> go.Figure | None:
    """Output tokens each tenant has received over time, one line per (variant, tenant): the tenant by colour,
    the variant by dash. None when no variant names tenants."""
    runs = [(name, s["anomalies"]["service_over_time"]) for name, s in summaries.items()
            if "service_over_time" in s.get("anomalies", {})]
    if not runs:
        return None
    tenants = sorted({t for _, svc in runs for t in svc["output_tokens"]})
    fig = go.Figure()
    for k, (name, svc) in enumerate(runs):
        for t, got in sorted(svc["output_tokens"].items()):
            fig.add_trace(go.Scatter(x=svc["t"], y=got, mode="lines", name=f"{name}: {t}",
                                     line={"color": color(tenants.index(t)), "dash": DASHES[k % len(DASHES)]},
                                     hovertemplate="%{x:.1f} s: %{y:.0f} tokens<extra>" + html.escape(f"{name}: {t}")
                                     + "</extra>"))
    legend_below(fig.update_layout(template=TEMPLATE), 400)
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="output tokens received", rangemode="tozero")
    return fig


def _row(name: str, s: dict) -> list[str]:
    a = s["anomalies"]
    inv, st = a["inversions"], a["starvation"]
    hol = a.get("head_of_line")
    blocked = "" if hol is None else (", ".join(str(i) for i in hol["blocked_replicas"]) or "none")
    fair = s.get("fairness", {})
    jain = fair.get("jain_index")
    windows = fair.get("backlogged_windows")
    cell = "" if jain is None else f"{jain:.3f}" + ("" if windows is None else f" ({windows} windows)")
    return [name, f"{inv['count']}", f"{inv['by_priority']}", f"{inv['by_arrival']}", blocked,
            f"{st['longest_wait']:.2f} s (request {st['request']}, {st['class']})", cell]


def fairness_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    rows = [_row(name, s) for name, s in summaries.items() if "anomalies" in s]
    if not rows:
        return []
    table = _table(("run", "inversions", "by priority", "by arrival", "HOL-blocked replicas", "longest wait",
                    "Jain's index"), rows)
    note = '<p class="note">' + html.escape(
        "An inversion is a pair served by one replica where the request that arrived no later and has no lower "
        f"priority was first scheduled more than {1000 * INVERSION_TOLERANCE:g} ms after the other (FCFS has "
        "none; fair and cache-aware orders have them by design). A replica is head-of-line blocked when its mean "
        f"queue (Little's law) is over {HOL_FACTOR:g} times the fleet's. The longest wait is to a request's first "
        "scheduling. Jain's index compares the service (prompt + 2 x output tokens) the tenants received while "
        "backlogged (a request of theirs waiting), over the windows (of 20 in the run) where two or more were: "
        "1 is equal service, 1 / tenants one tenant served alone; 1 where no two tenants were ever backlogged "
        "together. Where some tenant got a smaller share of the output tokens it asked for (its requests rejected or "
        "failed), the index is Jain's index of those shares if lower: a refused request never waits. The chart "
        "shows each tenant's output tokens received so far.") + "</p>"
    return [Section("Fairness and anomalies", fig_service_over_time(summaries), note + table)]
