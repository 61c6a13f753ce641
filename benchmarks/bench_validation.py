"""Fidelity benchmark: the calibrated simulator against the real engine, with the strict targets of issue 4.

    python benchmarks/bench_validation.py                      # calibrate the tiny model now, then validate
    python benchmarks/bench_validation.py --profile calibration/profiles/tiny-cpu.json --repeats 3

Calibrates (unless --profile is given), then replays calibration/scenarios/validate-tiny.yaml (gamma arrivals,
lognormal prompts, exponential outputs: nothing like the calibration grid) on the engine and in the simulator
``--repeats`` times, and prints per variant and metric the real and simulated values and the relative error
(median over the repeats), and whether it meets its target:

    TTFT, TPOT, E2EL p50: |error| < 5%     TTFT, TPOT, E2EL p99: |error| < 10%     output throughput: < 3%

"adj" repeats the error with the simulator's step times scaled by the machine's measured slowdown around the
run (the profile's reference step timed before and after it; see calibration/validate.py). One torch thread, as
the calibration. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibration.fit import build_profile, format_errors  # noqa: E402
from calibration.measure import measure  # noqa: E402
from calibration.validate import validate  # noqa: E402

TARGETS = {**{f"{m}_p50": 0.05 for m in ("ttft", "tpot", "e2el")},
           **{f"{m}_p99": 0.10 for m in ("ttft", "tpot", "e2el")},
           "output_throughput": 0.03}
SHOWN = ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "itl_p50", "itl_p90", "itl_p99",
         "e2el_p50", "e2el_p90", "e2el_p99", "output_throughput", "kv_usage_mean", "kv_usage_max", "num_preemptions")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, help="an existing profile (default: calibrate now)")
    ap.add_argument("--scenario", type=Path, default=ROOT / "calibration" / "scenarios" / "validate-tiny.yaml")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calibration-repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.profile is None:
        t = time.perf_counter()
        m = measure("tiny", device="cpu", repeats=args.calibration_repeats)
        prof = build_profile("tiny", m.provenance["device"], m.samples, swap_block=m.swap_block,
                             wake_curve=m.wake_curve,
                             num_gpu_blocks=m.num_gpu_blocks, provenance=m.provenance)
        path = Path(tempfile.mkdtemp()) / "tiny-cpu.json"
        import json

        path.write_text(json.dumps(prof))
        print(f"calibrated in {time.perf_counter() - t:.1f} s ({len(m.samples)} step shapes)")
        print(format_errors(prof["fit"]["heldout"]))
    else:
        path = args.profile
    runs = []
    for r in range(args.repeats):
        t = time.perf_counter()
        runs.append(validate(args.scenario, path, overrides={"workload.num_requests": args.requests}))
        print(f"validation run {r + 1}/{args.repeats}: {time.perf_counter() - t:.1f} s", flush=True)
    names = [v.name for v in runs[0].variants]
    total = met = 0
    print(f"\n{args.requests} requests per variant; error = median over {args.repeats} runs of (sim - real) / real")
    for i, name in enumerate(names):
        vs = [run.variants[i] for run in runs]
        slow = [v.machine_slowdown for v in vs if v.machine_slowdown is not None]
        print(f"\n{name} ({vs[0].num_gpu_blocks} KV blocks; machine slowdown around the runs: "
              f"{', '.join(f'{s:.2f}' for s in slow) or 'n/a'})")
        print(f"  {'metric':<18}{'real':>11}{'sim':>11}{'error':>9}{'adj':>9}  {'target':<8}")
        for key in SHOWN:
            real = np.median([v.metrics[key]["real"] or 0.0 for v in vs])
            simv = np.median([v.metrics[key]["sim"] or 0.0 for v in vs])
            errs = [v.metrics[key]["rel_error"] for v in vs if v.metrics[key]["rel_error"] is not None]
            adjs = [v.adjusted_metrics[key]["rel_error"] for v in vs
                    if v.adjusted_metrics and v.adjusted_metrics[key]["rel_error"] is not None]
            err = float(np.median(errs)) if errs else float("nan")
            adj = float(np.median(adjs)) if adjs else float("nan")
            scale = 1e3 if key.split("_")[0] in ("ttft", "tpot", "itl", "e2el") else 1.0
            verdict = ""
            if key in TARGETS:
                total += 1
                ok = abs(err) < TARGETS[key]
                met += ok
                verdict = f"{'ok' if ok else 'MISS'} <{100 * TARGETS[key]:.0f}%"
            print(f"  {key:<18}{real * scale:>11.4g}{simv * scale:>11.4g}{100 * err:>+8.1f}%{100 * adj:>+8.1f}%  "
                  f"{verdict}")
    print(f"\ntargets met: {met}/{total} (latencies in ms, throughput in tokens/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
