"""The text of ``servesim plan``: the chosen deployment, the candidates tried, and why the others lost."""

from __future__ import annotations

import math

from sim.metrics.intervals import coverage_text
from sim.studies.plan_result import NAN, SLO_CLASSES, SLO_METRICS, Evaluation, PlanResult
from sim.words import counted


def _ms(x: float | None) -> str:
    """A latency in seconds as milliseconds: every latency the plan prints is in ms, as in the run table."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * 1000:,.1f}"


def _metric_names(result: PlanResult) -> list[str]:
    return [k for k in SLO_METRICS if result.slos.get(k) is not None]


def _load_text(e: Evaluation) -> str:
    """The output rate a deployment is priced at, and why that one (``OutputLoad``)."""
    load = e.load
    if load is None or not math.isfinite(load.offered):
        return f"{e.output_throughput:,.0f} output tok/s over the run (no offered rate: closed loop or all at once)"
    if load.saturated:
        return (f"saturated: serves {load.served:,.0f} output tok/s of the {load.offered:,.0f} offered and schedules "
                f"{load.scheduled_late:,} of the {load.arrived_late:,} requests arriving (second half of the arrival "
                "window), it cannot keep up")
    return (f"carries the offered {load.offered:,.0f} output tok/s (the run's {load.run:,.0f} counts the drain "
            "after the last arrival)")


def _confidence_lines(result: PlanResult, ch: Evaluation) -> list[str]:
    """Whether the choice meets its SLOs with 80% confidence, the numbers, and the cheapest that does."""
    q, keys = result.percentile, _metric_names(result)
    cover = ", ".join(f"{SLO_CLASSES[k]} {coverage_text(SLO_CLASSES[k])}" for k in keys)
    highs = ", ".join(f"p{q} {k.upper()} {_ms(ch.latency_80_high.get(k))} ms" for k in keys)
    out = [f"  with 80% confidence: {'met' if ch.meets_80 else 'not met'} (slow ends of the 80% intervals, "
           f"sim/metrics/intervals.py: {highs}; their leave-one-source-out coverage {cover})"]
    best = result.cheapest_80()
    if best is None:
        out.append("  no simulated deployment meets the SLOs with 80% confidence" + (
            "; --all (plan.stop_early: false) simulates the costlier ones too" if result.count("not simulated")
            else ""))
    elif best is not ch:
        out.append(f"  cheapest simulated deployment meeting them with 80% confidence: {best.candidate.label()} "
                   f"at ${best.candidate.cost_per_hour:.2f}/h")
    return out


def _nearest_miss(result: PlanResult) -> list[str]:
    """The simulated deployment closest to the SLOs (the smallest worst ratio of a percentile to its SLO, the
    cheaper on a tie), with its numbers: what to widen or relax is read from it. None simulated: nothing."""
    keys = _metric_names(result)

    def worst(e: Evaluation) -> tuple[float, str]:
        ratios = [(e.latency.get(k, NAN) / float(result.slos[k] or NAN), k) for k in keys]
        return max(((r, k) for r, k in ratios if math.isfinite(r)), default=(math.inf, ""))

    missed = [e for e in result.simulated if not e.meets]
    if not missed:
        return []
    e = min(missed, key=lambda e: (worst(e)[0], e.candidate.cost_per_hour))
    lat = ", ".join(f"p{result.percentile} {k.upper()} {_ms(e.latency.get(k))} ms (SLO {_ms(result.slos[k])} ms)"
                    for k in keys)
    over, key = worst(e)
    why = f"{key.upper()} {100 * (over - 1):.0f}% over its SLO" if math.isfinite(over) and over > 1 else e.reason
    return [f"nearest miss: {e.candidate.label()} at ${e.candidate.cost_per_hour:.2f}/h: {lat}"
            + (f"; {why}" if why else "")]


def _joules(j: float) -> str:
    """A deployment's joules per output token for the Pareto table, 6 wide: NaN (a GPU without power figures,
    sim/costs/energy.py) is a dash."""
    return f"{j:>6.4f}" if math.isfinite(j) else f"{'-':>6}"


def _front_lines(result: PlanResult, keys: list[str]) -> list[str]:
    """The Pareto front of the simulated deployments as a table, with the line saying what its columns mean."""
    q = result.percentile
    lines = [f"Pareto front of the simulated deployments (cost vs p{q} latency):"]
    head = f"  {'$/h':>7} {'GPUs':>4}  " + "".join(f"{k.upper() + ' p' + str(q) + ' ms':>14}" for k in keys)
    head += f"  {'meets':<5} {'$/M out':>8}  {'J/out':>6}  deployment"
    lines.append(head)
    front = result.pareto_front()
    for e in front:
        cells = "".join(f"{_ms(e.latency[k]):>14}" for k in keys)
        lines.append(f"  {e.candidate.cost_per_hour:>7.2f} {e.candidate.num_gpus:>4}  {cells}  "
                     f"{'yes' if e.meets else 'no':<5} {e.cost_per_million_output_tokens:>8.3f}"
                     f"{'*' if e.saturated else ' '} {_joules(e.j_per_output_token)}  {e.candidate.label()}")
    offered = next((e.load.offered for e in front if e.load is not None and math.isfinite(e.load.offered)), NAN)
    dash = "a GPU without power figures"  # a disaggregated deployment's pools draw as their GPUs do
    if math.isfinite(offered):
        lines.append(f"$/M out: USD per million output tokens at the offered {offered:,.0f} output tok/s"
                     + ("; *: saturated, at the rate it served in the second half of the arrival window"
                        if any(e.saturated for e in front) else "")
                     + f"; J/out: joules per output token (-: {dash})")
    elif front:
        lines.append(f"J/out: joules per output token (-: {dash})")
    lines.append("")
    return lines


def format_plan(result: PlanResult) -> str:
    """The search in words: counts, the Pareto front, the choice, its cost per token and the break-even."""
    q = result.percentile
    keys = _metric_names(result)
    slo_text = ", ".join(f"p{q} {k.upper()} <= {_ms(result.slos[k])} ms" for k in keys)
    n = len(result.evaluations)
    pruned = {b: result.count("pruned", b) for b in ("memory", "ttft", "tpot", "e2el", "throughput", "max_gpus")}
    pruned_text = ", ".join(f"{b} {v:,}" for b, v in pruned.items() if v)
    lines = [
        f"{result.scenario}: SLOs {slo_text}, every request completed",
        f"searched {counted(n, 'deployment', fmt=',')}; pruned by analytic bounds: {pruned_text or 'none'}"
        # what the throughput bound means, only where it pruned something (it read as if it had when none was)
        + (" (throughput: steady state, utilisation > 1)" if pruned["throughput"] else "")
        + f"; simulated {len(result.simulated):,}"
        + (f", {result.count('not simulated'):,} not simulated (costlier than the choice or equally cheap with "
           "lower precision)" if result.count("not simulated") else "")
        + f"; {result.seconds:.1f} s",
        "",
    ]
    if not result.simulated:  # an empty table said nothing of why: each bound's reason, on its cheapest deployment
        lines.append("nothing simulated: the bounds ruled out every deployment; the cheapest each bound ruled out:")
        for b in pruned:
            ruled = [e for e in result.evaluations if e.status == "pruned" and e.bound == b]
            if ruled:
                e = min(ruled, key=lambda e: e.candidate.cost_per_hour)
                lines.append(f"  {b}: {e.candidate.label()}: {e.reason}")
        lines.append("")
    else:
        lines += _front_lines(result, keys)
    ch = result.chosen
    if ch is None:
        lines.append("no deployment in the space meets the SLOs: widen plan (more GPUs, other GPUs or dtypes) or "
                     "relax the SLOs")
        lines += _nearest_miss(result)
    else:
        c = ch.candidate
        lat = ", ".join(f"p{q} {k.upper()} {_ms(ch.latency[k])} ms (SLO {_ms(result.slos[k])} ms)" for k in keys)
        lines += [
            f"chosen: {c.label()}" + (" (plan.objective joules: the fewest joules per output token meeting the SLOs)"
                                      if result.objective == "joules" else ""),
            f"  {c.num_gpus} GPU(s) at ${c.gpu_price_per_hour:.2f}/h = ${c.cost_per_hour:.2f}/h; {lat}",
            f"  {_load_text(ch)}: ${ch.cost_per_million_output_tokens:.3f} per million output tokens"
            + ("" if not math.isfinite(ch.j_per_output_token) else f", {ch.j_per_output_token:.4f} J per output token"),
        ]
        lines += _confidence_lines(result, ch)
        cheap = result.cheapest
        if result.objective == "joules" and cheap is not None and cheap is not ch:
            jc = cheap.j_per_output_token
            lines.append(f"cheapest simulated deployment meeting the SLOs: {cheap.candidate.label()} at "
                         f"${cheap.candidate.cost_per_hour:.2f}/h" + (f", {jc:.4f} J" if math.isfinite(jc) else ""))
        fj = result.fewest_joules()
        if fj is not None and fj is not ch:
            c2 = fj.candidate
            lines.append(f"fewest joules per output token among the simulated deployments that meet the SLOs: "
                         f"{c2.label()}, {fj.j_per_output_token:.4f} J at ${c2.cost_per_hour:.2f}/h")
        be = result.break_even
        if be is not None:
            cheaper = be.load_output_tokens_per_hour >= be.break_even_output_tokens_per_hour
            lines += [
                (f"break-even against the API (${be.api_input_per_million:g}/M input, ${be.api_output_per_million:g}"
                f"/M output; {be.input_per_output:.2f} input tokens per output token: ${be.api_per_million_output:.3f}"
                f" per M output tokens):"),
                f"  self-hosting is cheaper above {be.break_even_output_tokens_per_hour / 1e6:.3f} M output "
                f"tokens/hour ({be.break_even_requests_per_second:.3g} req/s of this workload); at "
                + ("the" if ch.saturated else "the scenario's")
                + f" {be.load_output_tokens_per_hour / 1e6:.3f} M/hour"
                + (" it serves" if ch.saturated else "")
                + f" it costs ${be.cost_per_hour:.2f}/h against "
                f"${be.api_cost_per_hour_at_load:.2f}/h for the API: "
                + ("self-hosting is cheaper" if cheaper else "the API is cheaper"),
            ]
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
