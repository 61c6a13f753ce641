"""A time-binned steps table for long runs: per replica and fixed-width time bin, the steps' sums, means and
peaks. Millions of per-step rows (75 MB for Vidur's 20,000-request configuration, 2.8 s of CPU to write) are
then a few thousand rows that say the same about utilisation, batch shapes, KV and queues; the full per-step log
stays available on request (``servesim run --steps full``)."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from typing import IO

import numpy as np

from sim.metrics.block_sums import RunSums
from sim.metrics.records import RunResult
from sim.metrics.step_columns import StepColumns, continues_ascending, step_blocks

MAX_BINS = 2000  # time bins per replica at most: bin width is the run's span / MAX_BINS, rounded up to 1-2-5
FULL_STEPS_MAX = 200_000  # steps of a run (all variants) up to which `--steps auto` writes the full log

_SUMS = ("duration", "prefill_tokens", "decode_tokens", "padding_tokens", "padded_rows", "num_preempted",
         "num_rejected", "swap_blocks", "flops")
_PEAKS = ("batch_size", "kv_blocks_used", "kv_tokens", "kv_capacity_blocks", "num_running", "num_waiting",
          "num_swapped")
BINNED_COLUMNS: tuple[str, ...] = (
    ("replica", "start_s", "width_s", "num_steps", "busy_s", "mean_batch_size")
    + tuple(c for c in _SUMS if c != "duration") + tuple(f"max_{c}" for c in _PEAKS)
)
# what each column holds (docs/outputs.md lists it). A step counts in the bin where it starts, but its busy time
# is split over the bins it runs in: busy_s was the summed durations of the steps starting in a bin, up to 3.14x
# width_s (lesson-continuous-batching --steps binned), which no reader takes for a busy share
BINNED_COLUMN_HELP: dict[str, str] = {
    "variant": "the variant's name",
    "replica": "the replica whose steps the row sums",
    "start_s": "the bin's start (the bins of a run are of one width, 1, 2 or 5 x 10^k seconds)",
    "width_s": "the bin's width",
    "num_steps": "the steps that start in the bin; a bin has a row where some step starts or runs (0: a longer "
                 "step that started before runs through it)",
    "busy_s": "the seconds of the bin in which a step ran (a step that runs past the bin's end counts the rest in "
              "the bins it runs on in), at most width_s: busy_s / width_s is the bin's busy share",
    "mean_batch_size": "the mean of those steps' batch_size (with no step starting in the bin, the batch_size of "
                       "the step that runs through it)",
    **{c: f"the sum of those steps' `{c}`" for c in _SUMS if c != "duration"},
    **{f"max_{c}": f"the largest `{c}` of those steps (with none, of the step that runs through the bin)"
       for c in _PEAKS},
}


def bin_width(span: float, max_bins: int = MAX_BINS) -> float:
    """The smallest 1, 2 or 5 times a power of ten that cuts ``span`` seconds into at most ``max_bins`` bins."""
    if span <= 0:
        return 1.0
    raw = span / max_bins
    e = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        w = m * 10.0**e
        if w >= raw:
            return w
    return 10.0 ** (e + 1)


def bin_starts(index: np.ndarray, width: float) -> list[float]:
    """Bins' starts, index x width, rounded to the width's decimals: in floating point 29 x 0.05 read
    1.4500000000000002 and 3 x 0.1 0.30000000000000004 in the table (a width is 1, 2 or 5 x 10^e)."""
    return np.round(np.asarray(index, dtype=np.float64) * width, max(0, -math.floor(math.log10(width)))).tolist()


def _own_and_spill(start: np.ndarray, dur: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                              np.ndarray]:
    """Each step's seconds in the bin it starts in, and the bins it runs on into: (own seconds per step, then per
    piece of a later bin in step order: the step's index, the bin, the seconds of it the step ran)."""
    end = start + dur
    first = start // width
    last = end // width
    last = np.where((last > first) & (end - last * width <= 0), last - 1, last)  # an end on a boundary: not in it
    cross = np.flatnonzero(last > first)
    own = dur.copy()
    own[cross] = (first[cross] + 1) * width - start[cross]
    n = (last - first)[cross].astype(np.int64)  # the later bins of each step that crosses a boundary
    idx = np.repeat(cross, n)
    bins = first[idx] + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + 1)
    secs = np.minimum(end[idx], (bins + 1) * width) - bins * width
    return own, idx, bins.astype(np.int64), secs


class _Spills:
    """The seconds steps ran on into later bins, per bin key, added in step order, with the batch size and peaks of
    the step that ran through a bin (for a bin that no step starts in)."""

    def __init__(self) -> None:
        self.secs: dict[int, float] = {}
        self.shape: dict[int, tuple[float, list[int]]] = {}

    def add(self, keys: np.ndarray, secs: np.ndarray, batch: np.ndarray, peaks: list[np.ndarray]) -> None:
        for j, (k, x) in enumerate(zip(keys.tolist(), secs.tolist(), strict=True)):
            self.secs[k] = self.secs.get(k, 0.0) + x
            mine = [int(p[j]) for p in peaks]
            held = self.shape.get(k)
            self.shape[k] = (float(batch[j]), mine) if held is None else \
                (max(held[0], float(batch[j])), [max(a, b) for a, b in zip(held[1], mine, strict=True)])

    def merge(self, cols: list[list], keys: list[int], nb: int, width: float) -> list[list]:
        """``cols`` (rows of bin ``keys``, in order) with the spilled seconds added to busy_s, and a row for each
        bin that only a step starting earlier ran in."""
        at = {k: i for i, k in enumerate(keys)}
        busy = cols[4]
        blank = [0.0 if c == "flops" else 0 for c in _SUMS if c != "duration"]
        extra = []
        for k, x in self.secs.items():
            if k in at:
                busy[at[k]] += x
            else:
                batch, peaks = self.shape[k]
                extra.append((k, k // nb, *bin_starts(np.array([k % nb]), width), width, 0, x, batch, *blank, *peaks))
        if not extra:
            return cols
        rows = sorted([*zip(keys, *cols, strict=True), *extra], key=lambda r: r[0])
        return [list(c) for c in zip(*rows, strict=True)][1:]


def write_binned_steps_csv(f: IO[str], results: list[RunResult]) -> None:
    """One row per (variant, replica, time bin) in which a step starts or runs; a step counts in the bin where it
    starts, its busy seconds in each bin it runs in. Sums (tokens, FLOPs, busy seconds), the step-weighted mean
    batch size, and per-step peaks."""
    w = csv.writer(f, lineterminator="\n")
    w.writerow(("variant",) + BINNED_COLUMNS)
    for res in results:
        s = res.steps
        cols = _binned_in_blocks(s) if isinstance(s, StepColumns) else None
        if cols is None:
            cols = _binned(s)
        if cols is not None:
            w.writerows(zip([res.name] * len(cols[0]), *cols, strict=True))


def _binned(s: Mapping[str, np.ndarray]) -> list[list] | None:
    """The binned table's columns from the whole step columns (None: no steps)."""
    start = np.asarray(s["start"], dtype=np.float64)
    if len(start) == 0:
        return None
    dur = np.asarray(s["duration"], dtype=np.float64)
    width = bin_width(float((start + dur).max()))
    replica = np.asarray(s["replica"], dtype=np.int64)
    nb = int((start + dur).max() // width) + 1
    key = replica * nb + (start // width).astype(np.int64)
    order = np.argsort(key, kind="stable")
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[first, len(k)])
    own, idx, bins, secs = _own_and_spill(start[order], dur[order], width)
    sums = {c: np.add.reduceat(own if c == "duration" else np.asarray(s[c], dtype=np.float64)[order], first)
            for c in _SUMS}
    peaks = {c: np.maximum.reduceat(np.asarray(s[c], dtype=np.int64)[order], first) for c in _PEAKS}
    batch = np.add.reduceat(np.asarray(s["batch_size"], dtype=np.float64)[order], first) / counts
    kk = k[first]
    cols = [(kk // nb).tolist(), bin_starts(kk % nb, width), [width] * len(kk), counts.tolist(),
            sums["duration"].tolist(), batch.tolist()]
    cols += [sums[c].tolist() if c == "flops" else sums[c].astype(np.int64).tolist() for c in _SUMS
             if c != "duration"]
    cols += [peaks[c].tolist() for c in _PEAKS]
    spills = _Spills()
    spills.add(replica[order][idx] * nb + bins, secs, np.asarray(s["batch_size"])[order][idx],
               [np.asarray(s[c])[order][idx] for c in _PEAKS])
    return spills.merge(cols, kk.tolist(), nb, width)


ROWS = 1 << 16  # steps read at a time by _binned_in_blocks
_BATCH = "batch_size (sum)"  # the batch sizes' sum per bin, beside the sums of _SUMS


def _binned_in_blocks(s: StepColumns) -> list[list] | None:
    """``_binned`` of one replica's log whose steps start in order, read a block of steps at a time in three
    passes (the bins' width, then the steps per bin, then the sums and peaks) instead of as a dozen whole columns
    with their sorted copies (the write phase's peak at 300,000 requests). Its bins are then runs of steps in
    order, and ``np.add.reduceat`` sums a run as its first value plus numpy's pairwise sum of the rest, which a
    ``PairwiseSum`` of the rest gives to the bit; peaks are maxima. None when the steps do not start in order."""
    last_start, top_end = -np.inf, -np.inf
    for _, b in step_blocks(s, ("start", "duration"), ROWS):
        st = np.asarray(b["start"], dtype=np.float64)
        if not continues_ascending(st, last_start):
            return None
        last_start, top_end = st[-1], max(top_end, (st + np.asarray(b["duration"])).max())
    if last_start == -np.inf:
        return None
    width = bin_width(float(top_end))
    nb = int(top_end // width) + 1
    base = s.replica * nb
    keys: list[int] = []
    counts: list[int] = []
    for _, b in step_blocks(s, ("start",), ROWS):
        k = base + (np.asarray(b["start"], dtype=np.float64) // width).astype(np.int64)
        first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        n = np.diff(np.r_[first, len(k)]).tolist()
        if keys and keys[-1] == int(k[0]):  # the bin goes on from the block before
            counts[-1] += n.pop(0)
            first = first[1:]
        keys += k[first].tolist()
        counts += n
    sums = {c: RunSums(counts) for c in (*_SUMS, _BATCH)}
    most = {c: RunSums(counts, "max") for c in _PEAKS}
    spills = _Spills()
    for _, b in step_blocks(s, ("start", *_SUMS, *_PEAKS), ROWS):
        own, idx, bins, secs = _own_and_spill(np.asarray(b["start"], dtype=np.float64),
                                              np.asarray(b["duration"], dtype=np.float64), width)
        spills.add(base + bins, secs, np.asarray(b["batch_size"])[idx], [np.asarray(b[c])[idx] for c in _PEAKS])
        for c in _SUMS:
            sums[c].add(own if c == "duration" else np.asarray(b[c], dtype=np.float64))
        sums[_BATCH].add(np.asarray(b["batch_size"], dtype=np.float64))
        for c in _PEAKS:
            most[c].add(np.asarray(b[c], dtype=np.int64))
    ks = np.asarray(keys, dtype=np.int64)
    cols = [(ks // nb).tolist(), bin_starts(ks % nb, width), [width] * len(keys), counts, sums["duration"].sums,
            (np.asarray(sums[_BATCH].sums) / np.asarray(counts, dtype=np.int64)).tolist()]
    cols += [sums[c].sums if c == "flops" else np.asarray(sums[c].sums).astype(np.int64).tolist() for c in _SUMS
             if c != "duration"]
    cols += [most[c].sums for c in _PEAKS]
    return spills.merge(cols, keys, nb, width)
