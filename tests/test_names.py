"""sim/hardware/names.py: published model and GPU names matched to presets, and bench_published's engine column
read by name and version (so that a row a real engine ran is not refused for how its source spelled it)."""

from __future__ import annotations

from types import ModuleType

import pytest

from sim.engines.vllm_v0 import VLLM_V06_HOST_TIME_RATIO
from sim.hardware.names import match_gpu, match_model
from tests.test_machine_paths import _benchmark


@pytest.mark.parametrize(("text", "preset"), [
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"), ("Llama 3.1 70B Instruct FP8", "llama-3.1-70b"),
    ("LLaMA-13B", "llama-13b"), ("Llama-2-70b-chat-hf", "llama-2-70b"), ("Llama3-8B", "llama-3-8b"),
    ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"), ("Mistral-7B-Instruct-v0.3", "mistral-7b"),
    ("amd/Llama-3.1-405B-Instruct-FP8-KV", "llama-3.1-405b"), ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("llama-3.1-8b", "llama-3.1-8b"),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-v3"), ("DeepSeek-V3", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama-3.3-70b"), ("DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"),
    ("DeepSeek-V2.5", None), ("gpt-4", None), ("Llama-3.1-8B-Instructor", None)])
def test_model_names(text: str, preset: str | None) -> None:
    assert match_model(text) == preset


@pytest.mark.parametrize(("text", "preset"), [
    ("H100-SXM-80GB (assumed SXM)", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("H100 NVL", "h100-nvl"), ("H200-SXM-141GB", "h200"), ("GH200", "gh200"),
    ("NVIDIA H20", "h20"), ("A100-SXM-80GB (330W cap)", "a100-80gb"), ("A100-40GB", "a100-40gb"),
    ("A100 40GB PCIe", "a100-40gb-pcie"), ("A10G-24GB", "a10g"), ("NVIDIA L40S", "l40s"), ("L4", "l4"),
    ("MI300X-192GB", "mi300x"), ("AMD Instinct MI300X", "mi300x"), ("RTX-4090-24GB", "rtx-4090"), ("b200", "b200"),
    ("A100-SXM4-80GB (400W)", "a100-80gb"), ("A100 40 GB", "a100-40gb"),
    ("NVIDIA GB200", "gb200"), ("GB200 NVL72", "gb200"), ("AMD Instinct MI325X", "mi325x"), ("NVIDIA H800 SXM", "h800"),
    ("A800-SXM4-80GB", "a800"), ("NVIDIA L20", "l20"), ("NVIDIA A10", "a10"), ("Tesla T4", "t4"), ("T4-16GB", "t4"),
    ("MI250X", None), ("RTX 3090", None)])
def test_gpu_names(text: str, preset: str | None) -> None:
    assert match_gpu(text) == preset


def _bench() -> ModuleType:
    return _benchmark("bench_published")


@pytest.mark.parametrize(("text", "engine", "assumed"), [
    ("vLLM v0.5.3", {"name": "vllm-v0", "version": "0.5"}, False),
    ("vLLM 0.4.2", {"name": "vllm-v0", "version": "0.5"}, False),
    ("vLLM (June 2023)", {"name": "vllm-v0", "version": "0.5"}, False),
    ("vLLM v0.6.0", {"name": "vllm-v0", "version": "0.6"}, False),
    ("vllm==0.7.3", {"name": "vllm-v0", "version": "0.6"}, False),
    ("vLLM ROCm build ghcr.io/x/vllm-rocm:cb3b2b9 (V0 engine, --enforce-eager)", {"name": "vllm-v0", "version": "0.6"},
     False),
    ("vLLM v0.10.1.1 (V1 engine, vllm serve)", {"name": "vllm-v1"}, False),
    ("vLLM (version not stated)", {"name": "vllm-v1"}, False),
    ("TensorRT-LLM v0.17 (TRT engine)", {"name": "tensorrt-llm", "kv_cache_free_gpu_mem_fraction": 0.95}, False),
    ("TensorRT-LLM r24.07 (Triton backend v0.11)", {"name": "tensorrt-llm"}, False),
    ("SGLang v0.3.0", {"name": "sglang"}, False), ("LMDeploy v0.6.0a0", {"name": "lmdeploy"}, False),
    ("LMDeploy v0.1.0a1 (TurboMind, Python API)", {"name": "lmdeploy", "version": "0.1"}, False),
    ("gpt-fast (PyTorch)", None, False),
    ("HF TGI", {"name": "tgi"}, False), ("Text Generation Inference 2.2.0", {"name": "tgi"}, False),
    ("DeepSpeed-FastGen", {"name": "vllm-v1"}, True)])
def test_engine_column(text: str, engine: dict | None, assumed: bool) -> None:
    assert _bench().engine_of_row(text) == (engine, assumed)


def test_multi_step_divides_the_host_time_and_static_batching_is_refused() -> None:
    bench = _bench()
    eng, _ = bench.engine_of_row("vLLM v0.6.0 (--num-scheduler-steps 10)")
    assert eng["host_time_ratio"] == pytest.approx(bench.VLLM_V06_HOST_TIME_RATIO / 10)
    with pytest.raises(KeyError, match="static batches"):
        bench.engine_of_row("HF Transformers")


def test_sharegpt_lengths_keep_the_stated_means_inside_the_filter() -> None:
    """A row stating only ShareGPT's averages runs lengths spread about them, inside benchmark_serving.py's filter,
    the same for the same seed."""
    bench = _bench()
    ins, outs = bench.sharegpt_lengths(202, 179, 500)
    assert len(ins) == len(outs) == 500
    assert abs(sum(ins) / 500 - 202) < 1 and abs(sum(outs) / 500 - 179) < 2  # mid-quantiles: no sampling noise
    assert min(ins) >= 4 and max(ins) <= 1024 and min(outs) >= 4
    assert max(i + o for i, o in zip(ins, outs, strict=True)) <= 2048
    assert max(outs) > 4 * 179  # the long tail a fixed average leaves out
    assert bench.sharegpt_lengths(202, 179, 500) == (ins, outs)
    assert bench.sharegpt_lengths(202, 179, 500, seed=1) != (ins, outs)


def test_outputs_that_end_at_eos_spread_about_the_stated_mean_under_the_cap() -> None:
    """A row whose outputs ended at the end of sequence before the length asked for runs geometric lengths cut at
    that length, averaging the row's mean; a closed loop of such users no longer sends its prompts in lockstep."""
    bench = _bench()
    outs = bench.eos_lengths(100, 128, 300)
    assert len(outs) == 300 and abs(sum(outs) / 300 - 100) < 0.5 and min(outs) >= 1 and max(outs) == 128
    assert 0.5 < outs.count(128) / 300 < 0.7  # P(G >= 128) of the geometric whose capped mean is 100
    assert bench.eos_lengths(1024, 1024, 10) == [1024] * 10  # every request ran to the length asked for
    assert bench.eos_lengths(100, 128, 300) == outs and bench.eos_lengths(100, 128, 300, seed=1) != outs
    rows = bench.read_rows([bench.OWN_DATA])
    sweep = next(r for r in rows if "mushfiqrahman" in r["source"] and r["batch_or_concurrency"] == "4")
    case = bench.case_of(sweep, 3000)
    assert case.run.output_lens == bench.eos_lengths(100, 128, 300) and case.run.input_lens == [256] * 300
    qwen = next(r for r in rows if r["output_len"].startswith("1019 (mean; --random-output-len 1024"))
    assert max(bench.case_of(qwen, 3000).run.output_lens) == 1024


def test_gpus_beyond_tp_are_replicas_unless_pipeline_is_said() -> None:
    bench = _bench()
    row = {"tp": "2", "num_gpus": "8", "workload": "ShareGPT, QPS 16", "notes": ""}
    assert bench.parallelism_of(row, {}) == (2, 1, 4)
    assert bench.parallelism_of(row | {"notes": "TP2 PP4"}, {}) == (2, 4, 1)
    assert bench.parallelism_of(row, {"pipeline_parallel_size": 2}) == (2, 2, 2)
    assert bench.parallelism_of({"tp": "8", "num_gpus": "8", "workload": "", "notes": ""}, {}) == (8, 1, 1)
    with pytest.raises(ValueError, match="no multiple"):
        bench.parallelism_of({"tp": "3", "num_gpus": "8", "workload": "", "notes": ""}, {})


def test_a_replicated_row_runs_one_replica_at_its_share() -> None:
    """8 GPUs at tp 2 serving 1,000 prompts at 16 requests/s: one replica of 2 GPUs, 250 prompts at 4/s, compared
    with a quarter of the measured throughput; its TTFT as it is."""
    bench = _bench()
    base = {"source": "github:x/y:README.md", "engine": "vLLM v0.10.1", "model": "Llama-3.1-8B", "gpu": "H100-SXM-80GB",
            "num_gpus": "8", "tp": "2", "weight_dtype": "bf16", "kv_dtype": "auto",
            "workload": "random 1000 prompts, QPS 16", "input_len": "512", "output_len": "128",
            "batch_or_concurrency": "", "request_rate": "16", "unit": "req/s", "notes": "",
            "settings": "num_prompts=1000"}
    thr = bench.case_of(base | {"metric": "request_throughput", "value": "15.2"}, 3000)
    assert len(thr.run.input_lens) == 250 and thr.run.request_rate == pytest.approx(4.0)
    assert thr.run.aggregates["request_throughput"] == pytest.approx(15.2 / 4)
    assert thr.cfg.deployment.tensor_parallel_size == 2
    ttft = bench.case_of(base | {"metric": "ttft_ms_mean", "value": "80", "unit": "ms"}, 3000)
    assert ttft.run.aggregates["mean_ttft"] == pytest.approx(0.080)


@pytest.mark.parametrize(("metric", "unit", "expected"), [
    ("ttft_ms_mean", "ms", ("TTFT", "mean_ttft", 1e-3)), ("ttft_ms_median", "ms", ("TTFT", "median_ttft", 1e-3)),
    ("ttft_ms_p50", "ms", ("TTFT", "median_ttft", 1e-3)), ("tpot_ms_p99", "ms", ("decode speed", "p99_tpot", 1e-3)),
    ("itl_ms_median", "ms", ("decode speed", "median_itl", 1e-3)), ("e2el_s_mean", "s", ("E2E", "mean_e2el", 1.0)),
    ("batch_latency_s", "s", ("E2E", "request_throughput", -2.0)),
    ("output_tok_s_total", "tok/s", ("throughput", "output_throughput", 1.0)),
    ("total_tok_s", "tok/s", ("throughput", "total_token_throughput", 1.0)),
    ("request_throughput", "req/min", ("throughput", "request_throughput", 1 / 60)),
    ("output_tok_s_per_gpu", "tok/s", ("throughput", "output_throughput", 8.0)),
    ("output_tok_s_per_user", "tok/s", ("decode speed", "mean_tpot", -1.0)),
    ("tok_s_batch1", "tok/s", ("decode speed", "mean_e2el", 0.0))])
def test_metric_columns(metric: str, unit: str, expected: tuple) -> None:
    row = {"metric": metric, "unit": unit, "num_gpus": "8", "tp": "8"}
    assert _bench().metric_of(row) == pytest.approx(expected) if expected[2] else _bench().metric_of(row) == expected


def test_an_unknown_metric_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="ttft_ms_p90 has no simulated counterpart.*output_tok_s_per_user"):
        _bench().metric_of({"metric": "ttft_ms_p90", "unit": "ms", "tp": "1"})



def test_the_v060_headline_figures_run_with_multi_step_scheduling() -> None:
    """The post's headline 0.6.0 rows run as its benchmark section states for vLLM (--num-scheduler-steps 10): the
    host time ratio divided by 10, as on its engine comparison's rows; 0.5.3's rows and other sources' keep theirs."""
    bench = _bench()
    post = "github:vllm-project/vllm-project.github.io@c3a01c4:assets/figures/perf-v060/"
    row = {"source": post + "llama8B_comparison.png", "engine": "vLLM v0.6.0", "model": "Llama-3-8B",
           "gpu": "H100-SXM-80GB", "num_gpus": "1", "tp": "1", "weight_dtype": "bf16", "kv_dtype": "unstated",
           "workload": "ShareGPT 500 prompts, QPS inf", "input_len": "202 (avg)", "output_len": "179 (avg)",
           "batch_or_concurrency": "dynamic", "request_rate": "inf", "metric": "request_throughput", "value": "36.4",
           "unit": "req/s", "notes": ""}

    def ratio(**changes: str) -> float | None:
        return bench.case_of(row | changes, 10).cfg.deployment.engine.host_time_ratio

    assert ratio() == pytest.approx(VLLM_V06_HOST_TIME_RATIO / 10)
    assert ratio(source=post + "llama70B_comparison.png", model="Llama-3-70B", tp="4", num_gpus="4") == \
        pytest.approx(VLLM_V06_HOST_TIME_RATIO / 10)
    assert ratio(engine="vLLM v0.6.0 (--num-scheduler-steps 10)") == pytest.approx(VLLM_V06_HOST_TIME_RATIO / 10)
    assert ratio(engine="vLLM v0.5.3") is None  # 0.5's ratio comes from its version
    assert ratio(source="github:x/y:README.md") is None  # elsewhere 0.6.0 is one scheduler step (0.6's ratio)


def test_a100_alone_is_refused_with_its_choices() -> None:
    """``--gpu a100`` was the 80 GB part without a word (a 40 GB user's KV cache doubled), and "a100-40" was hinted
    as a100-80gb."""
    from sim.hardware.gpu import GPUSpec
    from sim.hardware.names import preset_hint

    with pytest.raises(ValueError, match=r"'A100' is ambiguous.*a100-80gb \(80 GiB\), a100-40gb \(40 GiB\)"):
        GPUSpec.from_name("A100")
    assert match_gpu("a100-40") == "a100-40gb" and match_gpu("A100 PCIe 400W") == "a100-80gb"
    assert preset_hint("a100", "gpu", "GPU 'a100' is ambiguous: ...") == ""
    from sim.cli.common import UsageError, _check_gpus

    with pytest.raises(UsageError, match=r"ambiguous: .*40 GiB\); give --set deployment.gpu=NAME$"):
        _check_gpus("--gpu", "a100", "deployment.gpu", None)  # its choices, not every preset and 'a100-80gb'


@pytest.mark.parametrize("given", ["a" * 300, ""])
def test_a_model_no_file_can_be_is_an_unknown_model_not_a_path(given: str) -> None:
    """engine run / calibrate --model with a 300-letter name ended in a traceback (OSError: File name too long, from
    the check for a config path), and an empty one was told it is a config.json path (Path("") is the folder)."""
    from sim.hardware.names import model_preset

    with pytest.raises(ValueError, match=r"^--model: unknown model"):
        model_preset(given, "why")


def test_lmdeploy_python_client_sends_its_threads_requests_one_at_a_time() -> None:
    """LMDeploy v0.1.0a1's profile_generation.py: each thread's request reaches TurboMind after the client's own
    Python time (one GPU 230 us, 80 us more a further GPU), one request at a time. 16 threads of 1-token prompts
    that end together then meet an engine that starts a step on the first to arrive, the rest waiting for it: their
    first token takes about two decode steps, not the one a simultaneous arrival gives (the table's 7B: 21 ms at 16
    threads, 11 ms at one). Fails before: no client time, every request admitted at the same step."""
    bench = _bench()
    row = {"source": "github:InternLM/lmdeploy@ebe90bc:docs/en/benchmark/a100_fp16.md",
           "engine": "LMDeploy v0.1.0a1 (TurboMind, Python API)", "model": "llama2-7b", "gpu": "A100-80GB",
           "num_gpus": "1", "tp": "1", "weight_dtype": "fp16", "kv_dtype": "fp16",
           "workload": "ISL=1,OSL=16 fixed, closed loop of 16 threads (profile_generation.py static inference)",
           "input_len": "1", "output_len": "16", "batch_or_concurrency": "16", "request_rate": "inf",
           "metric": "ttft_s_mean", "value": "0.021", "unit": "s", "notes": "",
           "settings": "max_concurrency=16;num_prompts=64;max_num_seqs=128;max_model_len=4096"}
    client = bench.case_of(row, 64)
    assert client.cfg.deployment.serving.request_handling_s == pytest.approx(230e-6)
    assert client.cfg.deployment.serving.tokenize_s_per_token == 0.0
    assert bench.case_of(row | {"tp": "4", "num_gpus": "4", "model": "llama2-70b"}, 64) \
        .cfg.deployment.serving.request_handling_s == pytest.approx(470e-6)
    assert bench.case_of(row | {"workload": "ISL=1,OSL=16 fixed, QPS inf"}, 64).cfg.deployment.serving \
        .request_handling_s is None  # an HTTP server's client keeps the serving layer's defaults
    together = bench.case_of(row, 64, online=False)
    assert together.cfg.deployment.serving is None
    # predict's error is measured / simulated - 1 for TTFT: the two steps halve the simulated mean's inverse
    staggered, simultaneous = (1 + e for e in bench.predict([client, together]))
    assert simultaneous / staggered == pytest.approx(1.9, abs=0.25)
