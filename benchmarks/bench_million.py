"""Long-run benchmark: the Azure 2023 conversation trace tiled to N requests (one variant, azure-conv's
``chunked``: continuous batching, chunked prefill, 2,048-token steps, Llama-3.1-8B on one H100), the whole of
``servesim run`` (workload, simulation, summary, run folder), with CPU time and peak memory per phase.

    python benchmarks/bench_million.py [--requests N] [--out DIR] [--steps auto|binned|full] [--parts]

``--parts`` also prints the CPU time of each part of the write phase: the report's sections, the exports'
figures, and the writing of each file (timers around them, a few microseconds each). Peak memory is the process's maximum resident set (``resource.getrusage``), read after each phase. Start at
100,000 and 300,000 requests and extrapolate before trying 1,000,000 (run it under ``ulimit -v``). Not part of
the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sim.config.scenario import parse_scenario
from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def timed_parts() -> dict[str, float]:
    """Put timers around the write phase's parts (module attributes, looked up when called); their CPU seconds."""
    import sim.output.benchfiles.exports as exports
    import sim.output.report as report
    import sim.output.run_folder as run_folder

    spent: dict[str, float] = defaultdict(float)

    def timer(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            c = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.process_time() - c
        return timed

    def section(b: Callable[..., Any]) -> Callable[..., Any]:
        return timer(f"  report: {b.__name__.strip('_')}", lambda *a, **k: list(b(*a, **k)))

    report.SECTIONS[:] = [section(b) for b in report.SECTIONS]
    report.build_report = timer("report.html: build", report.build_report)
    exports.vllm_bench_writer = timer("vllm-bench figures", exports.vllm_bench_writer)
    exports.openmetrics_text = timer("OpenMetrics text", exports.openmetrics_text)
    write = run_folder.write_atomically

    def write_timed(out: Any, contents: dict[str, Any]) -> None:
        write(out, {name: timer(f"write {name}", (lambda f, t=text: f.write(t)) if isinstance(text, str) else text)
                    for name, text in contents.items()})

    run_folder.write_atomically = write_timed
    return spent


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
    ap.add_argument("--parts", action="store_true", help="also time each part of the write phase")
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
    parts = timed_parts() if args.parts else {}
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
    if parts:
        parts["the rest (the report's import...)"] = rows[-1][1] - sum(v for k, v in parts.items() if k[0] != " ")
    for what, cpu in sorted(parts.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.005:
            print(f"  {what:<40} {cpu:>8.2f} s CPU")


if __name__ == "__main__":
    main()
