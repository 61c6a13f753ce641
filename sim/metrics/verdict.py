"""What limits a run: the candidate limits ranked, each with a score in [0, 1] and the numbers that show it.

A run can be limited by several things at once, and the one a user must hear first is often not a hardware
roofline: a server that is offered more requests than it serves is overloaded whatever its GPU does, and the
reason it cannot keep up is the next limit in the list. The candidates:

- overloaded: the queue of requests waiting for their first step grows over the arrival window (by at least
  ``OVERLOAD_GROWTH`` of the offered rate), or queueing delay is a large share of E2EL while requests took their
  first step slower than they arrived (by ``OVERLOAD_GROWTH``; a summary without the scheduled rate: the share
  alone). Listed first whenever present: it is the symptom; the limits after it say why. Not a ratio of offered
  to completed rates: requests still in flight when the arrivals end are no queue, and a short run holds enough
  of them to tip any ratio.
- batch formation: static batching whose queueing is a large share of E2EL while it keeps up (the queue steady,
  scheduled as fast as offered): requests wait for a batch to fill or for the running one to finish.
- queueing: continuous batching whose queueing is a large share of E2EL while it keeps up: requests queue in
  bursts, named with the cap they wait behind (batch slots, token budget, KV) where one binds.
- batch-slot cap: the running batch sits at ``max_num_seqs`` (or a static batch's ``batch_size``) while requests
  wait. Static batching counts only rows that compute for a request: padded rows fill slots for nobody.
- token-budget cap: the steps compute ``max_num_batched_tokens`` tokens while requests wait (long prompts: a step
  holds one or two prefills, and the batch slots sit mostly empty with requests queued behind the budget).
- memory-bound: KV usage near capacity, with preemptions or rejections.
- padding: the share of computed tokens that were padding (static batching).
- pipeline bubbles: the share of the step time pipeline stages sat idle (fewer micro-batches in flight than
  stages, plus the hops between them).
- compute-bound or bandwidth-bound: what bounds the steps themselves, from MFU while the GPU computed (the
  analytic cost model is a roofline, so a step at high MFU sits on its compute roof and one at low MFU waits on
  weight and KV reads or fixed overhead); weighted by the share of time the GPU computed.

``limit_inputs`` measures the figures a verdict needs from a run (summary.json keeps them under ``limits``), and
``rank_limits`` turns a summary into the ranking, so a summary read back from JSON gets the same verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.request_table import RequestTable, as_table
from sim.metrics.step_figures import StepFigures, step_figures
from sim.words import counted

# Thresholds, as fractions.
OVERLOAD_GROWTH = 0.05  # queue growth at or above this share of the offered rate: requests pile up
QUEUE_GROWTH_MIN = 1.0  # ...and by at least this many waiting requests: less is the noise of a few bursts
QUEUE_SHARE_OVERLOAD = 0.5  # queueing delay at or above this share of mean E2EL: the queue dominates latency
KV_FULL_MEAN = 0.85  # KV usage averaged over busy time at or above this: memory is the limit
KV_FULL_PEAK = 0.95  # ...or peaking at or above this while requests were preempted or rejected
MFU_COMPUTE = 0.30  # MFU while computing at or above this: steps sit on the compute roof
LISTED = 0.05  # limits scoring below this are left out of the ranking (but the step roofline always stays)
CAP_FILLED = 0.5  # a cap (batch slots, token budget) used less than this share of is not what holds requests back

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Limit:
    """One candidate limit: its name, a score in [0, 1] (how strongly the run shows it) and the numbers behind it."""

    name: str
    score: float
    evidence: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The limits of a run, strongest first (overload, when present, leads), and a one-line text."""

    limits: tuple[Limit, ...]
    text: str

    @property
    def names(self) -> list[str]:
        return [lim.name for lim in self.limits]

    @property
    def causes(self) -> list[str]:
        """The limits other than overload: why the server cannot keep up (or what bounds it when it can)."""
        return [n for n in self.names if n != "overloaded"]


def _fin(x: object) -> float:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else 0.0


def _pct(x: object) -> str:
    return f"{100 * float(x):.0f}%" if isinstance(x, int | float) and math.isfinite(x) else "n/a"


def _slot_cap(config: dict | None) -> tuple[float, bool]:
    """(slots per step, static batching?) from a variant's resolved configuration; NaN when unknown."""
    policy = (config or {}).get("policy") or {}
    if policy.get("type") == "static":
        return float(policy.get("batch_size", NAN)), True
    seqs = policy.get("max_num_seqs")
    return (NAN if seqs is None else float(seqs)), False  # None: an engine's default the config did not resolve


def token_cap(config: dict | None, applied: int | None = None) -> float:
    """Tokens a step may compute (``max_num_batched_tokens``): ``applied``, the core's, else the variant's recorded
    configuration's (a run read back from its folder); NaN when unknown or static batching (no token budget). The
    configuration alone left out every run on servesim's default budget (None where written)."""
    policy = (config or {}).get("policy") or {}
    budget = policy.get("max_num_batched_tokens") if applied is None else applied
    return NAN if budget is None or policy.get("type") == "static" else float(budget)


def _mean_waiting(starts: np.ndarray, stops: np.ndarray, lo: float, hi: float) -> float:
    """Mean number of the half-open spans [start, stop) that cover a time in [lo, hi): the queue length there."""
    overlap = np.clip(np.minimum(stops, hi) - np.maximum(starts, lo), 0.0, None)
    return float(overlap.sum() / (hi - lo))


def _waiting_spans(result: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """When each request waited for the GPU: from its arrival to its first step (or its end, never scheduled), and
    from each preemption to its resume. Counted from the requests, so a cluster's replicas, its router and a
    static batch's wait for a full batch all count alike."""
    starts, stops, _ = waiting_spans(as_table(result.requests), owners=False)
    return starts, stops


def waiting_spans(table: RequestTable, owners: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_waiting_spans`` of the table's requests, and the row of each span's request (an empty array when not
    ``owners``: the verdict's queue lengths need none, and a long run's summary holds its peak to a value a span)."""
    arrival, finish, sched = (table.column(k) for k in ("arrival", "finish", "first_scheduled"))
    preempted, resumed = table.spans("preempted_at"), table.spans("resumed_at")
    if not preempted:  # a span a request, in its order: what the placement below gives, without its index arrays
        return arrival, np.where(sched >= 0, sched, finish), np.arange(len(arrival) if owners else 0)
    # request by request: its wait for a first step, then its preemptions' (the order of the sums they feed)
    ids = table.column("id")
    extra = np.zeros(len(ids), dtype=np.int64)
    rows = np.flatnonzero(np.isin(ids, np.fromiter(preempted, dtype=np.int64, count=len(preempted))))
    for i in rows.tolist():
        extra[i] = len(preempted[int(ids[i])])
    at = np.arange(len(ids)) + np.cumsum(extra) - extra  # where each request's first span goes
    starts = np.empty(len(ids) + int(extra.sum()))
    stops = np.empty_like(starts)
    owner = np.repeat(np.arange(len(ids)), extra + 1) if owners else np.arange(0)
    starts[at] = arrival
    stops[at] = np.where(sched >= 0, sched, finish)
    for i in rows.tolist():
        pre, res = preempted[int(ids[i])], resumed.get(int(ids[i]), ())
        for k, t in enumerate(pre):
            starts[at[i] + 1 + k] = t
            stops[at[i] + 1 + k] = res[k] if k < len(res) else finish[i]
    return starts, stops, owner


def limit_inputs(result: RunResult, fig: StepFigures | None = None) -> dict:
    """The figures ``rank_limits`` reads, measured on a run (summary.json's ``limits``; rates in req/s, times in s).

    All rates share one window, from the first to the last arrival (NaN for a window under a millisecond: one
    burst, no rate):

    - offered_rate: requests arriving; scheduled_rate: requests taking their first step (a server keeping up
      schedules what arrives; one falling behind schedules at the pace it serves);
    - queue_start / queue_end: mean requests waiting for the GPU (not yet scheduled, or preempted) over the first
      and the last quarter of the window; queue_growth: their difference over the 3/4 of the window between the
      quarters' midpoints, in requests/s;
    - queue_share: mean queueing delay over mean E2EL of completed requests;
    - waiting_share: share of GPU time whose steps ran with requests waiting;
    - mean_running: requests computing per step (padded rows excluded), time-weighted; slot_cap: max_num_seqs or
      the static batch size (per replica); static: whether the policy batches statically;
    - waiting_batched_tokens: tokens computed for requests per step (prefill + decode) while requests waited,
      time-weighted; token_cap: max_num_batched_tokens (per replica; NaN when unknown);
    - busy_mfu: MFU while computing (FLOPs over busy time x peak); prefill_share: prefill tokens / computed tokens.
    """
    table = as_table(result.requests)
    arrivals = table.column("arrival")
    # the first and last arrival (a NaN anywhere makes both NaN, as it ended a sorted copy: no window either way)
    first_at, last_at = (arrivals.min(), arrivals.max()) if arrivals.size else (NAN, NAN)
    done = table.outcome_is("completed")
    offered = scheduled = growth = NAN
    q_start = q_end = NAN
    if fig is None:  # the step sums, a block of steps at a time (the summary passes those it took)
        fig = step_figures(result.steps, result.kv_capacity_blocks, result.block_size)
    if arrivals.size > 1 and last_at - first_at >= 1e-3:
        t0, t1 = float(first_at), float(last_at)
        span = t1 - t0
        offered = (arrivals.size - 1) / span  # n arrivals bound n - 1 gaps
        first = table.column("first_scheduled")
        scheduled = int(((t0 <= first) & (first <= t1)).sum()) / span
        w_start, w_stop = _waiting_spans(result)
        quarter = span / 4
        q_start = _mean_waiting(w_start, w_stop, t0, t0 + quarter)
        q_end = _mean_waiting(w_start, w_stop, t1 - quarter, t1)
        growth = (q_end - q_start) / (span - quarter)
    arrival = table.column("arrival")[done]
    e2el = table.column("finish")[done] - arrival
    e2el_mean = e2el.mean() if e2el.size else NAN
    del e2el  # one value a request at a time besides the arrivals (a long run's summary peak)
    queue_mean = (table.column("first_scheduled")[done] - arrival).mean() if arrival.size else NAN
    queue_share = float(queue_mean / e2el_mean) if arrival.size and e2el_mean > 0 else NAN
    busy, computed, flops = fig.busy, fig.computed_tokens, fig.flops
    cap, static = _slot_cap(result.config)
    return {
        "offered_rate": offered,
        "scheduled_rate": scheduled,
        "queue_share": queue_share,
        "queue_start": q_start,
        "queue_end": q_end,
        "queue_growth": growth,
        "waiting_share": fig.waiting_busy / busy if busy > 0 else NAN,
        "mean_running": fig.batch_dot / busy if busy > 0 else NAN,
        "slot_cap": cap,
        "static": static,
        "waiting_batched_tokens": fig.batched_waiting_dot / fig.waiting_busy if fig.waiting_busy > 0 else NAN,
        "token_cap": token_cap(result.config, result.token_budget),
        "busy_mfu": flops / (busy * result.peak_flops) if busy > 0 and result.peak_flops > 0 else NAN,
        "prefill_share": fig.prefill_tokens / computed if computed > 0 else NAN,
    }


def _filled(fill: float) -> float:
    """A cap's fill as its score's factor: 0 below CAP_FILLED (requests that wait beside a cap mostly unused wait
    for something else)."""
    return fill if fill >= CAP_FILLED else 0.0


def _token_budget(summary: dict) -> Limit | None:
    """The token-budget cap: how full the budget ran while requests waited, times the share of the run's time they
    waited. A disaggregated run is judged pool by pool, each against its own budget, the fullest named: its config
    records the decode pool's budget alone, and the prefill pool's prompt-filled steps read against a budget they
    never had."""
    lim = summary.get("limits") or {}
    pools = (summary.get("disaggregation") or {}).get("pools") or {}
    judged = [(f"{name} pool: ", p, p) for name, p in pools.items() if "token_cap" in (p or {})]
    if not judged:
        judged = [("", lim, summary)]
    best: Limit | None = None
    for where, fig, run in judged:
        budget, batched = _fin(fig.get("token_cap")), _fin(fig.get("waiting_batched_tokens"))
        if not budget > 0:
            continue
        share = _fin(fig.get("waiting_share")) * _fin(run.get("busy_fraction"))
        limit = Limit("token-budget cap", _filled(min(1.0, batched / budget)) * share,
                      f"{where}{batched:,.0f} of max_num_batched_tokens {budget:,.0f} tokens per step while "
                      f"requests waited ({_pct(fig.get('waiting_share'))} of busy time)")
        if best is None or limit.score > best.score:
            best = limit
    return best


def _binding_cap(found: Sequence[Limit]) -> Limit | None:
    """The cap requests wait behind (batch slots, token budget or KV), the highest scoring, or None if none
    scores."""
    caps = [x for x in found if x.score > 0 and x.name in ("batch-slot cap", "token-budget cap", "memory-bound")]
    return max(caps, key=lambda x: x.score) if caps else None


def _overload(lim: dict) -> Limit | None:
    """Overloaded when the waiting queue grows (score: twice its growth over the offered rate, 1 when it gains
    half the requests offered) or queueing is at least half of E2EL while requests are scheduled slower than they
    arrive (score: that share). A summary written before ``queue_growth`` existed is judged on the queue share
    alone. A queue share that is high while the server keeps up is no overload: static batching on a CPU profile
    read "overloaded: offered 56.82 req/s, scheduled 55.39 req/s, queue 2 -> 3 waiting, queueing 53% of E2EL"."""
    offered, share = _fin(lim.get("offered_rate")), lim.get("queue_share")
    qs, qe, growth = lim.get("queue_start"), lim.get("queue_end"), _fin(lim.get("queue_growth"))
    grew = (
        offered > 0
        and growth >= OVERLOAD_GROWTH * offered
        and _fin(qe) - _fin(qs) >= QUEUE_GROWTH_MIN
    )
    scheduled = _fin(lim.get("scheduled_rate"))
    behind = not math.isfinite(scheduled) or not offered > 0 or scheduled < (1.0 - OVERLOAD_GROWTH) * offered
    score = max(min(1.0, 2.0 * growth / offered) if grew else 0.0,
                _fin(share) if behind and _fin(share) >= QUEUE_SHARE_OVERLOAD else 0.0)
    if score <= 0:
        return None
    text = f"offered {offered:.2f} req/s"
    if "scheduled_rate" in lim:
        text += f", scheduled {_fin(lim.get('scheduled_rate')):.2f} req/s (first to last arrival)"
    if isinstance(qs, int | float) and isinstance(qe, int | float) and math.isfinite(qs) and math.isfinite(qe):
        text += f", queue {qs:.0f} -> {qe:.0f} waiting"
    text += f", queueing {_pct(share)} of E2EL"
    return Limit("overloaded", score, text)


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def rejection_reasons(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Why requests were rejected, with how many, most first. Reasons that differ only in their numbers (each
    request's own length) count as one, each number that varies written as its range: "prompt+output 617-994
    tokens exceeds max_model_len 512"."""
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    table = as_table(records)
    codes, names = table.text("reason")
    for code in codes[table.outcome_is("rejected")].tolist():
        reason = names[code] or "no reason given"
        groups.setdefault(tuple(_NUMBER.split(reason)), []).append(_NUMBER.findall(reason))
    out: dict[str, int] = {}
    for pieces, numbers in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        text = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            seen = sorted({n[i] for n in numbers}, key=float)
            text += seen[0] if len(seen) == 1 else f"{seen[0]}-{seen[-1]}"
            text += piece
        out[text] = len(numbers)
    return out


def _roof(busy_mfu: object, device: str = "GPU") -> tuple[str, str]:
    """The roofline limit of steps at this MFU while computing, and its evidence. Without an MFU the limit is the
    ``device`` that ran the steps: a CPU engine run read "GPU-bound: MFU unknown, CPU busy 99% of the time"."""
    if not isinstance(busy_mfu, int | float) or not math.isfinite(busy_mfu):
        return f"{device}-bound", "MFU unknown"
    return ("compute-bound" if busy_mfu >= MFU_COMPUTE else "bandwidth-bound"), f"MFU {_pct(busy_mfu)} while computing"


def rank_limits(summary: dict) -> Verdict:
    """The verdict of a summary (``sim.metrics.summary.summarize``'s, or one read back from summary.json)."""
    n = summary.get("num_requests", 0)
    if n and summary.get("num_rejected") == n:  # nothing ran to diagnose: why (summary.json's ``rejections``)
        why = "; ".join(f"{text} ({count})" for text, count in (summary.get("rejections") or {}).items())
        lead = "the only request was rejected" if n == 1 else f"all {n} requests were rejected"
        return Verdict((), lead + (f": {why}." if why else "."))
    if summary.get("num_steps", 0) == 0:
        return Verdict((), "no steps ran: nothing to diagnose.")
    lim = summary.get("limits") or {}
    found: list[Limit] = []

    over = _overload(lim)

    cap, running = _fin(lim.get("slot_cap")), _fin(lim.get("mean_running"))
    if cap > 0:
        fill = min(1.0, running / cap)
        kind = "batch_size" if lim.get("static") else "max_num_seqs"
        # a cap a seventh used (8.7 of 64 slots, the docs' my_scenario.yaml) was listed as a limit, scored by the
        # wait it did not cause
        found.append(Limit("batch-slot cap", _filled(fill) * _fin(lim.get("waiting_share")),
                           f"{running:.1f} of {kind} {cap:.0f} running, requests waiting "
                           f"{_pct(lim.get('waiting_share'))} of busy time"))
    share = _fin(lim.get("queue_share"))
    if over is None and lim.get("static") and share >= QUEUE_SHARE_OVERLOAD:
        # static batching that keeps up still queues: a request waits for its batch to form and for the one
        # running to finish (it read "overloaded" while scheduled as fast as offered)
        # the batch size only where the summary has it (slot_cap null read "static batches of 0")
        found.append(Limit("batch formation", share, f"queueing {_pct(share)} of E2EL while static batches"
                           f"{f' of {cap:.0f}' if cap > 0 else ''} formed, the queue steady"))
    # long prompts fill the step's token budget with one or two prefills while the slots sit mostly empty: the
    # docs' my_scenario.yaml (prompts of 2,000 tokens, a budget of 2,048) read "then batch-slot cap: 8.7 of
    # max_num_seqs 64 running", a cap a seventh used, and never named the budget that held requests back,
    # max_num_batched_tokens. Scored over the run's time, not its busy time: a full budget in the bursts of a
    # server idle 92% of the time (azure-code-bursty) is no limit of the run
    budget = _token_budget(summary)
    if budget is not None:
        found.append(budget)

    kv = summary.get("kv_usage") or {}
    kv_mean, kv_max = _fin(kv.get("mean")), _fin(kv.get("max"))
    kv_text = f"KV usage {_pct(kv.get('mean'))} on average"
    pools = (summary.get("disaggregation") or {}).get("pools") or {}
    pool_kv = {name: _fin((p or {}).get("kv_usage_mean")) for name, p in pools.items()}
    if pool_kv and max(pool_kv.values()) > kv_mean:
        # a disaggregated run's mean is over both pools: a decode pool full at 90% read 45% beside an idle
        # prefill pool's cache, under the threshold; the fullest pool's mean is the one that limits
        fullest = max(pool_kv, key=lambda name: pool_kv[name])
        kv_mean = pool_kv[fullest]
        kv_text = f"KV usage {_pct(kv_mean)} on average in the {fullest} pool"
    pressure = _fin(summary.get("num_preemptions")) + _fin(summary.get("num_rejected"))
    kv_score = kv_mean if kv_mean >= KV_FULL_MEAN else 0.0  # a half-full cache without pressure limits nothing
    if pressure > 0 and kv_max >= KV_FULL_PEAK:
        kv_score = max(kv_score, kv_max)
    extras = [counted(summary["num_preemptions"], "preemption")] if summary.get("num_preemptions") else []
    if summary.get("num_rejected"):
        extras.append(f"{summary['num_rejected']} rejected")
    found.append(Limit("memory-bound", kv_score, f"{kv_text} (peak {_pct(kv.get('max'))})"
                       + (", " + ", ".join(extras) if extras else "")))

    pad = _fin(summary.get("padding_fraction"))
    found.append(Limit("padding", pad, f"{_pct(pad)} of computed tokens were padding"))

    pipe = summary.get("pipeline") or {}  # pipeline stages (sim/serving/pipeline.py): idle while micro-batches are
    # elsewhere
    bubble = _fin(pipe.get("bubble_fraction"))
    if bubble > 0:
        found.append(Limit("pipeline bubbles", bubble, f"stages idle {_pct(bubble)} of the step time, "
                           f"{_fin(pipe.get('mean_micro_batches')):.1f} micro-batches in flight for "
                           f"{pipe.get('pipeline_parallel_size')} stages"))

    if over is None and not lim.get("static") and share >= QUEUE_SHARE_OVERLOAD:
        # continuous batching that keeps up can still spend most of a request's latency queued: in bursts, behind a
        # cap that binds only then (a token budget, scored over the run's time). azure-code-bursty at a budget of
        # 320 tokens, queueing 59% of E2EL, read "compute-bound: ... GPU busy 17% of the time (more load would
        # fit)", the queue unnamed
        cap_held = _binding_cap(found)
        why = f"behind the {cap_held.name}" if cap_held else "in bursts of arrivals"
        found.append(Limit("queueing", share, f"{_pct(share)} of E2EL waiting for a first step while scheduled as "
                           f"fast as offered (the queue steady), {why}"))

    busy = _fin(summary.get("busy_fraction"))
    busy_mfu = lim.get("busy_mfu")
    if not isinstance(busy_mfu, int | float) or not math.isfinite(busy_mfu):
        mfu = summary.get("mfu")  # an older summary: MFU over the run, scaled to busy time
        busy_mfu = _fin(mfu) / busy if busy > 0 and isinstance(mfu, int | float) and math.isfinite(mfu) else NAN
    device = "CPU" if summary.get("device") == "cpu" else "GPU"
    roof, roof_text = _roof(busy_mfu, device)
    roof_text += f", {device} busy {_pct(busy)} of the time"
    # a disaggregated run's busy share is over both pools: 3P1D read "GPU busy 56%" while its one decode GPU
    # was busy 99.8% of the time, the bottleneck the lesson names; each pool's share is said, and spare load is
    # claimed only when the busiest pool has room
    pool_busy = {name: _fin((p or {}).get("busy_fraction")) for name, p in pools.items()}
    pooled = bool(pools) and all(isinstance((p or {}).get("busy_mfu"), int | float) for p in pools.values())
    if pooled:
        # each pool against its own roof, the busiest one's the run's: 3P1D read "compute-bound: MFU 33%" over
        # the fleet, its prefill pool's compute-heavy steps outweighing the decode GPU that limits it
        order = sorted(pools, key=lambda name: -pool_busy[name])
        roof, first = _roof(pools[order[0]]["busy_mfu"])
        busy = pool_busy[order[0]]
        roof_text = f"{order[0]} pool (the busiest): {first}, busy {_pct(busy)} of the time"
        for name in order[1:]:
            r, t = _roof(pools[name]["busy_mfu"])
            roof_text += f"; {name} pool {r}: {t}, busy {_pct(pool_busy[name])}"
    elif pool_busy:
        roof_text += " (" + ", ".join(f"{name} pool {_pct(b)}" for name, b in pool_busy.items()) + ")"
    idle = max([busy, *pool_busy.values()]) < 0.5
    # an overloaded run with its GPU mostly idle is not held back by the GPU but by the cap it waits behind:
    # azure-code-bursty's chunked variant at a budget of 256 tokens read "overloaded: ...; then compute-bound: ...,
    # GPU busy 17% of the time (more load would fit)", the overload and its remedy contradicting each other
    waits_behind = _binding_cap(found) if over is not None and idle else None
    if idle and over is None:
        roof_text += " (more load would fit)"
    if not pooled and math.isfinite(_fin(lim.get("prefill_share"))) and "prefill_share" in lim:
        roof_text += f", prefill {_pct(lim.get('prefill_share'))} of tokens"
    # The roofline bounds every step, so it is always listed; it is the run's limit only as far as nothing else
    # is: a server whose slots are full or whose rows compute padding would not go faster on a faster roof.
    strongest = max((x.score for x in found), default=0.0)
    roofline = Limit(roof, 0.0 if waits_behind is not None else busy * (1.0 - strongest), roof_text)

    ranked = [x for x in found if x.score >= LISTED] + [roofline]
    ranked.sort(key=lambda x: -x.score)
    if over is not None:
        ranked.insert(0, over)
    top = ranked[0]
    text = f"{top.name}: {top.evidence}"
    if len(ranked) > 1:
        nxt = ranked[1]
        text += f"; then {nxt.name}: {nxt.evidence}"
    if summary.get("num_failed"):
        text += f"; {summary['num_failed']} failed"
    return Verdict(tuple(ranked), text + ".")
