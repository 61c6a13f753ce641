"""A cluster study of 64 runs (replicas {2,4,8,16} x routers {round_robin, least_outstanding, least_kv,
prefix_affinity} x loads {8,16,32,64} requests/s; examples/studies/cluster-study.yaml) run serially, on the local
process pool and on a local Ray instance: wall and CPU time of each, the speed-up over serial, and a check that
every executor wrote the very same rows.

    python benchmarks/bench_cluster_study.py [--requests 4000] [--workers 2] [--no-ray] [--json PATH]

CPU time and the Ray start are measured as benchmarks/bench_tournament.py measures them (its helpers): the
pool's workers and Ray's daemons and workers are counted, Ray is started before the clock (its start reported
apart) and the sweep finds it running. The 1-minute load average is printed before each executor: on a shared
machine the figures move with the other jobs, and two workers can at best halve the wall time on two cores.
Not part of the test suite.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_tournament, which puts the repository on the path

from bench_tournament import arguments, measured, run_executors, write_json  # noqa: E402

STUDY = HERE.parent / "examples" / "studies" / "cluster-study.yaml"


def run(sc, raw, out: Path, executor: str, workers: int) -> dict:
    from sim.studies.sweep import run_sweep

    res, figures = measured(executor, workers, lambda: run_sweep(sc, raw, out, source=str(STUDY), executor=executor,
                                                                 workers=workers, fresh=True))
    return {**figures, "runs": res.ran}


def main() -> None:
    args = arguments(__doc__, requests=4000)

    from sim.config.scenario import load_scenario, sweep_points

    sc, raw = load_scenario(STUDY, {"workload.num_requests": args.requests})
    assert sc.sweep is not None
    axes = " x ".join(f"{len(v)} {k}" for k, v in sc.sweep.items())
    print(f"{axes} = {len(sweep_points(sc))} runs of {args.requests} requests; {os.cpu_count()} cores", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-study-"))
    try:
        results = run_executors(functools.partial(run, sc, raw), tmp, args.workers, ray=not args.no_ray)
        write_json(args.json, args.requests, results)
    finally:  # a failed run leaves no study folders behind
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
