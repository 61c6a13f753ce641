"""Output-length predictors for policies that rank by job size (``RequestView.predicted_output_len``).

- ``OraclePredictor``: the true output length (an upper bound on what any predictor can give);
- ``NoisyOraclePredictor``: the truth times exp(N(0, sigma^2)), rounded, at least 1 (a learned predictor's error is
  roughly multiplicative: Qiu et al. 2024, Zheng et al., "Response Length Perception", 2023);
- ``BucketPredictor``: the bucket the truth falls in, reported as its upper edge (a classifier over length ranges,
  as in "S^3" (Jin et al., 2023)); lengths past the last edge report that edge.

Every request's noise is a pure function of (seed, request id), so each compared variant, and the simulator and
the real engine, see the same prediction for the same request, whatever order they ask in.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from sim.serving.request import Request

_CHUNK = 4096  # noise is drawn for 4096 consecutive request ids at a time, each chunk from its own stream


class OraclePredictor:
    def predict(self, req: Request) -> int:
        return req.output_len

    def describe(self) -> str:
        return "oracle"


class NoisyOraclePredictor:
    def __init__(self, sigma: float, seed: int = 0) -> None:
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"predictor sigma must be a finite number >= 0, got {sigma}")
        self.sigma = float(sigma)
        self.seed = int(seed)
        self._chunks: dict[int, np.ndarray] = {}

    def predict(self, req: Request) -> int:
        if self.sigma == 0:
            return req.output_len
        k, i = divmod(req.id, _CHUNK)
        z = self._chunks.get(k)
        if z is None:
            z = self._chunks[k] = np.random.default_rng([self.seed, k]).standard_normal(_CHUNK)
        return max(1, round(req.output_len * math.exp(self.sigma * float(z[i]))))

    def describe(self) -> str:
        return f"oracle x lognormal(sigma={self.sigma})"


class BucketPredictor:
    def __init__(self, edges: Sequence[int]) -> None:
        e = [int(x) for x in edges]
        if not e or any(x < 1 for x in e) or any(b <= a for a, b in zip(e, e[1:], strict=False)):
            raise ValueError(f"predictor edges must be increasing positive token counts, got {list(edges)}")
        self.edges = e

    def predict(self, req: Request) -> int:
        i = bisect_left(self.edges, req.output_len)
        return self.edges[min(i, len(self.edges) - 1)]

    def describe(self) -> str:
        return f"buckets {self.edges}"
