"""The disaggregation section: each pool's use and the distribution of the KV transfer times, for the runs that
split prefill and decode (``RunResult.disaggregation``, filled by ``sim.loop.disagg.pools``)."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics.records import RunResult
from sim.output.report.common import TEMPLATE, color, legend_below
from sim.output.table import FORMATTERS as fmt

ECDF_POINTS = 400  # points per run on the transfer-time curve

NOTE = (
    "Left: the share of time each pool's replicas run steps (busy) and their mean KV-cache use. A pool near 100% "
    "busy while the other idles is the bottleneck of the xPyD split. Right: each request's KV transfer time, "
    "from the end of its prefill to its KV at the decode pool (the wait for the prefill replica's link plus the "
    "copy), as a cumulative distribution. TTFT includes it, the decode queue and the first decode step."
)


def fig_disagg(results: list[RunResult], summaries: dict) -> go.Figure | None:
    # colours follow the run's place among all runs, as in every other figure
    runs = [(i, r) for i, r in enumerate(results) if r.disaggregation and r.name in summaries]
    if not runs:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("pool use", "KV transfer time (CDF)"))
    for i, r in runs:
        pools = summaries[r.name]["disaggregation"]["pools"]
        roles = list(pools)
        hover = [f"{p['replicas']}x {p['gpu']} TP{p['tensor_parallel_size']}" for p in pools.values()]
        fig.add_trace(go.Bar(x=roles, y=[100 * p["busy_fraction"] for p in pools.values()], name=f"{r.name}: busy",
                             marker_color=color(i), hovertext=hover), row=1, col=1)
        fig.add_trace(go.Bar(x=roles, y=[100 * p["kv_usage_mean"] for p in pools.values()],
                             name=f"{r.name}: KV use", marker_color=color(i), opacity=0.45, hovertext=hover),
                      row=1, col=1)
        d = r.disaggregation
        assert d is not None
        t = np.sort(d["transfer_end"] - d["prefill_end"]) * 1e3
        if t.size:
            idx = np.unique(np.linspace(0, t.size - 1, min(t.size, ECDF_POINTS)).astype(np.int64))
            fig.add_trace(go.Scatter(x=t[idx], y=(idx + 1) / t.size, mode="lines", name=f"{r.name}: transfer",
                                     line={"color": color(i), "width": 2}), row=1, col=2)
    legend_below(fig.update_layout(template=TEMPLATE, barmode="group"), 380)
    fig.update_yaxes(title_text="% (busy, KV use)", range=[0, 100], row=1, col=1)
    fig.update_xaxes(title_text="ms", row=1, col=2)
    fig.update_yaxes(title_text="share of requests", range=[0, 1], row=1, col=2)
    return fig


def disagg_table_html(results: list[RunResult], summaries: dict) -> str:
    """A row per disaggregated run: the split, the link, bytes moved, transfer p50/p99 and the two TTFTs."""
    rows = []
    for r in results:
        s = summaries.get(r.name, {})
        d = s.get("disaggregation")
        if not d:
            continue
        link = d["kv_link"]
        # the summary table's formats (sim/output/table.py): this table read 112.2 GiB, 8.15 ms and 497 ms where
        # it read 112.18, 8.2 and 496.5
        cells = [r.name, d["ratio"], f"{link['kind']} {link['bandwidth'] / 1e9:.0f} GB/s",
                 fmt["gib"](d["bytes_moved"] / 2**30), fmt["ms"](d["transfer"]["p50"]), fmt["ms"](d["transfer"]["p99"]),
                 fmt["ms"](d["prefill_ttft"]["p99"]), fmt["ms"](s["ttft"]["p99"]), fmt["ms"](d["decode_queue"]["p99"])]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "split", "KV link", "KV moved (GiB)", "transfer p50 (ms)",
                                              "transfer p99 (ms)", "prefill TTFT p99 (ms)", "TTFT p99 (ms)",
                                              "decode queue p99 (ms)"))
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
