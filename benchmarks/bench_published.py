"""Published serving figures as benchmark results: calibrate the analytic model's knobs on half the rows of one
engine and GPU, predict the other half, and print the median |error| (issue 14; target: within 10%).

The rows (/work/shared/data/published-dev/published-dev.csv, its README says where each comes from) are offline
throughput runs: every request queued at once, fixed input and output lengths, the engine's batch "max". Each row
becomes one benchmark run of NUM_REQUESTS requests of those lengths on its model, tensor parallelism and dtypes,
compared on output tokens per second. The knobs (compute and bandwidth efficiency, step overhead) are fitted to
the training half together, never one per row; the rows alternate between the halves in file order.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_published.py [--engine PREFIX] [--gpu PREFIX] [--requests N]
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import numpy as np

from calibration.bench_fit import DEFAULTS, fit_knobs, simulate_runs
from sim.benchfiles.common import BenchRun
from sim.scenario import parse_scenario, variant_configs

DATA = Path("/work/shared/data/published-dev/published-dev.csv")
MODELS = {"Llama-3.1-8B": "llama-3.1-8b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3-8B": "llama-3-8b",
          "Llama-2-7B": "llama-2-7b", "Llama-2-70B": "llama-2-70b"}
GPUS = {"H100-SXM-80GB": "h100-sxm", "H200-SXM-141GB": "h200", "A100-SXM4-80GB": "a100-80gb"}


def rows_of(engine: str, gpu: str) -> list[dict[str, str]]:
    with DATA.open() as f:
        return [r for r in csv.DictReader(f) if r["engine"].startswith(engine) and r["gpu"].startswith(gpu)
                and r["metric"] == "output_tok_s_total" and r["model"] in MODELS]


def deployment_of(row: dict[str, str]):
    isl, osl = int(row["input_len"]), int(row["output_len"])
    gpu = next(v for k, v in GPUS.items() if row["gpu"].startswith(k))
    raw = {"name": "published", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                                             "prompt_len": {"type": "fixed", "value": isl},
                                             "output_len": {"type": "fixed", "value": osl}},
           "deployment": {"model": MODELS[row["model"]], "gpu": gpu, "tensor_parallel_size": int(row["tp"]),
                          "weight_dtype": row["weight_dtype"].split()[0], "kv_dtype": row["kv_dtype"].split()[0],
                          "max_model_len": isl + osl}}
    return variant_configs(parse_scenario(raw, "published row"))[0]


def run_of(row: dict[str, str], n: int) -> BenchRun:
    isl, osl = int(row["input_len"]), int(row["output_len"])
    return BenchRun(source=f"{row['model']} tp{row['tp']} {isl}/{osl}", input_lens=[isl] * n, output_lens=[osl] * n,
                    aggregates={"output_throughput": float(row["value"])})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="TensorRT-LLM v0.17")
    ap.add_argument("--gpu", default="H100-SXM-80GB")
    ap.add_argument("--requests", type=int, default=256, help="requests per row (all queued at once)")
    ap.add_argument("--max-iter", type=int, default=4)
    ap.add_argument("--robust", type=float, default=0.1, help="soft-L1 scale of the log errors (0: plain squares)")
    args = ap.parse_args()
    rows = rows_of(args.engine, args.gpu)
    cfgs = [deployment_of(r) for r in rows]
    runs = [run_of(r, args.requests) for r in rows]
    train = list(range(0, len(rows), 2))
    test = list(range(1, len(rows), 2))
    t0 = time.process_time()

    def errors(knobs: dict[str, float], idx: list[int]) -> np.ndarray:
        sims = simulate_runs([cfgs[i] for i in idx], [runs[i] for i in idx], knobs)
        return np.array([s["output_throughput"] / runs[i].aggregates["output_throughput"] - 1
                         for i, s in zip(idx, sims, strict=True)])

    before = errors(DEFAULTS, test)
    knobs, train_err, nfev = fit_knobs([cfgs[i] for i in train], [runs[i] for i in train], max_iter=args.max_iter,
                                       robust=args.robust or None)
    after = errors(knobs, test)
    print(f"{args.engine} on {args.gpu}: {len(rows)} rows, {len(train)} to fit, {len(test)} held out, "
          f"{args.requests} requests per row")
    print("fitted knobs: " + ", ".join(f"{k}={v:.4g}" for k, v in knobs.items()))
    print(f"training median |error| {train_err:.1%} ({nfev} simulations of the training half)")
    print(f"held-out median |error|: default knobs {np.median(np.abs(before)):.1%}, fitted {np.median(np.abs(after)):.1%}")
    for i, e0, e1 in zip(test, before, after, strict=True):
        print(f"  {runs[i].source:28s} measured {runs[i].aggregates['output_throughput']:9.1f} tok/s  "
              f"default {e0:+.1%}  fitted {e1:+.1%}")
    print(f"CPU time {time.process_time() - t0:.1f} s")
    assert math.isfinite(float(np.median(np.abs(after))))


if __name__ == "__main__":
    main()
