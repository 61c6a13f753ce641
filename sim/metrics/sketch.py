"""A mergeable quantile sketch for latencies, so that a run too long to keep every request still has percentiles.

A DDSketch-style log-bucket histogram (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch
with relative-error guarantees", VLDB 2019): a value ``x >= MIN_VALUE`` falls in bucket ``k = ceil(log_gamma x)``
with ``gamma = (1 + a) / (1 - a)``, so bucket ``k`` holds ``(gamma^(k-1), gamma^k]``, and the bucket reads back as
``2 gamma^k / (gamma + 1)``, which is within a relative ``a`` of every value in it. Values in ``[0, MIN_VALUE)``
are kept in a zero bucket that reads back as 0 (an absolute error below ``MIN_VALUE``, a nanosecond for seconds).

The bound. A quantile is read with numpy's default (linear) method over the sorted values: the two ranked values
around the virtual index ``(n - 1) q / 100`` and a lerp between them. The sketch replaces each ranked value by its
bucket's value, so each is within a relative ``a`` (or is exactly 0 in the zero bucket), and a lerp of two
non-negative values with weights in [0, 1] keeps that bound: every quantile is within ``a * exact`` of
``np.percentile`` of the values (plus float rounding of a few ulps), for values 0 or >= ``MIN_VALUE``.

Merging adds the bucket counts, so a sketch merged from parts has the very buckets, count, minimum and maximum
of one sketch fed every value, and reads the very same quantiles. The mean is exact up to the float sum: the sum
is kept as an exactly rounded sum (``math.fsum``) of each batch's sum.
"""

from __future__ import annotations

import math

import numpy as np

from sim.metrics.sums import dot

RELATIVE_ACCURACY = 0.005  # the default bound on a quantile's relative error (0.5%)
MIN_VALUE = 1e-9  # values below this read back as 0 (seconds: a nanosecond)
NAN = float("nan")


class QuantileSketch:
    """Counts of non-negative values (latencies in seconds) in log-spaced buckets of relative width
    ``relative_accuracy``; see the module docstring for the bound. Add values (optionally weighted by integer
    counts) batch by batch with ``add``, combine sketches with ``merge``."""

    __slots__ = ("relative_accuracy", "_log_gamma", "_gamma", "_dense", "_offset", "zero_count", "count", "_sums",
                 "min", "max")

    def __init__(self, relative_accuracy: float = RELATIVE_ACCURACY) -> None:
        if not 0 < relative_accuracy < 1:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy}")
        self.relative_accuracy = float(relative_accuracy)
        self._gamma = (1 + relative_accuracy) / (1 - relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self._dense = np.zeros(0, dtype=np.int64)  # values in bucket _offset + i
        self._offset = 0
        self.zero_count = 0  # values in [0, MIN_VALUE)
        self.count = 0  # all values, the zero bucket's included
        self._sums: list[float] = []  # each batch's sum (fsum'd when read)
        self.min = math.inf
        self.max = -math.inf

    def add(self, values: np.ndarray | list[float], counts: np.ndarray | list[int] | None = None) -> None:
        """Count ``values`` (each ``counts`` times when given; counts of 0 or less are skipped)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if counts is None:
            c = np.ones(v.size, dtype=np.int64)
        else:
            c = np.asarray(counts, dtype=np.int64).ravel()
            if c.shape != v.shape:
                raise ValueError(f"values and counts differ in length: {v.size} and {c.size}")
            keep = c > 0
            v, c = v[keep], c[keep]
        if v.size == 0:
            return
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError("a quantile sketch takes finite values >= 0")
        self.count += int(c.sum())
        self._sums.append(dot(v, c.astype(np.float64)))
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        small = v < MIN_VALUE
        if small.any():
            self.zero_count += int(c[small].sum())
            v, c = v[~small], c[~small]
        self._add_buckets(np.ceil(np.log(v) / self._log_gamma).astype(np.int64), c)

    def _add_buckets(self, keys: np.ndarray, counts: np.ndarray) -> None:
        # dense counts from bucket _offset up: a few thousand buckets span nanoseconds to hours at 0.5%
        if keys.size == 0:
            return
        lo, hi = int(keys.min()), int(keys.max())
        if self._dense.size == 0:
            self._offset = lo
        new_lo, new_hi = min(lo, self._offset), max(hi, self._offset + self._dense.size - 1)
        if new_lo < self._offset or new_hi >= self._offset + self._dense.size:
            grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
            grown[self._offset - new_lo : self._offset - new_lo + self._dense.size] = self._dense
            self._dense, self._offset = grown, new_lo
        self._dense += np.bincount(keys - self._offset, weights=counts, minlength=self._dense.size).astype(np.int64)

    def merge(self, other: QuantileSketch) -> None:
        """Add every value ``other`` counted (both must have the same accuracy)."""
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError(f"cannot merge sketches of accuracy {self.relative_accuracy} and "
                             f"{other.relative_accuracy}")
        if other.count == 0:
            return
        self.count += other.count
        self.zero_count += other.zero_count
        self._sums.extend(other._sums)
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        keys, counts = other.buckets()
        self._add_buckets(keys, counts)

    def buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket indices, counts), the indices sorted: the state that quantiles read (tests compare it)."""
        nonzero = np.flatnonzero(self._dense)
        return nonzero + self._offset, self._dense[nonzero]

    @property
    def mean(self) -> float:
        return math.fsum(self._sums) / self.count if self.count else NAN

    def _value_at(self, ranks: np.ndarray) -> np.ndarray:
        """The bucket value of the value of each rank (0-based, in the sorted values)."""
        cum = np.cumsum(self._dense)
        out = np.zeros(len(ranks), dtype=np.float64)
        positive = ranks >= self.zero_count
        key = np.searchsorted(cum, ranks[positive] - self.zero_count, side="right") + self._offset
        out[positive] = 2 * np.exp(key * self._log_gamma) / (self._gamma + 1)
        # a value never reads back outside what was seen (the minimum and maximum are kept exactly)
        return np.clip(out, self.min if self.min >= MIN_VALUE else 0.0, self.max)

    def quantile(self, q: float) -> float:
        """The ``q``-th percentile (0 to 100), numpy's linear method on the bucket values; NaN when empty."""
        if self.count == 0:
            return NAN
        if not 0 <= q <= 100:
            raise ValueError(f"q must be in [0, 100], got {q}")
        virtual = (self.count - 1) * (float(q) / 100.0)
        lo = math.floor(virtual)
        hi = min(lo + 1, self.count - 1)
        a, b = (float(x) for x in self._value_at(np.array([lo, hi], dtype=np.int64)))
        gamma = virtual - lo
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma  # numpy's two-sided lerp

    def stats(self, percentiles: tuple[int, ...] = (50, 90, 95, 99)) -> dict[str, float]:
        """{mean, p50, p90, p95, p99}, as ``sim.metrics.summary.latency_stats`` keys them; NaN for no values."""
        return {"mean": self.mean, **{f"p{q}": self.quantile(q) for q in percentiles}}
