"""Report section of a decision trace (``servesim run --trace decisions``; summary.json's ``decisions`` per
variant, sim/metrics/decisions.py): decisions per kind with their top reasons, and the routing regret with the worst
decisions. No section when the run was not traced."""

from __future__ import annotations

import html

from sim.metrics.records import RunResult
from sim.output.report.common import Section
from sim.output.report.pipeline import _table

NOTE = (
    "Every admission, schedule, preemption and routing decision is in decisions.jsonl. A schedule row's reason is "
    "why the first waiting request left out was not admitted, as the plan shows it. Routing regret: the run "
    "simulated again with the request sent to each of the top-k alternatives (the others replayed as taken), "
    "the total E2E latency over the best alternative's, clipped at 0; the estimate is the prefill tokens queued "
    "ahead on the chosen replica over the best alternative, and its agreement is the share of decisions on which "
    "both say regret or both say none."
)


def _num(x: object, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt) if isinstance(x, float) else str(x)


def decisions_sections(results: list[RunResult], summaries: dict) -> list[Section]:
    traced = [(name, s["decisions"]) for name, s in summaries.items() if isinstance(s, dict) and "decisions" in s]
    if not traced:
        return []
    parts = [f"<p>{html.escape(NOTE)}</p>"]
    for name, d in traced:
        rows = [[kind, str(n), "; ".join(f"{why} ({c})" for why, c in d["top_reasons"].get(kind, [])[:3])]
                for kind, n in d["counts"].items()]
        parts.append(f"<h3>{html.escape(name)}</h3>")
        parts.append(_table(("decision", "count", "top reasons"), rows))
        reg = d.get("routing_regret")
        if reg is None:
            continue
        line = f"Routing regret ({reg['method']}, k={reg['k']}) over {reg['decisions']} decisions"
        if "total" in reg:
            agree = reg["agreement"]
            line += (f": {reg['positive']} with regret, {_num(reg['total'])} s in all, {_num(reg['mean'])} s each "
                     f"on average; the estimate agrees on {_num(agree['sign_agreement'], '.0%')} of decisions.")
        else:
            est = reg["estimate"]
            line += f": the estimate finds {est['positive']} with regret, {est['total']} prefill tokens in all."
        parts.append(f"<p>{html.escape(line)}</p>")
        worst = [[str(w["request"]), _num(w["t"]), str(w["chosen"]), str(w["best_alternative"]), _num(w["regret"])]
                 for w in reg.get("worst", [])]
        if worst:
            parts.append(_table(("request", "arrival (s)", "chosen", "best alternative", "regret (s)"), worst))
    return [Section("Decisions", None, "".join(parts))]
