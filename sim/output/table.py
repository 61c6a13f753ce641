"""The comparison table of a run's variants: one row per metric, one column per variant, as cells
(``table_cells``, which the HTML report renders) or as fixed-width text for the terminal (``format_table``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.metrics.registry import BUILTIN_METRICS, Metric, plugin_metrics


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



# Thousands separators throughout: a queued TTFT reads 366,841.4 ms, not 366841.4.
def _ms(x: float) -> str:
    return f"{1e3 * x:,.1f}"


def _s(x: float) -> str:
    return f"{x:,.2f}"


def _rate(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 100 else f"{x:,.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _int(x: float) -> str:
    return f"{x:,.0f}"


def _sig(x: float) -> str:
    """Three significant digits, trailing zeros kept (``:.3g`` read 1.996 J as "2" beside "2.02"), whole numbers
    with separators from 100 up, as ratio_text writes ratios."""
    return ratio_text(x) if x != 0 else "0"


def _gib(x: float) -> str:
    """GiB as _s writes them, three significant digits below 0.01: the tiny model's 1P2D engine run moved 174,592
    bytes and its table read "KV moved (GiB) 0.00", as if nothing had moved."""
    return _s(x) if x == 0 or not abs(x) < 0.01 else ratio_text(x)


FORMATTERS: dict[str, Callable[[float], str]] = {"ms": _ms, "s": _s, "rate": _rate, "pct": _pct, "int": _int,
                                                  "sig": _sig, "gib": _gib}


def rows_of(metrics: tuple[Metric, ...]) -> tuple[tuple[str, str, Callable[[float], str]], ...]:
    """(label, summary key with dots for nesting, formatter) of each metric."""
    return tuple((m.label, m.key, FORMATTERS[m.fmt]) for m in metrics)


# the built-in metrics (sim/metrics/registry.py), in table order
TABLE_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = rows_of(BUILTIN_METRICS)


def table_rows() -> tuple[tuple[str, str, Callable[[float], str]], ...]:
    """TABLE_ROWS, then a row for each metric a plugin registered."""
    return TABLE_ROWS + rows_of(plugin_metrics())


# shown when a run is a cluster (summary["cluster"])
CLUSTER_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("replicas mean", "cluster.replicas_mean", _s),
    ("replicas max", "cluster.replicas_max", _int),
    ("GPU-hours", "cluster.gpu_hours", _s),
    ("cost ($)", "cluster.cost_usd", _s),
)




# shown when a run's GPU has power figures (summary["energy"], sim/costs/energy.py)
ENERGY_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("J / output token", "energy.j_per_output_token", _sig),
    ("mean power (W)", "energy.mean_power_w", _int),
)


# shown when a run splits prefill and decode (summary["disaggregation"], sim/loop/disagg)
DISAGG_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("KV moved (GiB)", "disaggregation.gib_moved", _gib),
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
    """A ratio in one format for every row and every decade: three significant digits (0.000155 for a
    6,447-fold fall, 0.570, 4.18, 60.0), whole numbers with separators from 100 up (251, 1,124). A ratio to zero
    (or of an undefined value) means nothing and reads "-": padding 65.8% -> 0.0% is no "0"."""
    if not math.isfinite(r) or r == 0:
        return "-"
    digits = math.floor(math.log10(abs(float(f"{r:.3g}"))))  # after rounding: 99.96 reads 100
    return f"{r:,.0f}" if digits >= 2 else f"{r:.{2 - digits}f}"


def _bound(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{1e3 * seconds:g} ms"


def slos_text(slos: dict | None) -> str:
    """The SLOs behind a goodput, as "TTFT <= 2 s and TPOT <= 100 ms"; "" when there are none."""
    bounds = slos or {}
    names = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))
    return " and ".join(f"{label} <= {_bound(float(bounds[k]))}" for k, label in names if bounds.get(k))


def table_notes(summaries: dict) -> list[str]:
    """What the table's figures are over, printed under it: the SLOs behind goodput and SLO attainment (the
    run's, and each class's own where it differs), and the window of its rates (the verdict's offered and
    scheduled rates span the arrivals only, and the workload's rate is the arrival process's setting)."""
    runs = {n: slos_text(s.get("slos")) for n, s in summaries.items()}
    # a class with SLOs of its own: its requests count against those in the run's goodput too (sim/metrics/summary.py)
    own = {n: {c: slos_text(b.get("slos")) for c, b in (s.get("classes") or {}).items()}
           for n, s in summaries.items()}
    own = {n: {c: t for c, t in cs.items() if t != runs[n]} for n, cs in own.items()}
    # without run SLOs, "within no SLOs, a class's own where it has them" said it backwards
    texts = {n: (t + ", a class's own where it has them" if t else "their class's own SLOs (none for a class "
                 "without)") if own[n] else (t or "no SLOs") for n, t in runs.items()}
    notes = []
    if len(set(texts.values())) == 1:
        if next(iter(runs.values())) or any(own.values()):
            notes.append(f"goodput, SLO attainment: requests completed within {next(iter(texts.values()))}.")
    else:
        notes.append("goodput, SLO attainment: requests completed within "
                     + "; ".join(f"{t} ({n})" for n, t in texts.items()) + ".")
    # a class's SLOs once, not once per variant (five variants of two classes printed ten lines of two facts)
    holders: dict[tuple[str, str], list[str]] = {}
    for n, cs in own.items():
        for c, t in cs.items():
            holders.setdefault((c, t), []).append(n)
    for (c, t), names in holders.items():
        which = f" ({', '.join(names)})" if len(names) < len(summaries) else ""
        notes.append(f"{c}: goodput, SLO attainment within {t or 'no SLOs'}{which}.")
    notes.append("tok/s, req/s and goodput: per second from a run's first arrival to its last finish.")
    return notes


def row_specs(summaries: dict) -> list[tuple[str, list[str], Callable[[float], str]]]:
    """(label, key parts, formatter) of every row the table shows for these summaries: the metrics, the cluster,
    energy and disaggregation rows where a run has them, then the request classes' block."""
    names = list(summaries)
    cluster = any("cluster" in summaries[n] for n in names)
    disagg = any("disaggregation" in summaries[n] for n in names)
    energy = any(summaries[n].get("energy") for n in names)
    plain = table_rows() + (CLUSTER_ROWS if cluster else ()) + (ENERGY_ROWS if energy else ()) \
        + (DISAGG_ROWS if disagg else ())
    busy = _busy_label(summaries, names)
    return [(busy if key == "busy_fraction" else label, key.split("."), fmt) for label, key, fmt in plain] \
        + _class_rows(summaries, names)


def _busy_label(summaries: dict, names: list[str]) -> str:
    """The busy row's label by the device the runs computed on: a real-engine run on a CPU records ``device:
    cpu`` and its table said "GPU busy 100%"; a simulated run is a GPU's."""
    kinds = sorted({"CPU" if summaries[n].get("device") == "cpu" else "GPU" for n in names}, reverse=True)
    return "/".join(kinds or ["GPU"]) + " busy"


def table_cells(summaries: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of strings: one row per TABLE_ROWS entry (then a block per request class, and the tenants'
    fairness, when a run has them), one column per variant, plus a ratio column (last variant over the first,
    headed "B / A" by their names) when exactly two variants are compared. Undefined values show as "-"."""
    names = list(summaries)
    header = ["metric"] + names
    two = len(names) == 2
    if two:
        header.append(f"{names[1]} / {names[0]}")
    rows = []
    for label, parts, fmt in row_specs(summaries):
        vals = [value_at(summaries[n], parts) for n in names]
        row = [label] + [fmt(v) if math.isfinite(v) else "-" for v in vals]
        if two:
            a, b = vals
            row.append(ratio_text(b / a) if a != 0 else "-")
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
    """A fixed-width comparison table for the terminal: metric names left, numbers right-aligned, then the notes
    saying what its goodput and rates are over."""
    return format_cells(*table_cells(summaries)) + "".join(f"{n}\n" for n in table_notes(summaries))
