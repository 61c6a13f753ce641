"""Pooled inter-token gaps: (gap seconds, tokens that saw it) pairs in one canonical form, and a pool that keeps
a long run's pairs at the size of their distinct gaps.

A run records a pair per decode step (the gap, the decode group's size): 16 bytes a step, 3.2 GB at 200 M steps
(ten million requests), although a run has far fewer distinct gaps (568,000 of 6.0 M steps at 300,000 Azure
conversation requests). ``GapPool`` pools the pairs added since it last pooled, on their own, once they
outnumber both ``POOL_MIN`` and a quarter of the pairs it pooled before, and merges them into those
(``merge_pooled``): it holds its distinct gaps and at most that many more, and never sorts more than those (a
pooling of every pair held, with its copies and order, was the largest transient of gathering a long run's results,
some 65 bytes a pair). Pooling is exact (counts are integers), so pooling the pooled parts gives what pooling
everything at once gave; a shorter run keeps its pairs in the order they were added, as before."""

from __future__ import annotations

import numpy as np

# pairs held unpooled at most (4 MB) before a pool pools them, on their own, and merges them into those it pooled
# before; past four times as many pooled pairs, a quarter of those (the merges stay few, each a copy of the pool)
POOL_MIN = 1 << 18


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


def merge_pooled(g1: np.ndarray, c1: np.ndarray, g2: np.ndarray, c2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pooled_gaps`` of two pooled parts one after the other (each in the canonical form), by placing the second
    part's gaps in the first's instead of sorting both again: the same arrays (a gap both hold keeps the first
    part's value, as the stable sort kept it for -0.0 and 0.0), while holding the two parts and the result (about
    32 bytes a distinct gap) rather than pooled_gaps' copies, order and sorted columns of every pair."""
    if not len(g2):
        return g1, c1
    if not len(g1) or np.isnan(g1[-1]) or np.isnan(g2[-1]):  # NaN (sorted last) is never equal: each its own pair
        return pooled_gaps(np.concatenate([g1, g2]), np.concatenate([c1, c2]))
    at = np.searchsorted(g1, g2)  # g2 is sorted and distinct: each lands on its equal, or before the next larger
    found = at < len(g1)
    found[found] = g1[at[found]] == g2[found]
    new = ~found
    ins = at[new]
    gaps = np.insert(g1, ins, g2[new])
    counts = np.insert(c1, ins, c2[new])
    hit = at[found]
    counts[hit + np.searchsorted(ins, hit, side="right")] += c2[found]  # moved past the gaps inserted before it
    return gaps, counts


class GapPool:
    """(gap, count) pairs added in order, pooled as they grow (see the module docstring)."""

    __slots__ = ("_parts", "_new", "_gaps", "_counts")

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []  # pairs added since the pool last pooled, in order
        self._new = 0  # pairs in _parts
        self._gaps: np.ndarray | None = None  # the pairs pooled so far (canonical form); None: never pooled
        self._counts = np.zeros(0, dtype=np.int64)

    def add(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        if not len(gaps):
            return
        self._parts.append((np.asarray(gaps, dtype=np.float64), np.asarray(counts, dtype=np.int64)))
        self._new += len(gaps)
        if self._new >= max(POOL_MIN, 0 if self._gaps is None else len(self._gaps) // 4):
            self._pool()

    def _pool(self) -> None:
        """Pool the pairs added since the last pooling on their own, and merge them into the pooled ones."""
        parts, self._parts, self._new = self._parts, [], 0
        gaps, counts = pooled_gaps(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        del parts
        if self._gaps is not None:
            gaps, counts = merge_pooled(self._gaps, self._counts, gaps, counts)
        self._gaps, self._counts = gaps, counts

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, counts): in the order added until the pool first pooled, then the pooled pairs followed by those
        added since."""
        parts = [(np.zeros(0), np.zeros(0, dtype=np.int64)), *self._parts]
        if self._gaps is not None:
            parts.insert(1, (self._gaps, self._counts))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """``pooled_gaps(*self.arrays())``, pooling what is left (the pool then holds its pairs pooled)."""
        if self._parts:
            self._pool()
        return (np.zeros(0), np.zeros(0, dtype=np.int64)) if self._gaps is None else (self._gaps, self._counts)
