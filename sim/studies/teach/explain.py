"""The few sentences the teaching page writes under its charts, chosen by what the run shows.

Each rule reads the summary of ``sim.metrics.summary.summarize`` (and the offered rate, which the summary does not hold)
and, when its sign is there, says what happened and which knob moves it. The thresholds are fractions stated
here, so a test can place a run on either side of each.
"""

from __future__ import annotations

import math
from typing import Any

from sim.words import counted

QUEUE_WAIT_S = 5.0  # queue p90 above this many seconds: the queue is growing, not just absorbing a burst
KV_CEILING = 0.95  # KV usage peak at or above this share of the pool: the memory ceiling was hit
SLOTS_IDLE_BUSY = 0.5  # GPU busy below this share of the time: slots sit idle, more load would fit
PADDING = 0.10  # padding above this share of the computed tokens: static batching's finished rows
KV_WASTE = 0.5  # stored tokens below this share of the allocated KV slots: reservation wastes memory


def _fin(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else float("nan")


def explain(summary: dict[str, Any], offered_rate: float | None = None) -> list[str]:
    """Sentences on what one run shows: queue growing, memory ceiling hit, slots idle, padding, reserved KV
    wasted; one sentence saying the server keeps up when none of them applies."""
    out: list[str] = []
    n, rejected = int(summary.get("num_requests", 0)), int(summary.get("num_rejected", 0))
    if n and not summary.get("num_completed"):  # nothing ran: "slots sit idle, more traffic would fit" misled
        why = "; ".join(f"{r}: {k}" for r, k in (summary.get("rejections") or {}).items())
        some = f"all {n} were rejected" if rejected == n else f"none of {n} completed, {rejected} rejected"
        return [f"No request was served: {some}" + (f" ({why})." if why else ".")]
    done_rate = _fin(summary.get("request_throughput"))
    queue_p90 = _fin(summary.get("queue", {}).get("p90"))
    # the queue wait, not completed/s against the offered rate: a short run's tail (its last long requests after
    # the arrivals end) lowers completed/s even where no queue ever builds
    if queue_p90 > QUEUE_WAIT_S:
        rate = f"{offered_rate:.3g} requests/s arrive but " if offered_rate is not None else ""
        out.append(
            f"The queue is growing: {rate}the server completes {done_rate:.3g}/s, so a request waits "
            f"{queue_p90:.3g} s (p90) before its first step. Lower the arrival rate, or serve more per step "
            "(continuous batching, a larger batch, more KV memory)."
        )
    kv_peak = _fin(summary.get("kv_usage", {}).get("max"))
    pressure = int(summary.get("num_preemptions", 0)) + int(summary.get("num_rejected", 0))
    if kv_peak >= KV_CEILING:
        what = (f": {counted(summary.get('num_preemptions', 0), 'preemption')} and "
                f"{counted(summary.get('num_rejected', 0), 'rejection')}") if pressure else ""
        out.append(
            f"The memory ceiling is hit: KV usage peaked at {100 * kv_peak:.0f}% of the pool{what}. More "
            "gpu_memory_utilization, a bigger GPU, fp8 KV, or paged blocks instead of reservations make room."
        )
    busy = _fin(summary.get("busy_fraction"))
    if busy < SLOTS_IDLE_BUSY:
        out.append(
            f"Slots sit idle: the GPU is busy only {100 * busy:.0f}% of the time (mean batch "
            f"{_fin(summary.get('mean_batch_size')):.3g} requests). More traffic would fit on this server."
        )
    pad = _fin(summary.get("padding_fraction"))
    if pad > PADDING:
        out.append(
            f"Padding: {100 * pad:.0f}% of the computed tokens are padding: each prompt is padded to the longest of "
            "its batch, and the rows of finished requests run on until the batch's longest request is done. "
            "Continuous batching computes neither."
        )
    util = _fin(summary.get("kv_token_utilization"))
    if util < KV_WASTE:
        out.append(
            f"Reserved KV is mostly empty: only {100 * util:.0f}% of the allocated KV slots hold a token, the "
            "rest is reserved for tokens that may never come. Paged KV allocates blocks as tokens arrive."
        )
    if not out:
        out.append(
            f"The server keeps up: GPU busy {100 * busy:.0f}% of the time, KV peak {100 * kv_peak:.0f}%, no "
            "queue builds. Raise the arrival rate or the lengths to find its limit."
        )
    return out


def compare(pinned: dict[str, Any], current: dict[str, Any]) -> str:
    """One sentence comparing the output throughput and TTFT p99 of the current run to the pinned one."""
    a, b = _fin(pinned.get("output_throughput")), _fin(current.get("output_throughput"))
    if not (a > 0 and b >= 0):
        return "The pinned run completed no output tokens: no ratio to show."
    ta, tb = _fin(pinned.get("ttft", {}).get("p99")), _fin(current.get("ttft", {}).get("p99"))
    return (f"This run serves {b / a:.2f}x the output tokens per second of the pinned one ({b:,.0f} against "
            f"{a:,.0f} tok/s); TTFT p99 {tb:.3g} s against {ta:.3g} s.")
