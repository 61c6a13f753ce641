"""Fidelity over a family of unseen workloads: the calibrated simulator against the engine, per CPU model.

    python benchmarks/bench_fidelity.py                                  # tiny and llama-57m, 20 workloads each
    python benchmarks/bench_fidelity.py --models tiny --workloads 5 --no-hog
    python benchmarks/bench_fidelity.py --compare-profile tiny=/tmp/tiny-grid.json   # before/after a refit

For each model: the shipped profile (calibration/profiles/MODEL-cpu.json, or --profile MODEL=PATH), the first
--workloads workloads of the validation family (calibration/workloads.py, seed 0: Poisson, gamma and on/off
arrivals; lognormal, exponential, heavy-tailed and long-prompt lengths; static, continuous and chunked policies;
ample caches and caches that preempt by recompute or by swap; shared prefixes), each run on the engine (virtual
clock: a step lasts the serving thread's CPU time, or, for a profile measured on the reference clock, that time at
the profile's reference speed: ``realengine.clock``) and in the simulator. Printed per metric: the median and the
p90 across workloads of |relative error| against the targets

    TTFT, TPOT, E2EL p50: median < 5%, p90 < 10%     p99: median < 10%, p90 < 20%
    output throughput (saturated workloads only): median < 3%, p90 < 6%

and the worst workloads. By default a CPU-bound process (``python3 -c 'while 1: pass'``) runs beside the whole
benchmark, as the targets require (--no-hog: without). ``--compare-profile MODEL=PATH`` re-simulates every
workload with another profile (the engine's runs are kept), e.g. a grid-only fit, for a before/after table.
``--out DIR`` writes fidelity-MODEL.json with every workload's errors. Each workload's line also gives ``steps
xR``: the engine's step times over what the profile predicts for the very same step shapes (sum over sum; ``dec``
the median over decode-only steps), which tells a remainder in the step times (the clock, the machine's speed,
the cost model) from one in what the simulator does with them (scheduling, queueing). Not part of the test
suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibration.fidelity import (  # noqa: E402
    LATENCY_METRICS,
    THROUGHPUT_METRIC,
    VALIDATION_SEED,
    WorkloadRun,
    error_table,
    format_table,
    make_probe,
    resimulate,
    run_family,
)
from calibration.fit import predict, profile_coefficients  # noqa: E402
from calibration.validate import profile_clock  # noqa: E402
from calibration.workloads import family  # noqa: E402


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, _, v = item.partition("=")
        if not v:
            raise SystemExit(f"expected MODEL=PATH, got {item!r}")
        out[k] = v
    return out


def _errors_of(run: WorkloadRun, metrics: dict) -> dict[str, float | None]:
    out: dict[str, float | None] = {k: metrics[k]["rel_error"] for k in LATENCY_METRICS}
    out[THROUGHPUT_METRIC] = metrics[THROUGHPUT_METRIC]["rel_error"] if run.workload.saturated else None
    return out


def _recorded(path: str) -> str:
    """A profile path as the results record it: relative to the repository root when inside it (the JSON files are
    committed, and an absolute path names one machine), else as given."""
    p = Path(path).resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else path


def step_ratios(run: WorkloadRun, coefficients: dict) -> tuple[float, float | None]:
    """The engine's step times over the profile's predictions for the same shapes: summed over every step, and
    the median over decode-only steps (None when there are none)."""
    measured = np.array([s.duration for s in run.samples])
    predicted = predict(coefficients, run.samples)
    decode = np.array([s.num_decode_seqs == s.num_seqs for s in run.samples])
    ratio = measured / predicted
    return float(measured.sum() / predicted.sum()), (float(np.median(ratio[decode])) if decode.any() else None)


def _fmt(e: float | None) -> str:
    return "    n/a" if e is None else f"{100 * e:+6.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "llama-57m"])
    ap.add_argument("--workloads", type=int, default=20)
    ap.add_argument("--seed", type=int, default=VALIDATION_SEED)
    ap.add_argument("--profile", nargs="*", default=[],
                    help="MODEL=PATH (default: calibration/profiles/MODEL-cpu.json)")
    ap.add_argument("--compare-profile", nargs="*", default=[], help="MODEL=PATH: re-simulate with it too")
    ap.add_argument("--no-hog", action="store_true", help="no CPU-bound process beside the benchmark")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    profiles = _pairs(args.profile)
    compare = _pairs(args.compare_profile)
    hog = None
    if not args.no_hog:
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        print(f"CPU hog running beside the benchmark (pid {hog.pid}); load average {os.getloadavg()[0]:.2f}")
    try:
        for model in args.models:
            path = profiles.get(model, str(ROOT / "calibration" / "profiles" / f"{model}-cpu.json"))
            t0 = time.perf_counter()
            wls = family(args.workloads, model, args.seed)
            with open(path) as f:
                coefficients = profile_coefficients(json.load(f))

            def done(run: WorkloadRun, t0: float = t0, coefficients: dict = coefficients) -> None:
                e = run.errors()
                sl = "n/a" if run.slowdown is None else f"{run.slowdown:.2f}"
                total, dec = step_ratios(run, coefficients)
                print(f"  {run.workload.name:<52} rho {run.workload.rho:4.2f} "
                      f"ttft50 {_fmt(e['ttft_p50'])} tpot50 {_fmt(e['tpot_p50'])} e2el50 {_fmt(e['e2el_p50'])} "
                      f"thr {_fmt(e[THROUGHPUT_METRIC])}  machine x{sl}  steps x{total:.3f} dec "
                      f"{'n/a' if dec is None else f'x{dec:.3f}'}  ({time.perf_counter() - t0:.0f} s)", flush=True)

            shown = _recorded(path)
            cpu_clock, reference = profile_clock(path)  # the engine reads its steps on the profile's clock
            print(f"\n{model}: {len(wls)} workloads, profile {shown}, engine step clock {cpu_clock}", flush=True)
            probe = make_probe(path)
            runs = run_family(wls, path, model=model, on_done=done, probe=probe)
            table = error_table([r.errors() for r in runs])
            sat = sum(r.workload.saturated for r in runs)
            print(format_table(table, f"\n{model}: |relative error| across {len(runs)} workloads ({sat} saturated), "
                                      f"profile {shown}"))
            adjusted = error_table([r.errors(adjusted=True) for r in runs]) if probe is not None else None
            if adjusted is not None:
                slow = [r.slowdown for r in runs if r.slowdown is not None]
                print(format_table(adjusted, f"\n{model}: the same, simulator scaled by the machine's slowdown "
                                             f"around each run (x{min(slow):.2f} to x{max(slow):.2f})"))
            doc = {"model": model, "profile": shown, "cpu_clock": cpu_clock, "reference_seconds": reference,
                   "seed": args.seed, "table": table, "adjusted_table": adjusted,
                   "seconds": time.perf_counter() - t0,
                   "load_average_end": os.getloadavg()[0], "hog": hog is not None,
                   "workloads": [{"name": r.workload.name, "rho": r.workload.rho, "rate": r.rate,
                                  "saturated": r.workload.saturated, "errors": r.errors(),
                                  "adjusted_errors": r.errors(adjusted=True), "machine_slowdown": r.slowdown,
                                  "step_ratios": step_ratios(r, coefficients),
                                  "real_steps": int(r.validation.real.steps["duration"].size)} for r in runs]}
            if model in compare:
                other = [_errors_of(r, resimulate(r, compare[model], model=model)) for r in runs]
                t2 = error_table(other)
                print(format_table(t2, f"\n{model}: the same engine runs, simulated with "
                                       f"{_recorded(compare[model])}"))
                doc["compare"] = {"profile": _recorded(compare[model]), "table": t2, "errors": other}
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"fidelity-{model}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
