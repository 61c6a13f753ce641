"""The utilisation timeline's series of a long run read a block of steps at a time (``fig_timeline``): a run of
more than ``KEEP_EVENTS_MAX`` steps held its start column and four to six more whole columns while the figure
was made (8 bytes a step each, 1.6 GB at ten million requests). The values are those of the whole columns:
windowed amounts by ``_cum_in_blocks``, per-window peaks as ``np.maximum.reduceat`` (``RunSums``), the
preemptions gathered block by block in step order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sim.metrics.block_sums import RunSums
from sim.metrics.records import RunResult
from sim.metrics.step_columns import StepColumns, step_blocks
from sim.output.report.common import _cums_in_blocks, _held, _in_order_blocks, _kv_capacity, _once, keeping, window_runs

QUEUES = ("num_waiting", "num_running", "num_swapped")


@dataclass(frozen=True, slots=True)
class TimelineSeries:
    """Per window: busy fraction, MFU (None without peak FLOPs), KV used and used less reserved (peaks), queue
    peaks; whether any step reserved blocks or swapped; the preempting steps' starts and preemptions."""

    busy: np.ndarray
    mfu: np.ndarray | None
    kv_used: np.ndarray
    kv_filled: np.ndarray
    any_reserved: bool
    queues: dict[str, np.ndarray]
    any_swapped: bool
    preempt_t: np.ndarray
    preempt_n: np.ndarray


# the amounts the report windows over a long run's steps (busy time and FLOPs in the timeline, decode and prefill
# tokens in the throughput figure): inside ``step_events_kept`` the first asked finds the four in one pass
WINDOWED = ("duration", "flops", "decode_tokens", "prefill_tokens")


def _amount(s: StepColumns, key: str, edges: np.ndarray) -> np.ndarray:
    """``amount_per_window(start, duration, s[key], edges)``, a block at a time."""
    keys = WINDOWED if key in WINDOWED and keeping() else (key,)
    return _once(("amounts", edges.tobytes(), keys), s, lambda: _amounts(s, keys, edges))[key]


def _amounts(s: StepColumns, keys: tuple[str, ...], edges: np.ndarray) -> dict[str, np.ndarray]:
    def blocks() -> Iterator[tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]]:
        for _, b in step_blocks(s, ("start", "duration", *keys)):
            yield (np.asarray(b["start"], dtype=np.float64), np.asarray(b["duration"], dtype=np.float64),
                   tuple(np.asarray(b[k], dtype=np.float64) for k in keys))

    out = {}
    for key, c in zip(keys, _cums_in_blocks(blocks(), edges, len(keys)), strict=True):
        cum = np.zeros(len(edges))
        cum += c
        out[key] = np.diff(cum)
    return out


def amount_in_blocks(s: StepColumns, key: str, edges: np.ndarray) -> np.ndarray | None:
    """``amount_per_window(start, duration, s[key], edges)`` of a log whose steps start and end in order and last a
    positive time, a block at a time; None otherwise."""
    return _amount(s, key, edges) if _steps_in_order(s) else None


def _steps_in_order(s: StepColumns) -> bool:
    """Whether the log's steps start in order, end in order and last a positive time (read once a log inside
    ``step_events_kept``)."""
    return bool(_once("steps_in_order", s, lambda: _in_order_blocks(step_blocks(s, ("start", "duration")))))


def timeline_series(result: RunResult, s: StepColumns, edges: np.ndarray) -> TimelineSeries | None:
    """The series, or None when the steps do not start and end in order or some step has no duration (then the
    whole columns are read)."""
    if not _steps_in_order(s):
        return None
    runs = window_runs(s, edges, step_blocks)
    if runs is None:
        return None
    held, counts = runs
    nb = len(edges) - 1
    width = edges[1] - edges[0]
    busy = _amount(s, "duration", edges) / width
    mfu = _amount(s, "flops", edges) / (width * result.peak_flops) if result.peak_flops > 0 else None
    peaks = {k: RunSums(counts, "max") for k in ("used", "filled", *QUEUES)}
    reserved = swapped = False
    pre_t: list[np.ndarray] = []
    pre_n: list[np.ndarray] = []
    keys = ("start", "kv_capacity_blocks", "kv_blocks_used", "kv_blocks_reserved", "num_preempted", *QUEUES)
    for _, b in step_blocks(s, keys):
        cap = _kv_capacity(b, result)
        with np.errstate(divide="ignore", invalid="ignore"):
            peaks["used"].add(b["kv_blocks_used"] / cap)
            peaks["filled"].add((b["kv_blocks_used"] - b["kv_blocks_reserved"]) / cap)
        for k in QUEUES:
            peaks[k].add(np.asarray(b[k], dtype=np.float64))
        reserved = reserved or bool(np.any(b["kv_blocks_reserved"] > 0))
        swapped = swapped or bool(np.any(b["num_swapped"] > 0))
        pre = b["num_preempted"] > 0
        pre_t.append(b["start"][pre])
        pre_n.append(b["num_preempted"][pre])
    windowed = {k: _held(np.asarray(r.sums), held, nb) for k, r in peaks.items()}
    return TimelineSeries(busy, mfu, windowed["used"], windowed["filled"], reserved,
                          {k: windowed[k] for k in QUEUES}, swapped, np.concatenate(pre_t), np.concatenate(pre_n))
