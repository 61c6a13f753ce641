"""A tournament of 4 policies x 8 loads x 3 seeds (96 runs) on the classes-priority scenario, run serially, on the
local process pool and on a local Ray instance: wall and CPU time of each, the speed-up over serial, and a check
that every executor wrote the very same rows.

    python benchmarks/bench_tournament.py [--requests 400] [--workers 2] [--no-ray] [--json PATH]

Policies: FCFS (continuous), vLLM's priority, shortest-job-first on predicted output length (oracle) and a user's
file (examples/policies/shortest_prompt_first.py). Loads: 0.25x to 2x the scenario's 13.5 requests/s.

CPU time: serial, this process's; the pool, this process's and its workers' (reaped when the pool closes); Ray,
this process's and every process under it (Ray's GCS server, raylet and workers, read with psutil before Ray is
shut down), so Ray's own daemons are counted. Ray is started before the clock (its start is reported apart) and
the tournament finds it running. The load average of the machine is printed before each run: on a shared
machine the figures move with it. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LIMITS = {"max_num_seqs": 32, "enable_chunked_prefill": True, "max_num_batched_tokens": 2048}


def spec_text(requests: int) -> str:
    import yaml

    return yaml.safe_dump({
        "name": "bench-tournament",
        "scenario": str(ROOT / "scenarios" / "classes-priority.yaml"),
        "num_requests": requests,
        "policies": {
            "fcfs": {"type": "continuous", **LIMITS},
            "priority": {"type": "priority", **LIMITS},
            "sjf": {"type": "sjf", **LIMITS},
            "shortest-prompt": {"type": "custom",
                                "cls": f"{ROOT / 'examples' / 'policies' / 'shortest_prompt_first.py'}"
                                       ":ShortestPromptFirst", "max_num_seqs": 32, "max_num_batched_tokens": 2048},
        },
        "loads": {"multiplier": [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]},
        "seeds": [0, 1, 2],
    }, sort_keys=False)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tree_cpu() -> float:
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def compare_rows(a: Path, b: Path) -> str:
    """'identical', or how many cells differ only past the 12th significant digit (a float summed in another
    order), or 'DIFFERENT'."""
    import csv
    import math

    ra, rb = list(csv.DictReader(open(a))), list(csv.DictReader(open(b)))
    if a.read_text() == b.read_text():
        return "identical"
    if len(ra) != len(rb):
        return "DIFFERENT"
    close = 0
    for x, y in zip(ra, rb, strict=True):
        for k in x:
            if x[k] == y[k]:
                continue
            try:
                if math.isclose(float(x[k]), float(y[k]), rel_tol=1e-12):
                    close += 1
                    continue
            except ValueError:
                pass
            return "DIFFERENT"
    return f"equal to 1e-12 ({close} cells differ in the last digits)"


def run(t, out: Path, executor: str, workers: int) -> dict:
    from sim.studies.tournament import run_tournament

    load = os.getloadavg()[0]
    cpu0, kids0, tree0 = time.process_time(), _children_cpu(), _tree_cpu() if executor == "ray" else 0.0
    t0 = time.perf_counter()
    res = run_tournament(t, out, executor=executor, workers=workers, fresh=True)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + _children_cpu() - kids0
    if executor == "ray":
        cpu += _tree_cpu() - tree0
    return {"executor": executor, "workers": workers, "runs": res.ran, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "load_avg_1min_before": round(load, 2),
            "winners": {t.load_label(s.load): s.policy for s in res.standings if s.winner}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()

    from sim.studies.tournament import load_spec

    tmp = Path(tempfile.mkdtemp(prefix="bench-tournament-"))
    spec = tmp / "spec.yaml"
    spec.write_text(spec_text(args.requests))
    t = load_spec(spec)
    print(f"{len(t.policies)} policies x {len(t.loads)} loads x {len(t.spec.seeds)} seeds, {args.requests} requests "
          f"per run; {os.cpu_count()} cores", flush=True)
    results = [run(t, tmp / "serial", "local", 1)]
    print(results[-1], flush=True)
    results.append(run(t, tmp / "local", "local", args.workers))
    print(results[-1], flush=True)
    ray_start = None
    if not args.no_ray:
        try:
            from sim.studies.sweep import _ray_init

            t0 = time.perf_counter()
            ray, _ = _ray_init(args.workers, None)
            ray_start = round(time.perf_counter() - t0, 2)
        except Exception as e:  # noqa: BLE001 - any failure to start Ray is reported, the rest stands
            print(f"Ray did not start here: {e}", flush=True)
        else:
            try:
                results.append(run(t, tmp / "ray", "ray", args.workers))
                results[-1]["ray_start_s"] = ray_start
                print(results[-1], flush=True)
            finally:
                ray.shutdown()
    for r in results[1:]:
        r["same_rows_as_serial"] = compare_rows(tmp / "serial" / "sweep.csv",
                                                tmp / ("ray" if r["executor"] == "ray" else "local") / "sweep.csv")
        r["speedup_wall"] = round(results[0]["wall_s"] / r["wall_s"], 2)
    print(f"{'executor':<10} {'workers':>7} {'wall s':>8} {'CPU s':>8} {'speed-up':>8} {'load avg':>8}  rows")
    for r in results:
        print(f"{r['executor']:<10} {r['workers']:>7} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
              f"{r.get('speedup_wall', 1.0):>8.2f} {r['load_avg_1min_before']:>8.2f}  "
              f"{r.get('same_rows_as_serial', '-')}")
    print("winners (serial):", results[0]["winners"])
    if args.json:
        args.json.write_text(json.dumps({"requests": args.requests, "cores": os.cpu_count(), "results": results},
                                        indent=2) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
