"""Speed benchmark of a cluster: the Azure 2023 conversation trace on 16 replicas of Llama-3.1-8B on H100 SXM
behind a KV-aware router (least_kv), continuous batching with chunked prefill.

    python benchmarks/bench_cluster.py [--replicas 16] [--rate-scale 16] [--requests N] [--router least_kv]

``--rate-scale 16`` (the default) sends the trace's arrivals 16 times as fast, so that each of the 16 replicas
sees about the load one replica sees at the trace's own rate; ``--requests`` tiles the trace to that many
requests. Prints the simulated time over the wall time and over the CPU time (the figure to compare on a busy
machine). Targets on a 2-core machine: at least 200x real time; 256 replicas (``--replicas 256 --rate-scale 256``)
at least 20x.
Not part of the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import time

from sim.config.scenario import parse_scenario, variant_configs
from sim.loop.run import generate_workload, simulate_variant
from sim.metrics.summary import summarize


def scenario_dict(requests: int, replicas: int, rate_scale: float, router: str) -> dict:
    """The benchmark's scenario (tests/test_pinned_outputs.py pins its summary at a few hundred requests)."""
    return {
        "name": "bench-cluster",
        "workload": {"arrival": {"type": "trace", "trace": "azure-conv", "repeat_to": requests,
                                 "rate_scale": rate_scale}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192},
        "policy": {"type": "continuous", "enable_chunked_prefill": True},
        "cluster": {"replicas": replicas, "router": router},
    }


def speed(x: float) -> str:
    """A speed-up as 61x, or 2.9x below 10 (whole numbers made 2.7x and 2.9x both read 3x)."""
    return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate-scale", type=float, default=16.0)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--router", default="least_kv")
    args = ap.parse_args()
    scenario = parse_scenario(scenario_dict(args.requests, args.replicas, args.rate_scale, args.router))
    c0 = time.process_time()
    t0 = time.perf_counter()
    workload = generate_workload(scenario)
    t1 = time.perf_counter()
    (cfg,) = variant_configs(scenario)
    result, _, _ = simulate_variant(cfg, workload)
    t2 = time.perf_counter()
    c2 = time.process_time()
    s = summarize(result)
    sim_time = result.duration
    print(f"replicas          {args.replicas:>12} ({args.router})")
    print(f"requests          {len(workload.requests):>12,} (trace rate x {args.rate_scale:g})")
    print(f"workload build    {t1 - t0:>12.2f} s")
    print(f"simulation        {t2 - t1:>12.2f} s wall ({c2 - c0:.2f} s CPU in all)")
    print(f"simulated time    {sim_time:>12.0f} s ({speed(sim_time / (t2 - t1))} real time, "
          f"{speed(sim_time / (c2 - c0))} per CPU second)")
    print(f"steps             {len(result.steps['start']):>12,}")
    print(f"per replica       {s['request_throughput'] / args.replicas:>12.2f} req/s, "
          f"KV usage {100 * s['kv_usage']['mean']:.1f}%, TTFT p99 {1e3 * s['ttft']['p99']:.0f} ms")


if __name__ == "__main__":
    main()
