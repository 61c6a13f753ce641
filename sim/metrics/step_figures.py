"""The figures a summary takes from every step (KV usage, busy time, FLOPs, tokens, batch size, waiting share),
read a block of steps at a time (``step_blocks``) instead of as whole columns: a long run's column is 160 MB at
20 M steps and 1.6 GB at 200 M (ten million requests), and the summary and the verdict held several at once.

Each figure is the very number the whole-column arithmetic gave (``sim.metrics.block_sums``: numpy's pairwise
sums and ``sums.dot`` taken in blocks to the bit; the integer columns' sums are exact integers, which a float64
sum of whole columns also was, its partial sums being integers under 2^53). A masked sum needs the number of
values it adds before its first block, so the few masks are counted in a first, cheaper pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.metrics.block_sums import BlockDot, PairwiseSum
from sim.metrics.step_columns import BLOCK_ROWS, step_blocks

NAN = float("nan")
_EXACT = 1 << 53  # integer sums below this are exact in float64 whatever their order

ROWS = BLOCK_ROWS  # steps read at a time
_COUNTED = ("kv_capacity_blocks", "kv_blocks_used", "num_waiting")
_READ = ("duration", "kv_capacity_blocks", "kv_blocks_used", "kv_tokens", "flops", "batch_size", "prefill_tokens",
         "decode_tokens", "padding_tokens", "num_waiting")


@dataclass(frozen=True, slots=True)
class StepFigures:
    """Sums over a run's steps (see the module docstring); NaN where undefined."""

    num_steps: int
    busy: float  # seconds computed: the sum of the steps' durations
    flops: float
    prefill_tokens: float
    decode_tokens: float
    padding_tokens: float
    batch_dot: float  # sum of batch size x duration (sums.dot)
    batched_waiting_dot: float  # sum of tokens computed for requests (prefill + decode) x duration, over the steps
    # that ran with requests waiting (beside waiting_busy: how full the token budget was while requests waited)
    waiting_busy: float  # seconds computed with requests waiting
    kv_usage_mean: float  # time-weighted KV block usage share
    kv_usage_max: float
    kv_token_share: float  # time-weighted share of the token slots in use that hold a token (not capped at 1)

    @property
    def computed_tokens(self) -> float:
        return self.prefill_tokens + self.decode_tokens + self.padding_tokens


def _weighted_mean(num: BlockDot, den: PairwiseSum) -> float:
    total = den.value()
    return num.value() / total if total > 0 else NAN


def _usage(block: dict[str, np.ndarray], capacity: float) -> np.ndarray:
    """Each step's KV usage share, NaN for a step without a capacity (one logged without it uses the run's)."""
    cap = np.asarray(block["kv_capacity_blocks"], dtype=np.float64)
    cap = np.where(cap > 0, cap, capacity)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cap > 0, np.asarray(block["kv_blocks_used"], dtype=np.float64) / cap, np.nan)


def step_figures(steps: Any, kv_capacity_blocks: int, block_size: int) -> StepFigures:
    """The figures of ``steps`` (a run's step columns), a block at a time."""
    capacity = float(kv_capacity_blocks)
    n = n_cap = n_alloc = n_wait = 0
    for _, b in step_blocks(steps, _COUNTED, ROWS):
        n += len(b["num_waiting"])
        n_cap += int((~np.isnan(_usage(b, capacity))).sum())
        n_alloc += int((np.asarray(b["kv_blocks_used"], dtype=np.float64) * block_size > 0).sum())
        n_wait += int((np.asarray(b["num_waiting"], dtype=np.float64) > 0).sum())
    busy, flops, wait_busy = PairwiseSum(n), PairwiseSum(n), PairwiseSum(n_wait)
    cap_dur, alloc_dur = PairwiseSum(n_cap), PairwiseSum(n_alloc)
    batch, batched, usage_dot, token_dot = BlockDot(), BlockDot(), BlockDot(), BlockDot()
    tokens = {k: 0 for k in ("prefill_tokens", "decode_tokens", "padding_tokens")}
    usage_max = -np.inf
    for _, b in step_blocks(steps, _READ, ROWS):
        dur = np.asarray(b["duration"], dtype=np.float64)
        busy.add(dur)
        flops.add(np.asarray(b["flops"], dtype=np.float64))
        batch.add(np.asarray(b["batch_size"], dtype=np.float64), dur)
        waited = np.asarray(b["num_waiting"], dtype=np.float64) > 0
        wait_busy.add(dur[waited])
        batched.add((np.asarray(b["prefill_tokens"], dtype=np.float64)
                     + np.asarray(b["decode_tokens"], dtype=np.float64))[waited], dur[waited])
        for k in tokens:
            tokens[k] += int(np.sum(b[k], dtype=np.int64))
        usage = _usage(b, capacity)
        has = ~np.isnan(usage)
        if has.any():
            usage_max = max(usage_max, float(usage[has].max()))
        usage_dot.add(usage[has], dur[has])
        cap_dur.add(dur[has])
        slots = np.asarray(b["kv_blocks_used"], dtype=np.float64) * block_size
        stored = np.minimum(np.asarray(b["kv_tokens"], dtype=np.float64), slots)
        alloc = slots > 0
        token_dot.add(stored[alloc] / slots[alloc], dur[alloc])
        alloc_dur.add(dur[alloc])
    if any(abs(v) >= _EXACT for v in tokens.values()):
        raise OverflowError("a run's token counts past 2^53: its float sums would depend on their order")
    return StepFigures(
        num_steps=n,
        busy=busy.value(),
        flops=flops.value(),
        prefill_tokens=float(tokens["prefill_tokens"]),
        decode_tokens=float(tokens["decode_tokens"]),
        padding_tokens=float(tokens["padding_tokens"]),
        batch_dot=batch.value(),
        batched_waiting_dot=batched.value(),
        waiting_busy=wait_busy.value(),
        kv_usage_mean=_weighted_mean(usage_dot, cap_dur),
        kv_usage_max=usage_max if n_cap else NAN,
        kv_token_share=_weighted_mean(token_dot, alloc_dur),
    )
