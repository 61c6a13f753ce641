"""Check mode: run a policy with the simulator's fast path and without it, and name the first step where the two
runs differ.

The fast path (``sim.serving.fast_path``, ``ServingCore.plan_without_policy``) skips asking a policy when its declared
``depends_on`` says the answer cannot have changed. A policy whose declaration is wrong (it reads the clock, or how
far a running request got, yet declares only arrivals and finishes) gives a different schedule with the fast path;
stepping one by one asks it before every step and is always right. ``servesim check-policy`` reports the first step
at which they part, so the author can fix the declaration (or drop it: the default, every step, is always safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config.scenario import VariantConfig
from sim.loop.run import simulate_variant
from sim.workload.generator import GeneratedWorkload


@dataclass(frozen=True, slots=True)
class CheckResult:
    variant: str
    num_steps: int  # steps of the run stepped one by one
    difference: str | None  # the first difference, in words; None: identical

    def line(self) -> str:
        if self.difference is None:
            return f"{self.variant}: ok, the fast path gives the same {self.num_steps} steps as stepping one by one"
        return f"{self.variant}: DIFFERS: {self.difference}"


def _apart(a: object, b: object) -> tuple[str, str]:
    """Two differing values as text, floats with the fewest significant digits that still tell them apart
    (docs/write-a-policy.md: "duration is 0.01195 with the fast path, 0.01281"; the line printed
    0.03793607946479316 against 0.025680997314422527)."""
    if not (isinstance(a, float | np.floating) and isinstance(b, float | np.floating)):
        return str(a), str(b)
    for digits in range(4, 18):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            return x, y
    return repr(float(a)), repr(float(b))


def check_fast_path(cfg: VariantConfig, workload: GeneratedWorkload) -> CheckResult:
    fast, _, _ = simulate_variant(cfg, workload, keep_token_times=True)
    slow, _, _ = simulate_variant(cfg, workload, keep_token_times=True, fast_path=False)
    start = np.asarray(slow.steps["start"])
    n = len(start)
    first: tuple[int, str] | None = None
    for col in slow.steps:
        a, b = np.asarray(fast.steps[col]), np.asarray(slow.steps[col])
        m = min(len(a), len(b))
        diff = np.flatnonzero(a[:m] != b[:m])
        i = int(diff[0]) if len(diff) else (m if len(a) != len(b) else -1)
        if i >= 0 and (first is None or i < first[0]):
            first = (i, col)
    if first is not None:
        i, col = first
        a, b = np.asarray(fast.steps[col]), np.asarray(slow.steps[col])
        got, want = _apart(a[i] if i < len(a) else "no step", b[i] if i < len(b) else "no step")
        when = f" (t={start[i]:.6f} s)" if i < n else ""
        return CheckResult(cfg.name, n, f"step {i}{when}: {col} is {got} with the fast path, {want} stepping one by "
                                        "one; the policy's depends_on misses what its decision reads")
    for ra, rb in zip(fast.requests, slow.requests, strict=False):
        if ra != rb:
            return CheckResult(cfg.name, n, f"request {rb.id}: {ra} with the fast path, {rb} stepping one by one")
    return CheckResult(cfg.name, n, None)
