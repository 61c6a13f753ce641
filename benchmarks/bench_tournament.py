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
import functools
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


def measured(executor: str, workers: int, work) -> tuple[object, dict]:
    """``work()``'s result and its figures: wall time, CPU time (this process's, the pool's reaped workers', and
    with Ray every process under this one, its daemons included) and the 1-minute load average before it."""
    load = os.getloadavg()[0]
    cpu0, kids0, tree0 = time.process_time(), _children_cpu(), _tree_cpu() if executor == "ray" else 0.0
    t0 = time.perf_counter()
    res = work()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + _children_cpu() - kids0
    if executor == "ray":
        cpu += _tree_cpu() - tree0
    return res, {"executor": executor, "workers": workers, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                 "load_avg_1min_before": round(load, 2)}


def on_ray(workers: int, run_one) -> dict | None:
    """``run_one()``'s figures on a local Ray instance started before its clock (the start's seconds added as
    ``ray_start_s``) and shut down after; None where Ray cannot start here (said on stdout)."""
    try:
        from sim.studies.sweep import _ray_init

        t0 = time.perf_counter()
        ray, _ = _ray_init(workers, None)
    except Exception as e:  # noqa: BLE001 - any failure to start Ray is reported, the rest stands
        print(f"Ray did not start here: {e}", flush=True)
        return None
    ray_start = round(time.perf_counter() - t0, 2)
    try:
        result = {**run_one(), "ray_start_s": ray_start}
    finally:
        ray.shutdown()
    print(result, flush=True)
    return result


def arguments(doc: str | None, *, requests: int) -> argparse.Namespace:
    """A benchmark of the executors' options: requests per run, workers, --no-ray, --json."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--requests", type=int, default=requests, help="requests per run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    return ap.parse_args()


def run_executors(run_one, tmp: Path, workers: int, *, ray: bool = True) -> list[dict]:
    """``run_one(out, executor, workers)``'s figures serially, on the local process pool and on local Ray (each in
    ``tmp/{serial,local,ray}``), printed as they come and then as a table against the serial run."""
    results = [run_one(tmp / "serial", "local", 1)]
    print(results[-1], flush=True)
    results.append(run_one(tmp / "local", "local", workers))
    print(results[-1], flush=True)
    on = on_ray(workers, lambda: run_one(tmp / "ray", "ray", workers)) if ray else None
    results += [on] if on else []
    print_table(results, tmp)
    return results


def write_json(path: Path | None, requests: int, results: list[dict]) -> None:
    if path:
        path.write_text(json.dumps({"requests": requests, "cores": os.cpu_count(), "results": results},
                                   indent=2) + "\n")


def print_table(results: list[dict], tmp: Path) -> None:
    """Each executor's rows (``tmp/{serial,local,ray}/sweep.csv``) against the serial run's and its speed-up,
    then the table of every executor's figures."""
    for r in results[1:]:
        r["same_rows_as_serial"] = compare_rows(tmp / "serial" / "sweep.csv",
                                                tmp / ("ray" if r["executor"] == "ray" else "local") / "sweep.csv")
        r["speedup_wall"] = round(results[0]["wall_s"] / r["wall_s"], 2)
    print(f"{'executor':<10} {'workers':>7} {'wall s':>8} {'CPU s':>8} {'speed-up':>8} {'load avg':>8}  rows")
    for r in results:
        print(f"{r['executor']:<10} {r['workers']:>7} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
              f"{r.get('speedup_wall', 1.0):>8.2f} {r['load_avg_1min_before']:>8.2f}  "
              f"{r.get('same_rows_as_serial', '-')}")


def run(t, out: Path, executor: str, workers: int) -> dict:
    from sim.studies.tournament import run_tournament

    res, figures = measured(executor, workers,
                            lambda: run_tournament(t, out, executor=executor, workers=workers, fresh=True))
    return {**figures, "runs": res.ran,
            "winners": {t.load_label(s.load): [s.policy, *s.ties] for s in res.standings if s.winner}}


def main() -> None:
    args = arguments(__doc__, requests=400)

    from sim.studies.tournament import load_spec

    tmp = Path(tempfile.mkdtemp(prefix="bench-tournament-"))
    spec = tmp / "spec.yaml"
    spec.write_text(spec_text(args.requests))
    t = load_spec(spec)
    print(f"{len(t.policies)} policies x {len(t.loads)} loads x {len(t.spec.seeds)} seeds, {args.requests} requests "
          f"per run; {os.cpu_count()} cores", flush=True)
    results = run_executors(functools.partial(run, t), tmp, args.workers, ray=not args.no_ray)
    print("winners (serial):", results[0]["winners"])
    write_json(args.json, args.requests, results)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
