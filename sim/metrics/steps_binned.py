"""A time-binned steps table for long runs: per replica and fixed-width time bin, the steps' sums, means and
peaks. Millions of per-step rows (75 MB for Vidur's 20,000-request configuration, 2.8 s of CPU to write) are
then a few thousand rows that say the same about utilisation, batch shapes, KV and queues; the full per-step log
stays available on request (``servesim run --steps full``)."""

from __future__ import annotations

import csv
import math
from typing import IO

import numpy as np

from sim.metrics.records import RunResult

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


def write_binned_steps_csv(f: IO[str], results: list[RunResult]) -> None:
    """One row per (variant, replica, time bin) that holds at least one step; a step counts in the bin where it
    starts. Sums (tokens, FLOPs, busy seconds), the step-weighted mean batch size, and per-step peaks."""
    w = csv.writer(f, lineterminator="\n")
    w.writerow(("variant",) + BINNED_COLUMNS)
    for res in results:
        s = res.steps
        start = np.asarray(s["start"], dtype=np.float64)
        if len(start) == 0:
            continue
        width = bin_width(float((start + np.asarray(s["duration"])).max()))
        replica = np.asarray(s["replica"], dtype=np.int64)
        nb = int(start.max() // width) + 1
        key = replica * nb + (start // width).astype(np.int64)
        order = np.argsort(key, kind="stable")
        k = key[order]
        first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        counts = np.diff(np.r_[first, len(k)])
        sums = {c: np.add.reduceat(np.asarray(s[c], dtype=np.float64)[order], first) for c in _SUMS}
        peaks = {c: np.maximum.reduceat(np.asarray(s[c], dtype=np.int64)[order], first) for c in _PEAKS}
        batch = np.add.reduceat(np.asarray(s["batch_size"], dtype=np.float64)[order], first) / counts
        kk = k[first]
        cols = [(kk // nb).tolist(), ((kk % nb) * width).tolist(), [width] * len(kk), counts.tolist(),
                sums["duration"].tolist(), batch.tolist()]
        cols += [sums[c].tolist() if c == "flops" else sums[c].astype(np.int64).tolist() for c in _SUMS
                 if c != "duration"]
        cols += [peaks[c].tolist() for c in _PEAKS]
        w.writerows(zip([res.name] * len(kk), *cols, strict=True))
