"""Sums of a long run's step columns taken a block of steps at a time, equal to the bit to those numpy takes of the
whole columns, so that a summary never holds a whole column (1.6 GB at 200 M steps, ten million requests).

- ``PairwiseSum(n)``: ``np.add.reduce`` of n float64 values. numpy sums a contiguous float64 array pairwise: it
  halves the range (the first half rounded down to a multiple of 8) until a part is at most 128 values, so the
  result depends on n and the values only. The same tree is cut at parts of at most ``leaf`` values, each part
  summed by numpy itself (a slice of that length takes the same tree below it), and the parts combined as numpy
  combines them.
- ``BlockDot``: ``sim.metrics.sums.dot``, which takes ``np.dot`` of blocks of ``sums.BLOCK`` values and adds them
  with ``math.fsum``: the pieces are cut at the same places whatever the blocks they are fed in.
"""

from __future__ import annotations

import math

import numpy as np

from sim.metrics.sums import BLOCK

_PW_BLOCKSIZE = 128  # numpy's PW_BLOCKSIZE: a part this short is summed with 8 accumulators, not halved
LEAF = 1 << 16  # values summed by one numpy call at most


def _split(n: int) -> int:
    """Where numpy's pairwise sum splits n values (n > 128): half, rounded down to a multiple of 8."""
    n2 = n // 2
    return n2 - n2 % 8


def _leaves(n: int, leaf: int, out: list[int]) -> None:
    if n <= leaf or n <= _PW_BLOCKSIZE:
        out.append(n)
        return
    n2 = _split(n)
    _leaves(n2, leaf, out)
    _leaves(n - n2, leaf, out)


class _Pieces:
    """Values fed in arrays of any length, handed out in pieces of the lengths asked for."""

    def __init__(self) -> None:
        self._held: list[tuple[np.ndarray, ...]] = []
        self.count = 0  # values held

    def add(self, *arrays: np.ndarray) -> None:
        if len(arrays[0]):
            self._held.append(arrays)
            self.count += len(arrays[0])

    def take(self, k: int) -> tuple[np.ndarray, ...]:
        """The first k values held (k <= count), as contiguous arrays."""
        if len(self._held[0][0]) < k:  # join the arrays that hold the first k
            joined = tuple(np.concatenate(parts) for parts in zip(*self._held, strict=True))
            self._held = [joined]
        first = self._held[0]
        out = tuple(np.ascontiguousarray(a[:k]) for a in first)
        if len(first[0]) == k:
            self._held.pop(0)
        else:
            self._held[0] = tuple(a[k:] for a in first)
        self.count -= k
        return out


class PairwiseSum:
    """``float(np.add.reduce(x))`` of a float64 array ``x`` of ``n`` values fed in order, in arrays of any length
    (``add``); ``value`` once all n were fed."""

    def __init__(self, n: int, leaf: int | None = None) -> None:
        self._n = n
        self._leaf = LEAF if leaf is None else leaf
        self._lengths: list[int] = []
        if n:
            _leaves(n, self._leaf, self._lengths)
        self._lengths.reverse()  # popped from the end, in order
        self._sums: list[float] = []
        self._pieces = _Pieces()

    def parts(self) -> list[int]:
        """The lengths of the parts numpy sums, in order (of the values still to come): values fed in arrays of
        exactly these lengths are summed as they are, without being joined or cut into copies."""
        return self._lengths[::-1]

    def add(self, values: np.ndarray) -> None:
        self._pieces.add(np.asarray(values, dtype=np.float64))
        while self._lengths and self._pieces.count >= self._lengths[-1]:
            (part,) = self._pieces.take(self._lengths.pop())
            self._sums.append(float(np.add.reduce(part)))

    def value(self) -> float:
        if self._lengths or self._pieces.count:
            raise ValueError(f"PairwiseSum of {self._n} values was fed a different number")
        if not self._n:
            return 0.0  # np.add.reduce of nothing
        sums = iter(self._sums)

        def combine(n: int) -> float:
            if n <= self._leaf or n <= _PW_BLOCKSIZE:
                return next(sums)
            n2 = _split(n)
            left = combine(n2)
            return left + combine(n - n2)

        return combine(self._n)


class BlockDot:
    """``sim.metrics.sums.dot(x, w)`` of two float64 arrays fed in order, in pairs of arrays of any length."""

    def __init__(self) -> None:
        self._parts: list[float] = []
        self._pieces = _Pieces()
        self._n = 0

    def add(self, x: np.ndarray, w: np.ndarray) -> None:
        self._pieces.add(np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64))
        self._n += len(x)
        while self._pieces.count >= BLOCK:
            a, b = self._pieces.take(BLOCK)
            self._parts.append(float(np.dot(a, b)))

    def value(self) -> float:
        if self._pieces.count:
            a, b = self._pieces.take(self._pieces.count)
            self._parts.append(float(np.dot(a, b)))
        if self._n <= BLOCK:  # dot's one np.dot (np.dot of nothing is 0.0)
            return self._parts[0] if self._parts else 0.0
        return math.fsum(self._parts)


class RunSums:
    """``np.add.reduceat(x, first)`` of a float64 array ``x`` fed in order in arrays of any length, for runs of
    ``counts`` consecutive values (``first`` their starts; each count at least 1): numpy sums a run as its first
    value plus its pairwise sum of the rest, which a ``PairwiseSum`` of the rest gives. ``sums``: the runs ended so
    far; with ``how="max"``, their maxima instead (``np.maximum.reduceat``)."""

    def __init__(self, counts: list[int], how: str = "sum") -> None:
        self._counts = counts
        self._max = how == "max"
        self._at = -1  # the run being fed
        self._left = 0  # its values still to come
        self._head: float = 0.0
        self._rest = PairwiseSum(0)
        self.sums: list[float] = []
        self._fed = 0  # values fed so far
        self._bounds: np.ndarray | None = None  # where each run starts in the whole column, and the last ends

    def add(self, values: np.ndarray) -> None:
        i, n = 0, len(values)
        while i < n:
            if not self._left:
                i = self._whole_runs(values, i)
                if i == n:
                    break
                # a run begins: its first value
                self._at += 1
                self._left = self._counts[self._at] - 1
                self._head = values[i].item()
                self._rest = PairwiseSum(0 if self._max else self._left)
                i += 1
            j = min(n, i + self._left)
            if self._max and j > i:  # np.maximum: a NaN wins, as in np.maximum.reduceat
                self._head = np.maximum(self._head, values[i:j].max()).item()
            elif not self._max:
                self._rest.add(values[i:j])
            self._left -= j - i
            i = j
            if not self._left:
                full = self._counts[self._at] > 1 and not self._max
                self.sums.append(self._head + self._rest.value() if full else self._head)
        self._fed += n

    def _whole_runs(self, values: np.ndarray, i: int) -> int:
        """The runs that begin at ``values[i]`` and end within ``values``, reduced by one ``reduceat`` of the slice
        (numpy reduces each run of it alone, on its values only, so a slice gives the whole column's sums and
        maxima); returns the index after them. A Python loop a run cost some 10 us, 0.26 s of bench_vidur's
        steps_binned.csv (2,000 bins, 11 columns)."""
        bounds = self._bounds
        if bounds is None:
            bounds = self._bounds = np.cumsum([0, *self._counts])
        first = self._at + 1  # the run that begins at values[i]
        stop = int(np.searchsorted(bounds, self._fed + len(values), side="right")) - 1  # runs first..stop-1 end here
        if stop - first < 2:  # none or one: the loop takes it
            return i
        end = int(bounds[stop]) - self._fed
        out = (np.maximum if self._max else np.add).reduceat(values[i:end], bounds[first:stop] - (self._fed + i))
        self.sums += out.tolist()
        self._at = stop - 1
        return end

