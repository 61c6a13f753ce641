"""Published energy per output token against the simulator's power model (sim/costs/energy.py), and its shape.

The development set (``benchmarks/data/energy-published.csv``) holds figures others measured and published, each row
with its source's address and its conditions (model, GPU and count, weight dtype, engine and version, batch size,
task, mean output length, and where published the mean power and output throughput):

- ML.ENERGY Leaderboard v3.0 (Dec 2025), 200 rows: every LLM configuration of the leaderboard's published data
  (github.com/ml-energy/leaderboard at 0cd52da, ``public/data/tasks/{lm-arena-chat,gpqa}.json``) whose model has a
  servesim preset and that runs tensor parallel only: Llama-3.1 8B/70B/405B (bf16; 405B also in Meta's FP8 release,
  run on its own preset, ``model_of``), Llama-3.3-70B,
  Qwen3 8B/14B/32B and Qwen3-30B-A3B on H100 and B200, batch (``max_num_seqs``) 8 to 4096, chat and GPQA (reasoning).
- ML.ENERGY Leaderboard v2.0 (Sep 2024), 1 row: Llama-3.1-8B on one H100 at batch 64 with vLLM 0.5.4, from its
  published data file (ml-energy/leaderboard-v2 at c3af7f3): 0.171 J per output token, 1,785 tok/s, 482.8 output
  tokens a request (the longitudinal post's chart reads 0.20 J).
- Serial Alice benchmark (Jun 2026, its Reddit post and benchmark page), 3 rows: Mistral-7B on an H100 SXM with vLLM's
  AsyncLLMEngine (version unstated, taken as a v1 release), bf16, batch 1 (732 uWh = 2.64 J/token) and 128 (13.8 uWh
  = 0.050 J), and Mixtral-8x7B on one B200 at batch 128 (36.4 uWh = 0.131 J); NVML at 100 ms. Its lengths are
  unstated: the defaults below.
- fleet-sim's B200 context-length sweep (Apr 2026, vllm-project/semantic-router at b1de045,
  ``src/fleet-sim/studies/context-length-power-efficiency/data/b200_table1_measurements``), 7 rows: Llama-3.1-70B in
  fp16 at TP 8 on eight B200s, vLLM 0.20.0, at ``max-model-len`` 2K to 128K, as many streams as vLLM's KV cache
  holds at that length (its logged "Maximum concurrency", 1,725 to 28), output_len 512 (2,048 at 128K), decode tok/s
  and one GPU's mean power over the window where every stream decodes (``all_overlap``: the last first token to the
  first finish). Prompt lengths, sampling and ``max-num-seqs`` are unstated: each prompt is taken as the context
  less the output (column ``prompt_tokens``: the streams that fill the KV cache, as the study counts them), greedy,
  every stream running at once. A source independent of ML.ENERGY for the B200; nothing fitted to it.

What ML.ENERGY v3.0 documents, and so each row runs with (ml-energy/benchmark at c1d6557; the row's columns where
it varies): vLLM 0.11.1 (``docs/overview.md``; the B200 rows the same software and configurations, their GPUs at
1,000 W, the leaderboard's About page) with async scheduling, ``max-num-batched-tokens`` 8192 and
``max-model-len`` 20,480 chat or 40,960 GPQA (51,200 for Qwen3-30B-A3B-Thinking;
``configs/vllm/<task>/<model>/<GPU>/monolithic.config.yaml``, column ``max_model_len``); "batch size" is
``--max-num-seqs`` (``mlenergy/benchmark/llm/benchmark.py`` ``spawn_vllm``); ``max_tokens`` 4,096 chat or 32,768
GPQA (``configs/vllm/<task>/benchmark.yaml``, column ``max_output_tokens``); every request sent at once, 1,024 chat
or 198 GPQA requests times the configuration's
``num_request_repeats`` (``sweeps.yaml``; column ``num_requests``: the sum of the configuration's published
output-length histogram). Energy is Zeus's GPU energy of the job's GPUs only (``ZeusMonitor()`` in a process whose
``CUDA_VISIBLE_DEVICES`` are the server's), prefill included, over the harness's steady state: from the moment
``batch_size`` requests have their first token to the moment all but ``batch_size + 1`` have finished; per output
token means over the completion tokens (reasoning included) streamed in that window; power and tok/s are that
window's energy and tokens over its length (ml-energy/data ``mlenergy_data/records/runs.py``); ``avg_batch_size`` is
vLLM's ``num_requests_running`` averaged over it. Prompts: chat is LMArena's arena-human-preference-100k, each turn
of a conversation a request whose prompt holds the conversation so far; GPQA is GPQA-diamond's question and four
choices (``mlenergy/benchmark/llm/datasets.py``). Their token counts are published nowhere: 200 tokens is assumed
(``--prompt-tokens``). Documented and not modelled: a repeated request's prompt hitting vLLM's prefix cache. Its
temperature 0.8, top-p 0.95 and repetition_penalty 1.1 (``benchmark.py``) are each v3.0 row's ``workload.sampling``
(``SAMPLING``; the penalty's per-step host work, sim/engines/sampling.py ``PENALTY_HOST_TIME``, stays under every
row's forward and changes no figure here): vLLM 0.11.1 (and 0.5's V0) sorts each row's whole vocabulary for top-p, its
FlashInfer sampler off by default since vLLM PR #26859 (the harness sets no ``VLLM_USE_FLASHINFER_SAMPLER``),
priced by sim/engines/sampling.py.

v2.0's row runs as its harness did (leaderboard-v2 ``benchmark/llm_text_generation/chat``): 500 ShareGPT first-turn
prompts sent 4 times, all at once, ``max_tokens`` 1,024 and ``max-model-len`` 4,096, temperature 0.8 and top-p 0.95;
its energy and tokens run from the start to the step that schedules the last waiting request
(``scripts/aggregate_leaderboard_data.py``: column ``energy_window``, ``until_queue_empty``).

Output lengths are the published run's own, drawn from its published histogram (``OUTPUT_LENGTHS``): chat's fall
off about as an exponential's (coefficient of variation 0.86-1.14), GPQA's do not (0.48-0.71: a request in its
steady state has generated 0.62-0.75 of the mean output, under an exponential all of it). A row without a histogram
draws them exponential, capped at its ``max_output_tokens`` (4,096 where unstated), with the mean before the cap
that makes the capped lengths average its published mean (``uncapped_mean``);
without a published mean output (Serial Alice's), about 717 tokens, the v3.0 post's mean text-conversation output.
vLLM 0.11 (and an unstated version) runs on the ``vllm-v1`` preset, 0.5 on ``vllm-v0`` 0.5 (its host loop stalls
the GPU). Nothing is fitted to a row; the power model's one fitted constant (sim/costs/energy.py's
MEMORY_POWER_SHARE) was fitted to v3.0's published mean power, not its joules. Beside each J/token error the power
and throughput errors say which side is wrong, the published and simulated steady-state batches (``avg_batch_size``,
vLLM's running requests) whether the simulated KV holds what vLLM's held; then each source's rows sorted by their
J/token error (``by_source``), and the summary splits each group's J/token error into the two (``breakdown``). At a
batch of 64 or less a v3.0 row's published median and p90 inter-token latencies (columns ``median_itl_ms``,
``p90_itl_ms``, from the same files) say what paced its steps (``pacing``): the GPU (p90 within 1.2x the median, as
in every H100 run) or something else (wider: the one-GPU B200 runs), and the summary groups the rows by it.
``--step-gaps`` prints instead, without simulating, each row's decode step (average batch / output tok/s) against
the roofline's and the time per row the roofline misses (sim/engines/vllm_v1.py reads it).

Then the shape the issue asks for, on a closed loop: J/token against batch size (1 to 256) and output length
(128 to 4096 tokens at batch 32), and B200 against H100 at batch 64.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_energy.py [--only SUBSTRING] [--requests N]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import servesim
from sim.costs.energy import run_energy
from sim.hardware.models import resolve_model
from sim.metrics.records import RunResult

DATA = Path(__file__).resolve().parent / "data" / "energy-published.csv"
# each v3.0 row's published output-length histogram: 50 equal bins from min_tokens to max_tokens, the counts
# summing to the row's num_requests (ml-energy/leaderboard public/data/models/*.json, output_length_distribution)
OUTPUT_LENGTHS = DATA.with_name("energy-published-output-lengths.csv")
PROMPT_TOKENS = 200  # assumed: the sources state no prompt lengths
OUTPUT_TOKENS = 717  # the ML.ENERGY v3.0 post's mean text-conversation output, for rows that publish none
MAX_OUTPUT = 4096  # max_tokens of a row that states none (the v3.0 chat harness's)
MAX_NUM_BATCHED_TOKENS = 8192  # every v3.0 configuration's max-num-batched-tokens (vLLM 0.11 chunks prefills)
# what each source's harness sends (vLLM's names): ML.ENERGY v3.0's benchmark.py and v2.0's chat harness sample at
# temperature 0.8 and top-p 0.95, v3.0 also with repetition_penalty 1.1; Serial Alice states none, so it runs as the
# benchmark clients send by default (greedy). Top-p costs vLLM a sort of each row's vocabulary each step, a penalty
# the host's rebuild of each row's tokens (sim/engines/sampling.py)
SAMPLING = {"ML.ENERGY Leaderboard v3.0": {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1},
            "ML.ENERGY": {"temperature": 0.8, "top_p": 0.95}}
# A published run at batch <= 64 whose p90 inter-token latency exceeds its median by more than this was paced by
# something other than its GPU work (``pacing``): just above the widest of the H100 runs' spreads there (1.18)
ITL_JITTER = 1.2
# A row whose simulated output tok/s is within this of the published one has about the right time: its power error
# is then the power model's own (the summary's "tok/s within" groups)
TIME_MATCHED = 0.10
# Meta's FP8 checkpoints by the name a source gives them, and the preset that states their unconverted modules
META_FP8 = {"meta-llama/Llama-3.1-405B-Instruct-FP8": "llama-3.1-405b-fp8"}
# a row, and its J/token, power and output tok/s errors, and (where known) the J/token error of its simulated work at
# its published throughput (``work_at_published_time``)
Err = tuple[dict[str, str], float, float, float] | tuple[dict[str, str], float, float, float, float]


def model_of(row: dict[str, str]) -> str:
    """The preset that runs the row: the checkpoint the source names where it differs from its base model's.
    ML.ENERGY's 405B FP8 rows ran Meta's own FP8 release, meta-llama/Llama-3.1-405B-Instruct-FP8, which leaves
    every layer's attention and the first and last layers' MLP in bf16 (its config.json's modules_to_not_convert;
    "The Llama 3 Herd of Models", section 6.2): the ``llama-3.1-405b-fp8`` preset (sim/hardware/quant.py). The
    plain preset under fp8 reads every weight at one byte."""
    return META_FP8.get(row["published_model"], row["model"])


def engine_of(row: dict[str, str]) -> dict[str, Any]:
    """The row's deployment.engine: vLLM 0.5 and 0.6 are vllm-v0's presets; a v1 release (0.8 on, or unstated)
    vllm-v1's."""
    version = row["engine_version"][:3]
    if row["engine"] == "vllm" and version in ("0.5", "0.6"):
        return {"name": "vllm-v0", "version": version}
    return {"name": "vllm-v1"}


def _key(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(row[k] for k in ("model", "gpu", "num_gpus", "batch_size", "task"))


def published_output_lengths(row: dict[str, str]) -> np.ndarray | None:
    """One output length per request of the row's published run, drawn from its published histogram (within each
    bin uniformly, seeded, in a shuffled order); None when the row has no histogram."""
    with open(OUTPUT_LENGTHS, newline="") as f:
        hist = next((h for h in csv.DictReader(f) if _key(h) == _key(row)), None)
    if hist is None:
        return None
    counts = [int(c) for c in hist["counts"].split()]
    edges = np.linspace(float(hist["min_tokens"]), float(hist["max_tokens"]), len(counts) + 1)
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.uniform(edges[i], edges[i + 1], k) for i, k in enumerate(counts)])
    rng.shuffle(lengths)
    return np.maximum(np.round(lengths), 1).astype(np.int64)


def uncapped_mean(mean: float, cap: int) -> float:
    """The mean of the exponential whose draws, capped at ``cap``, average ``mean``: the capped mean of an
    exponential of mean m is m (1 - exp(-cap / m)), which grows with m from 0 to ``cap``, solved by bisection (the
    draws' rounding to whole tokens and their floor of 1 move it by under a thousandth of a token). v2.0's 482.8
    tokens under 1,024: 583.9 (drawn about 482.8 itself, they average 424.9 in theory, 441.9 in its seeded draw)."""
    if not 0 < mean < cap:
        raise ValueError(f"a mean output of {mean} tokens cannot come from lengths capped at {cap}")
    lo, hi = mean, 2 * mean
    while hi * -math.expm1(-cap / hi) < mean:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid * -math.expm1(-cap / mid) < mean else (lo, mid)
    return (lo + hi) / 2


def published_scenario(row: dict[str, str], requests: int, prompt: int = PROMPT_TOKENS,
                       lengths_dir: Path | None = None) -> dict[str, Any]:
    """The row's run as the ML.ENERGY harness drives it: every request sent at once, as many as the published run
    sent; a row without that count sends ``requests``, at least 3 batches and at most 32 (a batch of one runs 32
    requests one after another, not 512). Output lengths: the published run's own (``published_output_lengths``,
    written to a lengths file in ``lengths_dir``) where the row has them and ``lengths_dir`` is given, else
    exponential about the published mean."""
    batch = int(row["batch_size"])
    cap = int(row["max_output_tokens"]) if row["max_output_tokens"] else MAX_OUTPUT
    prompt = int(row["prompt_tokens"]) if row.get("prompt_tokens") else prompt  # the row's own, where it has one
    # a published mean is of the lengths its max_tokens cut, so the exponential drawn before the cap is longer; a
    # mean at the cap is every request at the cap (fixed lengths, as the fleet-sim sweep's output_len)
    fixed = bool(row["mean_output_tokens"]) and float(row["mean_output_tokens"]) == cap
    mean = (uncapped_mean(float(row["mean_output_tokens"]), cap) if row["mean_output_tokens"] and not fixed
            else OUTPUT_TOKENS)
    dep: dict[str, Any] = {"model": model_of(row), "gpu": row["gpu"], "tensor_parallel_size": int(row["num_gpus"]),
                           "weight_dtype": row["weight_dtype"]}
    if row["max_model_len"]:  # the server's --max-model-len, where the source states it, within the preset's
        # context (Qwen3-30B-A3B-Thinking-2507 serves 51,200 of its 262,144; the qwen3-30b-a3b preset holds 40,960)
        dep["max_model_len"] = min(int(row["max_model_len"]), resolve_model(model_of(row)).max_position_embeddings)
    policy: dict[str, Any] = {"type": "continuous", "max_num_seqs": batch}
    dep["engine"] = engine = engine_of(row)
    if engine["name"] == "vllm-v1":  # it always chunks prefills, here at the configurations' token budget
        policy |= {"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    # the published run's own count where the row has one (ML.ENERGY: 1,024 chat or 198 GPQA requests times the
    # configuration's repeats), else ``requests`` held to 3-32 batches
    n = int(row["num_requests"]) if row["num_requests"] else max(min(requests, 32 * batch), 3 * batch)
    workload: dict[str, Any] = {"arrival": {"type": "all_at_once"}, "num_requests": n,
                                "prompt_len": {"type": "fixed", "value": prompt},
                                "output_len": ({"type": "fixed", "value": cap} if fixed
                                               else {"type": "exponential", "mean": mean, "max": cap})}
    sampling = next((v for k, v in SAMPLING.items() if row["source"].startswith(k)), None)
    if sampling is not None:
        workload["sampling"] = sampling
    lengths = published_output_lengths(row) if lengths_dir is not None else None
    if lengths is not None and lengths_dir is not None:
        path = lengths_dir / ("-".join(_key(row)[:4]) + ("-gpqa" if "gpqa" in row["task"].lower() else "") + ".csv")
        path.write_text("prompt,output\n" + "".join(f"{prompt},{o}\n" for o in lengths))
        del workload["prompt_len"], workload["output_len"]
        workload["lengths"] = {"type": "pairs", "file": str(path), "prompt_column": "prompt",
                               "output_column": "output", "sample": "in_order"}
    return {"name": "energy", "seed": 0, "workload": workload, "deployment": dep, "policy": policy}


def steady_state(r: RunResult, batch: int, window: str = "steady_state") -> tuple[float, float, float, float]:
    """J per output token, mean W, output tokens/s and the mean running batch over the source's window. ML.ENERGY
    v3.0's harness (``steady_state``): from the ``batch``-th first token to the moment all but ``batch + 1``
    requests have finished (the whole run when that window is empty). v2.0's aggregation
    (``until_queue_empty``, leaderboard-v2 ``scripts/aggregate_leaderboard_data.py``): from the run's first step
    to the step that schedules the last waiting request (its first step with an empty waiting queue), that step
    left out. The batch is time-weighted over the window's steps, as the harness's average of vLLM's
    ``vllm:num_requests_running`` over the same window (the published ``avg_batch_size``)."""
    if window not in ("steady_state", "until_queue_empty", "all_overlap"):
        raise ValueError(f"unknown energy window {window!r}: steady_state, until_queue_empty or all_overlap")
    e = run_energy(r)
    assert e is not None and r.power is not None
    first = np.sort([q.first_token for q in r.requests if q.first_token >= 0])
    done = np.sort([q.finish for q in r.requests])
    start = np.asarray(r.steps["start"], dtype=np.float64)
    dur = np.asarray(r.steps["duration"], dtype=np.float64)
    if window == "until_queue_empty":
        t0, t1 = float(start[0]), max(q.first_scheduled for q in r.requests)
    elif window == "all_overlap":  # every request decoding: from the last first token to the first finish
        t0, t1 = float(first[-1]), float(done[0])
    else:
        t0, t1 = float(first[min(batch, len(first)) - 1]), float(done[max(len(done) - batch - 2, 0)])
    if not t1 > t0:
        t0, t1 = float(start[0]), float(start[-1] + dur[-1])
    sel = (start >= t0) & (start < t1)
    busy = float(dur[sel].sum())
    joules = float(e.step_energy_j[sel].sum()) + max(t1 - t0 - busy, 0.0) * r.power.idle_w * r.power.gpus
    tokens = float(np.asarray(r.steps["decode_tokens"])[sel].sum()) + float(((first >= t0) & (first < t1)).sum())
    secs = max(t1 - t0, busy)
    running = float((np.asarray(r.steps["batch_size"], dtype=np.float64)[sel] * dur[sel]).sum()) / busy
    return joules / tokens, joules / secs, tokens / secs, running


def work_at_published_time(j_per_token: float, tokens_per_s: float, idle_floor_w: float,
                            published_tokens_per_s: float) -> float:
    """J per output token had the simulated run taken the published time, its work's energy kept: the joules above
    the GPUs' idle floor a token (what the steps' compute and memory traffic drew) plus the floor's draw over the
    published time a token. Unlike "if time exact" (the simulated power over the published time), a slower step
    then draws less: the longer time runs at the floor, the work's joules are the same. Its error says whether
    the power model prices the work right once the time is right."""
    dynamic = j_per_token - idle_floor_w / tokens_per_s
    return dynamic + idle_floor_w / published_tokens_per_s


def published_row(row: dict[str, str], requests: int, prompt: int, lengths_dir: Path) -> tuple[Err, float]:
    """Simulate one published row, print its line and return its errors (J/token, power, output tok/s) and its
    simulated steady-state batch."""
    batch = int(row["batch_size"])
    res = servesim.run(published_scenario(row, requests, prompt, lengths_dir))
    r = res.results[0]
    jt, watts, tps, running = steady_state(r, batch, row["energy_window"] or "steady_state")
    pub = float(row["j_per_output_token"])
    pw = float(row["mean_power_w"]) if row["mean_power_w"] else float("nan")
    pt = float(row["output_tokens_per_s"]) if row["output_tokens_per_s"] else float("nan")
    assert r.power is not None
    work = work_at_published_time(jt, tps, r.power.idle_w * r.power.gpus, pt)
    err = (row, jt / pub - 1, watts / pw - 1, tps / pt - 1, work / pub - 1)
    print(f"{row['model']:15s} {row['gpu']:>8s} {row['num_gpus']:>2s} {batch:5d} {row['task'][:5]:5s} "
          f"{row['engine_version']:>6s} {pub:7.4f} {jt:7.4f} {_pct(err[1])} {pw:6.0f} {watts:6.0f} "
          f"{_pct(err[2])} {_pct(err[3]):>9s} {row['avg_batch_size'] or '-':>7s} {running:7.1f}", flush=True)
    return err, running


def step_gaps(rows: list[dict[str, str]], prompt: int = PROMPT_TOKENS) -> None:
    """Per published row with a throughput: its decode step (average batch / output tok/s) against the roofline's
    step of that batch at the mean context (prompt + mean output: an exponential output's length-biased age), its
    prompt tokens' compute per step beside it, and the time per row neither explains. No simulation; the classic
    cost model (the max of compute and weight reads) is what the gap is measured against."""
    from sim.costs.analytic import AnalyticCostModel

    print(f"{'model':15s} {'gpu':>8s} {'n':>2s} {'batch':>6s} {'step ms':>8s} {'roofline':>8s} {'prompts':>8s} "
          f"{'gap/row us':>10s} {'compute/row us':>14s} {'pub W/GPU':>9s}")
    for row in rows:
        if not row["output_tokens_per_s"] or not row["avg_batch_size"] or "v3.0" not in row["source"]:
            continue
        m = AnalyticCostModel(model_of(row), row["gpu"], weight_dtype=row["weight_dtype"],
                              tensor_parallel_size=int(row["num_gpus"]))
        batch, out = float(row["avg_batch_size"]), float(row["mean_output_tokens"])
        n = round(batch)
        step = batch / float(row["output_tokens_per_s"])
        roof = m.decode_step_time(n, round(n * (prompt + out)))
        compute = sum(m.flops_per_unit[:2]) / (m.peak_flops * m.compute_efficiency)  # s per token, one GPU
        prompts = prompt / out * n * compute  # each output token brings prompt/out prompt tokens, compute-bound
        print(f"{row['model']:15s} {row['gpu']:>8s} {row['num_gpus']:>2s} {n:6d} {1e3 * step:8.2f} {1e3 * roof:8.2f} "
              f"{1e3 * prompts:8.2f} {1e6 * (step - roof - prompts) / n:10.1f} {1e6 * compute:14.1f} "
              f"{float(row['mean_power_w']) / int(row['num_gpus']):9.0f}")


def closed_loop(model: str, gpu: str, batch: int, *, prompt: int = PROMPT_TOKENS, output: int = OUTPUT_TOKENS,
                per_user: int = 4) -> dict[str, Any]:
    return {"name": "energy", "seed": 0,
            "workload": {"arrival": {"type": "closed_loop", "num_users": batch}, "num_requests": per_user * batch,
                         "prompt_len": {"type": "fixed", "value": prompt},
                         "output_len": {"type": "fixed", "value": output}},
            "deployment": {"model": model, "gpu": gpu}, "policy": {"type": "continuous", "max_num_seqs": batch}}


def j_per_token(sc: dict[str, Any]) -> float:
    res = servesim.run(sc)
    return float(res.summary[res.variants[0]]["energy"]["j_per_output_token"])


def _pct(x: float) -> str:
    return f"{100 * x:+6.1f}%" if x == x else "      -"


def _median(vals: list[float]) -> float:
    vals = [v for v in vals if v == v]
    return statistics.median(vals) if vals else float("nan")


def _batch_bin(batch: int) -> str:
    """The batch's bin, named so that the bins sort in batch order."""
    return next(name for name, hi in (("batch    1-16", 16), ("batch   17-64", 64), ("batch  65-256", 256))
                if batch <= hi) if batch <= 256 else "batch 257+"


def pacing(row: dict[str, str]) -> str:
    """What paced the published run's steps, from its published inter-token latencies (ML.ENERGY v3.0's
    ``median_itl_ms`` and ``p90_itl_ms``), at a batch of 64 or less, where a step's work barely changes from one
    step to the next: "GPU-paced" when the p90 ITL is within ``ITL_JITTER`` of the median, as in every H100 run
    there (1.01-1.18), "host-jittered" beyond it, steps stretched by something other than their GPU work (the
    one-GPU B200 runs but two, 1.31-2.51); "" at larger batches (prefill chunks widen every run's spread) or
    without published ITLs."""
    if int(row["batch_size"]) > 64 or not row.get("median_itl_ms") or not row.get("p90_itl_ms"):
        return ""
    jitter = float(row["p90_itl_ms"]) / float(row["median_itl_ms"])
    return "host-jittered" if jitter > ITL_JITTER else "GPU-paced"


def _work(x: Err) -> float:
    """The row's J/token error at its published time, its work's energy kept; NaN where unknown."""
    return x[4] if len(x) > 4 else float("nan")


def breakdown(errs: list[Err]) -> None:
    """Median errors overall and by source, GPU, task, GPU and task, model and batch, with the J/token error split
    into its two factors. J/token is power over output tok/s (the published rows' own figures are: their J is
    their W over their tok/s), so 1 + J error = (1 + W error) / (1 + tok/s error), exactly: "J if W exact" is the
    median |J error| were the power right and the time as simulated (|1 / (1 + tok/s error) - 1|), "if time
    exact" were the time right and the power as simulated (|W error|); "time share" is the time's part of the
    summed |ln| of the two factors. "J work at pub time" is the median |J error| had the run taken the published
    time with its work's joules kept (``work_at_published_time``): the power model's error once the time is right.
    Rows without a published power or throughput count in the J columns only. Each GPU's rows are also grouped by
    task and by one GPU (``x1``) or tensor parallel (``TP``): on the B200 the one-GPU rows miss on their time, the
    tensor-parallel ones on their power. Rows whose simulated tok/s is within ``TIME_MATCHED`` of the published are
    grouped again by GPU and GPU count: their power error is the power model's at about the right time, and on the
    B200 it is as low on one GPU as on two to eight (docs/engines-and-hardware.md), so no all-reduce explains it."""
    def line(key: str, sel: list[Err]) -> str:
        both = [x for x in sel if x[2] == x[2] and x[3] == x[3]]
        lw = sum(abs(np.log1p(x[2])) for x in both)
        lt = sum(abs(np.log1p(x[3])) for x in both)
        cols = (_median([abs(x[1]) for x in sel]), _median([x[1] for x in sel]), _median([x[2] for x in sel]),
                _median([x[3] for x in sel]), _median([abs(1 / (1 + x[3]) - 1) for x in both]),
                _median([abs(x[2]) for x in both]), lt / (lw + lt) if lw + lt > 0 else float("nan"),
                _median([abs(_work(x)) for x in both]))
        return (f"  {key:50s} {len(sel):3d} {100 * cols[0]:5.1f}% {100 * cols[1]:+6.1f}% {100 * cols[2]:+6.1f}% "
                f"{100 * cols[3]:+6.1f}% {100 * cols[4]:8.1f}% {100 * cols[5]:8.1f}% {100 * cols[6]:5.0f}% "
                f"{100 * cols[7]:8.1f}%")

    print(f"\nmedian |error| of J/output token over {len(errs)} rows: {100 * _median([abs(x[1]) for x in errs]):.1f}% "
          f"(signed median {100 * _median([x[1] for x in errs]):+.1f}%); of mean power "
          f"{100 * _median([abs(x[2]) for x in errs]):.1f}% ({100 * _median([x[2] for x in errs]):+.1f}%); of output "
          f"tokens/s {100 * _median([abs(x[3]) for x in errs]):.1f}% ({100 * _median([x[3] for x in errs]):+.1f}%); "
          f"{sum(abs(x[1]) <= 0.15 for x in errs)} rows within 15%")
    groups: dict[str, list[Err]] = {}
    for x in errs:
        r = x[0]
        keys = ["all", r["source"], f"gpu {r['gpu']}", f"task {r['task']}", f"{r['gpu']}, {r['task']}",
                f"model {r['model']}", _batch_bin(int(r["batch_size"]))]
        if pace := pacing(r):
            keys.append(f"{r['gpu']}, batch <= 64, {pace}")
        if n := r.get("num_gpus"):  # one GPU or tensor parallel: on the B200 each misses on its own side
            keys.append(f"{r['gpu']} {'x1' if n == '1' else 'TP'}, {r['task']}")
            if abs(x[3]) <= TIME_MATCHED:  # the time right: what is left is the power model's
                keys.append(f"{r['gpu']} {'x1' if n == '1' else 'TP'}, tok/s within {100 * TIME_MATCHED:.0f}%")
        for key in keys:
            groups.setdefault(key, []).append(x)
    print(f"  {'':50s} {'n':>3s} {'|J|':>6s} {'J':>7s} {'W':>7s} {'tok/s':>7s} {'|J| if W':>9s} {'if time':>9s} "
          f"{'time':>6s} {'|J| work':>9s}")
    print(f"  {'':50s} {'':3s} {'':6s} {'':7s} {'':7s} {'':7s} {'exact':>9s} {'exact':>9s} {'share':>6s} "
          f"{'pub time':>9s}")
    for key, sel in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        print(line(key, sel))


def by_source(errs: list[Err]) -> None:
    """Each source's rows, sorted by their J/token error (most negative first), with their power and throughput
    errors: where a source's misses sit (which models, batches and tasks) and which way each goes, before the
    medians pool them."""
    sources = sorted({x[0]["source"] for x in errs})
    for source in sources:
        sel = sorted((x for x in errs if x[0]["source"] == source), key=lambda x: x[1])
        print(f"\n{source}: {len(sel)} rows, J/token median |error| {100 * _median([abs(x[1]) for x in sel]):.1f}% "
              f"(signed {100 * _median([x[1] for x in sel]):+.1f}%), sorted by J error")
        for x in sel:
            row, j, w, t = x[:4]
            print(f"  {row['model']:15s} {row['gpu']:>8s} x{row['num_gpus']:<2s} batch {row['batch_size']:>5s} "
                  f"{row['task'][:18]:18s} max-model-len {row.get('max_model_len') or '-':>6s} "
                  f"J {_pct(j)}  W {_pct(w)}  tok/s {_pct(t)}  J work {_pct(_work(x))}  {pacing(row)}".rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="rows whose source, model, GPU or task contain this")
    ap.add_argument("--requests", type=int, default=512, help="requests per row (at least 3 batches)")
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="the assumed prompt length")
    ap.add_argument("--no-shape", action="store_true", help="skip the shape checks")
    ap.add_argument("--step-gaps", action="store_true", help="only each row's decode step against the roofline's "
                    "(no simulation): the time per row the cost model's max() misses")
    args = ap.parse_args()
    with open(DATA, newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if any(args.only.lower() in r[k].lower() for k in ("source", "model", "gpu", "task"))]
    if args.step_gaps:
        step_gaps(rows, args.prompt_tokens)
        return
    print(f"{'model':15s} {'gpu':>8s} {'n':>2s} {'batch':>5s} {'task':5s} {'eng':>6s} {'pub J':>7s} {'sim J':>7s} "
          f"{'J err':>7s} {'pub W':>6s} {'sim W':>6s} {'W err':>7s} {'tok/s err':>9s} {'pub B':>7s} {'sim B':>7s}")
    errs: list[Err] = []
    fuller: list[str] = []  # rows whose simulated batch runs over the published one (the KV held more)
    with tempfile.TemporaryDirectory() as tmp:  # the rows' lengths files
        for row in rows:
            err, running = published_row(row, args.requests, args.prompt_tokens, Path(tmp))
            errs.append(err)
            if row["avg_batch_size"] and running > 1.03 * float(row["avg_batch_size"]):
                fuller.append(f"{row['model']} {row['gpu']} x{row['num_gpus']} at {row['batch_size']} "
                              f"({row['avg_batch_size']} published, {running:.1f} simulated)")
    if fuller:
        print(f"\n{len(fuller)} rows whose simulated steady-state batch is over 3% above the published "
              f"(vLLM's KV held fewer requests): {'; '.join(fuller)}")

    if errs:
        by_source(errs)
        breakdown(errs)
    if args.no_shape:
        return
    print("\nshape, llama-3.1-8b on h100-sxm, closed loop (J/output token):")
    for b in (1, 8, 64, 256):
        print(f"  batch {b:3d}, {OUTPUT_TOKENS} out: {j_per_token(closed_loop('llama-3.1-8b', 'h100-sxm', b)):.4f}")
    for out in (128, 1024, 4096):
        jt = j_per_token(closed_loop("llama-3.1-8b", "h100-sxm", 32, prompt=16, output=out))
        print(f"  batch  32, {out:4d} out (16 in): {jt:.4f}")
    for gpu in ("h100-sxm", "b200"):
        print(f"  {gpu}, batch 64: {j_per_token(closed_loop('llama-3.1-8b', gpu, 64)):.4f}")


if __name__ == "__main__":
    main()
