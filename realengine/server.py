"""`servesim serve`: the real engine behind an OpenAI-compatible HTTP API, so that real clients can drive it.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent events when ``stream`` is
true), ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text in vLLM's metric names). The
engine is the one ``servesim engine run`` drives: the scenario variant's policy (built-in or a user's), KV block
manager and ``ServingCore`` inside the simulator's own loop (``sim.loop.simulator.Simulation``) on the wall clock, with
an arrival source that takes requests from the HTTP threads instead of from a workload.

What the API takes from a request: the prompt's length and ``max_tokens``. The engine always generates exactly
``max_tokens`` tokens (it ignores end-of-sequence, as ``ignore_eos`` asks; ``ignore_eos`` is accepted and
changes nothing). A prompt given as a list of token ids has that many tokens; given as text, without a tokenizer,
it counts one token per whitespace-separated word (the same approximation ``servesim observe`` makes when it
writes prompts), and the tokens the model sees are the engine's own deterministic ones for that length. Output
text is one word per token: the token id (random weights) or the tokenizer's text (real weights).

Threads: the engine loop runs in one thread (``LiveEngine.start``); each HTTP connection is served by a thread of
``ThreadingHTTPServer``, which hands the request to the loop through ``LiveEnvironment.call_soon`` and then
blocks on its own queue of token chunks, which the loop fills after every step.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import simpy
import simpy.rt
from simpy.core import EmptySchedule

from realengine.openai_request import parse_request
from sim.serving.request import Outcome, Request, RequestSpec

# seconds a policy may leave requests waiting with nothing running before they fail (LiveEngine._check_stall): as long
# as a policy's call may take (sim/policies/watchdog.py), far past any batch timeout a policy waits on
STALL_TIMEOUT_S = 60.0

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class LiveEnvironment(simpy.rt.RealtimeEnvironment):
    """A real-time SimPy clock that other threads can hand work to (``call_soon``). Where the plain real-time
    environment sleeps until its next event, this one waits on a ``threading.Event`` that ``call_soon`` sets, so
    an arriving request is taken at once rather than at the next event; the callbacks run in the loop's thread, at
    the wall-clock time they are taken (never past the next scheduled event, so the clock never goes back)."""

    def __init__(self) -> None:
        super().__init__(strict=False)
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._wake = threading.Event()
        self.taken_at = 0.0  # the wall-clock time (on this clock) at which the inbox was last taken

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` in the loop's thread as soon as it can (thread-safe)."""
        self._inbox.append(fn)
        self._wake.set()

    def wall_now(self) -> float:
        return (time.monotonic() - self.real_start) / self.factor + self.env_start

    def _drain(self) -> None:
        inbox = self._inbox
        if not inbox:
            return
        # The clock moves to the wall time, but never past the next event: when the loop runs late (a step's end
        # is processed after its time) the callbacks run at that event's time and read ``taken_at`` for the truth.
        self.taken_at = self.wall_now()
        self._now = max(self._now, min(self.taken_at, self.peek()))
        while inbox:
            inbox.popleft()()

    def step(self) -> None:
        self._wake.clear()
        self._drain()
        evt_time = self.peek()
        if evt_time == math.inf:
            raise EmptySchedule()
        delta = self.real_start + (evt_time - self.env_start) * self.factor - time.monotonic()
        if delta > 0 and self._wake.wait(delta):
            return  # woken by call_soon: the next step takes it
        simpy.Environment.step(self)


class _Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count); observed from the loop thread, read under a lock."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class _Stream:
    """One HTTP request's link to the loop: the request, the tokens sent so far and the chunks to write."""

    __slots__ = ("request", "sent", "chunks", "received", "token_times", "request_id")

    def __init__(self, received: float) -> None:
        self.request: Request | None = None
        self.sent = 0
        self.chunks: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.received = received  # loop-clock seconds at which the loop took it
        self.token_times: list[float] = []  # loop-clock seconds at which each chunk was handed to the connection
        self.request_id = ""  # the client's X-Request-Id header, logged


class LiveEngine:
    """The engine's loop in a thread of its own, fed by ``submit`` from any thread.

    ``core`` and ``executor``: one replica as ``realengine.engine`` builds it; ``detokenize(ids)``: the text of
    output token ids. ``log``: called in the loop thread with one dict per finished request (the server's log).
    ``guard()``: the loop runs in it (``sim.loop.run.policy_errors``: what it raises names the variant and policy)."""

    def __init__(self, core, executor, *, model_name: str, max_model_len: int,
                 detokenize: Callable[[list[int]], str], runner, log: Callable[[dict], None] | None = None,
                 stall_timeout_s: float | None = STALL_TIMEOUT_S,
                 guard: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        from sim.loop.simulator import Simulation

        self.env = LiveEnvironment()
        executor.env = self.env
        self.core = core
        self.runner = runner
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.detokenize = detokenize
        self.log, self.guard = log, guard
        self._next_id = 0
        self._id_lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._stopped = False
        self.sim = Simulation([], [(core, executor)], fast_forward=False, env=self.env, arrivals=self._heartbeat)
        self.sim.replicas[0].step_listeners.append(self._after_step)
        core.finish_listeners.append(self._on_finish)
        core.finish_listeners.append(lambda r: runner.release(r.id))
        self.metrics_lock = threading.Lock()
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.e2e = _Histogram(REQUEST_BUCKETS)
        self.queue_time = _Histogram(REQUEST_BUCKETS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished: collections.Counter[str] = collections.Counter()  # finished_reason -> count
        self.thread = threading.Thread(target=self._run, name="servesim-engine", daemon=True)
        self.error: BaseException | None = None
        self.on_stop: Callable[[BaseException], None] | None = None  # told when the loop dies (serve then exits)
        # requests left waiting with nothing running and no step taken this long fail (None: never); see _check_stall
        self.stall_timeout_s = stall_timeout_s
        self.on_stall: Callable[[str], None] | None = None  # told, in the loop thread, when it fails requests
        self._steps = 0  # steps taken, and the count and loop-clock time at which the engine was last seen busy
        self._busy_seen = (0, 0.0)

    # ---- the loop thread --------------------------------------------------------------------------------------
    def _heartbeat(self, sim):
        """The arrival source: requests come through ``call_soon``; this only keeps the clock's queue from running
        dry (an empty queue ends ``env.run``) while the server waits for them."""
        while not self._stopped:
            yield self.env.timeout(1.0)
            self._check_stall()
        sim.close_arrivals()

    def _check_stall(self) -> None:
        """Fail the queued requests once the policy has left them waiting, with nothing running and no step taken,
        for ``stall_timeout_s``: a policy that never schedules them (or only asks to be woken again) hung every
        client for good, where a simulation ends such a run with 'stalled'. A request still waiting for the next
        step of a busy engine, or for a policy's batch timeout that ends in a step, is never failed."""
        core, now = self.core, self.env.now
        steps, since = self._busy_seen
        if self.stall_timeout_s is None or core.running or not (core.waiting or core.swapped) or steps != self._steps:
            self._busy_seen = (self._steps, now)
            return
        stuck = [*core.waiting, *core.swapped]
        since = max(since, min(r.arrival for r in stuck))  # (the heartbeat looks once a second)
        if now - since < self.stall_timeout_s:
            return
        name = getattr(core.policy, "name", None) or type(core.policy).__name__  # a user's: its class's name
        reason = (f"not scheduled: the policy ({name}) left {len(stuck)} request(s) waiting "
                  f"with none running for {self.stall_timeout_s:g} s or more (servesim serve --stall-timeout)")
        for r in stuck:
            core.abort(r, now, reason)
        self._busy_seen = (self._steps, now)
        if self.on_stall is not None:
            self.on_stall(reason)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        import torch

        try:
            self.env.sync()
            with self.guard(), torch.inference_mode():
                self.env.run()  # not sim.run(): its end-of-run checks expect a workload known in advance
        except BaseException as e:  # noqa: BLE001 - kept for /health and the serve command's exit
            self.error = e
            for s in list(self._streams.values()):
                s.chunks.put(("error", f"engine stopped: {type(e).__name__}: {e}"))
            if self.on_stop is not None and not self._stopped:
                self.on_stop(e)

    def stop(self) -> None:
        self._stopped = True
        self.env.call_soon(lambda: None)
        self.thread.join(timeout=5.0)

    def _after_step(self, _replica) -> None:
        self._steps += 1
        now = self.env.now
        for s in self._streams.values():
            r = s.request
            if r is None or r.num_output_tokens <= s.sent:
                continue
            n = r.num_output_tokens
            toks = self.runner.tokens(r.id)[r.prompt_len + s.sent: r.prompt_len + n]
            with self.metrics_lock:
                if s.sent == 0:
                    self.ttft.observe(now - r.arrival)
                elif s.token_times:
                    self.itl.observe((now - s.token_times[-1]) / (n - s.sent))
            s.sent = n
            s.token_times.append(now)
            self._put_text(s, r, toks)

    def _on_finish(self, r: Request) -> None:
        s = self._streams.pop(r.id, None)
        if s is None:
            return
        if r.num_output_tokens > s.sent and r.id in self.runner.live_requests:  # the last step's tokens
            self._after_step_one(s, r)
        reason = "length" if r.outcome is Outcome.COMPLETED else "abort"
        with self.metrics_lock:
            self.finished[reason] += 1
            if r.outcome is Outcome.COMPLETED:
                self.e2e.observe(r.finish - r.arrival)
                self.prompt_tokens_total += r.prompt_len
                self.generation_tokens_total += r.num_output_tokens
                if r.first_scheduled >= 0:  # (a step that began while the loop ran late can start before it)
                    self.queue_time.observe(max(r.first_scheduled - r.arrival, 0.0))
        if r.outcome is Outcome.COMPLETED:
            s.chunks.put(("done", {"prompt_tokens": r.prompt_len, "completion_tokens": r.num_output_tokens}))
        else:
            s.chunks.put(("error", r.reason or str(r.outcome)))
        if self.log is not None:
            self.log({"id": r.id, "request_id": s.request_id, "priority": r.spec.priority, "outcome": str(r.outcome),
                      "reason": r.reason,
                      "prompt_tokens": r.prompt_len,
                      "output_tokens": r.num_output_tokens, "arrival": r.arrival, "first_token": r.first_token,
                      "finish": r.finish, "num_preemptions": r.num_preemptions, "chunk_times": s.token_times})

    def _after_step_one(self, s: _Stream, r: Request) -> None:
        n = r.num_output_tokens
        toks = self.runner.tokens(r.id)[r.prompt_len + s.sent: r.prompt_len + n]
        s.sent = n
        s.token_times.append(self.env.now)
        self._put_text(s, r, toks)

    def _put_text(self, s: _Stream, r: Request, toks: list[int]) -> None:
        # "last": the chunk that brings the request to max_tokens, which the engine always generates (EOS ignored):
        # vLLM sends its finish_reason on that chunk, not on one of its own after it
        s.chunks.put(("last" if s.sent >= r.output_len else "text", self.detokenize(toks)))

    # ---- any thread -------------------------------------------------------------------------------------------
    def submit(self, prompt_len: int, max_tokens: int, request_id: str = "", priority: int = 0) -> _Stream:
        """A request arrives: it is queued in the loop at once; its chunks come on the returned stream. ``priority``:
        vLLM's request field (lower is served sooner), which the policy reads as the request's priority."""
        with self._id_lock:
            rid = self._next_id
            self._next_id += 1
        stream = _Stream(0.0)
        stream.request_id = request_id
        if self.error is not None or not self.thread.is_alive():  # no loop to take it: answer now, never hang
            stream.chunks.put(("error", f"the engine is not running ({self.error or 'stopped'})"))
            return stream

        def arrive() -> None:
            stream.received = self.env.now
            if self._stopped or self.error is not None:
                stream.chunks.put(("error", "the server is shutting down"))
                return
            self._streams[rid] = stream
            self.sim.send(RequestSpec(rid, self.env.now, prompt_len, max_tokens, priority=priority))
            if rid in self._streams:  # not refused at once by admission
                r = stream.request = self.sim.requests[-1]
                # a loop running late takes the request at the overdue event's time: its arrival is when it came
                r.arrival = max(r.arrival, self.env.taken_at)

        self.env.call_soon(arrive)
        return stream

    def cancel(self, stream: _Stream, reason: str) -> None:
        """The client went away: the request fails and frees its KV at the next step boundary."""

        def abort() -> None:
            r = stream.request
            if r is not None and r.outcome is None:
                self.core.abort(r, self.env.now, reason)

        self.env.call_soon(abort)

    def metrics_text(self) -> str:
        """Prometheus text exposition, vLLM's names (vllm/v1/metrics/loggers.py)."""
        core = self.core
        labels = f'model_name="{self.model_name}",engine="0"'
        kv = core.kv
        usage = kv.num_used_blocks / kv.num_blocks if kv.num_blocks else 0.0
        lines: list[str] = []

        def metric(name: str, kind: str, helptext: str, body: list[str]) -> None:
            lines.extend([f"# HELP {name} {helptext}", f"# TYPE {name} {kind}", *body])

        with self.metrics_lock:
            metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   [f"vllm:num_requests_running{{{labels}}} {len(core.running)}"])
            metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   [f"vllm:num_requests_waiting{{{labels}}} {len(core.waiting) + len(core.swapped)}"])
            metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   [f"vllm:kv_cache_usage_perc{{{labels}}} {usage!r}"])
            metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
                   [f"vllm:num_preemptions_total{{{labels}}} {core.stats.num_preemptions}"])  # the core counts each
            metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                   [f"vllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens_total}"])
            metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                   [f"vllm:generation_tokens_total{{{labels}}} {self.generation_tokens_total}"])
            metric("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                   [f'vllm:request_success_total{{{labels},finished_reason="{k}"}} {v}'
                    for k, v in sorted(self.finished.items())])
            metric("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
                   self.ttft.lines("vllm:time_to_first_token_seconds", labels))
            metric("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
                   self.itl.lines("vllm:inter_token_latency_seconds", labels))
            metric("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
                   self.e2e.lines("vllm:e2e_request_latency_seconds", labels))
            metric("vllm:request_queue_time_seconds", "histogram",
                   "Histogram of time spent in WAITING phase for request.",
                   self.queue_time.lines("vllm:request_queue_time_seconds", labels))
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked transfer for the event streams
    engine: LiveEngine  # set on the subclass that make_server builds

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would drown the terminal at a few hundred requests per second

    def _send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str) -> None:
        # the error's type by its status, as vLLM's server names them: a 500 (the engine failed the request: its
        # policy raised, or left it waiting past --stall-timeout) said BadRequestError, the client's fault
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(code, "InternalServerError")
        self._send_json(code, {"object": "error", "message": message, "type": kind, "code": code})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        eng = self.engine
        if self.path == "/metrics":
            data = eng.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/health":
            if eng.error is not None:
                self._error(500, f"engine stopped: {eng.error}")
            else:
                self._send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": eng.model_name, "object": "model",
                                                               "owned_by": "servesim",
                                                               "max_model_len": eng.max_model_len}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        chat = self.path == "/v1/chat/completions"
        if self.path != "/v1/completions" and not chat:
            self._error(404, f"no route {self.path}")
            return
        try:  # json.JSONDecodeError is a ValueError
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            req = parse_request(body, chat)
        except ValueError as e:
            self._error(400, str(e))
            return
        eng, n_prompt, max_tokens = self.engine, req.prompt_len, req.max_tokens
        if n_prompt + max_tokens > eng.max_model_len:
            self._error(400, f"This model's maximum context length is {eng.max_model_len} tokens. However, you "
                        f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in "
                        "the completion).")
            return
        # vLLM's id: its X-Request-Id, else a random one (it was id(stream), which repeats once a stream is freed)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        stream = eng.submit(n_prompt, max_tokens, self.headers.get("X-Request-Id") or "", req.priority)
        if body.get("stream"):
            self._stream(stream, body, chat, rid)
        else:
            self._whole(stream, chat, rid)

    def _reply_base(self, chat: bool, rid: str, created: int | None = None) -> dict:
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()) if created is None else created, "model": self.engine.model_name}

    def _stream(self, stream: _Stream, body: dict, chat: bool, rid: str) -> None:
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())  # one time for all of a request's chunks, as vLLM's
        first, finished = True, False

        def choice(text: str | None, finish_reason: str | None) -> dict:
            base = self._reply_base(chat, rid, created)
            part = ({"delta": {} if text is None else {"content": text}} if chat else {"text": text or ""})
            base["choices"] = [{"index": 0, **part, "logprobs": None, "finish_reason": finish_reason}]
            return base

        try:
            while True:
                kind, value = stream.chunks.get()
                if kind in ("text", "last"):
                    if chat and first:  # vLLM's first chat chunk gives the role alone
                        opening = choice(None, None)
                        opening["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                        self._event(opening)
                    first, finished = False, kind == "last"
                    self._event(choice(value, "length" if finished else None))
                    continue
                if kind == "done":
                    if not finished:  # (the last tokens never came as a "last" chunk)
                        self._event(choice(None, "length"))
                    if usage_wanted:
                        usage = {**value, "total_tokens": value["prompt_tokens"] + value["completion_tokens"]}
                        self._event({**self._reply_base(chat, rid, created), "choices": [], "usage": usage})
                else:  # a failed or refused request: vLLM ends the stream with an error event
                    self._event({"object": "error", "message": value, "type": "InternalServerError", "code": 500})
                self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")
                return
        except (BrokenPipeError, ConnectionResetError):
            self.engine.cancel(stream, "client disconnected")
            self.close_connection = True

    def _event(self, obj: dict) -> None:
        self._write_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _whole(self, stream: _Stream, chat: bool, rid: str) -> None:
        parts: list[str] = []
        while True:
            kind, value = stream.chunks.get()
            if kind in ("text", "last"):
                parts.append(value)
            elif kind == "done":
                break
            else:
                self._error(500, value)
                return
        text = "".join(parts)
        base = self._reply_base(chat, rid)
        base["object"] = "chat.completion" if chat else "text_completion"
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = {**value, "total_tokens": value["prompt_tokens"] + value["completion_tokens"]}
        self._send_json(200, {**base, "choices": [choice], "usage": usage})


def make_server(engine: LiveEngine, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The HTTP server (not yet serving: call ``serve_forever``). Port 0 picks a free one (``server_address``)."""
    handler = type("Handler", (_Handler,), {"engine": engine})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def build_live_engine(cfg, *, device: str = "cpu", model_spec: str | None = None, num_gpu_blocks: int | None = None,
                      dtype=None, real_model=None, seed: int = 0, log: Callable[[dict], None] | None = None,
                      stall_timeout_s: float | None = STALL_TIMEOUT_S) -> LiveEngine:
    """One replica of the real engine for the variant ``cfg`` (its policy, KV manager and limits), as
    ``realengine.engine.run_engine`` builds it, on the wall clock."""
    import torch

    from realengine.attention import build_metadata
    from realengine.config import engine_config
    from realengine.engine import _default_dtype, sized_config
    from realengine.executor import EngineExecutor
    from realengine.model import LlamaModel, torch_dtype
    from realengine.runner import ModelRunner
    from sim.loop.build import build
    from sim.loop.run import policy_errors
    from sim.serving.core import ENGINE_LOOK_EVERY, ServingCore

    tdtype = torch_dtype(dtype) if dtype is not None else _default_dtype(cfg, device)
    tdtype = real_model.model.dtype if real_model is not None else tdtype
    cfg = engine_config(cfg, model_spec=model_spec, num_gpu_blocks=num_gpu_blocks, dtype=tdtype, device=device)
    _, _, _, built = build(cfg)
    model = real_model.model if real_model is not None else LlamaModel(built.model, dtype=tdtype, device=device,
                                                                       seed=seed)
    policy, kv, _, built = build(sized_config(cfg, model, built, tdtype, device))
    prompt_fn = None
    detokenize: Callable[[list[int]], str] = lambda ids: "".join(f" {t}" for t in ids)  # noqa: E731
    if real_model is not None:
        from realengine.text import text_prompt_ids

        tok = real_model.tokenizer

        def prompt_fn(spec):
            return text_prompt_ids(spec.id, spec.prompt_len, tok, seed=seed)

        detokenize = tok.decode
    runner = ModelRunner(built.model, block_manager=kv, model=model, max_num_seqs=min(built.limits.max_num_seqs,
                         1024), max_model_len=built.max_model_len, prompt_fn=prompt_fn,
                         kv_layout="paged" if hasattr(kv, "tables") else "contiguous")
    with torch.inference_mode():  # warm-up: the first forward pays one-off costs
        meta = build_metadata([0], [8], device=model.device, block_size=kv.block_size)
        model(torch.zeros(8, dtype=torch.long, device=model.device), meta.positions, meta, None)
    # engine run's look for a policy that takes back what it computes; one that waits is --stall-timeout's
    core = ServingCore(policy, kv, fast_path=False, look_every=ENGINE_LOOK_EVERY, stop_waiting=False)
    executor = EngineExecutor(runner, clock="wall")
    return LiveEngine(core, executor, model_name=built.model.name, max_model_len=built.max_model_len,
                      detokenize=detokenize, runner=runner, log=log, stall_timeout_s=stall_timeout_s,
                      guard=lambda: policy_errors(cfg, loop="serve"))
