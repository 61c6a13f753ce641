"""A family of seeded random workloads for validating the calibrated simulator (torch-free).

Each workload is deliberately unlike the calibration grid (scripted steps at fixed lengths): requests arrive by a
random process, with random lengths, under one serving policy and KV cache, and some share prompt prefixes. The
axes, each drawn independently per workload from the family's seed (so that any workload can be rebuilt from
``(seed, index)`` alone):

- arrivals: Poisson; gamma bursts (coefficient of variation 2-4); on/off traffic (Poisson bursts at several
  times the mean rate separated by silences);
- lengths: lognormal prompts and outputs; exponential; heavy-tailed (Pareto, shape 1.3-1.8, capped); long prompts
  with short outputs;
- policy: static batching, continuous batching, chunked prefill;
- KV cache: ample (the engine's own sizing), or small enough to preempt by recompute, or by swap;
- prefixes: none, or a few shared system prompts (prefix caching on).

The offered load is set against what the engine can serve: ``rho`` is the arrival rate over the rate at which the
engine finishes the same requests when all of them are queued at once (measured by the caller in the simulator,
see ``calibration.fidelity``). Latency workloads draw ``rho`` in 0.3-0.9; about a third of the family is
*saturated* (``rho`` 2-4), where the engine, not the arrivals, sets the output throughput: only those judge it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sim.serving.request import RequestSpec

ARRIVALS = ("poisson", "gamma", "onoff")
LENGTHS = ("lognormal", "exponential", "heavy_tailed", "long_prompt")
POLICIES = ("static", "continuous", "chunked")
CACHES = ("ample", "recompute", "swap")
PREFIX_BLOCK = 16  # tokens named by one prefix hash id (the engine's block size)


@dataclass(frozen=True, slots=True)
class FamilySettings:
    """The scale of a model's workloads: lengths and batch limits that keep its steps in their intended range."""

    num_requests: int = 60
    prompt_mean: int = 96  # tokens, lognormal / exponential mean
    prompt_max: int = 480
    output_mean: int = 20
    output_max: int = 96
    long_prompt: tuple[int, int] = (256, 640)  # the long-prompt/short-output case: prompts uniform in this range
    max_num_seqs: tuple[int, ...] = (8, 16, 32)
    static_batch: tuple[int, ...] = (4, 8, 16)
    chunk_tokens: tuple[int, ...] = (64, 128, 256)
    max_model_len: int = 768

    @classmethod
    def for_model(cls, model: str) -> FamilySettings:
        """tiny: 1 ms steps, so many requests and big batches are cheap; llama-57m (5-50 ms steps on one CPU
        thread): fewer requests and batches of at most 16 keep a workload within seconds of CPU time."""
        if model == "tiny":
            return cls()
        return cls(num_requests=40, prompt_mean=80, prompt_max=400, output_mean=16, output_max=64,
                   long_prompt=(192, 448), max_num_seqs=(4, 8, 16), static_batch=(4, 8), chunk_tokens=(32, 64, 128),
                   max_model_len=640)


@dataclass(frozen=True, slots=True)
class FamilyWorkload:
    """One workload of the family: its axes, its requests (arrivals at offered load ``rho``, see
    ``with_rate``) and the scenario its single variant runs under."""

    index: int
    seed: int
    arrival: str  # ARRIVALS
    lengths: str  # LENGTHS
    policy_kind: str  # POLICIES
    cache: str  # CACHES
    prefix: bool  # shared system prompts with prefix caching
    rho: float  # offered load: arrival rate over the engine's saturated rate
    policy: dict[str, Any]  # the scenario's policy section
    deployment: dict[str, Any]  # the scenario's deployment section (model, lengths, KV blocks)
    kv_cache: dict[str, Any]
    requests: tuple[RequestSpec, ...]  # arrivals at rate 1 request/s (unit gaps); see with_rate
    gaps: tuple[float, ...] = field(default=(), repr=False)  # unit-rate inter-arrival gaps, one per request

    @property
    def name(self) -> str:
        pre = "+prefix" if self.prefix else ""
        return f"w{self.index:02d}-{self.arrival}-{self.lengths}-{self.policy_kind}-{self.cache}{pre}"

    @property
    def saturated(self) -> bool:
        """Offered load above what the engine serves: its output throughput is the engine's."""
        return self.rho > 1.0

    def scenario(self) -> dict[str, Any]:
        """The scenario dict (``sim.config.scenario.parse_scenario``) of the workload's single variant. Its workload
        section is a placeholder: the requests are given explicitly (``requests``)."""
        return {"name": self.name, "seed": self.seed,
                "workload": {"arrival": {"type": "all_at_once"}, "num_requests": len(self.requests),
                             "prompt_len": {"type": "fixed", "value": 1}, "output_len": {"type": "fixed", "value": 1}},
                "deployment": dict(self.deployment), "kv_cache": dict(self.kv_cache),
                "policy": dict(self.policy)}

    def with_rate(self, rate: float) -> tuple[RequestSpec, ...]:
        """The requests with their arrival process scaled to ``rate`` requests per second (the gaps were drawn
        at rate 1: scaling keeps the process's shape, bursts included)."""
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        t = np.cumsum(np.asarray(self.gaps, dtype=np.float64)) / rate
        t -= t[0]
        return tuple(replace(r, arrival=float(a)) for r, a in zip(self.requests, t, strict=False))


def _gaps(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """Inter-arrival gaps of mean 1 s."""
    if kind == "poisson":
        return rng.exponential(1.0, n)
    if kind == "gamma":
        cv = float(rng.uniform(2.0, 4.0))
        shape = 1.0 / cv**2
        return rng.gamma(shape, 1.0 / shape, n)
    # on/off: bursts of Poisson arrivals at `peak` times the mean rate, each followed by a silence that brings
    # the mean gap back to 1 s
    peak = float(rng.uniform(3.0, 6.0))
    burst = int(rng.integers(5, 13))
    g = rng.exponential(1.0 / peak, n)
    silence = burst * (1.0 - 1.0 / peak)
    g[burst::burst] += silence
    return g * (n / g.sum())


def _lengths(rng: np.random.Generator, kind: str, s: FamilySettings, n: int) -> tuple[np.ndarray, np.ndarray]:
    def lognormal(mean: float, cv: float, size: int) -> np.ndarray:
        sigma2 = np.log1p(cv**2)
        return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size)

    if kind == "lognormal":
        p = lognormal(s.prompt_mean, float(rng.uniform(0.5, 1.2)), n)
        o = lognormal(s.output_mean, float(rng.uniform(0.5, 1.0)), n)
    elif kind == "exponential":
        p = rng.exponential(s.prompt_mean, n)
        o = rng.exponential(s.output_mean, n)
    elif kind == "heavy_tailed":  # Pareto (Lomax) tails: most requests short, a few very long
        a = float(rng.uniform(1.3, 1.8))
        p = (rng.pareto(a, n) + 1) * s.prompt_mean * (a - 1) / a
        o = (rng.pareto(a, n) + 1) * s.output_mean * (a - 1) / a
    else:  # long prompts, short outputs (summarisation, retrieval-augmented prompts)
        p = rng.uniform(*s.long_prompt, n)
        o = rng.integers(2, 9, n).astype(np.float64)
    p = np.clip(np.rint(p), 4, s.prompt_max).astype(np.int64)
    o = np.clip(np.rint(o), 2, s.output_max).astype(np.int64)
    return p, o


def _blocks(tokens: np.ndarray, block_size: int) -> np.ndarray:
    return -(-tokens // block_size)


def make_workload(seed: int, index: int, model: str, settings: FamilySettings | None = None) -> FamilyWorkload:
    """Workload ``index`` of the family ``seed`` (independent of every other index)."""
    s = settings or FamilySettings.for_model(model)
    rng = np.random.default_rng([seed, index])
    arrival = ARRIVALS[int(rng.integers(len(ARRIVALS)))]
    lengths = LENGTHS[int(rng.integers(len(LENGTHS)))]
    policy_kind = POLICIES[int(rng.integers(len(POLICIES)))]
    cache = CACHES[int(rng.integers(len(CACHES)))]
    prefix = bool(rng.random() < 0.3)
    saturated = bool(rng.random() < 0.35)
    rho = float(rng.uniform(2.0, 4.0) if saturated else rng.uniform(0.3, 0.9))
    n = s.num_requests
    prompts, outputs = _lengths(rng, lengths, s, n)
    gaps = _gaps(rng, arrival, n)
    hash_ids: list[tuple[int, ...]] = [()] * n
    if prefix:  # 2-4 system prompts of 2-8 blocks, each request using one of them (or none)
        groups = int(rng.integers(2, 5))
        plen = rng.integers(2, 9, groups) * PREFIX_BLOCK
        pick = rng.integers(-1, groups, n)
        for i, g in enumerate(pick):
            if g >= 0:
                hash_ids[i] = tuple(1000 * (int(g) + 1) + j for j in range(int(plen[g]) // PREFIX_BLOCK))
                prompts[i] = min(prompts[i] + int(plen[g]), s.prompt_max + 128)
    bs = 16
    longest = int((prompts + outputs).max())
    # a small cache must hold one longest request (max_model_len <= the cache's tokens)
    mml = longest if cache != "ample" else max(s.max_model_len, longest)
    deployment: dict[str, Any] = {"model": model, "max_model_len": mml, "block_size": bs}
    if policy_kind == "static":
        policy: dict[str, Any] = {"type": "static", "batch_size": int(rng.choice(s.static_batch)),
                                  "max_wait": float(rng.choice([0.0, 0.005, 0.02]))}
    else:
        policy = {"type": "continuous", "max_num_seqs": int(rng.choice(s.max_num_seqs))}
        if policy_kind == "chunked":
            policy.update(enable_chunked_prefill=True, max_num_batched_tokens=int(rng.choice(s.chunk_tokens)))
    if cache != "ample":
        policy["preemption_mode"] = cache
        # enough for the longest request and a few more blocks, but well below what a full batch holds: the
        # batch outgrows the cache as it decodes, and the latest-admitted request is preempted
        need = _blocks(prompts + outputs, bs)
        rows = policy.get("batch_size", policy.get("max_num_seqs", 8))
        typical = float(np.median(need)) * rows
        deployment["num_gpu_blocks"] = int(max(-(-mml // bs) + 2, rng.uniform(0.3, 0.6) * typical))
    kv_cache = {"type": "paged", "enable_prefix_caching": prefix}
    requests = tuple(RequestSpec(i, 0.0, int(p), int(o), h, PREFIX_BLOCK if h else 512)
                     for i, (p, o, h) in enumerate(zip(prompts, outputs, hash_ids, strict=False)))
    return FamilyWorkload(index, seed, arrival, lengths, policy_kind, cache, prefix, rho, policy, deployment,
                          kv_cache, requests, tuple(float(g) for g in gaps))


def family(n: int, model: str, seed: int = 0, settings: FamilySettings | None = None) -> list[FamilyWorkload]:
    """The first ``n`` workloads of the family ``seed`` for ``model``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [make_workload(seed, i, model, settings) for i in range(n)]
