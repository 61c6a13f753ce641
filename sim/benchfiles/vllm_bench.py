"""Reader for `vllm bench serve --save-result` JSON (with or without --save-detailed).

Field facts (vllm/benchmarks/serve.py): aggregates are `<stat>_<metric>_ms` with stat in mean/median/std/pNN and
metric in ttft/tpot/itl/e2el, in milliseconds; the detailed lists `input_lens`, `output_lens`, `ttfts` (seconds) and
`itls` (a list of per-request lists, seconds); deployment hints `model_id`, `request_rate` ("inf" or a number),
`burstiness`, `max_concurrency`, `duration` (seconds). TPOT there already excludes the first token, as servesim's does.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from sim.benchfiles.common import BenchFileError, BenchRun

_AGG = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def read_vllm_bench(path: str | Path) -> BenchRun:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise BenchFileError(f"{p}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise BenchFileError(f"{p}: top level: expected an object")
    run = BenchRun(source=str(p))
    skip = run.skipped.append
    if isinstance(data.get("model_id"), str):
        run.model = data["model_id"]
    rate = data.get("request_rate")
    if rate not in (None, "inf"):
        if _num(rate) is None or float(rate) <= 0:
            skip(f"{p}: request_rate: not a positive number or 'inf'")
        else:
            run.request_rate = float(rate)
    for name in ("burstiness", "duration"):
        if name in data and data[name] is not None:
            v = _num(data[name])
            if v is None or v <= 0:
                skip(f"{p}: {name}: not a positive number")
            elif name == "burstiness":
                run.burstiness = v
            else:
                run.duration_s = v
    mc = data.get("max_concurrency")
    if mc is not None:
        if isinstance(mc, int) and not isinstance(mc, bool) and mc > 0:
            run.max_concurrency = mc
        else:
            skip(f"{p}: max_concurrency: not a positive integer")
    for key, value in data.items():
        m = _AGG.match(key)
        if not m:
            continue
        v = _num(value)
        if v is None or v < 0:
            skip(f"{p}: {key}: not a non-negative number")
        else:
            run.aggregates[f"{m.group(1)}_{m.group(2)}"] = v / 1000.0  # ms -> s
    _read_detailed(p, data, run)
    if not run.aggregates and not run.input_lens:
        raise BenchFileError(f"{p}: no metrics: neither *_ms aggregates nor detailed per-request lists readable")
    return run


def _read_detailed(p: Path, data: dict[str, Any], run: BenchRun) -> None:
    if "input_lens" not in data:
        return  # saved without --save-detailed: aggregates only
    lists: dict[str, list[Any]] = {}
    for name in ("input_lens", "output_lens", "ttfts", "itls"):
        v = data.get(name)
        if not isinstance(v, list):
            run.skipped.append(f"{p}: {name}: missing or not a list; per-request comparison skipped")
            return
        lists[name] = v
    n = len(lists["input_lens"])
    for name, v in lists.items():
        if len(v) != n:
            run.skipped.append(f"{p}: {name}: length {len(v)} != input_lens' {n}; per-request comparison skipped")
            return
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lists["input_lens"]):
        run.skipped.append(f"{p}: input_lens: not all non-negative integers; per-request comparison skipped")
        return
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lists["output_lens"]):
        run.skipped.append(f"{p}: output_lens: not all non-negative integers; per-request comparison skipped")
        return
    ttfts = [_num(x) for x in lists["ttfts"]]
    if any(t is None for t in ttfts):
        run.skipped.append(f"{p}: ttfts: not all numbers; per-request comparison skipped")
        return
    itls: list[list[float]] = []
    for row in lists["itls"]:
        vals = [_num(x) for x in row] if isinstance(row, list) else [None]
        if any(x is None for x in vals):
            run.skipped.append(f"{p}: itls: not all lists of numbers; per-request comparison skipped")
            return
        itls.append([float(x) for x in vals if x is not None])
    run.input_lens = list(lists["input_lens"])
    run.output_lens = list(lists["output_lens"])
    run.ttfts_s = [float(t) for t in ttfts if t is not None]  # already seconds in vllm's file
    run.itls_s = itls
