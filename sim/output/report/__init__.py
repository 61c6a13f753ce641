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

The figures live by theme in ``sim.output.report.figures`` (latency CDFs, utilisation, KV memory, throughput),
``sim.output.report.slots`` (the batch-slot chart), ``sim.output.report.memory`` (memory stack, KV by request) and
``sim.output.report.sweep``, on the shared reductions of ``sim.output.report.common``; this module builds the page and
re-exports every name, so ``from sim.output.report import ...`` works as it did when the report was one file.

To add a section, write a builder ``(results, summaries) -> list[Section]`` and append it to ``SECTIONS`` (or
pass ``sections=`` to ``build_report``).
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from sim.config.files import write_atomically
from sim.metrics.records import RunResult, has_classes
from sim.metrics.summary import bottleneck
from sim.metrics.verdict import rank_limits
from sim.output.report.common import (
    COLORS,
    MAX_POINTS,
    MIN_WINDOWS,
    TEMPLATE,
    Section,
    _count_trace,
    _kv_capacity,
    _sorted_steps,
    _state_trace,
    _windowed,
    amount_per_window,
    color,
    common_end,
    ecdf_points,
    legend_below,
    plotly_safe,
    run_end,
    state_per_window,
    step_events_kept,
    trace_points,
    window_edges,
    wrap_lines,
)
from sim.output.report.decisions import decisions_sections
from sim.output.report.energy import energy_sections
from sim.output.report.fairness import fairness_sections
from sim.output.report.figures import (
    CDF_LOG_SPAN,
    CDF_PANELS,
    MARKED_PERCENTILES,
    REPLICA_LINES,
    _replica_lines,
    fig_class_latency_cdfs,
    fig_kv_memory,
    fig_latency_cdfs,
    fig_throughput,
    fig_timeline,
    latencies,
    replica_label,
    spans_decades,
)
from sim.output.report.memory import (
    MEMORY_LAYERS,
    MEMORY_POINTS,
    REQUEST_KV_CAPACITY_IN_RANGE,
    REQUEST_KV_POINTS,
    REQUEST_KV_REQUESTS,
    _gpu_total_bytes,
    fig_memory_by_request,
    fig_memory_stack,
    memory_layers,
    request_kv_tokens,
    request_kv_window,
)
from sim.output.report.pipeline import host_kv_sections, pipeline_sections
from sim.output.report.slots import (
    PAD_COLOR,
    SLOT_COLORS,
    SLOT_PANELS,
    SLOT_REQUESTS,
    SlotLayout,
    _policy,
    _slot_limit,
    assign_slots,
    fig_batch_slots,
    slot_layout,
    slot_window,
)
from sim.output.report.spec_decode import spec_decode_parts
from sim.output.report.sweep import (
    _SWEEP_NAME,
    SWEEP_PANELS,
    _metric,
    _parse_value,
    fig_sweep,
    sweep_params,
)
from sim.output.table import metric_value, table_cells, table_notes

# --- the page --------------------------------------------------------------------------------------------------


def _p(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def per_run_points(num_results: int) -> int:
    """Points per series in figures drawn once per run: fewer when a sweep makes many runs, so that the page stays
    small (the full MAX_POINTS up to four runs)."""
    return MAX_POINTS if num_results <= 4 else max(200, MAX_POINTS * 4 // num_results)


SLOT_TITLE_CHARS = 130  # a batch-slot panel title's line: about 950 px of the 1400 px page's figure


def _slots_section(results: list[RunResult], summaries: dict) -> list[Section]:
    dropped = len(results) - SLOT_PANELS
    results = results[:SLOT_PANELS]
    layouts = [slot_layout(r, SLOT_REQUESTS) for r in results]  # the spans the chart can draw
    # a run that scheduled no request (every one rejected) has no batch: its panel was an empty frame titled
    # "0 of 0 scheduled requests drawn; 0 rows"
    idle = [r.name for r, lay in zip(results, layouts, strict=True) if not lay.spans]
    drawn = [(r, lay) for r, lay in zip(results, layouts, strict=True) if lay.spans]
    results, layouts = [r for r, _ in drawn], [lay for _, lay in drawn]
    notes = [
        f"The first {SLOT_PANELS} of {SLOT_PANELS + dropped} runs are drawn." if dropped > 0 else "",
        f"{', '.join(idle)}: no request was scheduled, so there is no batch to draw." if idle else "",
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
    # the layouts made above, not made again (each is several arrays a request, and both were held at once)
    if not results:
        return [Section("Batch slots", None, _p(notes[1]))]
    fig = fig_batch_slots(results, layouts=layouts)
    for a in fig.layout.annotations:  # a panel title past SLOT_TITLE_CHARS ran past both edges of the figure
        a.text = wrap_lines(a.text, SLOT_TITLE_CHARS)
    return [Section("Batch slots", fig, "".join(_p(n) for n in notes if n))]


def _kv_peaks(names: list[str], summaries: dict) -> str:
    return " and ".join(f"{100 * metric_value(summaries[n], 'kv_usage.max'):.1f}% ({n})" for n in names)


def memory_ceiling_text(results: list[RunResult], summaries: dict) -> str:
    """Whether memory is the ceiling, per the verdict (sim/metrics/verdict.py: "memory-bound"), with the KV peaks behind
    it: the note once said "The ceiling is memory" over runs whose KV peaked at 9-16%."""
    names = [r.name for r in results if r.name in summaries
             and math.isfinite(metric_value(summaries[r.name], "kv_usage.max"))]
    bound = [n for n in names if "memory-bound" in rank_limits(summaries[n]).names]
    free = [n for n in names if n not in bound]
    parts = []
    if bound:
        pressure = ", ".join(
            f"{n}: {metric_value(summaries[n], 'num_preemptions'):.0f} preemptions, "
            f"{metric_value(summaries[n], 'num_rejected'):.0f} rejected" for n in bound)
        parts.append(f"The ceiling is memory for {', '.join(bound)}: KV usage peaks at {_kv_peaks(bound, summaries)} "
                     f"of the pool ({pressure}).")
    if free:
        parts.append(f"Memory is not the ceiling{' for ' + ', '.join(free) if bound else ' here'}: KV usage peaks "
                     f"at {_kv_peaks(free, summaries)} of the pool.")
    return " ".join(parts)


def _memory_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    general = (
        "The weights sit at the bottom for the whole run, and every running request's KV cache must stay "
        "resident above them until it finishes; when the KV pool fills, requests wait or are preempted. "
        "Reserved-but-empty blocks (contiguous reservation sets aside a request's maximum length up front) and "
        "the empty tails of partly filled blocks take room that holds no token. Values are means over short "
        "windows; the dashed line is the weights plus the KV pool"
        + (", the dotted one the GPU's whole memory." if any(_device(summaries, r.name) == "GPU" for r in results)
           else ".")
    )
    note = _p(" ".join(x for x in (memory_ceiling_text(results, summaries), general) if x))
    points = per_run_points(len(results))
    end = common_end(results)
    return [
        Section(f"{_device(summaries, r.name)} memory: {r.name}",
                fig_memory_stack(r, min(points, MEMORY_POINTS), x_end=end, device=_device(summaries, r.name)),
                note if i == 0 else "")
        for i, r in enumerate(results)
    ]


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


def _latency_section(results: list[RunResult], summaries: dict) -> list[Section]:
    # one scale per axis for every variant's panels: fcfs's TTFT read on a linear axis beside priority's log one
    per_class = [Section(f"Latency per class: {r.name}", fig_class_latency_cdfs(r, scale_over=results))
                 for r in results[:8] if has_classes(r.requests)]  # 8 variants at most, as the memory sections
    return [Section("Latency", fig_latency_cdfs(results)), *per_class]


def _timeline_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    points = per_run_points(len(results))
    end = common_end(results)
    return [Section(f"Utilisation: {r.name}", fig_timeline(r, points, x_end=end, device=_device(summaries, r.name)))
            for r in results]


def _device(summaries: dict, name: str) -> str:
    """What ran a variant's steps, as the table's busy row says it: "CPU" where its summary records ``device:
    cpu`` (``servesim engine run --device cpu``), else "GPU"."""
    return "CPU" if summaries.get(name, {}).get("device") == "cpu" else "GPU"


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
    legend_below(fig.update_layout(template=TEMPLATE), 380)
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
            cells = [r.name, replica_label(r, p["replica"]).removeprefix("replica "), f"{p['provisioned']:.0f}",
                     f"{p['ready']:.0f}",
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


def _disagg_section(results: list[RunResult], summaries: dict) -> list[Section]:
    from sim.output.report.disagg import NOTE, disagg_table_html, fig_disagg

    fig = fig_disagg(results, summaries)
    return [] if fig is None else [Section("Disaggregation", fig, _p(NOTE) + disagg_table_html(results, summaries))]


def _throughput_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section("Throughput", fig_throughput(results, per_run_points(len(results))))]


def _spec_decode_section(results: list[RunResult], summaries: dict) -> list[Section]:
    return [Section(t, f, h) for t, f, h in spec_decode_parts(results, summaries)]


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
    energy_sections,
    fairness_sections,
    decisions_sections,
    _spec_decode_section,
    pipeline_sections,
    host_kv_sections,
    _disagg_section,
]


def summary_table_html(summaries: dict) -> str:
    """The comparison table of ``sim.output.table.format_table`` as an HTML table, with its notes under it."""
    header, rows = table_cells(summaries)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + f"<th>{html.escape(r[0])}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in r[1:]) + "</tr>"
        for r in rows
    )
    notes = "".join(_p(n) for n in table_notes(summaries))
    return (f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}'
            + interval_html(summaries))


def interval_html(summaries: dict) -> str:
    """The 80% intervals of ``servesim run --interval`` (summary.json's ``interval_80``) under the table, the lines
    the terminal prints; nothing when the run computed none, so a plain run's report stays as it was."""
    if not any("interval_80" in s for s in summaries.values()):
        return ""
    from sim.metrics.intervals import interval_lines

    head, *rows = interval_lines(summaries)
    items = "".join(f"<li>{html.escape(r.strip())}</li>" for r in rows)
    return f'<p class="note">{html.escape(head)}</p><ul class="interval">{items}</ul>'


def bottlenecks_html(summaries: dict) -> str:
    """Per variant: the one-line verdict, the overload when there is one, then every other limit found, strongest
    first, with its score and numbers. The overload stands apart, not at the head of the numbered ranking: it is
    the symptom the limits explain and leads the verdict whatever its score, so a ranking that put "overloaded
    (0.21)" above "bandwidth-bound (0.99)" would read as out of order."""
    items = []
    for name, s in summaries.items():
        limits = rank_limits(s).limits
        over = "".join(
            f"<br>symptom: {html.escape(lim.name)} ({lim.score:.2f}): {html.escape(lim.evidence)}"
            for lim in limits if lim.name == "overloaded"
        )
        ranked = "".join(
            f"<li>{html.escape(lim.name)} ({lim.score:.2f}): {html.escape(lim.evidence)}</li>"
            for lim in limits if lim.name != "overloaded"
        )
        items.append(f"<li><b>{html.escape(name)}</b>: {html.escape(bottleneck(s))}{over}<ol>{ranked}</ol></li>")
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
    with step_events_kept():  # the windows over a run's steps order its starts and ends once
        for builder in SECTIONS if sections is None else sections:
            for sec in builder(results, summaries):
                parts.append(f"<h2>{html.escape(sec.title)}</h2>")
                if sec.html:
                    parts.append(sec.html)
                if sec.figure is not None:
                    parts.append(
                        pio.to_html(
                            plotly_safe(sec.figure, [*summaries, *(r.name for r in results)]),
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


__all__ = [
    "MAX_POINTS",
    "MIN_WINDOWS",
    "TEMPLATE",
    "COLORS",
    "color",
    "common_end",
    "run_end",
    "window_edges",
    "amount_per_window",
    "state_per_window",
    "_windowed",
    "_state_trace",
    "_count_trace",
    "ecdf_points",
    "trace_points",
    "_sorted_steps",
    "_kv_capacity",
    "latencies",
    "CDF_PANELS",
    "MARKED_PERCENTILES",
    "CDF_LOG_SPAN",
    "spans_decades",
    "fig_class_latency_cdfs",
    "fig_latency_cdfs",
    "REPLICA_LINES",
    "_replica_lines",
    "fig_timeline",
    "fig_kv_memory",
    "fig_throughput",
    "SLOT_REQUESTS",
    "SLOT_PANELS",
    "SlotLayout",
    "assign_slots",
    "slot_layout",
    "_policy",
    "_slot_limit",
    "slot_window",
    "SLOT_COLORS",
    "PAD_COLOR",
    "fig_batch_slots",
    "MEMORY_POINTS",
    "MEMORY_LAYERS",
    "memory_layers",
    "_gpu_total_bytes",
    "fig_memory_stack",
    "REQUEST_KV_REQUESTS",
    "REQUEST_KV_POINTS",
    "request_kv_window",
    "request_kv_tokens",
    "REQUEST_KV_CAPACITY_IN_RANGE",
    "fig_memory_by_request",
    "_SWEEP_NAME",
    "_parse_value",
    "sweep_params",
    "SWEEP_PANELS",
    "_metric",
    "fig_sweep",
    "Section",
    "_p",
    "per_run_points",
    "_slots_section",
    "_memory_sections",
    "_latency_section",
    "_timeline_sections",
    "_kv_sections",
    "_sweep_section",
    "fig_replicas",
    "_cluster_section",
    "_throughput_section",
    "SectionBuilder",
    "SECTIONS",
    "summary_table_html",
    "bottlenecks_html",
    "_CSS",
    "build_report",
    "write_report",
    "_request_memory_sections",
]
