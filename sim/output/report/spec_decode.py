"""The report's speculative decoding section: how many drafts the target accepted, and what that bought.

Speed-up of a speculating run = its output throughput over that of a run without speculation on the same
workload: the run of the same sweep point (same parameters) when the scenario sweeps, else the first run without
speculation. TPOT is compared likewise (a ratio below 1: tokens come faster).
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics.records import RunResult
from sim.output.report.common import TEMPLATE, color, legend_below
from sim.output.report.sweep import sweep_params


def _key(r: RunResult) -> tuple:
    sp = sweep_params(r)
    return () if sp is None else tuple(sorted((k, str(v)) for k, v in sp[1].items()))


def baselines(results: list[RunResult]) -> dict[str, str]:
    """Speculating run name -> the name of the run it is compared against (absent: none to compare with)."""
    plain = [r for r in results if not r.spec_decode]
    by_point: dict[tuple, str] = {}
    for r in plain:
        by_point.setdefault(_key(r), r.name)
    out = {}
    for r in results:
        if r.spec_decode:
            base = by_point.get(_key(r)) or (plain[0].name if plain and not _key(r) else None)
            if base is not None:
                out[r.name] = base
    return out


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _speedup_panel(fig: go.Figure, points: list[tuple[RunResult, float]]) -> str | None:
    """Draw each run's speed-up in the figure's second panel; return its x axis title. Sweep points of one numeric
    parameter: a line per variant against that parameter (a log axis over more than a decade). Otherwise a bar per
    run. One line through every run's name zigzagged between variants (lesson-speculative-decoding's draft-k4 and
    draft-k4-off-under-load alternated at each load) under tick labels written over each other."""
    if not points:
        return None
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#999"}, row=1, col=2)
    swept = [sweep_params(r) for r, _ in points]
    keys = {tuple(sp[1]) for sp in swept if sp is not None}
    key = next(iter(keys))[0] if len(keys) == 1 and len(next(iter(keys))) == 1 else None
    numeric = key is not None and all(sp is not None and isinstance(sp[1][key], (int, float))
                                      and not isinstance(sp[1][key], bool) for sp in swept)
    if not numeric:
        fig.add_trace(go.Bar(x=[r.name for r, _ in points], y=[v for _, v in points], name="speed-up",
                             showlegend=False, marker={"color": "#444"}), row=1, col=2)
        return None
    lines: dict[str, list[tuple[float, float]]] = {}
    for sp, (_, v) in zip(swept, points, strict=True):
        if sp is not None:  # every one is (numeric)
            lines.setdefault(sp[0], []).append((float(sp[1][key]), v))
    for i, (variant, xy) in enumerate(lines.items()):
        xy.sort()
        fig.add_trace(go.Scatter(x=[x for x, _ in xy], y=[y for _, y in xy], mode="lines+markers",
                                 name=f"speed-up: {variant}", line={"color": "#444", "dash": DASHES[i % len(DASHES)]},
                                 hovertemplate=f"{key}=%{{x}}: %{{y:.2f}}x<extra>{html.escape(variant)}</extra>"),
                      row=1, col=2)
    xs = [x for xy in lines.values() for x, _ in xy]
    if min(xs) > 0 and max(xs) > 10 * min(xs):
        fig.update_xaxes(type="log", row=1, col=2)
        return f"{key}, log scale"
    return key


def spec_decode_parts(results: list[RunResult], summaries: dict) -> list[tuple[str, go.Figure | None, str]]:
    """(title, figure, HTML) of the section; empty when no run speculates."""
    runs = [r for r in results if r.spec_decode and "spec_decode" in summaries.get(r.name, {})]
    if not runs:
        return []
    base = baselines(results)
    rows = []
    speedups: list[tuple[str, float]] = []
    for r in runs:
        s = summaries[r.name]
        sd = s["spec_decode"]
        b = summaries.get(base.get(r.name, ""), None)
        speed = s["output_throughput"] / b["output_throughput"] if b and b["output_throughput"] > 0 else math.nan
        tpot = s["tpot"]["mean"] / b["tpot"]["mean"] if b and b["tpot"]["mean"] > 0 else math.nan
        speedups.append((r.name, speed))
        per_pos = ", ".join(_fmt(x, ".2f") for x in sd["per_position_acceptance_rate"])
        cells = [r.name, sd["method"], sd["num_speculative_tokens"], _fmt(sd["draft_acceptance_rate"], ".1%"),
                 _fmt(sd["mean_acceptance_length"], ".2f"), per_pos, _fmt(sd["draft_time_share"], ".1%"),
                 base.get(r.name, "-"), _fmt(speed, ".2f") + ("x" if not math.isnan(speed) else ""),
                 _fmt(tpot, ".2f")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "method", "k", "draft acceptance rate", "mean acceptance length",
                                              "per-position acceptance", "draft time share", "compared with",
                                              "speed-up (output tok/s)", "TPOT ratio"))
    table = f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per-position acceptance rate", "speed-up over no speculation"))
    for i, r in enumerate(runs):
        rates = summaries[r.name]["spec_decode"]["per_position_acceptance_rate"]
        fig.add_trace(go.Bar(x=[f"draft {j + 1}" for j in range(len(rates))], y=rates, name=r.name,
                             marker={"color": color(i)}, legendgroup=r.name), row=1, col=1)
    x_title = _speedup_panel(fig, [(r, v) for r, (_, v) in zip(runs, speedups, strict=True) if not math.isnan(v)])
    legend_below(fig.update_layout(template=TEMPLATE, barmode="group"), 380)
    fig.update_yaxes(range=[0, 1], title_text="share of drafts", row=1, col=1)
    fig.update_yaxes(title_text="output tok/s over no speculation (x)", rangemode="tozero", row=1, col=2)
    if x_title:
        fig.update_xaxes(title_text=x_title, row=1, col=2)
    note = (
        '<p class="note">Each step, every decoding row drafts k tokens and the target verifies them in one step '
        "of 1 + k tokens; the row keeps the accepted prefix and one token of the target's. Mean acceptance length "
        "is tokens per row and step (1 + accepted / drafts). The speed-up is large while a step is bound by "
        "reading the weights (small batches) and shrinks, then turns into a loss, once the step is bound by "
        "compute: the rejected drafts are work thrown away.</p>"
    )
    return [("Speculative decoding", fig, note + table)]
