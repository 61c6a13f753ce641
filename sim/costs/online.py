"""The online-serving layer (``deployment.serving``): what a request meets outside the engine when it is served
through an engine's HTTP server and timed by a benchmark client, which offline throughput figures never show.

Off unless a scenario sets ``deployment.serving`` (``online``, or the keys below): an offline run (``LLM.generate``,
``trtllm-bench``, servesim's default) keeps exactly what it computed before. On, the client's request passes:

1. **the API server's own work**, one process, first come first served: ``request_handling_s`` per request (the
   HTTP request read and checked, the request handed to the engine, its first chunk framed) and
   ``tokenize_s_per_token`` per prompt token. A burst (``vllm bench serve --request-rate inf`` sends every request
   at once) reaches the engine spread over the time the server needs for all of them. vLLM's and SGLang's API
   servers do this work in one Python process apart from the engine's (vLLM V1's AsyncLLM beside its EngineCore,
   SGLang's TokenizerManager), on one event loop: vLLM tokenizes on one worker thread (vllm-project/vllm#25301),
   and its output processing had to be cut into pieces so as not to hold the same loop's requests up (#12287).
2. **the engine**, which sees the request when the API server is done with it.
3. **the way back**: every token reaches the client ``detokenize_s_per_token`` plus ``request_latency_s`` after the
   engine sampled it. That is the client's convention: ``vllm bench serve`` and SGLang's ``bench_serving`` start
   TTFT when they send and stop it at the first streamed chunk they receive, so TTFT and E2E latency grow by the
   whole path; TPOT and ITL, being differences of token times, do not.

Defaults, each from a measurement outside the development set (``../shared/data/published-dev/``):

- ``tokenize_s_per_token`` 2.2 us: vLLM 0.19's tokenizer took 220 ms for a 100k-token prompt on one CPU core
  (A. Luo, "CPU-GPU co-design for agentic inference on MI300X", andyluo7.github.io, 2026-05-14).
- ``request_handling_s`` 9.1 ms: vLLM 0.28's benchmark client measured TTFT 8.4 and 12.0 ms above the server's own
  ``vllm:time_to_first_token_seconds`` (vllm-project/vllm#54628, ``openai`` backend, 512-token prompts, 8
  concurrent), 10.2 ms on average; the server's clock starts after tokenization, so the 512 tokens' 1.1 ms
  (above) are taken out. The measurement does not split the server's work from the client's and the loopback
  connection's; all of it is taken as the server's, in the one process above (a streaming client's own CPU time is
  a fraction of it: servesim's, 0.3-0.6 ms a request, README's ``bench_observe.py`` table). So a request alone pays
  what the measurement saw, and a burst queues for it.
- ``request_latency_s`` 0: the rest of the way back is inside the handling time above.

The 9.1 ms is one measured total (server, loopback and client together); where it is spent, queued as
``request_handling_s`` or in parallel as ``request_latency_s``, is the preset's default split. A scenario that sets
either key has stated its own split, and the one it leaves out is 0: a file written before a26202f (where
``request_latency_s`` was the whole HTTP path, a live fit's included) or one that moves the whole time to the other
key must not also get the default's share, or the same measurement counts twice. calibrate's live fit writes both.
- ``detokenize_s_per_token`` 20 us: vLLM's incremental detokenizer took 19-21 us a token (vllm-project/vllm#5206,
  vLLM 0.3.0's log).

Per engine preset: vLLM 0.5 (``vllm-v0`` with version 0.5) ran its API server in the process that drives the GPU,
and the host time ratio of sim/engines/costs.py already counts the API server's share of the run (33% in vLLM's
0.5.3 profile), tokenization and detokenization among it: there the measured 9.1 ms is added on the way back as
``request_latency_s`` and nothing is queued. The other presets run the API server in its own process (vLLM 0.6
and V1, SGLang's tokenizer and detokenizer managers, trtllm-serve) and take the defaults above. Per-step scheduler
time stays the engine's (``host_time_ratio``, sim/engines/costs.py; the cost model's step overhead): the servers'
own processes overlap their work with the GPU's, and no measurement outside the development set says by how much
they slow a step.

Not modelled: the API server as a bottleneck (its per-token work for a large batch outgrowing a step), clusters
and disaggregated pools behind one front end (refused, and so is ``servesim plan``, whose candidates run as
clusters). In closed-loop runs a user sends the next request a think time after holding the last reply (the
engine's finish plus the way back), and it queues for the API server like any other (sim/loop/simulator.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field, model_validator

from sim.config.input_model import Float, InputModel
from sim.engines.base import engine_of
from sim.serving.request import Request
from sim.workload.generator import GeneratedWorkload

TOKENIZE_S_PER_TOKEN = 220e-3 / 100_000  # vLLM 0.19: 220 ms for 100k tokens, one core (andyluo7.github.io)
CLIENT_OVER_SERVER_TTFT_S = (8.4e-3 + 12.0e-3) / 2  # vllm#54628: client TTFT - server TTFT, openai backend
CLIENT_OVER_SERVER_PROMPT = 512  # that run's prompt length: its tokenization is inside the difference
# the API server's own time per request, spent one request at a time (the module's defaults say why all of it)
REQUEST_HANDLING_S = CLIENT_OVER_SERVER_TTFT_S - CLIENT_OVER_SERVER_PROMPT * TOKENIZE_S_PER_TOKEN
DETOKENIZE_S_PER_TOKEN = 20e-6  # vllm#5206: detokenize_incrementally 19-21 us a call (vLLM 0.3.0)


class ServingConfig(InputModel):
    """``deployment.serving``: the run is an online benchmark through the engine's HTTP server (``online``, or these
    keys; each left out takes the engine preset's default, sim/costs/online.py)."""

    request_handling_s: Float | None = Field(
        default=None, ge=0, le=60, description="API server's own seconds per request, one request at a time with "
        "the tokenizer before the engine sees it (HTTP handling, the streamed chunk); none: 0 if request_latency_s "
        "is given, else 9.1 ms (vllm#54628; 0 for vllm-v0 0.5, whose API server shared the engine's process: "
        "request_latency_s holds it).")
    request_latency_s: Float | None = Field(
        default=None, ge=0, le=60, description="Seconds every token takes from the engine to the client beyond "
        "detokenization, in parallel for every request; none: 0 (9.1 ms for vllm-v0 0.5 unless request_handling_s "
        "is given: the two split one measured time).")
    tokenize_s_per_token: Float | None = Field(
        default=None, ge=0, le=1, description="API server's tokenizer seconds per prompt token, one process first "
        "come first served; none: 2.2 us (0 for vllm-v0 0.5, whose host time ratio holds it).")
    detokenize_s_per_token: Float | None = Field(
        default=None, ge=0, le=1, description="Seconds from a token sampled to its text streamed; none: 20 us "
        "(vllm#5206; 0 for vllm-v0 0.5, whose host time ratio holds it).")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value != "online":
                raise ValueError(f"serving: {value!r}: give 'online' or its keys (request_handling_s, "
                                 "request_latency_s, tokenize_s_per_token, detokenize_s_per_token)")
            return {}
        return value


@dataclass(frozen=True, slots=True)
class Frontend:
    """The resolved layer: what each request pays outside the engine (seconds)."""

    request_latency_s: float
    tokenize_s_per_token: float
    detokenize_s_per_token: float
    request_handling_s: float = 0.0

    def in_server_s(self, prompt_len: int) -> float:
        """The API server's own time on a request of ``prompt_len`` tokens before the engine sees it."""
        return self.request_handling_s + self.tokenize_s_per_token * prompt_len

    @property
    def to_client_s(self) -> float:
        """From a token sampled to the client holding it."""
        return self.request_latency_s + self.detokenize_s_per_token


def frontend(serving: ServingConfig, engine: Any) -> Frontend:
    """The engine preset's defaults, the scenario's keys over them (``request_handling_s`` and ``request_latency_s``
    as one pair: either given, the other is 0)."""
    in_host_time = engine_of(engine).frontend_in_host_time(engine)
    own = 0.0 if in_host_time else None

    def pick(given: float | None, default: float) -> float:
        return float(given) if given is not None else (own if own is not None else default)

    handling, latency = serving.request_handling_s, serving.request_latency_s
    if handling is None and latency is None:
        # the preset's split of the one measured time: vLLM 0.5 spends it on the way back, in parallel, its host time
        # ratio holding the server; the others queue it in the API server
        handling, latency = (0.0, REQUEST_HANDLING_S) if in_host_time else (REQUEST_HANDLING_S, 0.0)
    # either given: the scenario's own split of that time, the other key 0 (the module says why)
    return Frontend(
        request_latency_s=float(latency or 0.0),
        tokenize_s_per_token=pick(serving.tokenize_s_per_token, TOKENIZE_S_PER_TOKEN),
        detokenize_s_per_token=pick(serving.detokenize_s_per_token, DETOKENIZE_S_PER_TOKEN),
        request_handling_s=float(handling or 0.0))


def to_engine(workload: GeneratedWorkload, fe: Frontend) -> tuple[GeneratedWorkload, list[float]]:
    """The workload as the engine receives it (each request when the API server is done with it, first come first
    served, so the order and the ids stay) and the clients' send times. Closed loop: unchanged, its sends depend on
    its replies, and the simulation queues them as they come (``ClosedLoopPlan.in_server_s``)."""
    sends = [r.arrival for r in workload.requests]
    if workload.closed_loop is not None or (fe.tokenize_s_per_token == 0 and fe.request_handling_s == 0):
        return workload, sends
    free, out = 0.0, []
    for r in workload.requests:
        free = max(r.arrival, free) + fe.in_server_s(r.prompt_len)
        out.append(replace(r, arrival=free))
    return replace(workload, requests=tuple(out)), sends


def to_client(requests: list[Request], sends: Sequence[float] | Mapping[int, float], fe: Frontend) -> None:
    """Each request's times as the benchmark client records them: sent at its send time (``sends[id]``), every
    token ``fe.to_client_s`` after the engine sampled it."""
    out = fe.to_client_s
    for r in requests:
        r.arrival = sends[r.id]
        if r.first_token >= 0:
            r.first_token += out
            r.last_token += out
        if r.finish >= 0:
            r.finish += out
        if r.token_times is not None:
            r.token_times = [t + out for t in r.token_times]
