"""Long-run benchmark: the Azure 2023 conversation trace tiled to N requests (one variant, azure-conv's
``chunked``: continuous batching, chunked prefill, 2,048-token steps, Llama-3.1-8B on one H100), the whole of
``servesim run`` (workload, simulation, summary, run folder), with CPU time and peak memory per phase.

    python benchmarks/bench_million.py [--requests N] [--out DIR] [--steps auto|binned|full]

Peak memory is the process's maximum resident set (``resource.getrusage``), read after each phase. Start at
100,000 and 300,000 requests and extrapolate before trying 1,000,000 (run it under ``ulimit -v``). Not part of
the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

from sim.config.scenario import parse_scenario
from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def scenario(n: int) -> dict:
    return {
        "name": "bench-million",
        "seed": 0,
        "workload": {"arrival": {"type": "trace", "trace": "azure-conv", "repeat_to": n}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpu_memory_utilization": 0.9,
                       "max_model_len": 16384, "block_size": 16},
        "kv_cache": {"type": "paged"},
        "slos": {"ttft": 1.0, "tpot": 0.05},
        "policy": {"type": "continuous", "max_num_seqs": 256, "enable_chunked_prefill": True,
                   "max_num_batched_tokens": 2048},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--out", default=None, help="run folder (default: a temporary one, removed after)")
    ap.add_argument("--steps", default="auto", choices=("auto", "binned", "full"))
    args = ap.parse_args()
    rows: list[tuple[str, float, float]] = []
    c = time.process_time()

    def mark(what: str) -> None:
        nonlocal c
        now = time.process_time()
        rows.append((what, now - c, peak_mb()))
        c = now

    mark("import")
    prepared = prepare_scenario(parse_scenario(scenario(args.requests)))
    mark("prepare (workload)")
    run = run_scenario(prepared)
    mark("simulate + summary")
    with tempfile.TemporaryDirectory() as tmp:
        write_scenario_run(run, args.out or tmp, steps=args.steps)
        mark("write run folder")
    (summary,) = run.summaries.values()
    print(f"requests   {summary['num_requests']:>14,}")
    print(f"steps      {summary['num_steps']:>14,}")
    print(f"simulated  {summary['duration']:>14,.0f} s")
    for what, cpu, peak in rows:
        print(f"{what:<20} {cpu:>8.2f} s CPU   peak {peak:>8,.0f} MB")
    print(f"{'total':<20} {sum(r[1] for r in rows):>8.2f} s CPU   peak {peak_mb():>8,.0f} MB")


if __name__ == "__main__":
    main()
