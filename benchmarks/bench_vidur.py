"""Vidur's published configuration end to end (scenarios/vidur-arxiv-llama2-70b.yaml): Llama-2-70B TP2 on A100,
Poisson 0.4 req/s, arxiv (prompt, output) pairs, vLLM v0 prefill-first scheduler, 128 sequences, 4,096-token
budget, 20,000 requests.

    python benchmarks/bench_vidur.py [--requests N] [--out DIR]

Prints CPU time (``time.process_time()``) of each phase: loading and generating the workload, simulating, and
writing the default outputs (summary.json, requests.csv, steps.csv, report.html). Target (issue 15): < 2 s in all
on the 2-core machine. Not part of the test suite (timings are not tests).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sim.config.scenario import load_scenario
from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    c0 = time.process_time()
    sc, raw = load_scenario(ROOT / "scenarios/vidur-arxiv-llama2-70b.yaml", {"workload.num_requests": args.requests})
    prepared = prepare_scenario(sc, raw)
    c1 = time.process_time()
    run = run_scenario(prepared)
    c2 = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "run"
        write_scenario_run(run, out)
        c3 = time.process_time()
        sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    steps = sum(len(r.steps["start"]) for r in run.results)
    sim_time = max(r.finish for res in run.results for r in res.requests)
    print(f"{args.requests} requests, {steps} steps, {sim_time:,.0f} s simulated")
    print(f"prepare {c1 - c0:.2f} s  simulate {c2 - c1:.2f} s ({steps / max(c2 - c1, 1e-9):,.0f} steps/s)  "
          f"write {c3 - c2:.2f} s  total {c3 - c0:.2f} s CPU")
    print("  " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
