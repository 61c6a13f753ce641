"""The analytic cost model's knobs as `servesim calibrate --from-bench` writes them (calibration/bench_fit.py), read
by ``deployment.cost_model: {type: analytic, profile: PATH}``."""

from __future__ import annotations

import math
from pathlib import Path

from sim.output.benchfiles.common import read_bench_json

KNOBS = ("compute_efficiency", "bandwidth_efficiency", "step_overhead", "per_request_overhead")
PROFILE_KIND = "servesim-analytic-knobs"


def read_knob_profile(path: str | Path) -> dict[str, float]:
    """The knobs of a profile (ValueError naming the file and what is wrong)."""
    p = Path(path)
    data = read_bench_json(p)  # a BenchFileError (ValueError) names the file
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ValueError(f"{p}: kind: not a {PROFILE_KIND} profile (servesim calibrate --from-bench)")
    cm = data.get("cost_model")
    if not isinstance(cm, dict):
        raise ValueError(f"{p}: cost_model: missing or not an object")
    out = {}
    for k in KNOBS:
        v = cm.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{p}: cost_model.{k}: missing or not a non-negative number")
        out[k] = float(v)
    return out


def read_knob_source(path: str | Path) -> tuple[object, object]:
    """(model, gpu) the profile's knobs were fitted on, as the file names them (None where it names none)."""
    data = read_bench_json(Path(path))
    return (data.get("model"), data.get("gpu")) if isinstance(data, dict) else (None, None)
