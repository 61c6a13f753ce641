"""Report sections of pipeline parallelism (stage utilisation and bubbles) and of the prefix cache's host tier
(what it loaded back instead of computing). Each builder returns no section when no run used the feature."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from sim.metrics.records import RunResult
from sim.output.report.common import TEMPLATE, Section, color


def _table(head: tuple[str, ...], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="summary"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


BAR_SPAN = 0.8  # of the unit between two micro-batch counts, what the bars at one count fill together


def fig_pipeline(results: list[RunResult]) -> go.Figure | None:
    """Stage utilisation by micro-batches in flight, per pipelined run, against GPipe's m / (m + p - 1) (a
    flushed schedule) and m / p (a pipeline that refills continuously, as inference does)."""
    runs = [r for r in results if r.pipeline]
    if not runs:
        return None
    fig = go.Figure()
    p_max = 1
    # the bars at each micro-batch count share its tick, side by side: grouped bars kept a slot for every run at
    # every count, so a run alone at a count stood beside its tick (lesson-pipeline-bubbles' bar at 1 sat at 0.7)
    sharing: dict[int, list[str]] = {}
    for r in runs:
        assert r.pipeline is not None
        for b in r.pipeline["by_micro_batches"]:
            sharing.setdefault(b["micro_batches"], []).append(r.name)
    for i, r in enumerate(results):
        if not r.pipeline:
            continue
        pl = r.pipeline
        p_max = max(p_max, pl["pipeline_parallel_size"])
        by = pl["by_micro_batches"]
        width = [BAR_SPAN / len(sharing[b["micro_batches"]]) for b in by]
        offset = [-BAR_SPAN / 2 + w * sharing[b["micro_batches"]].index(r.name) for b, w in zip(by, width, strict=True)]
        fig.add_trace(go.Bar(x=[b["micro_batches"] for b in by], y=[b["stage_utilization"] for b in by],
                             width=width, offset=offset,
                             name=r.name, marker_color=color(i),
                             customdata=[100 * b["time_fraction"] for b in by],
                             hovertemplate="%{x} micro-batches: utilisation %{y:.1%}, %{customdata:.1f}% of the "
                                           "step time<extra>" + html.escape(r.name) + "</extra>"))
    ms = list(range(1, p_max + 1))
    fig.add_trace(go.Scatter(x=ms, y=[m / p_max for m in ms], mode="lines+markers", name=f"m / p (p = {p_max})",
                             line=dict(color="black", dash="dot")))
    fig.add_trace(go.Scatter(x=ms, y=[m / (m + p_max - 1) for m in ms], mode="lines+markers",
                             name=f"GPipe m / (m + p - 1) (p = {p_max})", line=dict(color="grey", dash="dash")))
    fig.update_layout(template=TEMPLATE, barmode="overlay", height=380,
                      xaxis_title="micro-batches in flight (min(stages, running requests))",
                      xaxis=dict(tickmode="linear", tick0=1, dtick=1, range=[0.5, p_max + 0.5]),
                      yaxis_title="stage utilisation", yaxis_range=[0, 1.05])
    return fig


def pipeline_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    fig = fig_pipeline(results)
    if fig is None:
        return []
    rows = []
    for r in results:
        if r.pipeline:
            pl = r.pipeline
            rows.append([r.name, str(pl["pipeline_parallel_size"]), pl["link"], f"{pl['mean_micro_batches']:.2f}",
                         f"{100 * pl['stage_utilization']:.1f}%", f"{100 * pl['bubble_fraction']:.1f}%",
                         f"{pl['hop_seconds']:.3f}"])
    note = (
        '<p class="note">Each stage holds a share of the layers; a step is one round in which every running request '
        "advances, split into min(stages, requests) micro-batches that follow one another through the stages. "
        "A stage is idle (a bubble) while the micro-batches are elsewhere: with one micro-batch it works 1/p of "
        "the time. The bars are the measured utilisation, time-weighted over the steps with that many "
        "micro-batches; the lines are the ideal continuous pipeline (m / p) and GPipe's flushed schedule.</p>")
    table = _table(("run", "stages", "link", "micro-batches (mean)", "stage utilisation", "bubble",
                    "stage hops (s)"), rows)
    return [Section("Pipeline stages", fig, note + table)]


def fig_host_kv(results: list[RunResult]) -> go.Figure | None:
    """Prefill tokens computed and tokens loaded from the host tier instead, per run."""
    if not any(r.host_kv for r in results):
        return None
    names = [r.name for r in results]
    computed = [float(r.steps["prefill_tokens"].sum()) for r in results]
    loaded = [float(r.host_kv["recompute_saved_tokens"]) if r.host_kv else 0.0 for r in results]
    fig = go.Figure([
        go.Bar(x=names, y=computed, name="prefill tokens computed", marker_color=color(0)),
        go.Bar(x=names, y=loaded, name="loaded from host memory instead", marker_color=color(2)),
    ])
    fig.update_layout(template=TEMPLATE, barmode="stack", height=340, yaxis_title="tokens")
    return fig


def host_kv_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    fig = fig_host_kv(results)
    if fig is None:
        return []
    rows = []
    for r in results:
        h = r.host_kv
        if not h:
            continue
        ttft = summaries.get(r.name, {}).get("ttft", {}).get("mean", float("nan"))
        rows.append([r.name, f"{h['capacity_gib']:.0f}", f"{h['link_bandwidth'] / 1e9:.0f}", f"{h['stored_blocks']:,}",
                     f"{h['evicted_blocks']:,}", f"{h['hit_loads']:,}", f"{h['loaded_bytes'] / 2**30:,.1f}",
                     f"{h['recompute_saved_tokens']:,}", f"{h['load_seconds']:.2f}", f"{ttft:.2f}"])
    note = (
        '<p class="note">Prefix blocks the GPU cache evicts are copied to host memory (least recently used out '
        "when full); a prompt that continues past its GPU prefix hits loads the blocks the host holds over the "
        "host link instead of computing them again. The load time is added to the step that admits the "
        "request.</p>")
    table = _table(("run", "host GiB/GPU", "link GB/s", "blocks offloaded", "dropped from host", "requests loading",
                    "GiB loaded", "prefill tokens saved", "load time (s)", "TTFT mean (s)"), rows)
    return [Section("Host tier of the prefix cache", fig, note + table)]
