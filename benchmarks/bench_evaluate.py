"""Speed benchmark: servesim.evaluate() of a user's policy (a servesim.QueuePolicy subclass given as source text)
on a 1,000-request chat scenario, as a policy-search loop calls it.

    python benchmarks/bench_evaluate.py [--evals N] [--requests N] [--profile]
    python benchmarks/bench_evaluate.py --against OTHER_CHECKOUT [--evals N]

The scenario: Poisson chat at 16 requests/s (prompts ~600 tokens, answers ~250) to Llama-3.1-8B on one H100,
the chat traffic of scenarios/plan-chat.yaml, with its SLOs. Prints evaluations per CPU second, the CPU of this
process and of its workers together (best of --evals after one warm-up, which also draws the workload): the
source text in the default worker (the kept one, sim/studies/eval_worker.py, which reports its own CPU time),
in-process (``isolate=False``), and the same policy as an object (a worker forked for each call), and what the
worker costs. ``--profile``
shows where an evaluation's time goes (cProfile of the in-process runs). Target (issue 37): at least 10
evaluations per CPU second on the 2-core machine. Not part of the test suite (timings are not tests).

``--against`` compares this checkout with another (the code before a change, say) on a shared machine: one kept
process per checkout, each evaluating in the default worker, asked in turn one evaluation at a time (ABBA...), so
both see the same minutes of load; prints each one's best and median and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time

from sim.studies.eval_worker import KEPT
from sim.studies.evaluate import WorkloadCache, evaluate, policy_from_source

POLICY = '''
import servesim


class ShortestPromptFirst(servesim.QueuePolicy):
    def rank(self, req):
        return (req.prompt_len, req.arrival, req.id)
'''


def scenario(n: int) -> dict:
    return {
        "name": "bench-evaluate",
        "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": 16.0}, "num_requests": n,
                     "prompt_len": {"type": "lognormal", "mean": 600, "std": 500, "min": 16, "max": 3072},
                     "output_len": {"type": "exponential", "mean": 250, "min": 1, "max": 1024}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096},
        "slos": {"ttft": 0.5, "tpot": 0.03},
    }


def cpu() -> float:
    """CPU seconds of this process and of its workers: those already waited for, and the kept worker's (as of its
    last reply)."""
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime + KEPT.cpu_seconds()


def serve(n: int) -> None:
    """--serve: one evaluation (default worker) per line read, its CPU milliseconds printed (for --against)."""
    sc, cache = scenario(n), WorkloadCache()
    first = evaluate(POLICY, sc, cache=cache)
    assert first.ok, first.error
    print("ready", flush=True)
    for _ in sys.stdin:
        c0 = cpu()
        s = evaluate(POLICY, sc, cache=cache)
        print(f"{(cpu() - c0) * 1e3:.3f}", flush=True)
        assert s.summaries == first.summaries


def against(other: str, evals: int, n: int) -> None:
    """This checkout and ``other``, one evaluation each in turn (ABBA...)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this checkout": here, other: os.path.abspath(other)}
    procs = {}
    for name, root in trees.items():
        # this script in both, each importing its own checkout's sim (PYTHONPATH: the script's folder holds none)
        procs[name] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", "--requests", str(n)],
            cwd=root, env=dict(os.environ, PYTHONPATH=root), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for p in procs.values():
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    times: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for i in range(evals):
        for name in names if i % 2 == 0 else names[::-1]:
            p = procs[name]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            times[name].append(float(p.stdout.readline()))
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    for name, t in times.items():
        print(f"{name}: best {min(t):6.1f} ms CPU, median {statistics.median(t):6.1f} ms over {len(t)}: "
              f"{1e3 / statistics.median(t):5.2f} evaluations per CPU second by the median, {1e3 / min(t):5.2f} best")
    ratios = [a / b for a, b in zip(times[names[0]], times[names[1]], strict=True)]
    print(f"this checkout / {other}, per pair: median {statistics.median(ratios):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=10, help="timed evaluations per mode")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--profile", action="store_true", help="show where the time of an evaluation goes")
    ap.add_argument("--against", metavar="CHECKOUT", help="alternate single evaluations with another checkout")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.requests)
    if args.against:
        if not os.path.isfile(os.path.join(args.against, "sim", "studies", "evaluate.py")):
            ap.error(f"--against: {args.against} is not a servesim checkout with evaluate()")
        return against(args.against, args.evals, args.requests)
    sc = scenario(args.requests)
    cache = WorkloadCache()
    first = evaluate(POLICY, sc, cache=cache)
    assert first.ok, first.error
    print(f"{args.requests} requests: goodput {first.goodput:.2f} req/s, TTFT p99 {first.ttft_p99:.3f} s, "
          f"{first.summaries[0]['num_steps']:,} steps; workloads drawn: {cache.generated}")
    per: dict[str, float] = {}
    obj = policy_from_source(POLICY)()
    for name, policy, isolate in (("worker (default)", POLICY, True), ("in-process", POLICY, False),
                                  ("object, forked", obj, True)):
        times = []
        for _ in range(args.evals):
            c0 = cpu()
            s = evaluate(policy, sc, cache=cache, isolate=isolate)
            times.append(cpu() - c0)
            assert s.summaries == first.summaries
        per[name] = min(times)
        print(f"{name:<18} best {min(times) * 1e3:6.1f} ms CPU, median {sorted(times)[len(times) // 2] * 1e3:6.1f} ms:"
              f" {1 / min(times):5.2f} evaluations per CPU second (target >= 10)", flush=True)
    assert cache.generated == 1
    w, p = per["worker (default)"], per["in-process"]
    print(f"the worker costs {(w - p) * 1e3:+.1f} ms CPU per evaluation ({(w - p) / p:+.1%})")
    if args.profile:
        prof = cProfile.Profile()
        t0 = time.process_time()
        prof.enable()
        for _ in range(3):
            evaluate(POLICY, sc, cache=cache, isolate=False)
        prof.disable()
        print(f"\nprofile of 3 in-process evaluations ({time.process_time() - t0:.2f} s CPU with the profiler):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
