"""Pooled inter-token gaps (sim/metrics/gap_pool.py): merging two pooled parts is pooling them at once, to the bit,
and a pool of a long run's pairs never sorts or copies every pair it was given (issue 40, item 3)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import sim.metrics.gap_pool as gap_pool
from sim.metrics.gap_pool import GapPool, merge_pooled, pooled_gaps


def pairs(rng: np.random.Generator, n: int, *, odd: bool) -> tuple[np.ndarray, np.ndarray]:
    gaps = np.round(rng.exponential(0.02, n), 4)  # repeats, as a decode stretch's steps make
    if odd and n:  # -0.0 beside 0.0 (equal: pooled as one, the first seen kept), NaN (never equal to itself)
        gaps[rng.integers(0, n, 3)] = 0.0
        gaps[rng.integers(0, n, 3)] = -0.0
        gaps[rng.integers(0, n, 2)] = np.nan
    return gaps, rng.integers(1, 300, n)


def same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    return a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes() and a[1].dtype == b[1].dtype


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("odd", [False, True])
def test_merging_two_pooled_parts_is_pooling_them_at_once(seed: int, odd: bool) -> None:
    rng = np.random.default_rng(seed)
    n1, n2 = (int(x) for x in rng.integers(0, 3000, 2)) if seed else (0, 50)
    g1, c1 = pairs(rng, n1, odd=odd)
    g2, c2 = pairs(rng, n2, odd=odd and seed % 2 == 0)
    want = pooled_gaps(np.concatenate([g1, g2]), np.concatenate([c1, c2]))
    assert same(merge_pooled(*pooled_gaps(g1, c1), *pooled_gaps(g2, c2)), want)
    assert same(merge_pooled(*pooled_gaps(g2, c2), *pooled_gaps(np.zeros(0), np.zeros(0, dtype=np.int64))),
                pooled_gaps(g2, c2))


def test_a_gap_present_in_both_keeps_the_first_parts_sign() -> None:
    got = merge_pooled(np.array([0.0, 1.0]), np.array([2, 3]), np.array([-0.0, 0.5, 2.0]), np.array([5, 7, 11]))
    assert got[0].tolist() == [0.0, 0.5, 1.0, 2.0] and np.signbit(got[0]).tolist() == [False] * 4
    assert got[1].tolist() == [7, 7, 3, 11]
    got = merge_pooled(np.array([-0.0]), np.array([1]), np.array([0.0]), np.array([1]))
    assert np.signbit(got[0]).tolist() == [True] and got[1].tolist() == [2]


@pytest.mark.parametrize("pool_min", [16, 200])
def test_a_pool_ends_as_every_pair_pooled_at_once(pool_min: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gap_pool, "POOL_MIN", pool_min)
    rng = np.random.default_rng(3)
    gaps, counts = pairs(rng, 20_000, odd=True)
    pool = GapPool()
    for lo in range(0, gaps.size, 37):
        pool.add(gaps[lo : lo + 37], counts[lo : lo + 37])
    want = pooled_gaps(gaps, counts)
    assert same(pooled_gaps(*pool.arrays()), want)  # pooled in part, then pooled
    assert same(pool.pooled(), want)
    assert same(pool.arrays(), want)  # it holds its pairs pooled from then on


def test_pooling_a_long_run_holds_its_distinct_gaps_not_every_pair() -> None:
    # 8 M pairs with 200,000 distinct gaps, added 65,536 at a time as a spilled step log's chunks are: pooled
    # every 2^20 pairs and at the end all at once, the pairs' copies, order and sorted columns were some 65 bytes
    # a pair at once (70 MB here); pooled a part at a time and merged, 16 MB
    rng = np.random.default_rng(1)
    distinct = np.sort(rng.exponential(0.02, 200_000))
    tracemalloc.start()
    try:
        pool = GapPool()
        for _ in range(122):
            pool.add(distinct[rng.integers(0, distinct.size, 1 << 16)], rng.integers(1, 256, 1 << 16))
        gaps, counts = pool.pooled()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(gaps) == 200_000 and counts.sum() > 0
    assert peak < 30e6
