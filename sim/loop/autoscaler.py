"""An autoscaler that adds and removes whole GPUs (replicas) on a chosen signal.

Every ``interval`` seconds it reads one signal over the replicas that serve traffic and compares it with two
thresholds:

- ``busy``: the share of the last interval each replica spent running steps, averaged (what most GPU
  dashboards show as "utilisation": a replica streaming weights for a batch of two reads 100%);
- ``compute``: the FLOPs each replica did in the last interval over what its peak could have done (model FLOPs
  utilisation, averaged): low in a memory-bound overload, where the KV cache, not the math units, is full;
- ``kv_usage``: KV blocks in use plus those its queued prompts need, as a share of its cache, averaged
  (memory pressure: the signal that sees a memory-bound overload coming);
- ``queue``: requests waiting per replica;
- ``ttft``: the mean time to first token of the requests that got their first token in the last interval.

Above ``scale_up`` it provisions one replica, which serves only after ``provisioning_delay`` (instances take
minutes to boot and load weights) but is paid for from the start; below ``scale_down`` it drains one (no new
requests; it is released, and stops costing, once its last request ends). After any action it waits
``cooldown`` seconds. ``min_replicas`` and ``max_replicas`` bound the count (provisioning ones included).
Every replica costs the GPU's price per hour times its tensor-parallel size, from provisioning to release.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIGNALS = ("busy", "compute", "kv_usage", "queue", "ttft")


@dataclass(frozen=True)
class AutoscalerConfig:
    signal: str
    scale_up: float
    scale_down: float
    interval: float = 10.0
    cooldown: float = 60.0
    provisioning_delay: float = 120.0
    min_replicas: int = 1
    max_replicas: int = 8

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"autoscaler signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if not self.scale_down < self.scale_up:
            raise ValueError(f"autoscaler: scale_down ({self.scale_down}) must be below scale_up ({self.scale_up})")
        if not (self.interval > 0 and self.cooldown >= 0 and self.provisioning_delay >= 0):
            raise ValueError("autoscaler: interval must be > 0, cooldown and provisioning_delay >= 0")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"autoscaler: need 1 <= min_replicas ({self.min_replicas}) <= max_replicas "
                             f"({self.max_replicas})")


@dataclass
class ReplicaLife:
    """When one replica was provisioned, began serving, began draining and was released (inf: never)."""

    index: int
    provisioned: float
    ready: float
    draining: float = float("inf")
    released: float = float("inf")

    def gpu_seconds(self, end: float, start: float = 0.0) -> float:
        """Seconds it was paid for within [start, end]."""
        return max(0.0, min(self.released, end) - max(self.provisioned, start))


@dataclass
class ScalingLog:
    """What the autoscaler saw and did: one row per tick, and every replica's life."""

    times: list[float] = field(default_factory=list)
    signal: list[float] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)  # replicas taking traffic at the tick
    total: list[int] = field(default_factory=list)  # replicas paid for (provisioning and draining included)
    actions: list[tuple[float, str, int]] = field(default_factory=list)  # (time, "up" | "down", replica)
    lives: list[ReplicaLife] = field(default_factory=list)

    def replica_seconds(self, end: float, start: float = 0.0) -> float:
        return sum(life.gpu_seconds(end, start) for life in self.lives)
