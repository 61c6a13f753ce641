"""The comparison table of a run's variants: one row per metric, one column per variant, as cells
(``table_cells``, which the HTML report renders) or as fixed-width text for the terminal (``format_table``)."""

from __future__ import annotations

import math
from collections.abc import Callable


def metric_value(summary: dict, key: str) -> float:
    """A summary's figure at a dotted key (``ttft.p99``) as a float; NaN where it is absent, null or not a number
    (a summary read back from an older or other run folder)."""
    return value_at(summary, key.split("."))


def value_at(summary: dict, parts: list[str]) -> float:
    """:func:`metric_value` at a key given as its parts (a class name may hold a dot)."""
    v: object = summary
    for part in parts:
        if not isinstance(v, dict) or part not in v:
            return math.nan
        v = v[part]
    try:
        return math.nan if v is None else float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan



def _ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def _s(x: float) -> str:
    return f"{x:.2f}"


def _rate(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _int(x: float) -> str:
    return f"{x:.0f}"


# (label, summary key with dots for nesting, formatter)
TABLE_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("TTFT mean (ms)", "ttft.mean", _ms),
    ("TTFT p50 (ms)", "ttft.p50", _ms),
    ("TTFT p99 (ms)", "ttft.p99", _ms),
    ("TPOT mean (ms)", "tpot.mean", _ms),
    ("TPOT p50 (ms)", "tpot.p50", _ms),
    ("TPOT p99 (ms)", "tpot.p99", _ms),
    ("ITL p50 (ms)", "itl.p50", _ms),
    ("ITL p99 (ms)", "itl.p99", _ms),
    ("E2EL p50 (s)", "e2el.p50", _s),
    ("E2EL p99 (s)", "e2el.p99", _s),
    ("queue p99 (s)", "queue.p99", _s),
    ("output tok/s", "output_throughput", _rate),
    ("total tok/s", "total_token_throughput", _rate),
    ("req/s", "request_throughput", _rate),
    ("goodput (req/s)", "goodput", _rate),
    ("SLO attainment", "slo_attainment", _pct),
    ("KV usage mean", "kv_usage.mean", _pct),
    ("KV usage max", "kv_usage.max", _pct),
    ("KV token util", "kv_token_utilization", _pct),
    ("GPU busy", "busy_fraction", _pct),
    ("MFU", "mfu", _pct),
    ("mean batch", "mean_batch_size", _s),
    ("padding", "padding_fraction", _pct),  # share of computed tokens that were padding (static batching)
    ("preemptions", "num_preemptions", _int),
    ("rejected", "num_rejected", _int),
    ("completed", "num_completed", _int),
    ("requests", "num_requests", _int),
)
# shown when a run is a cluster (summary["cluster"])
CLUSTER_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("replicas mean", "cluster.replicas_mean", _s),
    ("replicas max", "cluster.replicas_max", _int),
    ("GPU-hours", "cluster.gpu_hours", _s),
    ("cost ($)", "cluster.cost_usd", _s),
)


# shown when a run splits prefill and decode (summary["disaggregation"], sim/disagg)
DISAGG_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("KV moved (GiB)", "disaggregation.gib_moved", _s),
    ("KV transfer p50 (ms)", "disaggregation.transfer.p50", _ms),
    ("KV transfer p99 (ms)", "disaggregation.transfer.p99", _ms),
    ("prefill TTFT p99 (ms)", "disaggregation.prefill_ttft.p99", _ms),
    ("prefill pool busy", "disaggregation.pools.prefill.busy_fraction", _pct),
    ("decode pool busy", "disaggregation.pools.decode.busy_fraction", _pct),
)

# shown for each request class (summary["classes"]), labelled with the class's name
CLASS_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("requests", "num_requests", _int),
    ("TTFT p50 (ms)", "ttft.p50", _ms),
    ("TTFT p99 (ms)", "ttft.p99", _ms),
    ("TPOT p99 (ms)", "tpot.p99", _ms),
    ("E2EL p99 (s)", "e2el.p99", _s),
    ("output tok/s", "output_throughput", _rate),
    ("goodput (req/s)", "goodput", _rate),
    ("SLO attainment", "slo_attainment", _pct),
)
FAIRNESS_ROW = ("Jain fairness (tenants)", "fairness.jain_index", _s)


def _class_rows(summaries: dict, names: list[str]) -> list[tuple[str, list[str], Callable[[float], str]]]:
    """(label, key parts, formatter) of the per-class block: CLASS_ROWS for each class any variant has."""
    classes: list[str] = []
    for n in names:
        classes += [c for c in summaries[n].get("classes") or {} if c not in classes]
    rows = [(f"{c}: {label}", ["classes", c, *key.split(".")], fmt) for c in classes for label, key, fmt in CLASS_ROWS]
    if any("fairness" in summaries[n] for n in names):
        label, key, fmt = FAIRNESS_ROW
        rows.append((label, key.split("."), fmt))
    return rows


def ratio_text(r: float) -> str:
    """A ratio that stays readable across decades: a 2000x fall in latency reads "1/2,000", never "0.00"."""
    if r == 0:
        return "0"
    if abs(r) < 0.1:
        return f"1/{1 / r:,.0f}"
    return f"{r:.2f}" if abs(r) < 100 else f"{r:,.0f}"


def table_cells(summaries: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of strings: one row per TABLE_ROWS entry (then a block per request class, and the tenants'
    fairness, when a run has them), one column per variant, plus a ratio column (last variant over the first)
    when exactly two variants are compared. Undefined values show as "-"."""
    names = list(summaries)
    header = ["metric"] + names
    two = len(names) == 2
    if two:
        header.append("×")
    rows = []
    cluster = any("cluster" in summaries[n] for n in names)
    disagg = any("disaggregation" in summaries[n] for n in names)
    plain = TABLE_ROWS + (CLUSTER_ROWS if cluster else ()) + (DISAGG_ROWS if disagg else ())
    rows_of = [(label, key.split("."), fmt) for label, key, fmt in plain] + _class_rows(summaries, names)
    for label, parts, fmt in rows_of:
        vals = [value_at(summaries[n], parts) for n in names]
        row = [label] + [fmt(v) if math.isfinite(v) else "-" for v in vals]
        if two:
            a, b = vals
            row.append(ratio_text(b / a) if math.isfinite(a) and math.isfinite(b) and a != 0 else "-")
        rows.append(row)
    return header, rows


def format_cells(header: list[str], rows: list[list[str]]) -> str:
    """Cells as fixed-width text: the first column left-aligned, the others right-aligned, a rule under the
    header (the run table and ``servesim compare`` alike)."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def format_table(summaries: dict) -> str:
    """A fixed-width comparison table for the terminal: metric names left, numbers right-aligned."""
    return format_cells(*table_cells(summaries))
