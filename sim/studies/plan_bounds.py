"""The analytic bounds ``servesim plan`` checks a candidate against before simulating it (the reasoning is in
sim/studies/planner.py's docstring): a percentile of latency lower bounds, and the busy time the workload needs at
least. They hold for the analytic cost model, whose step times never fall as a shape field grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.costs.costmodel import CostModel, StepShape
from sim.workload.generator import GeneratedWorkload

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """What the bounds read from a workload."""

    prompt: np.ndarray  # tokens per request, shared prefix included (int64)
    output: np.ndarray  # output tokens per request (int64)
    span: float  # seconds from the first to the last arrival; 0: no offered rate (all at once, closed loop)

    @classmethod
    def of(cls, workload: GeneratedWorkload) -> WorkloadShape:
        reqs = workload.requests
        prompt = np.array([r.prompt_len for r in reqs], dtype=np.int64)
        output = np.array([r.output_len for r in reqs], dtype=np.int64)
        span = 0.0
        if workload.closed_loop is None and reqs:
            arrivals = [r.arrival for r in reqs]
            span = float(max(arrivals) - min(arrivals))
        return cls(prompt, output, span)


def latency_bounds(cost: CostModel, shape: WorkloadShape, percentile: int, *,
                   prefix_caching: bool = False) -> dict[str, float]:
    """The ``percentile`` of per-request lower bounds on TTFT, TPOT and E2EL (seconds).

    TTFT_i >= step time of the whole uncached prompt alone (with prefix caching: of one token); every TPOT gap
    >= a one-row decode step attending the prompt. E2EL_i >= TTFT bound + (output - 1) x TPOT bound."""
    p, o = shape.prompt, shape.output
    ones = np.ones_like(p)
    u = ones if prefix_caching else p
    ttft = np.asarray(cost.step_time(StepShape(ones, u, 0 * ones, u, u * (u + 1) // 2)), dtype=np.float64)
    tpot = np.asarray(cost.step_time(StepShape(ones, ones, ones, p, p)), dtype=np.float64)
    e2el = ttft + (o - 1) * tpot
    multi = o > 1
    return {
        "ttft": float(np.percentile(ttft, percentile)) if len(p) else NAN,
        "tpot": float(np.percentile(tpot[multi], percentile)) if multi.any() else NAN,
        "e2el": float(np.percentile(e2el, percentile)) if len(p) else NAN,
    }


def max_decode_rows(shape: WorkloadShape, *, max_num_seqs: int, max_num_batched_tokens: int, num_gpu_blocks: int,
                    block_size: int, prefix_caching: bool = False) -> int:
    """Most requests one step can decode: ``max_num_seqs``, ``max_num_batched_tokens`` (a token each), and the
    largest b whose b smallest prompts' KV blocks fit in the cache (without prefix caching, which shares blocks)."""
    rows = min(max_num_seqs, max_num_batched_tokens)
    if not prefix_caching and len(shape.prompt):
        need = np.sort(-(-shape.prompt // block_size))
        rows = min(rows, int(np.searchsorted(np.cumsum(need), num_gpu_blocks, side="right")))
    return max(rows, 1)


def work_lower_bound(cost: CostModel, shape: WorkloadShape, *, max_num_seqs: int,
                     max_num_batched_tokens: int, num_gpu_blocks: int, block_size: int,
                     prefix_caching: bool = False) -> float:
    """Seconds of busy GPU time, summed over replicas, that any schedule of the workload needs (see the module
    docstring): max of the aggregate step, the decode tokens at the largest decode batch, and all tokens at
    ``max_num_batched_tokens`` per step."""
    p, o = shape.prompt, shape.output
    if not len(p):
        return 0.0
    u = np.ones_like(p) if prefix_caching else p
    decode = int((o - 1).sum())
    tokens = int(u.sum()) + decode
    rows = len(p) + decode
    kv = int(u.sum() + ((o - 1) * p).sum())
    pairs = int((u * (u + 1) // 2).sum() + ((o - 1) * p).sum())
    whole = float(cost.step_time(StepShape(rows, tokens, decode, kv, pairs)))
    b = max_decode_rows(shape, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        num_gpu_blocks=num_gpu_blocks, block_size=block_size, prefix_caching=prefix_caching)
    c = int(p.min())
    per_decode = float(cost.step_time(StepShape(b, b, b, b * c, b * c))) / b
    m = max_num_batched_tokens
    per_token = float(cost.step_time(StepShape(1, m, 0, m, m))) / m
    return max(whole, decode * per_decode, tokens * per_token)
