"""Speed benchmark: the Azure 2023 conversation trace tiled to 100,000 requests (about five hours of traffic at
its real rate, 5.5 req/s), Llama-3.1-8B on one H100 SXM, continuous batching with chunked prefill.

    python benchmarks/bench_azure_conv.py [--requests N] [--profile]

Prints wall time, simulated requests per second of wall time and steps per second. Target: under 20 s on a
2-core machine. Not part of the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import time

from sim.config.scenario import parse_scenario, variant_configs
from sim.loop.run import generate_workload, simulate_variant


def scenario_dict(requests: int) -> dict:
    """The benchmark's scenario (tests/test_pinned_outputs.py pins its summary at a few hundred requests)."""
    return {
        "name": "bench-azure-conv",
        "workload": {"arrival": {"type": "trace", "trace": "azure-conv", "repeat_to": requests}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192},
        "policy": {"type": "continuous", "enable_chunked_prefill": True},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-fast-path", action="store_true", help="step by step, for comparison")
    args = ap.parse_args()
    scenario = parse_scenario(scenario_dict(args.requests))
    c0 = time.process_time()
    t0 = time.perf_counter()
    workload = generate_workload(scenario)
    t1 = time.perf_counter()
    (cfg,) = variant_configs(scenario)
    if args.profile:
        import cProfile
        import pstats

        with cProfile.Profile() as pr:
            result, _, _ = simulate_variant(cfg, workload, fast_path=not args.no_fast_path)
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)
    else:
        result, _, _ = simulate_variant(cfg, workload, fast_path=not args.no_fast_path)
    t2 = time.perf_counter()
    c2 = time.process_time()
    steps = len(result.steps["start"])
    sim_time = result.duration
    print(f"requests          {len(workload.requests):>12,}")
    print(f"workload build    {t1 - t0:>12.2f} s")
    print(f"simulation        {t2 - t1:>12.2f} s wall")
    print(f"total             {t2 - t0:>12.2f} s wall ({c2 - c0:.2f} s CPU)")
    print(f"simulated time    {sim_time:>12.0f} s ({sim_time / (t2 - t1):,.0f}x real time)")
    print(f"requests/s (wall) {len(workload.requests) / (t2 - t1):>12,.0f}")
    print(f"steps             {steps:>12,}")
    print(f"steps/s (wall)    {steps / (t2 - t1):>12,.0f}")
    print(f"mean batch        {result.steps['batch_size'].mean():>12.1f}")


if __name__ == "__main__":
    main()
