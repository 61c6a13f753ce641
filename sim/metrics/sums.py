"""Dot products whose last digits do not depend on how many threads BLAS runs.

OpenBLAS (numpy's BLAS in its wheels) splits a dot product of more than 10,000 elements among its threads and adds
their partial sums, so ``np.dot`` of a long run's per-step columns changed in the last digits with the thread count:
one thread per core in the caller and in the process pool's forked workers, one in Ray's workers (which set
``OMP_NUM_THREADS=1``), so a tournament's or a sweep's rows differed between executors, and a summary between
machines. ``dot`` takes the product a block of 10,000 at a time (each block on one thread, the very ``np.dot`` of
a shorter array, so anything up to 10,000 elements is unchanged) and adds the blocks in order.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 10_000  # OpenBLAS's ddot runs on one thread up to this many elements (kernel/x86_64/ddot.c, arm64 likewise)


def dot(x: np.ndarray, w: np.ndarray) -> float:
    """``float(np.dot(x, w))`` of two 1-D arrays, the same on any number of BLAS threads."""
    n = len(x)
    if n <= BLOCK:
        return float(np.dot(x, w))
    return math.fsum(float(np.dot(x[i:i + BLOCK], w[i:i + BLOCK])) for i in range(0, n, BLOCK))
