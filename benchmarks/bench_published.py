"""Published serving figures against the simulator's analytic model, each row run on its engine's preset.

Over 600 lines because turning a published row into a run (its engine, metric, lengths, parallelism, settings and
client) and reporting it per class, per source and leave-one-source-out is one pipeline, read top to bottom.

The rows (``../shared/data/published-dev/published-dev.csv`` from the repository root and this repository's
``benchmarks/data/published-own/published-own.csv``, or the files given with ``--data``; their READMEs say where
each comes from) are figures others measured and published: TensorRT-LLM 0.17's offline throughput table,
gpt-fast's batch-1 decode speeds, the vLLM blog posts' serving throughput and TPOT, and dstack's vLLM 0.6.3
measurements of Llama-3.1-405B on 8x H100 and 8x MI300X (offline throughput, batch latency, and serving
throughput, TTFT, TPOT and ITL at 16-1000 requests/s). Every row the simulator can represent becomes one run:

- its model, GPU, tensor parallelism and dtypes, its engine's ``deployment.engine`` preset (sim/engines/registry.py):
  TensorRT-LLM -> ``tensorrt-llm`` (0.17 rows with ``kv_cache_free_gpu_mem_fraction`` 0.95, as the source's notes state
  for most of them), vLLM 0.5/0.6 -> ``vllm-v0``, SGLang -> ``sglang``, LMDeploy -> ``lmdeploy``, TGI -> ``tgi``;
  gpt-fast is no serving engine: one request, servesim's classic engine, its int8 and int4 weights read at
  PyTorch's weight-only kernels' share of the bandwidth (``TORCH_WEIGHT_ONLY_BANDWIDTH``, torchao's measurements);
- its workload: the fixed lengths stated (the blog's sonnet rows at their stated average lengths; its ShareGPT rows,
  which state only averages, at lengths spread about them, ``sharegpt_lengths``; rows whose outputs ended at the end
  of sequence before the length asked for, at geometric lengths under it averaging the stated mean, ``eos_lengths``),
  all requests at t=0 for offline and QPS-inf rows, Poisson at the rate stated otherwise, a closed loop of
  ``max_concurrency`` users where the row states one; what a row's optional ``settings`` column states
  (``max_model_len``, ``gpu_memory_utilization``, a KV cache sized in blocks (``num_gpu_blocks``, ``block_size``),
  ``num_prompts``, ``max_concurrency``, ``enforce_eager``, the
  scheduler's ``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``), ``earlier_runs``: the prompt
  counts of the runs the same server ran before it (``server_history``) and ``lengths``: a file of the per-request
  lengths the source published, run request by
  request, with the client's statistics (a request whose stream carried no text counts TTFT 0, as benchmark_serving.py
  counts it: ``client_stats``);
- the metric the row holds, computed as its source computes it;
- rows measured through an engine's HTTP server by a serving benchmark (their workload names a QPS) with the
  online-serving layer (``deployment.serving: online``, sim/costs/online.py); ``--offline`` runs them without it.
  On the V1 engine they start after the serving benchmark's warm-up request, which leaves the first prompt in the
  prefix cache (``warmup_request``).

No constant is fitted to a row: the cost model runs with its documented defaults. The headline is the error per
metric class (TTFT, decode speed, throughput, E2E) and per source (one document: sources are the unit a new engine
or GPU is new in) that leave-one-source-out gives; with nothing fitted, that is each row's plain error. Rows that
cannot be represented are listed with the reason. Per class it prints the errors' 10th-90th percentiles, each source
weighing the same (the 80% intervals of sim/metrics/intervals.py), and how many rows of each source the other
sources' percentiles hold; ``--write-intervals`` puts both in sim/metrics/intervals.py. It also prints how many rows
of each class lie within issue 38's target and how many the median needs (``median_needs``), and the groups (source,
engine, model, metric) with the most rows beyond 25% (``miss_groups``): where a mechanism would move most. ``--fit``
instead repeats issue 14's held-out calibration on the rows of one engine and GPU (fit the knobs on every other
row, predict the rest), now with the rows' engine preset.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_published.py [--data CSV]... [--requests N] [--fit [--engine P]]
        [--only TEXT] [--v0-host-time-ratio R] [--write-intervals]
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.scenario import VariantConfig, parse_scenario, variant_configs
from sim.costs.analytic import TORCH_WEIGHT_ONLY_BANDWIDTH
from sim.config.schema import ScenarioError
from sim.engines.tensorrt_llm import trtllm_bench_build
from sim.engines.vllm_v0 import VLLM_V06_HOST_TIME_RATIO
from sim.hardware.gpu import resolve_gpu
from sim.hardware.models import resolve_model
from sim.hardware.names import match_gpu, match_model
from sim.loop.build import build
from sim.loop.run import simulate_variant
from sim.metrics.intervals import source_percentiles
from sim.metrics.records import RunResult
from sim.output.benchfiles.common import BenchRun
from sim.output.benchfiles.stats import bench_stats, run_lists, run_stats
from sim.output.benchfiles.validate import rebuild_workload
from sim.serving.request import RequestSpec
from sim.workload.generator import GeneratedWorkload

ROOT = Path(__file__).resolve().parent.parent
# the shared data sit beside the repository, not in it: the development set is not shipped
DATA = ROOT.parent / "shared" / "data" / "published-dev" / "published-dev.csv"
# rows gathered for issue 38 from sources outside the shared set, in its format (README.md beside it)
OWN_DATA = ROOT / "benchmarks" / "data" / "published-own" / "published-own.csv"
# model and GPU columns: sim/hardware/names.py matches the published names to presets ("Meta-Llama-3-8B-Instruct" ->
# llama-3-8b, "H100-SXM-80GB (assumed SXM)" -> h100-sxm); these are the names it would not match alone
MODELS = {"Qwen2-7B": "qwen2.5-7b"}  # Qwen2-7B's config.json has Qwen2.5-7B's shapes (28 layers, hidden 3584,
#                                      28/4 heads, MLP 18944, vocab 152064)
# engine column -> deployment.engine (None: servesim's classic engine), by name and stated version:
# vLLM before 0.6 -> vllm-v0 0.5 (the oldest host-time profile modelled; a 2023 row is older still), 0.6 and 0.7
# -> vllm-v0 0.6 (V0 stayed the default until 0.8), 0.8 on or unstated -> vllm-v1, and 0.6's
# --num-scheduler-steps N divides its host time by N (sim/engines/costs.py); TensorRT-LLM 0.17's rows ran with
# kv_cache_free_gpu_mem_fraction 0.95, as the source notes for most of them
ENGINE_NAMES: tuple[tuple[str, str], ...] = (("tensorrt-llm", "tensorrt-llm"), ("trt-llm", "tensorrt-llm"),
                                             ("sglang", "sglang"), ("lmdeploy", "lmdeploy"), ("turbomind", "lmdeploy"),
                                             ("tgi", "tgi"), ("text generation inference", "tgi"),
                                             ("text-generation-inference", "tgi"), ("vllm", "vllm"))
# continuous-batching servers servesim has no preset for: run on vLLM V1's, the assumption printed with the row
ASSUMED_ENGINE = {"name": "vllm-v1"}
STATIC_ENGINES = ("hf transformers", "transformers")  # static batches of a size the rows do not state


def engine_of_row(text: str) -> tuple[dict[str, Any] | None, bool]:
    """A row's ``engine`` column as ``(deployment.engine, assumed)``; ``assumed``: no preset is that engine, so
    vLLM V1's stands in. Raises KeyError for an engine that batches statically (no continuous batching)."""
    low = text.lower()
    if low.startswith("gpt-fast"):
        return None, False
    if low.startswith(STATIC_ENGINES):
        raise KeyError(f"{text!r} runs static batches of a size the row does not state")
    name = next((preset for key, preset in ENGINE_NAMES if key in low), None)
    if name is None:
        return dict(ASSUMED_ENGINE), True
    if name == "tensorrt-llm":
        return {"name": name} | ({"kv_cache_free_gpu_mem_fraction": 0.95} if "v0.17" in low else {}), False
    if name == "lmdeploy" and re.search(r"\bv?0\.1\.", low):  # TurboMind before one forward (sim/engines/lmdeploy.py)
        return {"name": name, "version": "0.1"}, False
    if name != "vllm":
        return {"name": name}, False
    m = re.search(r"\bv?(\d+)\.(\d+)", low)
    year = re.search(r"\b(20\d\d)\b", low)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 5) if year and int(year.group(1)) < 2024 else None
    if "v0 engine" in low:  # a build that names its engine (AMD's ROCm build of 0.6: no version number)
        version = min(version or (0, 6), (0, 7))
    if version is None or version >= (0, 8) or "v1 engine" in low:
        return {"name": "vllm-v1"}, False
    if version < (0, 6):
        return {"name": "vllm-v0", "version": "0.5"}, False
    steps = re.search(r"num-scheduler-steps\s+(\d+)", low)
    return {"name": "vllm-v0", "version": "0.6"} | (
        {"host_time_ratio": VLLM_V06_HOST_TIME_RATIO / int(steps.group(1))} if steps else {}), False


# a metric column: <ttft|tpot|itl|e2el>_<ms|s>_<mean|median|p50|p99> (benchmark_serving.py's statistics), a rate
# (output_tok_s_total or output_tok_s, total_tok_s, request_throughput, output_tok_s_per_gpu), tokens per second
# per user (output_tok_s_per_user: 1 / mean TPOT) or gpt-fast's batch-1 tok_s_batch1
LATENCY_CLASS = {"ttft": "TTFT", "tpot": "decode speed", "itl": "decode speed", "e2el": "E2E"}
RATES = {"output_tok_s_total": "output_throughput", "output_tok_s": "output_throughput",
         "total_tok_s": "total_token_throughput", "request_throughput": "request_throughput",
         "output_tok_s_per_gpu": "output_throughput"}


BATCH = -2.0  # metric_of's scale for a batch's wall time: the run's requests / the value is its request rate


def metric_of(row: dict[str, str]) -> tuple[str, str, float]:
    """(class, simulated statistic, scale) of a row's metric: the measured value in the statistic's unit is value x
    scale; scale 0 marks a rate per request to invert (tokens / the value), -1 one per token (1 / the value),
    ``BATCH`` a batch's wall time (requests / the value)."""
    metric = row["metric"]
    if metric == "batch_latency_s":
        # benchmark_latency.py's avg_latency: the wall time of one llm.generate() over the whole batch, from the
        # start to its last request's end, which is the requests' E2E latency only while they all end together
        return "E2E", "request_throughput", BATCH
    if metric == "achieved_mem_bw_batch1":
        raise ValueError("derived: gpt-fast's GB/s is its tok/s times the model's bytes (the tok_s_batch1 row)")
    if metric == "tok_s_batch1":
        return "decode speed", "mean_e2el", 0.0  # gpt-fast: tok/s = tokens / whole generate()
    if metric == "output_tok_s_per_user":
        return "decode speed", "mean_tpot", -1.0
    if latency := re.fullmatch(r"(ttft|tpot|itl|e2el)_(ms|s)_(mean|median|p50|p99)", metric):
        base, unit, stat = latency.groups()
        return LATENCY_CLASS[base], f"{'median' if stat == 'p50' else stat}_{base}", 1e-3 if unit == "ms" else 1.0
    if metric in RATES:
        per_gpu = int(row.get("num_gpus") or row["tp"]) if metric.endswith("per_gpu") else 1
        return "throughput", RATES[metric], (1 / 60 if row["unit"] == "req/min" else 1.0) * per_gpu
    raise ValueError(f"metric {metric} has no simulated counterpart (a latency <ttft|tpot|itl|e2el>_<ms|s>_<mean|"
                     f"median|p99>, {', '.join(RATES)}, output_tok_s_per_user, tok_s_batch1 or batch_latency_s)")


CLASSES = ("TTFT", "decode speed", "throughput", "E2E")  # issue 38's metric classes, in its order
# a chart file shown in a post is that post's: the vLLM v0.6.0 post's figures live under assets/
SOURCE_ALIASES = {"vllm-project.github.io:assets/figures/perf-v060/":
                  "vllm-project.github.io:_posts/2024-09-05-perf-update.md",
                  # a README's raw result files and tables are that README's
                  "benchmarks:comparison/h100sxm5_vs_mi300x/": "benchmarks:comparison/h100sxm5_vs_mi300x/README.md",
                  "benchmarks:nvidia/8xh100/": "benchmarks:nvidia/8xh100/README.md",
                  "benchmarks:amd/inference/": "benchmarks:amd/inference/README.md",
                  # France Travail's reports, one per model, GPU and vLLM version, are one tool's and one team's
                  "results_benchmark_llm_serving:": "results_benchmark_llm_serving:README.md"}
# a row's ``settings`` (optional column, ``key=value;...``): what its source states beyond the other columns
POLICY_SETTINGS = {"enable_chunked_prefill", "max_num_seqs", "max_num_batched_tokens"}
# num_gpu_blocks and block_size: a KV cache the source sized in blocks (TurboMind's cache_max_entry_count above 1)
DEPLOYMENT_SETTINGS = {"max_model_len", "gpu_memory_utilization", "pipeline_parallel_size", "num_gpu_blocks",
                       "block_size"}
# deployment.engine keys: TGI's --max-input-tokens (the longest prompt, under max_model_len = --max-total-tokens)
ENGINE_SETTINGS = {"enforce_eager", "max_input_tokens"}
SETTINGS = POLICY_SETTINGS | DEPLOYMENT_SETTINGS | ENGINE_SETTINGS | {"num_prompts", "max_concurrency", "lengths",
                                                                      "earlier_runs"}
DIR_KEY = "_dir"  # the folder of the CSV a row was read from: a ``lengths`` file is named relative to it
# The vLLM v0.6.0 post's headline figures (0.5.3 against 0.6.0) state no flags, but the post runs vLLM with
# --num-scheduler-steps 10 ("For vLLM, we have turned on multistep scheduling via setting `--num-scheduler-steps
# 10`", its Performance Benchmarks), and their 0.6.0 throughput is the engine comparison's multi-step figure (36.4
# against 36.8 req/s for Llama-3-8B, 17.2 against 17.3 for 70B, within the charts' +-2% digitization)
MULTI_STEP_FIGURES = ("perf-v060/llama8B_comparison.png", "perf-v060/llama70B_comparison.png")
# a row built by trtllm-bench's heuristics, as TensorRT-LLM 0.17's performance overview states for its rows
TRTLLM_BENCH_BUILD = "chosen by trtllm-bench heuristics"
OFFLINE_REQUESTS = 3000  # offline rows: enough requests that the run reaches the engine's steady batch
# LMDeploy's benchmark/profile_generation.py (ebe90bc, the A100 tables' commit) runs --concurrency Python threads,
# each starting its first-token clock and then calling TurboMind's stream_infer, whose Python code (the request's
# tensors, their DLPack hand-over, one forward thread a GPU) runs before the C++ forward enqueues the request. The
# threads share one interpreter, so requests that threads send together reach TurboMind one at a time, and an engine
# whose batch went empty starts a step on the first (LlamaBatch's dequeue blocks only while the batch is empty):
# the rest wait for that step. That Python time, measured by benchmarks/bench_lmdeploy_client.py (the same code, the
# two TurboMind calls replaced by pure ones): median 230 us a request with one GPU, 470-480 us with four
PROFILE_GENERATION = "profile_generation.py"  # the client, as the rows' workload names it
PROFILE_GENERATION_SUBMIT_S = 230e-6  # a request's Python time before TurboMind sees it, one GPU
PROFILE_GENERATION_SUBMIT_PER_GPU_S = 80e-6  # and for each further GPU (its forward thread): (470 - 230) / 3


@dataclass
class Case:
    row: dict[str, str]
    cfg: VariantConfig
    run: BenchRun
    key: str  # simulated metric (sim.output.benchfiles.stats names) the row's value is compared with
    scale: float  # measured value in the simulated metric's unit = row value * scale
    # requests whose stream carried no text (a published per-request output length of 0), by request id; None: the
    # row's workload has no per-request lengths
    textless: list[bool] | None = None
    # vLLM's serving benchmark sends the first prompt once before the run (``warmup_request``)
    warmup: bool = False
    # prompts of the runs the same server ran before this one, oldest first (``server_history``)
    earlier: tuple[int, ...] = ()
    # the row's engine has no preset: vLLM V1's stands in (``engine_of_row``)
    assumed_engine: bool = False


def _number(text: str) -> int:
    m = re.search(r"[0-9]+", text)
    if not m:
        raise ValueError(f"no length stated ({text!r})")
    return int(m.group(0))


def source_of(row: dict[str, str]) -> str:
    """The document a row comes from (repository and file, the commit dropped): leave-one-source-out's unit, so
    that two commits of one README, or a post and its charts, count as one source."""
    repo, _, path = row["source"].removeprefix("github:").partition(":")
    key = f"{repo.split('@')[0].split('/')[-1]}:{path.split()[0] if path.split() else ''}"
    return next((post for prefix, post in SOURCE_ALIASES.items() if key.startswith(prefix)), key)


def online_row(row: dict[str, str]) -> bool:
    """Whether the row was measured through the engine's HTTP server by a serving benchmark client: its workload
    names a request rate (``QPS``, ``vllm bench serve``'s ``--request-rate``; the vLLM v0.6.0 post's recipe,
    vllm-project/vllm#8176, runs benchmark_serving.py against each engine's server). trtllm-bench, gpt-fast's
    generate.py and offline tables are not."""
    return "QPS" in row["workload"]


def settings_of(row: dict[str, str]) -> dict[str, Any]:
    """The optional ``settings`` column as values (``true``/``false``, numbers), unknown keys refused."""
    out: dict[str, Any] = {}
    for item in filter(None, (row.get("settings") or "").split(";")):
        k, _, v = item.partition("=")
        if k not in SETTINGS:
            raise ValueError(f"settings: unknown key {k!r} (known: {', '.join(sorted(SETTINGS))})")
        out[k] = v if k in ("lengths", "earlier_runs") else v == "true" if v in ("true", "false") \
            else int(v) if v.isdigit() else float(v)
    return out


def lengths_of(row: dict[str, str]) -> tuple[list[int], list[int]]:
    """The per-request input and output lengths the row's source published (``settings`` ``lengths=FILE``, a CSV
    of ``input_len,output_len`` beside the row's own CSV), in the order the benchmark sent the requests."""
    path = Path(row.get(DIR_KEY, "")) / settings_of(row)["lengths"]
    with path.open() as f:
        pairs = [(int(r["input_len"]), int(r["output_len"])) for r in csv.DictReader(f)]
    return [i for i, _ in pairs], [o for _, o in pairs]


# benchmark_serving.py's ShareGPT sampling (vllm/benchmarks/benchmark_serving.py sample_sharegpt_requests, 0.5-0.6):
# prompts and completions of at least 4 tokens, prompts of at most 1024, prompt + completion at most 2048
SHAREGPT_MIN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def _truncated_exponential(mean: float, low: float, high: float) -> float:
    """The scale of an exponential which, truncated to [low, high], has this mean (bisection)."""
    def truncated_mean(scale: float) -> float:
        w = high - low
        return low + scale - w * math.exp(-w / scale) / -math.expm1(-w / scale)
    lo, hi = 1e-3, 1e7
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if truncated_mean(mid) < mean else (lo, mid)
    return math.sqrt(lo * hi)


def sharegpt_lengths(mean_in: int, mean_out: int, n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Per-request lengths for a row that states only ShareGPT's average input and output: its requests differ,
    and a run of requests sent at once lasts as long as its longest ones, which fixed averages leave out. Each
    length is an exponential about the stated mean (the shape bench_energy.py takes for chat outputs too: an
    assumption, no source states ShareGPT's histogram with these means) cut to benchmark_serving.py's filter,
    drawn at the n mid-quantiles (so that the sample's mean is the distribution's, with no sampling noise) in an
    order shuffled with ``seed``. Nothing is fitted: the two means are the row's."""
    rng = np.random.default_rng(seed)
    q = (np.arange(n) + 0.5) / n
    lo = SHAREGPT_MIN
    scale_in = _truncated_exponential(mean_in, lo, SHAREGPT_MAX_PROMPT)
    ins = lo - scale_in * np.log1p(-q * -np.expm1(-(SHAREGPT_MAX_PROMPT - lo) / scale_in))
    ins = rng.permutation(np.rint(ins).astype(int))
    high_out = SHAREGPT_MAX_TOTAL - ins  # each request's room for its completion
    scale_out = _truncated_exponential(mean_out, lo, SHAREGPT_MAX_TOTAL - mean_in)
    qo = rng.permutation(q)
    outs = lo - scale_out * np.log1p(-qo * -np.expm1(-(high_out - lo) / scale_out))
    return [int(i) for i in ins], [int(o) for o in np.rint(outs)]


# a row whose outputs ended at the model's end of sequence before the length asked for (no --ignore-eos) states
# the run's mean output and the length requested: "1019 (mean; --random-output-len 1024, no --ignore-eos)"
PROMPT_COUNT = re.compile(r"\b(\d+) (?:\w+ )?prompts\b")
EOS_CAP = re.compile(r"--random-output-len\s+(\d+)|(\d+)\s+requested")


def eos_lengths(mean: float, cap: int, n: int, seed: int = 0) -> list[int]:
    """Per-request output lengths for a row whose requests stop at the model's end of sequence or at ``cap``,
    whichever comes first, averaging the ``mean`` the row states: every generated token has the same chance of
    being the end (a geometric length, the shape of a constant hazard; no source states these runs' histograms),
    cut at ``cap``. Drawn at the n mid-quantiles (the sample's mean is the distribution's) in an order shuffled with
    ``seed``. Equal lengths would keep a closed loop's users in lockstep, every user's next prompt arriving in the
    same step, which a run whose lengths differ does not do. Nothing is fitted: the mean is the row's."""
    if mean >= cap:
        return [cap] * n

    def capped_mean(q: float) -> float:  # E[min(G, cap)] for G geometric on 1, 2, ... with end chance q
        return -math.expm1(cap * math.log1p(-q)) / q
    lo, hi = 1e-12, 1.0 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if capped_mean(mid) < mean else (mid, hi)
    q = (lo + hi) / 2
    u = (np.arange(n) + 0.5) / n
    lengths = np.minimum(np.ceil(np.log1p(-u) / math.log1p(-q)), cap).astype(int)
    return [int(x) for x in np.random.default_rng(seed).permutation(np.maximum(lengths, 1))]


def parallelism_of(row: dict[str, str], settings: dict[str, Any]) -> tuple[int, int, int]:
    """(tensor parallel, pipeline parallel, data-parallel replicas) of a row: ``num_gpus`` beyond ``tp`` are
    pipeline stages where the row says so (a ``pipeline_parallel_size`` setting, or "PP" / "pipeline" in its
    workload or notes), else replicas of the same deployment, each serving an equal share of the requests."""
    tp = int(row["tp"])
    gpus = int(row.get("num_gpus") or tp)
    pp = int(settings.get("pipeline_parallel_size", 0))
    if not pp:
        stated = re.search(r"\bpp\s*[=:]?\s*\d|pipeline", f"{row['workload']} {row.get('notes', '')}", re.I)
        pp = max(1, gpus // tp) if stated else 1
    if gpus % (tp * pp):
        raise ValueError(f"num_gpus {gpus} is no multiple of tp {tp} x pp {pp}")
    return tp, pp, gpus // (tp * pp)


def case_of(row: dict[str, str], n_offline: int, classic: bool = False, online: bool = True,
            trtllm_build: bool = False, v0_host_ratio: float | None = None) -> Case:
    """The run that represents ``row``; raises ValueError/KeyError/ScenarioError saying why it cannot be.
    ``trtllm_build``: a row whose engine trtllm-bench built runs with the limits it picks (``trtllm_bench_build``).
    ``v0_host_ratio``: a ``vllm-v0`` row runs with that host time ratio in place of its version's, without the
    preset's cap on a decode step's host time (a diagnostic: at 0 the row's error is the roofline's and the serving
    layer's alone, docs/throughput-residuals.md)."""
    metric = row["metric"]
    _, key, scale = metric_of(row)
    model = MODELS.get(row["model"]) or match_model(row["model"])
    # a checkpoint the weight column names ("fp8 (meta-llama/Llama-3.1-405B-FP8)") is its own preset where it
    # differs from the base model's: Meta's FP8 leaves attention in bf16 (sim/hardware/quant.py)
    ckpt = re.search(r"\(([\w.-]+/[\w.-]+)\)", row["weight_dtype"])
    if model and ckpt and (named := match_model(ckpt.group(1))) and named.startswith(f"{model}-"):
        model = named
    if model is None:
        raise KeyError(f"model {row['model']}: no preset (sim/hardware/presets/models.py)")
    engine_text = row["engine"]
    if engine_text.startswith("vLLM v0.6") and any(f in row["source"] for f in MULTI_STEP_FIGURES) \
            and "scheduler-steps" not in engine_text:
        engine_text += " (--num-scheduler-steps 10)"
    engine, assumed = engine_of_row(engine_text)
    if engine is not None and engine["name"] == "vllm-v0" and v0_host_ratio is not None:
        engine["host_time_ratio"] = v0_host_ratio
    gpu = match_gpu(row["gpu"])
    if gpu is None:
        raise KeyError(f"GPU {row['gpu']}: no preset (sim/hardware/presets/gpus.py)")
    isl, osl = _number(row["input_len"]), _number(row["output_len"])
    wd = row["weight_dtype"].split()[0]
    kd = row["kv_dtype"].split()[0]
    kd = "auto" if kd == "unstated" else kd
    rate = row["request_rate"]
    settings = settings_of(row)
    stated = PROMPT_COUNT.search(row["workload"])  # "500 sonnet prompts"; not ISL=500 or OSL=500
    n = 1 if metric == "tok_s_batch1" else (int(stated.group(1)) if stated else n_offline)
    n = settings.get("num_prompts", n)
    ins, outs = [isl] * n, [osl] * n
    longest = isl + osl  # max_model_len, unless a setting states it
    textless = None
    if "sharegpt" in row["workload"].lower() and "(avg)" in row["input_len"] + row["output_len"] \
            and "lengths" not in settings:
        ins, outs = sharegpt_lengths(isl, osl, n)
        longest = max(i + o for i, o in zip(ins, outs, strict=True))
    if "(mean" in row["output_len"] and (cap := EOS_CAP.search(row["output_len"])) and "lengths" not in settings:
        outs = eos_lengths(osl, int(cap.group(1) or cap.group(2)), n)
        longest = max(longest, max(i + o for i, o in zip(ins, outs, strict=True)))
    if "lengths" in settings:
        ins, published = lengths_of(row)
        # benchmark_serving.py's output length counts the tokens of the text it received: 0 when the model's first
        # token was its end of sequence (a base model stops at once on many ShareGPT prompts; dstack's H100 runs:
        # 378 of 1000). The engine still prefilled the prompt and sampled that one token.
        textless = [o == 0 for o in published]
        outs = [max(o, 1) for o in published]
        n = len(ins)
        longest = max(i + o for i, o in zip(ins, outs, strict=True))
    tp, pp, replicas = parallelism_of(row, settings)
    if replicas > 1:  # data parallel: each replica serves every replicas-th request, at its share of the rate
        ins, outs = ins[::replicas], outs[::replicas]
        textless = textless[::replicas] if textless is not None else None
        n = len(ins)
    dep: dict[str, Any] = {"model": model, "gpu": gpu, "tensor_parallel_size": tp,
                           "weight_dtype": wd, "kv_dtype": kd, "max_model_len": longest}
    dep |= {k: v for k, v in settings.items() if k in DEPLOYMENT_SETTINGS} | (
        {"pipeline_parallel_size": pp} if pp > 1 else {})
    if engine is not None and not classic:
        dep["engine"] = engine | {k: v for k, v in settings.items() if k in ENGINE_SETTINGS}
    if row["engine"].lower().startswith("gpt-fast") and wd in TORCH_WEIGHT_ONLY_BANDWIDTH:
        # gpt-fast's int8 and int4 weight-only linears are torchao's kernels, whose weights stream slower than bf16's
        dep["cost_model"] = {"type": "analytic", "weight_only_bandwidth": TORCH_WEIGHT_ONLY_BANDWIDTH[wd]}
    if online and PROFILE_GENERATION in row["workload"]:
        # LMDeploy's Python client: its own time on each request, one at a time, as the serving layer's per-request
        # handling (no tokenizer: random token ids; no detokenizer: the stream carries token ids)
        dep["serving"] = {"request_handling_s": PROFILE_GENERATION_SUBMIT_S + PROFILE_GENERATION_SUBMIT_PER_GPU_S
                          * (tp - 1), "tokenize_s_per_token": 0.0, "detokenize_s_per_token": 0.0}
    if online and online_row(row):
        dep["serving"] = "online"  # sim/costs/online.py: tokenizer, HTTP and streaming, as the client times them
    arrival: dict[str, Any] = {"type": "all_at_once"}
    request_rate = None
    if rate not in ("inf", "n/a"):
        request_rate = float(rate) / replicas
        arrival = {"type": "poisson", "rate": request_rate}
    raw = {"name": "published", "workload": {"arrival": arrival, "num_requests": n,
                                             "prompt_len": {"type": "fixed", "value": isl},
                                             "output_len": {"type": "fixed", "value": osl}},
           "deployment": dep}
    if trtllm_build and engine is not None and not classic and TRTLLM_BENCH_BUILD in row["notes"] \
            and not POLICY_SETTINGS & settings.keys():
        # the engine trtllm-bench built for this dataset (sim/engines/tensorrt_llm.py): its max_batch_size, and its
        # max_num_tokens, which the activations are sized for; a whole sequence still fits one unchunked step
        bs, tokens = trtllm_bench_build(resolve_model(model), tp, isl, osl, 1 if wd == "fp8" else 2,
                                        1 if kd == "fp8" else 2, resolve_gpu(gpu).memory_bytes)
        settings |= {"max_num_seqs": bs, "max_num_batched_tokens": max(tokens, longest)}
    if policy := {k: v for k, v in settings.items() if k in POLICY_SETTINGS}:
        raw["policy"] = {"type": "continuous", **policy}
    cfg = variant_configs(parse_scenario(raw, "published row"))[0]
    build(cfg)  # refuses what does not fit, with the reason
    value = float(row["value"])
    # benchmark_latency's batch time: its requests / that time; gpt-fast's tok/s: tokens / whole generate()
    agg = {key: value * scale if scale > 0 else osl / value if scale == 0 else n / value if scale == BATCH
           else 1 / value}
    if key.endswith("throughput") and scale != BATCH:  # a batch's wall time is each replica's own
        agg[key] /= replicas  # one replica's share of the whole deployment's rate
    # --max-concurrency with the rate inf: a closed loop of that many users (sim.output.benchfiles.validate)
    run = BenchRun(source=f"{row['engine'][:22]} {row['model']} {row['gpu'][:14]} tp{row['tp']} {isl}/{osl}",
                   input_lens=ins, output_lens=outs, aggregates=agg, request_rate=request_rate,
                   burstiness=1.0 if request_rate else None,
                   max_concurrency=max(1, settings["max_concurrency"] // replicas) if "max_concurrency" in settings
                   else None)
    # benchmark_serving.py's initial test run sends the first request's prompt and waits for it before the run;
    # vLLM V1 caches every prompt block by default, so the run's first request finds its prompt cached. V0 (prefix
    # caching off by default) keeps nothing. A closed loop's one request in hundreds is left out.
    warm = bool(online and online_row(row) and engine and engine["name"] == "vllm-v1" and not classic
                and run.max_concurrency is None)
    earlier = tuple(int(x) for x in str(settings.get("earlier_runs", "")).split("+") if x)
    if earlier and not (online_row(row) and engine and engine["name"] == "vllm-v1" and run.max_concurrency is None):
        raise ValueError("earlier_runs: only a V1 server's runs of requests sent at once keep prompts cached")
    earlier = earlier if warm else ()  # --offline, --classic: no serving benchmark, nothing cached before
    return Case(row, cfg, run, key, scale, textless, warm, earlier, assumed)


def warmup_request(wl: GeneratedWorkload, run_warmup: Callable[[GeneratedWorkload], float]) -> GeneratedWorkload:
    """The workload after benchmark_serving.py's initial test run: request 0 repeats the first prompt (one
    output token here: its length only moves the start, and its decode would add gaps to the ITLs), the run's
    requests follow as ids 1.. once it has finished (``run_warmup`` gives when), the first sharing its prompt."""
    first = wl.requests[0]
    prompt = tuple(range(-(-first.prompt_len // first.hash_block_size)))  # the warm-up's and the first's alone
    warm = replace(first, id=0, arrival=0.0, output_len=1, hash_ids=prompt, session_id=None)
    start = run_warmup(GeneratedWorkload((warm,)))
    rest = tuple(replace(r, id=r.id + 1, arrival=r.arrival + start, hash_ids=prompt if r.id == 0 else r.hash_ids)
                 for r in wl.requests)
    return GeneratedWorkload((warm, *rest), wl.closed_loop, wl.failures)


def server_history(wl: GeneratedWorkload, earlier: tuple[int, ...],
                   finish: Callable[[GeneratedWorkload], float]) -> tuple[GeneratedWorkload, int]:
    """The workload after the runs the same server ran before it (``earlier``: their prompt counts, oldest first)
    and the requests that are no part of it (the count to skip). benchmark_serving.py's random prompts come from
    its seed (0 unless given), so an earlier run of n prompts sent this run's first n prompts, and vLLM V1 keeps
    their blocks in its prefix cache until it needs the room (dennislee22's logs show it: a server's "Prefix cache
    hit rate" climbs run after run). Each run, this one too, starts with its warm-up request (the first prompt, one
    output token) and is sent once the one before has finished (``finish``: when a workload's last request does);
    an earlier run's requests have this run's lengths."""
    reqs = wl.requests
    blocks = [-(-r.prompt_len // r.hash_block_size) for r in reqs]
    prompts = [tuple(range(i * max(blocks), i * max(blocks) + b)) for i, b in enumerate(blocks)]
    out: list[RequestSpec] = []
    for n in (*earlier, len(reqs)):
        start = finish(GeneratedWorkload(tuple(out))) if out else 0.0
        out.append(replace(reqs[0], id=len(out), arrival=start, output_len=1, hash_ids=prompts[0], session_id=None))
        start = finish(GeneratedWorkload(tuple(out)))
        out += [replace(r, id=len(out) + r.id, arrival=start + r.arrival, hash_ids=prompts[r.id], session_id=None)
                for r in reqs[:n]]
    return GeneratedWorkload(tuple(out), wl.closed_loop, wl.failures), len(out) - len(reqs)


def client_stats(result: RunResult, textless: list[bool], skip: int = 0,
                 itls: np.ndarray | None = None) -> dict[str, float]:
    """The statistics as vLLM 0.6's benchmark_serving.py computes them when some streams carry no text: it starts
    a request's TTFT at its first chunk with text, so a textless request keeps TTFT 0 and output length 0, and
    both count in the means and throughputs (backend_request_func.py's ``RequestFuncOutput`` defaults, and
    ``calculate_metrics`` averaging every successful request); TPOT skips requests of at most one token. The first
    ``skip`` requests (a warm-up, earlier runs) are no part of the run: its duration starts when the first of the
    others is sent. ``itls``: the run's own inter-token gaps, where the skipped requests have gaps of their own."""
    lists = {k: v[skip:] for k, v in run_lists(result).items()}
    if len(lists["ttfts"]) != len(textless):
        raise ValueError(f"{len(lists['ttfts'])} simulated requests for {len(textless)} published lengths")
    ttfts = [0.0 if t else x for x, t in zip(lists["ttfts"], textless, strict=True)]
    outs = [0 if t else x for x, t in zip(lists["output_lens"], textless, strict=True)]
    start = min(lists["start_times"]) if skip else 0.0
    duration = max(a + t for a, t in zip(lists["start_times"], lists["latencies"], strict=True)) - start \
        if skip else result.duration
    stats = bench_stats(ttfts, lists["latencies"], outs, lists["input_lens"], np.zeros(0) if itls is None else itls,
                        duration)
    if itls is not None:
        return stats
    # a one-token request has no inter-token gap, so the simulated ITLs are the client's
    return stats | {k: v for k, v in run_stats(result).items() if k.endswith("_itl")}


def predict(cases: list[Case], knobs: dict[str, float] | None = None) -> list[float]:
    """Simulated / measured - 1 of every case (higher-is-better metrics as they are; TPOT and E2EL inverted so that
    a positive error always means the simulator predicts the engine faster)."""
    from calibration.bench_fit import simulate_runs, with_knobs

    # no knobs given: none set, so each row's engine preset sets those it has (sim/engines/costs.py) and the cost
    # model's defaults the rest (DEFAULTS are those defaults, but set explicitly they would override the preset's)
    knobs = {} if knobs is None else knobs
    plain = [c for c in cases if c.textless is None and not c.warmup]
    sims = dict(zip(map(id, plain), simulate_runs([c.cfg for c in plain], [c.run for c in plain], knobs),
                    strict=True))
    for c in cases:
        if id(c) in sims:
            continue
        # the client's conventions need the run's requests, not its statistics
        cfg = with_knobs(c.cfg, knobs)
        wl, _ = rebuild_workload(c.run)
        skip = int(c.warmup)
        if c.earlier:
            wl, skip = server_history(wl, c.earlier, lambda w, cfg=cfg: max(
                r.finish for r in simulate_variant(cfg, w, name=cfg.name)[0].requests))
        elif c.warmup:
            wl = warmup_request(wl, lambda w, cfg=cfg: simulate_variant(cfg, w, name=cfg.name)[0].requests[0].finish)
        result, reqs, _ = simulate_variant(cfg, wl, name=cfg.name, keep_token_times=bool(c.earlier))
        # earlier runs' requests decode too: the run's ITLs are its own requests' gaps
        itls = np.concatenate([np.diff(r.token_times) for r in reqs if r.id >= skip and r.token_times]) \
            if c.earlier else None
        sims[id(c)] = client_stats(result, c.textless or [False] * len(c.run.input_lens), skip, itls)
    out = []
    for c in cases:
        ratio = sims[id(c)][c.key] / c.run.aggregates[c.key]
        out.append(ratio - 1 if c.key.endswith("throughput") else 1 / ratio - 1)
    return out


def _summary(label: str, errs: list[float], width: int = 44) -> str:
    a = np.abs(errs)
    return (f"{label:{width}s} {len(a):4d} rows  median |error| {np.median(a):6.1%}  within 25%: "
            f"{np.mean(a <= 0.25):5.0%}  bias (median) {np.median(errs):+6.1%}")


# issue 38's bars on each class's median |error| (E2E has none) and on the rows within 25%
TARGETS = {"TTFT": 0.20, "decode speed": 0.12, "throughput": 0.08}
MISS = 0.25


def median_needs(errs: list[float], target: float) -> tuple[int, int]:
    """Rows whose |error| is within ``target``, and how many must be for the median |error| to be within it: the
    middle row of an odd count, both middle rows of an even one (``len // 2 + 1``)."""
    return int(np.sum(np.abs(errs) <= target)), len(errs) // 2 + 1


def miss_groups(keyed: list[tuple[tuple[str, ...], float]], limit: int = 12) -> list[tuple[tuple[str, ...], int, int,
                                                                                           int, float]]:
    """The groups of rows (``(key, error)``, the key naming source, engine and metric) with the most errors beyond
    25%, each as ``(key, misses, of them too fast, rows, median error)``; most misses first, then the larger group,
    then the key. What to look at next: a mechanism that explains a group moves many rows at once."""
    groups: dict[tuple[str, ...], list[float]] = {}
    for key, x in keyed:
        groups.setdefault(key, []).append(x)
    out = [(k, sum(abs(x) > MISS for x in e), sum(x > MISS for x in e), len(e), float(np.median(e)))
           for k, e in groups.items()]
    out = [g for g in out if g[1]]
    return sorted(out, key=lambda g: (-g[1], -g[3], g[0]))[:limit]


def loso_coverage(pairs: list[tuple[str, float]]) -> tuple[int, int, list[str]]:
    """Rows whose error falls inside the 10th-90th percentiles of the other sources' errors (their class's rows
    only, each source weighing the same: ``source_percentiles``), the rows that had such an interval, and the
    sources that had none (no other source in the class)."""
    inside = total = 0
    alone = []
    for src in sorted({s for s, _ in pairs}):
        others = [(s, x) for s, x in pairs if s != src]
        if not others:
            alone.append(src)
            continue
        lo, hi = source_percentiles(others)
        mine = [x for s, x in pairs if s == src]
        inside += sum(lo <= x <= hi for x in mine)
        total += len(mine)
    return inside, total, alone


def interval_line(cls: str, pairs: list[tuple[str, float]]) -> str:
    if not pairs:
        return f"{cls:14s} no rows: no interval"
    lo, hi = source_percentiles(pairs)
    inside, total, alone = loso_coverage(pairs)
    cover = f"leave-one-source-out coverage {inside}/{total} = {inside / total:.0%}" if total else \
        "one source: no leave-one-source-out check"
    return (f"{cls:14s} error 10th-90th percentile over all {len(pairs)} rows, each source weighing the same "
            f"[{lo:+.1%}, {hi:+.1%}]; {cover}")


INTERVALS = ROOT / "sim" / "metrics" / "intervals.py"  # where the run's 80% intervals are applied
# the two assignments of INTERVALS that ``--write-intervals`` replaces, with the comment line between them
INTERVAL_BLOCK = re.compile(r"^ERROR_QUANTILES: .*?^LOSO_COVERAGE: [^}]*}\n", re.S | re.M)


def _two_a_line(head: str, items: list[str]) -> str:
    """``head`` and ``items`` as a dict literal of two items a line, continuation lines under the first item."""
    pad = " " * (len(head) + 1)
    lines = [", ".join(items[i:i + 2]) for i in range(0, len(items), 2)]
    return head + "{" + (",\n" + pad).join(lines) + "}\n"


def interval_constants(by_class: dict[str, list[tuple[str, float]]]) -> str:
    """sim/metrics/intervals.py's ``ERROR_QUANTILES`` and ``LOSO_COVERAGE`` for these errors (``(source,
    error)`` per class, in ``CLASSES`` order): each class's 10th and 90th percentiles, each source weighing the same
    (``source_percentiles``, to three decimals), and its leave-one-source-out coverage as the fraction of its rows
    (None where one source has the class), the figures the report's interval lines print."""
    quantiles, coverage = [], []
    for cls in CLASSES:
        pairs = by_class.get(cls)
        if not pairs:
            raise ValueError(f"no {cls} rows: an interval needs the class's errors")
        lo, hi = source_percentiles(pairs)
        quantiles.append(f'"{cls}": ({lo:.3f}, {hi:.3f})')
        inside, total, _ = loso_coverage(pairs)
        coverage.append(f'"{cls}": ' + (f"{inside} / {total}" if total else "None"))
    return (_two_a_line("ERROR_QUANTILES: dict[str, tuple[float, float]] = ", quantiles)
            + "# the same run's leave-one-source-out check (None: one source, nothing to check against)\n"
            + _two_a_line("LOSO_COVERAGE: dict[str, float | None] = ", coverage))


def write_intervals(by_class: dict[str, list[tuple[str, float]]], path: Path = INTERVALS) -> None:
    """Put this run's ``interval_constants`` in place of ``path``'s (sim/metrics/intervals.py), so that the
    intervals servesim applies are the report's figures, never copied by hand."""
    text = path.read_text()
    if len(INTERVAL_BLOCK.findall(text)) != 1:
        raise ValueError(f"{path}: no single ERROR_QUANTILES ... LOSO_COVERAGE block to replace")
    path.write_text(INTERVAL_BLOCK.sub(lambda _: interval_constants(by_class), text))


def read_rows(files: list[Path]) -> list[dict[str, str]]:
    """Every row of the given CSVs, in order (the shared set's and this repository's share one format; the
    optional ``settings`` column is empty where a file lacks it)."""
    rows = []
    for path in files:
        with path.open() as f:
            rows += [r | {DIR_KEY: str(path.parent)} for r in csv.DictReader(f)]
    return rows


def report(n_offline: int, classic: bool = False, data: list[Path] | None = None, online: bool = True,
           trtllm_build: bool = False, only: str | None = None, v0_host_ratio: float | None = None,
           intervals: Path | None = None) -> None:
    """The report over every row of ``data``; ``only``: the rows whose source (as ``source_of`` names it) or engine
    column holds that text; ``intervals``: the file whose 80% intervals the run's replace (``write_intervals``)."""
    files = data or [DATA, OWN_DATA]
    rows = read_rows(files)
    print("rows from " + ", ".join(f"{p.name} ({len(read_rows([p]))})" for p in files))
    if only is not None:
        rows = [r for r in rows if only in source_of(r) or only in r["engine"]]
        if not rows:
            print(f"error: --only {only!r}: no row's source or engine holds it", file=sys.stderr)
            raise SystemExit(2)
        print(f"only the {len(rows)} rows whose source or engine holds {only!r}")
    if v0_host_ratio is not None:
        print(f"vllm-v0 rows with host_time_ratio {v0_host_ratio:g} in place of their version's, uncapped")
    cases, refused = [], []
    for r in rows:
        try:
            cases.append(case_of(r, n_offline, classic, online, trtllm_build, v0_host_ratio))
        except (ValueError, KeyError, ScenarioError) as e:
            refused.append((r, str(e).strip("'\"")))
    t0 = time.process_time()
    errs = predict(cases)
    print(f"{len(rows)} rows: {len(cases)} simulated, {len(refused)} not representable "
          f"({time.process_time() - t0:.0f} s CPU); "
          f"{sum(online_row(c.row) for c in cases)} measured through an HTTP server, run "
          + ("with the online-serving layer (sim/costs/online.py)" if online else "without the online-serving layer"))
    sources = [source_of(c.row) for c in cases]
    classes = [metric_of(c.row)[0] for c in cases]
    # The headline is what a new engine or GPU would see: every row predicted by a model that has not seen its
    # source. Nothing in this run is fitted to the rows (the cost model's documented defaults, the presets'
    # constants from the documents sim/engines/registry.py and sim/engines/costs.py cite), so a row's
    # leave-one-source-out prediction is its plain prediction. One preset constant is read from a source of these
    # rows: vLLM 0.5.3's host time (sim/engines/costs.py) is the profile in the vLLM v0.6.0 post, which also holds
    # the 0.5.3 rows.
    print("leave-one-source-out error by metric class (nothing is fitted to the rows, so it is the plain error; "
          "positive: the simulator predicts faster than measured)")
    for cls in CLASSES:
        e = [x for k, x in zip(classes, errs, strict=True) if k == cls]
        print("  " + (_summary(f"{cls} ({len(set(s for s, k in zip(sources, classes, strict=True) if k == cls))} "
                               "sources)", e) if e else f"{cls:44s}    0 rows in this set"))
    # issue 38's fourth bar (85% of all rows within 25%) is over every class at once; one decimal, as the bar is near
    inside = int(np.sum(np.abs(errs) <= 0.25))
    print("  " + _summary(f"all classes ({len(set(sources))} sources)", errs)
          + f"  ({inside}/{len(errs)} = {inside / len(errs):.1%} within 25%)")
    for cls, target in TARGETS.items():
        if e := [x for k, x in zip(classes, errs, strict=True) if k == cls]:
            within, needed = median_needs(e, target)
            print(f"  {cls}: {within} of {len(e)} rows within issue 38's {target:.0%}, {needed} for the median")
    print("leave-one-source-out error by source and metric class")
    by_source: dict[tuple[str, str], list[float]] = {}
    for s, k, x in zip(sources, classes, errs, strict=True):
        by_source.setdefault((s, k), []).append(x)
    for (s, k), e in sorted(by_source.items(), key=lambda kv: (CLASSES.index(kv[0][1]), kv[0][0])):
        print("  " + _summary(f"{k:12s} {s[:62]}", e, 76))
    print("80% intervals from leave-one-source-out residuals (each source's rows against the 10th-90th "
          "percentiles of the other sources' errors in its class, each source weighing the same; target coverage "
          "70-90%)")
    by_class = {cls: [(s, x) for s, k, x in zip(sources, classes, errs, strict=True) if k == cls] for cls in CLASSES}
    for cls in CLASSES:
        print("  " + interval_line(cls, by_class[cls]))
    if intervals is not None:
        write_intervals(by_class, intervals)
        print(f"  written to {intervals.relative_to(ROOT) if intervals.is_relative_to(ROOT) else intervals}")
    print(f"largest groups of rows beyond {MISS:.0%} (misses, of them too fast, rows, median error; source, engine, "
          "model and tensor parallelism, metric)")
    for (src, engine, model, metric), n, fast, rows, med in miss_groups(
            [((s, c.row["engine"], f"{c.row['model']} tp{c.row['tp']}", c.row["metric"]), x)
             for s, c, x in zip(sources, cases, errs, strict=True)]):
        print(f"  {n:4d} {fast:4d} {rows:4d} {med:+8.1%}  {src[:40]:40s} {engine[:28]:28s} {model[:26]:26s} {metric}")
    print("by engine and metric")
    groups: dict[str, list[float]] = {}
    for c, x in zip(cases, errs, strict=True):
        groups.setdefault(f"{c.row['engine'][:30]} {c.row['metric']}", []).append(x)
    for k, e in groups.items():
        print("  " + _summary(k, e))
    print("every row")
    for c, x in zip(cases, errs, strict=True):
        print(f"  {c.run.source:70s} {c.row['metric']:18s} measured {float(c.row['value']):9.1f}  error {x:+7.1%}")
    if assumed := sorted({c.row["engine"] for c in cases if c.assumed_engine}):
        print(f"run on vLLM V1's preset, no preset being theirs: {', '.join(assumed)}")
    print("not representable")
    for r, why in refused:
        print(f"  {r['engine'][:28]:28s} {r['model']:18s} {r['gpu'][:16]:16s} {r['metric']:22s} {why}")


def fit(engine: str, gpu: str, n: int, max_iter: int, robust: float, classic: bool = False,
        data: Path = DATA) -> None:
    """Issue 14's held-out check: fit the knobs on every other row of one engine and GPU, predict the rest."""
    from calibration.bench_fit import DEFAULTS, fit_knobs

    with data.open() as f:
        rows = [r for r in csv.DictReader(f) if r["engine"].startswith(engine) and r["gpu"].startswith(gpu)
                and r["metric"] == "output_tok_s_total"]
    cases = []
    for r in rows:
        try:
            cases.append(case_of(r, n, classic))
        except (ValueError, KeyError, ScenarioError) as e:
            print(f"  skipped {r['model']} tp{r['tp']} {r['input_len']}/{r['output_len']}: {e}")
    train, test = cases[0::2], cases[1::2]
    t0 = time.process_time()
    before = predict(test, DEFAULTS)
    knobs, train_err, nfev = fit_knobs([c.cfg for c in train], [c.run for c in train], max_iter=max_iter,
                                       robust=robust or None)
    after = predict(test, knobs)
    print(f"{engine} on {gpu}: {len(cases)} rows, {len(train)} to fit, {len(test)} held out, {n} requests per row, "
          f"engine preset {cases[0].cfg.deployment.engine}")
    print("fitted knobs: " + ", ".join(f"{k}={v:.4g}" for k, v in knobs.items()))
    print(f"training median |error| {train_err:.1%} ({nfev} simulations of the training half)")
    print(f"held-out median |error|: default knobs {np.median(np.abs(before)):.1%}, "
          f"fitted {np.median(np.abs(after)):.1%}")
    for c, e0, e1 in zip(test, before, after, strict=True):
        print(f"  {c.run.source:60s} measured {float(c.row['value']):9.1f} tok/s  default {e0:+.1%}  "
              f"fitted {e1:+.1%}")
    print(f"CPU time {time.process_time() - t0:.1f} s")
    assert math.isfinite(float(np.median(np.abs(after))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, action="append",
                    help="a CSV of rows, or the folder holding published-dev.csv; repeatable (default: "
                         "../shared/data/published-dev/ from the repository root and benchmarks/data/published-own/)")
    ap.add_argument("--requests", type=int, default=None, help="requests per offline row (default: 3000; --fit 256)")
    ap.add_argument("--classic", action="store_true", help="every row on servesim's classic engine (no presets)")
    ap.add_argument("--offline", action="store_true", help="no online-serving layer on the rows measured through an "
                    "HTTP server (the figures before it)")
    ap.add_argument("--trtllm-bench-build", action="store_true", help="TensorRT-LLM rows built by trtllm-bench run "
                    "with the max_batch_size and max_num_tokens its heuristics pick (docs/throughput-residuals.md)")
    ap.add_argument("--only", metavar="TEXT", help="only the rows whose source or engine holds TEXT (e.g. "
                    "results_benchmark_llm_serving, amd/inference, 'vLLM v0.4.3')")
    ap.add_argument("--v0-host-time-ratio", type=float, metavar="R", help="vllm-v0 rows with host_time_ratio R "
                    "in place of their version's (0.5: 1.63, 0.6: 0.7, capped on one GPU at 4 ms + 80 us a row; given: "
                    "uncapped; 0: the roofline and serving layer alone)")
    ap.add_argument("--write-intervals", action="store_true", help="put the run's 80%% intervals and their "
                    "leave-one-source-out coverage in sim/metrics/intervals.py (the default run only)")
    ap.add_argument("--fit", action="store_true", help="issue 14's held-out calibration instead of the report")
    ap.add_argument("--engine", default="TensorRT-LLM v0.17")
    ap.add_argument("--gpu", default="H100-SXM-80GB")
    ap.add_argument("--max-iter", type=int, default=4)
    ap.add_argument("--robust", type=float, default=0.1, help="soft-L1 scale of the log errors (0: plain squares)")
    args = ap.parse_args()
    if args.write_intervals and args.fit:  # the fit prints no intervals: the flag was dropped after minutes of it
        ap.exit(2, "error: --write-intervals writes the report's intervals; --fit runs no report\n")
    data = [p / DATA.name if p.is_dir() else p for p in args.data or [DATA, OWN_DATA]]
    for p in data:
        if not p.is_file():
            ap.exit(2, f"error: {p}: the published development set is not there; give its CSV with --data\n")
    if args.fit:
        fit(args.engine, args.gpu, args.requests or 256, args.max_iter, args.robust, args.classic, data[0])
    else:
        if args.v0_host_time_ratio is not None and args.v0_host_time_ratio < 0:
            ap.exit(2, f"error: --v0-host-time-ratio {args.v0_host_time_ratio:g}: a host time ratio is >= 0\n")
        changed = [f for f, on in (("--data", args.data), ("--requests", args.requests), ("--classic", args.classic),
                                   ("--offline", args.offline), ("--trtllm-bench-build", args.trtllm_bench_build),
                                   ("--only", args.only is not None),
                                   ("--v0-host-time-ratio", args.v0_host_time_ratio is not None)) if on]
        if args.write_intervals and changed:
            ap.exit(2, f"error: --write-intervals: the intervals servesim applies come from the default run, not one "
                       f"with {', '.join(changed)}\n")
        report(args.requests or OFFLINE_REQUESTS, args.classic, data, not args.offline, args.trtllm_bench_build,
               args.only, args.v0_host_time_ratio, INTERVALS if args.write_intervals else None)


if __name__ == "__main__":
    main()
