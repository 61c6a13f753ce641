"""Knobs of the teaching page as a scenario dict, validated and simulated by the very code ``servesim run`` uses.

A knob set is a flat, JSON-able dict (it lives in the browser, in a ``dcc.Store``, so two students never share
one): the values the page shows as controls (``UI_KNOBS``) plus the preset's fixed fields (model, GPU count,
dtypes, length clips, admission, SLOs). :func:`scenario_dict` turns it into the dict a scenario YAML file would
hold; :func:`prepare` validates it with ``parse_scenario`` and ``prepare_scenario``, so a bad value is refused with
the CLI's own message (``sim/config/scenario_messages.py``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from sim.config.scenario import parse_scenario
from sim.config.schema import ScenarioError
from sim.config.yaml_limits import safe_load_limited
from sim.loop.run import PreparedScenario, ScenarioRun, prepare_scenario, run_scenario
from sim.studies.teaching import find_scenario

Knobs = dict[str, Any]

# Requests per page run: enough for the queue and the memory to show their shape, few enough that a redraw of
# two pinned runs stays well under a second (measured in tests/test_teach.py and docs/lessons.md).
TEACH_REQUESTS = 200

SOURCE = "teach"  # where the page's messages say the bad value came from, as the CLI names the file

POLICIES = {
    "static": "naive: static batches",
    "continuous": "continuous batching",
    "chunked": "continuous + chunked prefill",
}
KV_TYPES = {"paged": "paged (blocks on demand)", "contiguous": "contiguous (reserve max_model_len)"}

# The controls of the page, in the order they appear: (knob, label, unit and meaning).
UI_KNOBS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("batch_size", "batch_size (static: requests per batch)"),
    ("max_wait", "max_wait (static: s the oldest waits for a full batch)"),
    ("max_num_seqs", "max_num_seqs (continuous: requests per step)"),
    ("gpu", "GPU"),
    ("gpu_memory_utilization", "gpu_memory_utilization (share of GPU memory)"),
    ("kv", "KV cache"),
    ("block_size", "block_size (tokens per KV block)"),
    ("rate", "arrival rate (requests/s)"),
    ("burstiness", "burstiness (cv of gaps; 1 = Poisson)"),
    ("prompt_mean", "prompt length mean (tokens)"),
    ("prompt_spread", "prompt length spread (std / mean)"),
    ("output_mean", "output length mean (tokens)"),
    ("output_spread", "output length spread (std / mean)"),
)
UI_KEYS = tuple(k for k, _ in UI_KNOBS)

# The lesson scenarios (those tests/test_lessons.py checks, and the first lesson), one preset per variant.
LESSONS = ("lesson-continuous-batching", "naive-vs-continuous", "lesson-paged-memory", "lesson-memory-bound")


def _merged(raw: dict[str, Any], variant: dict[str, Any] | None) -> dict[str, Any]:
    v = variant or {}
    dep = {**(raw.get("deployment") or {}), **(v.get("deployment") or {})}
    return {
        "deployment": dep,
        "policy": v.get("policy") or raw.get("policy") or {"type": "continuous"},
        "kv_cache": v.get("kv_cache") or raw.get("kv_cache") or {"type": "paged"},
        "admission": v.get("admission") or raw.get("admission") or {},
    }


def _length_knobs(dist: dict[str, Any]) -> tuple[float, float, int, int | None]:
    """(mean, spread = std/mean, min, max) of a length distribution of a scenario file."""
    kind = dist.get("type")
    lo, hi = int(dist.get("min", 1)), dist.get("max")
    if kind == "fixed":
        return float(dist["value"]), 0.0, 1, None
    if kind == "uniform":
        a, b = float(dist["low"]), float(dist["high"])
        mean = (a + b) / 2
        return mean, (b - a) / math.sqrt(12) / mean, int(a), int(b)
    if kind == "exponential":
        return float(dist["mean"]), 1.0, lo, hi
    if kind in ("lognormal", "normal"):
        return float(dist["mean"]), float(dist["std"]) / float(dist["mean"]), lo, hi
    raise ValueError(f"a teaching preset needs a parametric length distribution, got {kind!r}")


def knobs_from_scenario(raw: dict[str, Any], variant: str | None = None) -> Knobs:
    """The knob set of one variant of a scenario dict (the first variant when none is named)."""
    variants = raw.get("variants") or []
    chosen = next((v for v in variants if v.get("name") == variant), variants[0] if variants else None)
    if variant is not None and (chosen is None or chosen.get("name") != variant):
        raise KeyError(f"no variant {variant!r} in scenario {raw.get('name')!r}")
    m = _merged(raw, chosen)
    dep, pol, kv = m["deployment"], m["policy"], m["kv_cache"]
    wl = raw["workload"]
    arrival = wl["arrival"]
    p_mean, p_spread, p_min, p_max = _length_knobs(wl["prompt_len"])
    o_mean, o_spread, o_min, o_max = _length_knobs(wl["output_len"])
    ptype = pol.get("type", "continuous")
    if ptype == "continuous" and pol.get("enable_chunked_prefill"):
        ptype = "chunked"
    return {
        "name": f"{raw.get('name', 'scenario')}/{chosen['name']}" if chosen else str(raw.get("name", "scenario")),
        "seed": int(raw.get("seed", 0)),
        "policy": ptype,
        "batch_size": int(pol.get("batch_size", 16)),
        "max_wait": float(pol.get("max_wait", 0.5)),
        "max_num_seqs": int(pol.get("max_num_seqs", 256)),
        "max_num_batched_tokens": pol.get("max_num_batched_tokens"),
        "preemption_mode": pol.get("preemption_mode", "recompute"),
        "gpu": dep.get("gpu", "h100-sxm"),
        "model": dep.get("model", "llama-3.1-8b"),
        "tensor_parallel_size": int(dep.get("tensor_parallel_size", 1)),
        "weight_dtype": dep.get("weight_dtype", "bf16"),
        "kv_dtype": dep.get("kv_dtype", "auto"),
        "max_model_len": dep.get("max_model_len"),
        "gpu_memory_utilization": float(dep.get("gpu_memory_utilization", 0.9)),
        "kv": kv.get("type", "paged"),
        "block_size": int(dep.get("block_size", 16)),
        "rate": float(arrival["rate"]),
        "burstiness": float(arrival.get("cv", 1.0)) if arrival.get("type") == "gamma" else 1.0,
        "prompt_mean": p_mean,
        "prompt_spread": round(p_spread, 3),
        "prompt_min": p_min,
        "prompt_max": p_max,
        "output_mean": o_mean,
        "output_spread": round(o_spread, 3),
        "output_min": o_min,
        "output_max": o_max,
        "admission": m["admission"],
        "slos": raw.get("slos"),
    }


def preset_names() -> list[str]:
    """``scenario/variant`` of every lesson preset, in lesson order."""
    out = []
    for stem in LESSONS:
        raw = _read(stem)
        out += [f"{stem}/{v['name']}" for v in raw.get("variants") or []]
    return out


def _read(stem: str) -> dict[str, Any]:
    raw = safe_load_limited(find_scenario(stem).read_text())
    assert isinstance(raw, dict), stem
    return raw


def preset(name: str) -> Knobs:
    """The knob set of a lesson preset, ``scenario/variant`` (e.g. ``lesson-continuous-batching/naive``)."""
    stem, _, variant = name.partition("/")
    if stem not in LESSONS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return knobs_from_scenario(_read(stem), variant or None)


DEFAULT_PRESET = "lesson-continuous-batching/naive"


def _length(mean: Any, spread: Any, lo: int, hi: int | None) -> dict[str, Any]:
    # spread 0: every request the same length (a lognormal needs std > 0); else lognormal with std = spread x mean,
    # so the mean knob keeps its meaning while the spread moves. A value the schema refuses is passed on as it is,
    # for the schema's own message.
    if isinstance(spread, (int, float)) and spread == 0:
        value = round(mean) if isinstance(mean, (int, float)) and math.isfinite(mean) else mean
        return {"type": "fixed", "value": value}
    std = spread * mean if isinstance(spread, (int, float)) and isinstance(mean, (int, float)) else spread
    out: dict[str, Any] = {"type": "lognormal", "mean": mean, "std": std, "min": lo}
    if hi is not None:
        out["max"] = hi
    return out


def scenario_dict(knobs: Knobs, num_requests: int = TEACH_REQUESTS) -> dict[str, Any]:
    """The scenario dict (what a YAML file would hold) of one knob set: one variant, named after the knob set."""
    k = knobs
    rate, cv = k["rate"], k["burstiness"]
    if isinstance(cv, (int, float)) and cv == 1:
        arrival: dict[str, Any] = {"type": "poisson", "rate": rate}
    else:
        arrival = {"type": "gamma", "rate": rate, "cv": cv}
    if k["policy"] == "static":
        policy: dict[str, Any] = {"type": "static", "batch_size": k["batch_size"], "max_wait": k["max_wait"]}
    else:
        policy = {"type": "continuous", "max_num_seqs": k["max_num_seqs"],
                  "enable_chunked_prefill": k["policy"] == "chunked"}
        if k.get("max_num_batched_tokens") is not None:
            policy["max_num_batched_tokens"] = k["max_num_batched_tokens"]
    policy["preemption_mode"] = k.get("preemption_mode", "recompute")
    kv: dict[str, Any] = {"type": k["kv"]}
    if k["kv"] == "contiguous":
        kv["reserve"] = "max_model_len"
    deployment = {
        "model": k["model"],
        "gpu": k["gpu"],
        "tensor_parallel_size": k["tensor_parallel_size"],
        "weight_dtype": k["weight_dtype"],
        "kv_dtype": k["kv_dtype"],
        "gpu_memory_utilization": k["gpu_memory_utilization"],
        "block_size": k["block_size"],
    }
    if k.get("max_model_len") is not None:
        deployment["max_model_len"] = k["max_model_len"]
    raw: dict[str, Any] = {
        "name": "teach",
        "seed": k.get("seed", 0),
        "workload": {
            "arrival": arrival,
            "num_requests": num_requests,
            "prompt_len": _length(k["prompt_mean"], k["prompt_spread"], k["prompt_min"], k["prompt_max"]),
            "output_len": _length(k["output_mean"], k["output_spread"], k["output_min"], k["output_max"]),
        },
        "deployment": deployment,
        "policy": policy,
        "kv_cache": kv,
        "variants": [{"name": str(k.get("label") or k["policy"])}],
    }
    if k.get("admission"):
        raw["admission"] = copy.deepcopy(k["admission"])
    if k.get("slos"):
        raw["slos"] = copy.deepcopy(k["slos"])
    return raw


def prepare(knobs: Knobs, num_requests: int = TEACH_REQUESTS) -> PreparedScenario:
    """Validate a knob set exactly as ``servesim run`` validates a file; raises ScenarioError with its message."""
    missing = [key for key in UI_KEYS if knobs.get(key) is None]
    if missing:
        # an emptied number box or one the browser could not read as a number (dcc.Input gives None)
        raise ScenarioError(f"{SOURCE}: {', '.join(missing)}: a value is required")
    raw = scenario_dict(knobs, num_requests)
    scenario = parse_scenario(raw, source=SOURCE)
    return prepare_scenario(scenario, raw, source=SOURCE)


def simulate(knobs: Knobs, num_requests: int = TEACH_REQUESTS) -> ScenarioRun:
    """Validate and simulate one knob set (raises ScenarioError on a bad value)."""
    import numpy as np

    prepared = prepare(knobs, num_requests)
    with np.errstate(all="ignore"):  # a metric with no data is NaN on purpose, as in the CLI
        return run_scenario(prepared)
