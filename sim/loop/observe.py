"""`servesim observe`: a scenario's traffic sent to a live OpenAI-compatible server and measured as
`vllm bench serve` measures it.

Each request of the scenario's workload is sent at its arrival time (open loop), or by its closed-loop user a
think time after that user's previous request ended, as a streamed ``/v1/completions`` (or
``/v1/chat/completions``) request with ``max_tokens`` set to its output length and ``ignore_eos`` true (vLLM's and
SGLang's way of making the server generate all of them), and the request's class ``priority`` where it is not 0.
Per request, as vLLM's ``benchmarks/backend_request_func.py`` does: the clock starts just before the POST; TTFT
is the first chunk that carries text; each later text chunk adds one ITL gap (time since the previous one); the
latency (E2EL) ends at the last text chunk; the output token count is the server's ``usage.completion_tokens`` when
it sends usage, else the number of text chunks.

Prompts without a tokenizer: one common English word per token, each preceded by a space (`` the``, `` of``...),
which most BPE vocabularies (Llama's, GPT's, SmolLM's) hold as single tokens, so a prompt of N words is about N
tokens; the servesim server counts exactly one token per word. Words are drawn per prefix block from the
request's ``hash_ids`` (shared prefixes stay shared, for the server's prefix cache) and otherwise per request.
The run records this approximation (observe.json, ``prompt_tokens``).

Faults are data: a refused connection, an HTTP error, a stream that ends without ``[DONE]``, an error event in
the stream and a timeout each end the request ``failed`` with the reason; Ctrl-C ends the requests in flight as
failed ("interrupted") and the run folder says ``partial: true``.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.serving.request import RequestSpec

# Words that are one token each (with their leading space) in Llama-3's, GPT-2/4's and SmolLM2's vocabularies
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their been has when who will no more if out so up said what its "
         "about than into them can only other new some time could these two may then do first any my now").split()

PROMPT_METHOD = ("words: one common English word per token (' the', ' of', ...), no tokenizer; about one token "
                 "per word on BPE vocabularies, exactly one on `servesim serve`")


def prompt_text(spec: RequestSpec, seed: int = 0) -> str:
    """``spec.prompt_len`` words: block i of a shared prefix (``hash_ids[i]``) is the same words wherever it
    appears; the rest is the request's own."""
    out: list[str] = []
    bs = spec.hash_block_size
    for i, h in enumerate(spec.hash_ids):
        n = min(bs, spec.prompt_len - i * bs)
        if n <= 0:
            break
        rng = np.random.default_rng([seed, 1, int(h)])
        out.extend(WORDS[j] for j in rng.integers(0, len(WORDS), n))
    rest = spec.prompt_len - len(out)
    if rest > 0:
        rng = np.random.default_rng([seed, 2, spec.id])
        out.extend(WORDS[j] for j in rng.integers(0, len(WORDS), rest))
    return " ".join(out)


@dataclass(slots=True)
class Observed:
    """One request as the client saw it. Times in seconds since the run's start (``perf_counter`` based)."""

    id: int
    planned: float  # the scenario's arrival time
    sent: float = -1.0  # just before the POST
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    target: int = 0
    session_id: int = -1
    success: bool = False
    error: str = ""
    # the request's class, as the workload gave it (RequestSpec's fields; SLOs in seconds, -1: no bound): the run's
    # per-class figures and each class's own SLOs read them (observe dropped them, judging every request by the
    # scenario's SLOs alone)
    priority: int = 0
    tenant: str = ""
    slo_class: str = ""
    ttft_slo: float = -1.0
    tpot_slo: float = -1.0


@dataclass
class ObserveRun:
    """What an observation collected so far (filled as requests end, so an interrupted run keeps it)."""

    endpoint: str
    api: str
    results: dict[int, Observed] = field(default_factory=dict)
    metrics: list[tuple[float, str, float]] = field(default_factory=list)  # (time, name, value)
    scrape_errors: int = 0
    prompt_method: str = PROMPT_METHOD
    partial: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the client process's CPU time over the run


def base_url(endpoint: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (where ``/metrics`` lives)."""
    e = endpoint.rstrip("/")
    return e[: -len("/v1")] if e.endswith("/v1") else e


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: each vLLM, SGLang or TGI sample summed over its labels; histogram buckets left out
    (their _sum and _count stay)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name.endswith("_bucket") or not name.startswith(("vllm:", "sglang:", "tgi_")):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (ValueError, IndexError):
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


async def _one(session, url: str, payload: dict, rec: Observed, t0: float, timeout: float) -> None:
    """Send one request and measure it (vllm bench serve's rules, see the module docstring)."""
    import aiohttp

    st = time.perf_counter()
    rec.sent = st - t0
    most_recent = st
    chunks = 0
    usage_tokens = None
    done = False
    try:
        async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout),
                                headers={"X-Request-Id": f"servesim-observe-{rec.id}"}) as resp:
            if resp.status != 200:
                body = (await resp.text())[:200].replace("\n", " ")
                rec.error = f"HTTP {resp.status}: {body}"
                return
            buf = b""
            async for data in resp.content.iter_any():
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    line = event.strip()
                    if not line.startswith(b"data:"):
                        continue
                    line = line[5:].strip()
                    if line == b"[DONE]":
                        done = True
                        continue
                    ts = time.perf_counter()
                    obj = json.loads(line)
                    if "choices" not in obj and ("error" in obj or obj.get("object") == "error"):
                        err = obj.get("error", obj)
                        msg = err.get("message", err) if isinstance(err, dict) else err
                        rec.error = f"server error in the stream: {msg}"
                        return
                    choices = obj.get("choices") or []
                    if choices:
                        c = choices[0]
                        text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                        if text:
                            if chunks == 0:
                                rec.ttft = ts - st
                            else:
                                rec.itl.append(ts - most_recent)
                            most_recent = ts
                            chunks += 1
                    usage = obj.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        usage_tokens = int(usage["completion_tokens"])
        if not done:
            rec.error = f"stream cut short after {chunks} chunks (no [DONE])"
            return
        if chunks == 0:
            rec.error = "Never received a valid chunk to calculate TTFT."  # vLLM's words
            return
        rec.latency = most_recent - st
        rec.output_tokens = usage_tokens if usage_tokens is not None else chunks
        rec.success = True
    except TimeoutError:
        rec.error = f"timeout after {timeout:g} s ({chunks} chunks received)"
    except aiohttp.ClientConnectorError as e:
        rec.error = f"unreachable: {e.os_error or e}"
    except aiohttp.ClientPayloadError:
        rec.error = f"stream cut short after {chunks} chunks (connection closed mid-body)"
    except aiohttp.ServerDisconnectedError:
        rec.error = f"stream cut short after {chunks} chunks (server disconnected)"
    except aiohttp.ClientError as e:
        rec.error = f"client error: {type(e).__name__}: {e}"
    except json.JSONDecodeError as e:
        rec.error = f"malformed event in the stream: {e}"
    except asyncio.CancelledError:
        rec.error = "interrupted before it finished"
        raise
    finally:
        if not rec.success and not rec.error:
            rec.error = "interrupted before it finished"
        if not rec.success:
            rec.output_tokens = usage_tokens if usage_tokens is not None else chunks
            rec.latency = (most_recent - st) if chunks else 0.0


def exact_prompt(spec: RequestSpec, tokenizer: Any, seed: int = 0) -> tuple[str, int]:
    """With a tokenizer (``tokenizers.Tokenizer``): the words of :func:`prompt_text` cut to exactly
    ``spec.prompt_len`` tokens and decoded; returns (text, its token count re-encoded), which can differ from the
    target by a token or two where the cut's neighbours merge (the run counts those)."""
    text = prompt_text(spec, seed)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    while len(ids) < spec.prompt_len:  # a tokenizer that merges words: add more of them
        text += " " + prompt_text(dataclasses.replace(spec, id=spec.id + len(ids) + 1, hash_ids=()), seed)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
    text = tokenizer.decode(ids[: spec.prompt_len])
    return text, len(tokenizer.encode(text, add_special_tokens=False).ids)


def payload_of(spec: RequestSpec, api: str, model: str, seed: int, tokenizer: Any = None) -> dict[str, Any]:
    prompt = prompt_text(spec, seed) if tokenizer is None else exact_prompt(spec, tokenizer, seed)[0]
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_len, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if spec.priority:  # vLLM's field (lower is served sooner); sent only where set, since vLLM refuses a priority
        body["priority"] = spec.priority  # other than 0 unless it runs with --scheduling-policy priority
    return body


async def observe_async(run: ObserveRun, specs: list[RequestSpec], *, model: str = "", seed: int = 0,
                        closed_loop: Any = None, timeout: float = 600.0, scrape_interval: float = 1.0,
                        max_connections: int = 0, progress: Callable[[int], None] | None = None,
                        tokenizer: Any = None) -> ObserveRun:
    """Send ``specs`` to ``run.endpoint`` and fill ``run`` as they end. ``closed_loop``: a ``ClosedLoop`` (num_users,
    think_times); ``model``: the model name sent (default: the server's first in ``/v1/models``); ``tokenizer``:
    a ``tokenizers.Tokenizer`` that sizes the prompts exactly (:func:`exact_prompt`)."""
    import aiohttp

    url = run.endpoint.rstrip("/") + ("/chat/completions" if run.api == "chat" else "/completions")
    connector = aiohttp.TCPConnector(limit=max_connections, force_close=False)
    t0 = time.perf_counter()
    c0 = time.process_time()
    tasks: set[asyncio.Task] = set()
    async with aiohttp.ClientSession(connector=connector) as session:
        if not model:
            model = await _model_name(session, run.endpoint)
        payloads = {s.id: payload_of(s, run.api, model, seed, tokenizer) for s in specs}
        stop = asyncio.Event()
        scraper = asyncio.create_task(_scrape(session, run, t0, scrape_interval, stop)) if scrape_interval > 0 \
            else None

        async def send(spec: RequestSpec) -> None:
            rec = Observed(spec.id, spec.arrival, prompt_tokens=spec.prompt_len, target=spec.output_len,
                           session_id=-1 if spec.session_id is None else spec.session_id, priority=spec.priority,
                           tenant=spec.tenant, slo_class=spec.slo_class,
                           ttft_slo=-1.0 if spec.ttft_slo is None else spec.ttft_slo,
                           tpot_slo=-1.0 if spec.tpot_slo is None else spec.tpot_slo)
            run.results[spec.id] = rec
            try:
                await _one(session, url, payloads[spec.id], rec, t0, timeout)
            finally:
                if progress is not None:
                    progress(1)

        try:
            if closed_loop is None:
                for spec in sorted(specs, key=lambda s: (s.arrival, s.id)):
                    delay = t0 + spec.arrival - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    task = asyncio.create_task(send(spec))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
            else:
                users: dict[int, list[RequestSpec]] = {}
                for s in sorted(specs, key=lambda s: s.id):
                    users.setdefault(s.session_id or 0, []).append(s)
                think = closed_loop.think_times

                async def user(queue: list[RequestSpec]) -> None:
                    for i, spec in enumerate(queue):
                        if i:
                            await asyncio.sleep(float(think[spec.id]))
                        await send(spec)

                tasks.update(asyncio.create_task(user(q)) for q in users.values())
                await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            run.partial = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            stop.set()
            if scraper is not None:
                await asyncio.gather(scraper, return_exceptions=True)
            run.wall_s = time.perf_counter() - t0
            run.cpu_s = time.process_time() - c0
    return run


async def _model_name(session, endpoint: str) -> str:
    """The server's first model (``GET /v1/models``); "" where it has none to say."""
    import aiohttp

    try:
        async with session.get(endpoint.rstrip("/") + "/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status == 200:
                data = (await r.json()).get("data") or []
                if data and isinstance(data[0], dict):
                    return str(data[0].get("id", ""))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return ""


async def _scrape(session, run: ObserveRun, t0: float, interval: float, stop: asyncio.Event) -> None:
    """GET /metrics every ``interval`` seconds until ``stop``; once more at the end."""
    import aiohttp

    url = base_url(run.endpoint) + "/metrics"
    while True:
        t = time.perf_counter() - t0
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=max(interval, 1.0))) as r:
                if r.status == 200:
                    for name, value in parse_metrics(await r.text()).items():
                        run.metrics.append((t, name, value))
                else:
                    run.scrape_errors += 1
        except (aiohttp.ClientError, TimeoutError):
            run.scrape_errors += 1
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass


# ---- the run folder --------------------------------------------------------------------------------------------

def observed_result(run: ObserveRun, name: str, config: dict | None = None):
    """The observation as a ``RunResult`` (every request record, the pooled ITL gaps; no steps: the server's steps
    are not visible from outside)."""
    from sim.loop.results import pooled_gaps
    from sim.metrics.records import NO_CLASS, STEP_COLUMNS, RequestRecord, RunResult, has_classes

    records = []
    gaps: list[float] = []
    per_class: dict[str, list[float]] = {}
    for rec in sorted(run.results.values(), key=lambda r: r.id):
        sent = max(rec.sent, 0.0)
        first = sent + rec.ttft if rec.output_tokens > 0 and (rec.success or rec.ttft > 0) else -1.0
        finish = sent + rec.latency if rec.success else (sent + rec.latency if rec.latency > 0 else sent)
        records.append(RequestRecord(rec.id, sent, -1.0, first, finish, rec.prompt_tokens, rec.output_tokens,
                                     rec.target, 0, "completed" if rec.success else "failed", rec.error, 0,
                                     rec.session_id, priority=rec.priority, tenant=rec.tenant,
                                     slo_class=rec.slo_class, ttft_slo=rec.ttft_slo, tpot_slo=rec.tpot_slo))
        if rec.success:
            gaps.extend(rec.itl)
            per_class.setdefault(rec.slo_class or NO_CLASS, []).extend(rec.itl)
    uniq, counts = pooled_gaps(np.asarray(gaps, dtype=float), np.ones(len(gaps), dtype=np.int64))
    class_itl = {name: pooled_gaps(np.asarray(g, dtype=float), np.ones(len(g), dtype=np.int64))
                 for name, g in per_class.items()} if has_classes(records) else None
    start = min((r.arrival for r in records), default=0.0)
    end = max((r.finish for r in records), default=0.0)
    steps: dict[str, np.ndarray] = {k: np.zeros(0, dtype=t) for k, t in STEP_COLUMNS.items()}
    return RunResult(name=name, requests=records, steps=steps, itl_gaps=uniq, itl_counts=counts,
                     duration=max(end - start, 0.0), peak_flops=0.0, kv_capacity_blocks=0, block_size=0,
                     config=config, class_itl=class_itl)


def client_overhead(run: ObserveRun) -> dict[str, Any]:
    """How far the client itself was from the schedule: each request's send lag (sent - planned arrival) and the
    client's CPU seconds per request."""
    lags = np.asarray([r.sent - r.planned for r in run.results.values() if r.sent >= 0], dtype=float)
    n = len(run.results)
    out: dict[str, Any] = {"requests": n, "wall_s": run.wall_s, "cpu_s": run.cpu_s,
                           "cpu_per_request_s": run.cpu_s / n if n else None}
    if len(lags):
        out.update({"send_lag_p50_s": float(np.percentile(lags, 50)), "send_lag_p99_s": float(np.percentile(lags, 99)),
                    "send_lag_max_s": float(lags.max())})
    return out


def metrics_csv(run: ObserveRun) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["time_s", "metric", "value"])
    for t, name, value in run.metrics:
        w.writerow([repr(t), name, repr(value)])
    return buf.getvalue()


def failures_by_reason(run: ObserveRun) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in run.results.values():
        if not r.success:
            key = r.error.split(":", 1)[0] if r.error.startswith(("HTTP ", "unreachable", "server error")) \
                else r.error.split(" after ")[0].split(" (")[0]
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def write_observed_run(out_dir, run: ObserveRun, name: str, *, scenario: dict | None = None,
                       slos=None, planned: int = 0, written: list[str] | None = None,
                       sim_steps: dict[str, np.ndarray] | None = None):
    """The run folder: the simulator's files (summary.json, requests.csv, report.html, NAME.vllm-bench.json...)
    plus observe.json (endpoint, partial, the prompt approximation, failures by reason, the client's overhead),
    metrics.csv (the server's /metrics, scraped: time_s, metric, value) and live.html (the scraped gauges, with
    ``sim_steps``, the simulation's step series from :func:`simulated_steps`, drawn over them)."""
    from pathlib import Path

    from sim.config.files import write_atomically
    from sim.metrics.summary import summarize
    from sim.output.benchfiles.exports import BENCH_SUFFIX, file_stem
    from sim.output.run_folder import to_jsonable, write_run

    result = observed_result(run, name)
    info = {"endpoint": run.endpoint, "api": run.api, "partial": run.partial, "requests_planned": planned,
            "requests_sent": sum(1 for r in run.results.values() if r.sent >= 0),
            "prompt_tokens": run.prompt_method, "failures": failures_by_reason(run),
            "scrape_errors": run.scrape_errors, "client": client_overhead(run)}
    summary = summarize(result, slos) if slos is not None else summarize(result)
    # the server's busy time is not visible from outside: unknown ("-", null), where its empty steps made it 0.0%
    summary = {**summary, "busy_fraction": math.nan, "observed": info}
    names: list[str] = []
    out = write_run(out_dir, [result], {name: summary}, scenario=scenario, title=f"servesim observe: {name}",
                    written=names)
    # the per-request ITL lists that vllm bench serve's detailed result holds (the simulator's export has only the
    # pooled gaps; a client saw each request's own), in the file's request order (id)
    bench = Path(out) / (file_stem(name) + BENCH_SUFFIX)
    data = json.loads(bench.read_text())
    data["itls"] = [r.itl if r.success else [] for r in sorted(run.results.values(), key=lambda r: r.id)]
    extra = {"observe.json": json.dumps(to_jsonable(info), indent=2) + "\n", "metrics.csv": metrics_csv(run),
             LIVE_FILE: live_html(run, sim_steps, f"servesim observe: {name} at {run.endpoint}"),
             bench.name: json.dumps(data)}
    write_atomically(Path(out), extra)
    names += [n for n in extra if n not in names]
    if written is not None:
        written.extend(names)
    return out, info


# ---- the server's series against the simulation's ----------------------------------------------------------------

LIVE_FILE = "live.html"
# the scraped gauge and the simulated step column drawn in each panel: (title, server metrics, step column)
LIVE_PANELS = (
    ("requests running", ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
     "num_running"),
    ("requests waiting", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"), "num_waiting"),
    ("KV cache usage (0-1)", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
     "kv_usage"),
)


def simulated_steps(run: ObserveRun, cfg) -> dict[str, np.ndarray] | None:
    """The variant simulated on the requests as they were sent (each at its observed send time): its step series
    (start, num_running, num_waiting, kv_usage). None when nothing was sent."""
    from sim.loop.run import simulate_variant
    from sim.workload.generator import GeneratedWorkload

    sent = sorted((r for r in run.results.values() if r.sent >= 0), key=lambda r: (r.sent, r.id))
    if not sent:
        return None
    specs = tuple(RequestSpec(i, r.sent, max(r.prompt_tokens, 1), max(r.target, 1)) for i, r in enumerate(sent))
    result, _, _ = simulate_variant(cfg, GeneratedWorkload(specs))
    s = result.steps
    cap = np.maximum(np.asarray(s["kv_capacity_blocks"], dtype=float), 1.0)
    return {"start": np.asarray(s["start"], dtype=float), "num_running": np.asarray(s["num_running"], dtype=float),
            "num_waiting": np.asarray(s["num_waiting"], dtype=float),
            "kv_usage": np.asarray(s["kv_blocks_used"], dtype=float) / cap}


def fig_live(run: ObserveRun, sim_steps: dict[str, np.ndarray] | None = None):
    """The server's scraped gauges over the run, one panel each, with the simulation's step series over them."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(LIVE_PANELS), cols=1, shared_xaxes=True,
                        subplot_titles=[p[0] for p in LIVE_PANELS])
    for i, (_, names, column) in enumerate(LIVE_PANELS, start=1):
        for name in names:
            pts = [(t, v) for t, n, v in run.metrics if n == name]
            if pts:
                fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                                line={"shape": "hv", "color": "#1f77b4"}, row=i, col=1)
                break
        if sim_steps is not None and len(sim_steps["start"]):
            fig.add_scatter(x=sim_steps["start"], y=sim_steps[column], mode="lines", name=f"simulated {column}",
                            line={"shape": "hv", "color": "#ff7f0e"}, row=i, col=1)
    fig.update_xaxes(title_text="seconds since observe started", row=len(LIVE_PANELS), col=1)
    fig.update_layout(height=300 * len(LIVE_PANELS), title="the server's /metrics (scraped) and the simulation")
    return fig


def live_html(run: ObserveRun, sim_steps: dict[str, np.ndarray] | None, title: str) -> str:
    import html

    import plotly.io as pio

    note = ("Blue: the server's own gauges, scraped from /metrics. Orange: the scenario's variant simulated on the "
            "same requests, each arriving when observe sent it." if sim_steps is not None else
            "The server's own gauges, scraped from /metrics (no simulation drawn: --no-simulate).")
    body = pio.to_html(fig_live(run, sim_steps), include_plotlyjs=True, full_html=False, div_id="fig-live",
                       config={"displaylogo": False, "responsive": True})
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'</head><body><h1>{html.escape(title)}</h1><p>{html.escape(note)}</p>\n{body}\n</body></html>\n')
