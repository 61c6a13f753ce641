"""Pooled inter-token gaps: (gap seconds, tokens that saw it) pairs in one canonical form, and a pool that keeps
a long run's pairs at the size of their distinct gaps.

A run records a pair per decode step (the gap, the decode group's size): 16 bytes a step, 3.2 GB at 200 M steps
(ten million requests), although a run has far fewer distinct gaps (568,000 of 6.0 M steps at 300,000 Azure
conversation requests). ``GapPool`` pools what it holds whenever the pairs added since it last pooled outnumber
both ``POOL_MIN`` and the pooled ones, so it holds at most about twice the distinct gaps, each pair sorted
``O(log n)`` times. Pooling is exact (counts are integers), so pooling the pooled parts gives what pooling
everything at once gave; a shorter run keeps its pairs in the order they were added, as before."""

from __future__ import annotations

import numpy as np

POOL_MIN = 1 << 20  # pairs held unpooled at most before a pool first pools them (16 MB)


def pooled_gaps(gaps: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One canonical form of pooled inter-token gaps (sorted distinct values with their counts), so that a
    summary does not depend on whether they were recorded one by one, a decode stretch at a time, or replica
    by replica."""
    gaps = np.asarray(gaps, dtype=np.float64)
    if gaps.size == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    # one sort and a sum per run of equal values: np.unique's inverse index and bincount's float weights were
    # six arrays of a long run's length at once, the peak of gathering its results
    order = np.argsort(gaps, kind="stable")
    counts = np.asarray(counts, dtype=np.int64)[order]
    gaps = gaps[order]
    del order
    first = np.flatnonzero(np.r_[True, gaps[1:] != gaps[:-1]])
    return gaps[first], np.add.reduceat(counts, first)


class GapPool:
    """(gap, count) pairs added in order, pooled as they grow (see the module docstring)."""

    __slots__ = ("_parts", "_new", "_pooled")

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self._new = 0  # pairs added since the last pooling
        self._pooled = 0  # pairs it left

    def add(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        if not len(gaps):
            return
        self._parts.append((np.asarray(gaps, dtype=np.float64), np.asarray(counts, dtype=np.int64)))
        self._new += len(gaps)
        if self._new >= max(POOL_MIN, self._pooled):
            gaps, counts = pooled_gaps(*self.arrays())
            self._parts = [(gaps, counts)]
            self._new, self._pooled = 0, len(gaps)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, counts): in the order added until the pool first pooled, then pooled in part."""
        parts = [(np.zeros(0), np.zeros(0, dtype=np.int64)), *self._parts]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
