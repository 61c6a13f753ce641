"""Reader for `vllm bench serve --save-result` JSON (with or without --save-detailed).

Field facts (vllm/benchmarks/serve.py): aggregates are `<stat>_<metric>_ms` with stat in mean/median/std/pNN and
metric in ttft/tpot/itl/e2el, in milliseconds (pNN also p99.9); throughputs `request_throughput`,
`output_throughput`, `total_token_throughput`; the detailed lists (one entry per request sent, failed ones too, with
output 0 and a non-empty `errors` entry) `input_lens`, `output_lens`, `ttfts`, `itls` (per-request lists, not read:
the ITL figures are the aggregates; with `generated_texts` they are most of the file), and in
current versions `latencies` and `start_times` (perf_counter seconds, when each request was sent), all in seconds;
deployment hints `model_id`, `request_rate` ("inf" or a number), `burstiness`, `max_concurrency`, `duration`
(seconds), and with --ramp-up-strategy `ramp_up_strategy`, `ramp_up_start_rps`, `ramp_up_end_rps` (requests/s).
TPOT there already excludes the first token, as servesim's does. Saved without --save-detailed, the file holds no
per-request lists: the workload is rebuilt from `completed` requests of the mean lengths (`total_input_tokens` and
`total_output_tokens` over `completed`). The metrics it holds that are not compared (`UNCOMPARED`) are named in the
report with the reason, never dropped silently.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from sim.config.limits import MAX_REQUESTS, too_many_requests
from sim.output.benchfiles.common import BenchFileError, BenchRun, read_bench_json

_AGG = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
THROUGHPUT_FIELDS = ("request_throughput", "output_throughput", "total_token_throughput")
# metrics of vLLM's result that have no simulated counterpart, and why (null when vLLM did not measure them)
UNCOMPARED = {
    "request_goodput": "not compared: the file does not record the --goodput SLOs it counts against",
    # the key as benchmarks/benchmark_serving.py wrote it for many releases, colon included
    "request_goodput:": "not compared: the file does not record the --goodput SLOs it counts against",
    "max_output_tokens_per_s": "not compared: the peak output tokens in one second has no simulated counterpart",
    "max_concurrent_requests": "not compared: the peak of requests in flight has no simulated counterpart",
}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def read_vllm_bench(path: str | Path, data: Any = None) -> BenchRun:
    """``data``: the file's JSON value, where the caller read it already."""
    p = Path(path)
    if data is None:
        data = read_bench_json(p)
    if not isinstance(data, dict):
        raise BenchFileError(f"{p}: top level: expected an object")
    run = BenchRun(source=str(p))
    skip = run.skipped.append
    if isinstance(data.get("model_id"), str):
        run.model = data["model_id"]
    rate = data.get("request_rate")
    run.request_rate_absent = rate is None  # no key, or null: no more a rate of inf than a missing key is
    if rate not in (None, "inf"):
        if _num(rate) is None or float(rate) <= 0:
            skip(f"{p}: request_rate: not a positive number or 'inf'")
        else:
            run.request_rate = float(rate)
    for name in ("burstiness", "duration"):
        if name in data and data[name] is not None:
            # --burstiness inf (evenly spaced sends): json.dump writes Infinity, servesim's export "inf"
            v = math.inf if name == "burstiness" and data[name] in ("inf", math.inf) else _num(data[name])
            if v is None or v <= 0:
                skip(f"{p}: {name}: not a positive number")
            elif name == "burstiness":
                run.burstiness = v
            else:
                run.duration_s = v
    strategy = data.get("ramp_up_strategy")
    if strategy is not None:  # request_rate is then "inf": the ramp, not it, paced the sends
        lo, hi = _num(data.get("ramp_up_start_rps")), _num(data.get("ramp_up_end_rps"))
        if strategy in ("linear", "exponential") and lo is not None and hi is not None and lo > 0 and hi > 0:
            run.ramp_up = (strategy, lo, hi)
        else:
            skip(f"{p}: ramp_up_strategy: {strategy!r} from ramp_up_start_rps {data.get('ramp_up_start_rps')!r} to "
                 f"ramp_up_end_rps {data.get('ramp_up_end_rps')!r}: not a linear or exponential ramp between "
                 "positive rates; not used")
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
    for key in THROUGHPUT_FIELDS:
        if key in data:
            v = _num(data[key])
            if v is None or v < 0:
                skip(f"{p}: {key}: not a non-negative number")
            else:
                run.aggregates[key] = v
    for key, why in UNCOMPARED.items():
        if data.get(key) is not None:
            skip(f"{p}: {key}: {why}")
    _read_detailed(p, data, run)
    if "input_lens" not in data:
        _mean_lengths(p, data, run)
    if not run.aggregates and not run.input_lens:  # say which fields were there and why none could be read
        unread = [w for s in run.skipped if (w := s.removeprefix(f"{p}: ")).split(":", 1)[0] not in UNCOMPARED]
        raise BenchFileError(f"{p}: no metrics: neither *_ms aggregates nor detailed per-request lists readable"
                             + (f" ({'; '.join(unread)})" if unread else ""))
    return run


def _mean_lengths(p: Path, data: dict[str, Any], run: BenchRun) -> None:
    """A file saved without --save-detailed: its ``completed`` requests, each of the mean lengths, as length
    statistics without a spread (``rebuild_workload`` says so in a note)."""
    done = data.get("completed")
    tin, tout = _num(data.get("total_input_tokens")), _num(data.get("total_output_tokens"))
    if not (isinstance(done, int) and not isinstance(done, bool) and done >= 1) or tin is None or tout is None:
        run.skipped.append(f"{p}: input_lens: absent (saved without --save-detailed), and completed, "
                           "total_input_tokens and total_output_tokens not all there: the lengths are unknown")
        return
    if tin < done or tout < done:
        run.skipped.append(f"{p}: total_input_tokens, total_output_tokens: under one token a request "
                           f"({tin:g} and {tout:g} over {done} completed): the lengths are unknown")
        return
    if done > MAX_REQUESTS:  # drawn and simulated: hours, then memory
        raise BenchFileError(f"{p}: completed: {too_many_requests(done)}")
    run.num_requests = done
    run.input_len_stats = {"avg": tin / done}
    run.output_len_stats = {"avg": tout / done}


def _ints(v: list[Any]) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _read_detailed(p: Path, data: dict[str, Any], run: BenchRun) -> None:
    if "input_lens" not in data:
        return  # saved without --save-detailed: aggregates only
    lists: dict[str, list[Any]] = {}
    for name in ("input_lens", "output_lens", "ttfts"):
        v = data.get(name)
        if not isinstance(v, list):
            run.skipped.append(f"{p}: {name}: missing or not a list; per-request comparison skipped")
            return
        lists[name] = v
    n = len(lists["input_lens"])
    optional = {}
    for name in ("latencies", "start_times", "errors"):  # (itls: never read, common._UNREAD)
        v = data.get(name)
        if v is None:
            continue
        if not isinstance(v, list) or len(v) != n:
            run.skipped.append(f"{p}: {name}: not a list of {n} entries (one per request); not used")
        else:
            optional[name] = v
    declared = data.get("num_prompts")
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != n:
        # vLLM writes one entry per prompt sent, failed ones included: another count is an edited or merged file
        run.skipped.append(f"{p}: num_prompts: {declared}, but input_lens holds {n} requests; the lists are used")
    for name, v in lists.items():
        if len(v) != n:
            run.skipped.append(f"{p}: {name}: length {len(v)} != input_lens' {n}; per-request comparison skipped")
            return
    for name in ("input_lens", "output_lens"):
        if not _ints(lists[name]):
            run.skipped.append(f"{p}: {name}: not all non-negative integers; per-request comparison skipped")
            return
    ttfts = [_num(x) for x in lists["ttfts"]]
    if any(t is None or t < 0 for t in ttfts):  # a negative TTFT cannot be measured: a corrupt list
        run.skipped.append(f"{p}: ttfts: not all non-negative numbers; per-request comparison skipped")
        return
    # a request failed when its errors entry is non-empty (vLLM writes "" for a success) or it produced nothing
    errors = optional.get("errors", [""] * n)
    ok = [not e and out > 0 for e, out in zip(errors, lists["output_lens"], strict=True)]
    run.num_failed = n - sum(ok)

    def floats(name: str) -> list[float] | None:
        if name not in optional:
            return None
        vals = [_num(x) for x, good in zip(optional[name], ok, strict=True) if good]
        if any(x is None for x in vals):
            run.skipped.append(f"{p}: {name}: not all numbers; not used")
            return None
        return [float(x) for x in vals if x is not None]

    starts = floats("start_times")
    run.latencies_s = floats("latencies")
    if starts:
        t0 = min(starts)
        run.arrival_times_s = [t - t0 for t in starts]
    run.input_lens = [x for x, good in zip(lists["input_lens"], ok, strict=True) if good]
    run.output_lens = [x for x, good in zip(lists["output_lens"], ok, strict=True) if good]
    run.ttfts_s = [float(t) for t, good in zip(ttfts, ok, strict=True) if good and t is not None]  # seconds already
