"""Where the simulator's speed bias against its own CPU engine comes from, step by step (deterministic, no engine run).

    python benchmarks/bench_step_bias.py                                   # the shipped llama-57m profile
    python benchmarks/bench_step_bias.py --profile P.json --write NEW.json  # refit P's samples with today's fit

A profile keeps every step it was fitted on (grid scripts and, for ``--serving-workloads`` profiles, every step of
the engine's serving runs) with its measured time on the engine's clock and, for grid steps, its forward pass
timed apart. For each step class this prints, for the profile's coefficients and for a refit of the very same
samples by ``calibration.fit`` as it is now: the median and the sum of measured / predicted (the sum is what a
run's throughput and latencies add up), and the host's share of the grid steps (step time minus forward pass:
the core's bookkeeping, the policy, input preparation, sampling). ``--write`` saves the refitted profile
(provenance, swap cost, wake-up curve and block count kept), as the shipped profiles were made; the provenance's
``refits`` list gains the command, date, commit and steps of the refit. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibration.fit import (  # noqa: E402
    CLASSES,
    Sample,
    build_profile,
    predict,
    profile_coefficients,
    samples_from_profile,
)


def ratios(coefficients: dict[str, Any], samples: list[Sample]) -> dict[str, tuple[int, float, float]]:
    """Per step class (and all): steps, median and sum-over-sum of measured / predicted."""
    m = np.array([s.duration for s in samples])
    p = predict(coefficients, samples)
    kinds = np.array([s.step_class for s in samples])
    out = {}
    for k in (*CLASSES, "all"):
        i = kinds == k if k != "all" else np.ones(len(samples), dtype=bool)
        if i.any():
            out[k] = (int(i.sum()), float(np.median(m[i] / p[i])), float(m[i].sum() / p[i].sum()))
    return out


def host_share(samples: list[Sample]) -> dict[str, float]:
    """Per step class, the median host share (1 - forward / step) of the steps whose forward pass was timed."""
    out = {}
    for k in CLASSES:
        f = [1 - s.forward / s.duration for s in samples if s.step_class == k and s.forward > 0]
        if f:
            out[k] = float(np.median(f))
    return out


def _commit() -> str | None:
    """The checkout's commit (the fit code that refitted), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def refit(profile: dict[str, Any], command: str = "") -> dict[str, Any]:
    """The profile's samples fitted again by today's ``calibration.fit`` (everything measured apart kept). The
    provenance's ``refits`` list gains how: ``command``, date, commit, and the steps used (the calibration's own,
    measured on ``provenance.date``)."""
    new = build_profile(profile["model"], profile["device"], samples_from_profile(profile),
                        swap_block=profile["coefficients"].get("swap_block", 0.0),
                        wake_curve=[tuple(p) for p in profile.get("wake_curve", [])],
                        num_gpu_blocks=profile.get("num_gpu_blocks"), peak_flops=profile.get("peak_flops", 0.0),
                        provenance=profile.get("provenance", {}))
    if "serving_before" in profile.get("fit", {}):
        new["fit"]["serving_before"] = profile["fit"]["serving_before"]
        new["fit"]["method"] += "; grid and serving steps (engine runs of random workloads) fitted together"
    samples = samples_from_profile(profile)
    serving = sum(s.step_class == "serving" for s in samples)
    record = {"command": command, "date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": _commit(),
              "steps": len(samples), "grid_steps": len(samples) - serving, "serving_steps": serving,
              "measured_on": profile.get("provenance", {}).get("date")}
    new["provenance"]["refits"] = [*new["provenance"].get("refits", []), record]
    return new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, default=ROOT / "calibration" / "profiles" / "llama-57m-cpu.json")
    ap.add_argument("--write", type=Path, help="save the refitted profile here")
    args = ap.parse_args()
    try:
        profile = json.loads(args.profile.read_text())
    except (OSError, ValueError) as e:
        print(f"error: cannot read profile {args.profile}: {e}", file=sys.stderr)
        return 2
    samples = samples_from_profile(profile)
    if not samples:
        print(f"error: profile {args.profile} keeps no samples to analyse", file=sys.stderr)
        return 2
    command = " ".join(["python", "benchmarks/bench_step_bias.py", *sys.argv[1:]])
    new = refit(profile, command)
    before, after = ratios(profile_coefficients(profile), samples), ratios(profile_coefficients(new), samples)
    hosts = host_share(samples)
    print(f"{args.profile.name}: {len(samples)} steps; measured / predicted, median and sum over sum")
    print(f"{'class':<9}{'steps':>7}{'profile med':>13}{'sum':>7}{'refit med':>11}{'sum':>7}{'host share':>12}")
    for k, (n, med, tot) in before.items():
        _, med2, tot2 = after[k]
        h = f"{100 * hosts[k]:.1f}%" if k in hosts else "n/a"
        print(f"{k:<9}{n:>7}{med:>13.3f}{tot:>7.3f}{med2:>11.3f}{tot2:>7.3f}{h:>12}")
    print(f"held-out median |error| (all): profile {100 * profile['fit']['heldout']['all']['median_abs']:.1f}%, "
          f"refit {100 * new['fit']['heldout']['all']['median_abs']:.1f}%")
    if args.write is not None:
        args.write.write_text(json.dumps(new, indent=1) + "\n")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
