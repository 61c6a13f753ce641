"""Two runs side by side (``servesim compare RUN_A RUN_B``): the summary table with the ratio B / A per metric,
and an offline HTML page with that table and the latency CDFs of both runs overlaid.

A run is a folder written by ``servesim run`` or ``servesim engine run`` (both write the same summary.json and
requests.csv). Variants are paired by name; two runs of one variant each are paired whatever their names, and
two runs with as many variants as each other but no name in common are paired in order.
"""

from __future__ import annotations

import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.files import read_text_capped
from sim.config.schema import ScenarioError
from sim.metrics.records import RequestRecord
from sim.output.table import format_cells, ratio_text, row_specs, slos_text, value_at
from sim.words import counted

COMPARE_FILE = "compare.html"


class RunFolderError(ScenarioError):
    """A run folder that cannot be read: missing, not a folder, no summary.json, or unreadable files."""


@dataclass(slots=True)
class RunSide:
    """One side of a comparison: its label (the folder's name, or A / B), summaries and request records."""

    label: str
    summaries: dict[str, dict]
    requests: dict[str, list[RequestRecord]] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)  # summary.json as read


def read_run(path: str | os.PathLike) -> RunSide:
    """A run folder's summary.json and requests.csv (requests.csv may be missing: then no CDFs)."""
    from sim.output.run_folder import read_requests

    if not os.fspath(path).strip():  # Path("") is the current folder: the error read ".: no summary.json here"
        raise RunFolderError(f"run folder path is empty ({os.fspath(path)!r}); name a folder written by `servesim run`")
    p = Path(path)
    if not p.exists():
        raise RunFolderError(f"{p}: run folder not found")
    if not p.is_dir():
        raise RunFolderError(f"{p}: not a folder (give a run folder written by `servesim run`)")
    summary = p / "summary.json"
    if not summary.is_file():
        raise RunFolderError(f"{p}: no summary.json here (not a run folder written by `servesim run`)")
    try:  # capped, as every file servesim reads: a summary.json is kilobytes a variant
        doc = json.loads(read_text_capped(summary, 256 << 20, "a run's summary.json"))
    except RecursionError:  # ended in json's traceback
        raise RunFolderError(f"{summary}: cannot read it: JSON nested too deeply") from None
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{summary}: cannot read it: {e}") from None
    variants = doc.get("variants") if isinstance(doc, dict) else None
    if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
        raise RunFolderError(f"{summary}: no 'variants' mapping of variant name to summary")
    requests: dict[str, list[RequestRecord]] = {}
    if (p / "requests.csv").is_file():
        try:
            requests = read_requests(p)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RunFolderError(f"{p / 'requests.csv'}: cannot read it: {e}") from None
    return RunSide(p.resolve().name or str(p), variants, requests, doc)


def pairs(a: RunSide, b: RunSide) -> list[tuple[str | None, str | None]]:
    """(variant of A, variant of B) in table order; None where one side has no partner."""
    na, nb = list(a.summaries), list(b.summaries)
    common = [n for n in na if n in b.summaries]
    if not common and len(na) == len(nb):
        return list(zip(na, nb, strict=True))
    out: list[tuple[str | None, str | None]] = [(n, n) for n in common]
    out += [(n, None) for n in na if n not in b.summaries]
    out += [(None, n) for n in nb if n not in a.summaries]
    return out


@dataclass(slots=True)
class Comparison:
    """Run A against run B. ``table()`` for the terminal, ``html()`` / ``write(dir)`` for the page."""

    a: RunSide
    b: RunSide

    def labels(self) -> tuple[str, str]:
        """The two runs' labels: their folder names, or A and B where those are equal."""
        la, lb = self.a.label, self.b.label
        return ("A", "B") if la == lb else (la, lb)

    def cells(self) -> tuple[list[str], list[list[str]]]:
        """Header and rows of strings: per variant pair the value in A, in B and the ratio B / A ("-" where a
        value is undefined)."""
        la, lb = self.labels()
        ps = pairs(self.a, self.b)
        header = ["metric"]
        for va, vb in ps:
            if va is not None:
                header.append(f"{la}: {va}")
            if vb is not None:
                header.append(f"{lb}: {vb}")
            if va is not None and vb is not None:
                header.append("×")
        every = list(self.a.summaries.values()) + list(self.b.summaries.values())
        # the run table's rows for both runs' variants (energy, disaggregation and class rows too: table_rows and
        # the cluster rows alone left out J / output token, which a comparison of power caps or dtypes is for)
        rows_spec = row_specs(dict(enumerate(every)))
        rows = []
        for label, parts, fmt in rows_spec:
            row = [label]
            for va, vb in ps:
                x = value_at(self.a.summaries[va], parts) if va is not None else math.nan
                y = value_at(self.b.summaries[vb], parts) if vb is not None else math.nan
                if va is not None:
                    row.append(fmt(x) if math.isfinite(x) else "-")
                if vb is not None:
                    row.append(fmt(y) if math.isfinite(y) else "-")
                if va is not None and vb is not None:
                    ok = math.isfinite(x) and math.isfinite(y) and x != 0
                    row.append(ratio_text(y / x) if ok else "-")
            rows.append(row)
        return header, rows

    def key_line(self) -> str:
        """What the ratios are, or, when no variant pairs, that there are none and why."""
        la, lb = self.labels()
        if any(va is not None and vb is not None for va, vb in pairs(self.a, self.b)):
            return f"× is B / A (A = {la}, B = {lb})"
        return (f"no ratios: no variant of A pairs with one of B (A = {la}: {', '.join(self.a.summaries)}; B = {lb}: "
                f"{', '.join(self.b.summaries)}); variants pair by name, or in order when no name is shared and both "
                "runs have as many")

    def count_line(self) -> str:
        """A warning where paired variants served different numbers of requests ("" where every pair agrees): their
        percentiles and rates are of different workloads (a 100-request run's TTFT p99 beside a 1,000-request
        run's read as a speed-up), and the table said nothing."""
        la, lb = self.labels()
        differ = []
        for va, vb in pairs(self.a, self.b):
            if va is None or vb is None:
                continue
            na, nb = (side.summaries[v].get("num_requests") for side, v in ((self.a, va), (self.b, vb)))
            if na != nb:
                differ.append(f"{la}: {va} {_count(na)}, {lb}: {vb} {_count(nb)}")
        if not differ:
            return ""
        return ("warning: the runs served different numbers of requests (" + "; ".join(differ) + "): their "
                "percentiles and rates are of different workloads, not of one workload served two ways.")

    def slo_line(self) -> str:
        """The SLOs behind goodput and SLO attainment, once when both runs share them, else per column: the
        same run under a stricter bound read as goodput falling, the table silent on what it compared. "" when
        neither run has SLOs."""
        la, lb = self.labels()
        held: dict[str, list[str]] = {}
        for label, side in ((la, self.a), (lb, self.b)):
            for name, summary in side.summaries.items():
                held.setdefault(slos_text(summary.get("slos")) or "no SLOs", []).append(f"{label}: {name}")
        if list(held) == ["no SLOs"]:
            return ""
        if len(held) == 1:
            return f"goodput, SLO attainment: requests completed within {next(iter(held))}."
        return ("goodput, SLO attainment: requests completed within "
                + "; ".join(f"{t} ({', '.join(cols)})" for t, cols in held.items()) + ".")

    def table(self) -> str:
        """The side-by-side table as fixed-width text, with a line naming A and B and one on their SLOs."""
        notes = [line for line in (self.count_line(), self.slo_line()) if line]
        return format_cells(*self.cells()) + self.key_line() + "\n" + "".join(line + "\n" for line in notes)

    def figure(self):
        """Latency CDFs of both runs overlaid (TTFT, TPOT, E2EL; log time axes, since two runs can differ by
        decades): one colour per variant pair, A solid and B dashed."""
        from sim.output.report.common import plotly_safe

        return plotly_safe(fig_compare_cdfs(self), [*self.labels(), *self.a.summaries, *self.b.summaries])

    def html(self) -> str:
        """The whole comparison as one self-contained HTML page (plotly.js embedded, works offline)."""
        import plotly.io as pio

        from sim.output.report import _CSS  # the run report's page style: one look for both pages

        la, lb = self.labels()
        header, rows = self.cells()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + f"<th>{html.escape(r[0])}</th>" + "".join(f"<td>{html.escape(c)}</td>"
                                                                        for c in r[1:]) + "</tr>" for r in rows)
        title = f"servesim compare: {la} vs {lb}"
        fig = pio.to_html(self.figure(), include_plotlyjs=True, full_html=False, div_id="fig-0",
                          config={"displaylogo": False, "responsive": True})
        return "\n".join([
            "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>{html.escape(self.key_line())}.</p>",
            f"<p><b>{html.escape(self.count_line())}</b></p>" if self.count_line() else "",
            f"<p>{html.escape(self.slo_line())}</p>" if self.slo_line() else "",
            "<h2>Summary</h2>",
            f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
            "<h2>Latency CDFs</h2>", fig, "</body></html>\n",
        ])

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write ``compare.html`` into out_dir (created if missing); returns the file's path."""
        from sim.config.files import output_folder, write_atomically

        out = output_folder(out_dir, "out_dir")
        out.mkdir(parents=True, exist_ok=True)
        write_atomically(out, {COMPARE_FILE: self.html()})
        return out / COMPARE_FILE



def _count(n: object) -> str:
    if isinstance(n, int) and not isinstance(n, bool):
        return counted(n, "request", fmt=",")
    return "an unknown number of requests"


def compare_runs(a: RunSide, b: RunSide) -> Comparison:
    """The comparison of two run sides (see :func:`read_run`)."""
    return Comparison(a, b)


def latency_values(records: list[RequestRecord]) -> dict[str, np.ndarray]:
    """TTFT, TPOT and E2EL (seconds) of the completed requests, with vLLM's definitions (TPOT excludes the first
    token, so it needs two)."""
    done = [r for r in records if r.completed and r.first_token >= 0]
    arr = np.array([r.arrival for r in done], dtype=np.float64)
    ft = np.array([r.first_token for r in done], dtype=np.float64)
    fin = np.array([r.finish for r in done], dtype=np.float64)
    out = np.array([r.output_tokens for r in done], dtype=np.int64)
    multi = out > 1
    return {"ttft": ft - arr, "tpot": (fin[multi] - ft[multi]) / (out[multi] - 1), "e2el": fin - arr}


_PANELS = (("ttft", "TTFT (ms)", 1e3), ("tpot", "TPOT (ms)", 1e3), ("e2el", "E2EL (s)", 1.0))


def fig_compare_cdfs(cmp: Comparison):
    """See :meth:`Comparison.figure`."""
    from plotly.subplots import make_subplots

    from sim.output.report import TEMPLATE, color, ecdf_points

    la, lb = cmp.labels()
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in _PANELS], horizontal_spacing=0.07)
    import plotly.graph_objects as go

    for i, (va, vb) in enumerate(pairs(cmp.a, cmp.b)):
        for side, label, variant, dash in ((cmp.a, la, va, "solid"), (cmp.b, lb, vb, "dash")):
            if variant is None or variant not in side.requests:
                continue
            lat = latency_values(side.requests[variant])
            name = f"{label}: {variant}"
            for col, (key, axis, scale) in enumerate(_PANELS, start=1):
                v = lat[key] * scale
                v = v[v > 0]  # a log axis has no place for 0
                if len(v) == 0:
                    continue
                fig.add_trace(go.Scatter(name=name, legendgroup=name, showlegend=col == 1, mode="lines",
                                         line=dict(color=color(i), dash=dash),
                                         hovertemplate=f"{axis}: %{{x:.4g}}<br>fraction: %{{y:.3f}}",
                                         **ecdf_points(v)), row=1, col=col)
    for col, (_, axis, _) in enumerate(_PANELS, start=1):
        fig.update_xaxes(title_text=f"{axis}, log scale", type="log", row=1, col=col)
    fig.update_yaxes(title_text="fraction of requests", range=[0, 1.02], row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=400, hovermode="closest",
                      title=f"Latency CDFs, completed requests ({la} solid, {lb} dashed)")
    return fig
