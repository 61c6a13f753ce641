"""Speed benchmark of the inputs: drawing a synthetic workload and parsing a real trace.

    python benchmarks/bench_inputs.py [--repeats N]

Times taken out of the test suite (a test that asserts wall-clock speed fails on a loaded machine). Each figure is
the best of N runs, in CPU time of this process (steadier than wall time on a shared VM) with wall time beside it.
Targets, on a 2-core machine:
- 100,000 requests (Poisson arrivals, lognormal prompts, exponential outputs, a shared prefix): under 1.5 s;
- the Azure 2023 conversation trace (19,366 rows, read uncached): under 0.2 s.
Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from sim.workload import traces
from sim.workload.generator import Workload
from sim.workload.traces import TRACE_DIR, TRACES

NUM_REQUESTS = 100_000


def best_of(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best CPU seconds, best wall seconds) over ``repeats`` calls."""
    cpu, wall = float("inf"), float("inf")
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - t0)
    return cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    w = Workload.model_validate({
        "arrival": {"type": "poisson", "rate": 10.0}, "num_requests": NUM_REQUESTS,
        "prompt_len": {"type": "lognormal", "mean": 1000, "std": 800},
        "output_len": {"type": "exponential", "mean": 200, "max": 4096}, "shared_prefix": 64,
    })

    def generate() -> None:
        assert len(w.generate(np.random.default_rng(0))) == NUM_REQUESTS

    path = str(TRACE_DIR / TRACES["azure-conv"])
    rows = [
        ("generate 100,000 requests", best_of(generate, args.repeats), 1.5),
        ("parse azure-conv (19,366 rows)", best_of(lambda: traces._read_azure(path), args.repeats), 0.2),
    ]
    failed = 0
    print(f"{'what':34} {'cpu s':>8} {'wall s':>8} {'target s':>9}")
    for what, (cpu, wall), target in rows:
        ok = cpu < target
        failed += not ok
        print(f"{what:34} {cpu:8.3f} {wall:8.3f} {target:9.2f}  {'ok' if ok else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
