"""The sampler's sort (sim/engines/sampling.py): a top-p request costs vLLM a sort of each row's vocabulary each
step; greedy, top-k-only and FlashInfer-sampled requests cost nothing more, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.engines.sampling import SAMPLER_SORT_TIME
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec
from sim.loop.build import build

H100 = GPUSpec.from_name("h100-sxm")
LLAMA8 = ModelSpec.from_name("llama-3.1-8b")
ROOT = Path(__file__).resolve().parent.parent
TOP_P = {"temperature": 0.8, "top_p": 0.95}  # ML.ENERGY's harness


def _raw(engine: object, sampling: dict | None, model: str = "llama-3.1-8b") -> dict:
    workload: dict = {"arrival": {"type": "all_at_once"}, "num_requests": 40,
                      "prompt_len": {"type": "fixed", "value": 100}, "output_len": {"type": "fixed", "value": 30}}
    if sampling is not None:
        workload["sampling"] = sampling
    dep: dict = {"model": model, "gpu": "h100-sxm"}
    if engine is not None:
        dep["engine"] = engine
    return {"name": "t", "seed": 1, "workload": workload, "deployment": dep}


def _cost(engine: object, sampling: dict | None) -> AnalyticCostModel:
    cost = build(variant_configs(parse_scenario(_raw(engine, sampling), "t"))[0])[2]
    assert isinstance(cost, AnalyticCostModel)
    return cost


def test_one_decode_step_by_hand() -> None:
    """64 rows of Llama-3.1-8B (128,256 vocabulary entries) at 0.117 ns a logit: 64 x 128,256 x 0.117e-9 s =
    0.960381 ms (8,208,384 logits) more than the same step without the sort, all of it memory-busy time for the
    power model."""
    assert SAMPLER_SORT_TIME == 0.117e-9
    assert LLAMA8.vocab_size == 128256
    base = AnalyticCostModel(LLAMA8, H100, linear_overlap=0.0)
    sorted_ = AnalyticCostModel(LLAMA8, H100, linear_overlap=0.0, sampler_sort_time=SAMPLER_SORT_TIME)
    shape = StepShape(num_seqs=64, num_tokens=64, num_decode_seqs=64, kv_read_tokens=64_000, attn_pairs=64_000)
    assert sorted_.step_time(shape) - base.step_time(shape) == pytest.approx(0.960380928e-3, rel=1e-9)
    assert 64 * 128256 * 0.117e-9 == pytest.approx(0.960380928e-3, rel=1e-9)
    (c0, m0), (c1, m1) = base.busy_times(shape), sorted_.busy_times(shape)
    assert c1 == c0 and m1 - m0 == pytest.approx(0.960380928e-3, rel=1e-9)
    # the decode fast path prices the same floats as step_time
    times, _ = sorted_.decode_steps([64, 64], [64_000, 70_000])
    assert times == [sorted_.step_time(StepShape(64, 64, 64, c, c)) for c in (64_000, 70_000)]
    assert times[0] == sorted_.decode_step_time(64, 64_000)
    with pytest.raises(ValueError, match="sampler_sort_time"):
        AnalyticCostModel(LLAMA8, H100, sampler_sort_time=-1.0)


def test_the_sort_is_memory_busy_time_under_a_host_time_ratio_too() -> None:
    """vLLM 0.5's host loop stretches a step's GPU parts by 1.63 (host_time_ratio) but not its overheads, where the
    sort is priced: the step is the sort's 0.960 ms longer, and the power model's HBM-busy time grows by the same
    0.960 ms, not 0.960 / 2.63 (busy_times divides the stretched parts back, which the sort is not one of)."""
    base = AnalyticCostModel(LLAMA8, H100, host_time_ratio=1.63)
    sorted_ = AnalyticCostModel(LLAMA8, H100, host_time_ratio=1.63, sampler_sort_time=SAMPLER_SORT_TIME)
    shape = StepShape(num_seqs=64, num_tokens=64, num_decode_seqs=64, kv_read_tokens=64_000, attn_pairs=64_000)
    assert sorted_.step_time(shape) - base.step_time(shape) == pytest.approx(0.960380928e-3, rel=1e-9)
    (c0, m0), (c1, m1) = base.busy_times(shape), sorted_.busy_times(shape)
    assert c1 == c0 and m1 - m0 == pytest.approx(0.960380928e-3, rel=1e-9)


def test_which_requests_and_engines_sort() -> None:
    assert _cost("vllm-v1", TOP_P).sampler_sort_time == SAMPLER_SORT_TIME  # vLLM 0.11.1's default
    assert _cost({"name": "vllm-v0", "version": "0.5"}, TOP_P).sampler_sort_time == SAMPLER_SORT_TIME
    unsorted = [
        ("vllm-v1", None),  # the benchmark clients' default: greedy
        ("vllm-v1", {"temperature": 0, "top_p": 0.95}),  # greedy: argmax whatever top_p says
        ("vllm-v1", {"top_k": 50}),  # top-k alone: torch.topk, no full sort
        ("vllm-v1", {"temperature": 1.0}),  # vLLM's SamplingParams(): top_p 1
        ({"name": "vllm-v1", "use_flashinfer_sampler": True}, TOP_P),  # FlashInfer's kernel does not sort
        ("sglang", TOP_P),  # not modelled for other engines
        (None, TOP_P),  # the classic engine
    ]
    plain = _cost("vllm-v1", None)
    shape = StepShape(num_seqs=256, num_tokens=300, num_decode_seqs=250, kv_read_tokens=90_000, attn_pairs=80_000)
    for engine, sampling in unsorted:
        cost = _cost(engine, sampling)
        assert cost.sampler_sort_time == 0.0, (engine, sampling)
        if engine == "vllm-v1" or isinstance(engine, dict):
            assert cost.step_time(shape) == plain.step_time(shape)  # bit for bit


def test_greedy_runs_unchanged_and_top_p_runs_slower() -> None:
    def tpot(sampling: dict | None) -> list[float]:
        res = servesim.run(_raw("vllm-v1", sampling)).results[0]
        return [(q.finish - q.first_token) / 29 for q in res.requests]  # 30 tokens out

    plain = tpot(None)
    assert tpot({"temperature": 0.0, "top_p": 0.9, "top_k": 20}) == plain
    # the 40 rows decode together, all 29 steps after the first token: each step 40 x 128,256 x 0.117 ns =
    # 0.600 ms longer (the same decode steps, no padding at 40 rows: a CUDA-graph size)
    slower = tpot(TOP_P)
    assert [b - a for a, b in zip(plain, slower, strict=True)] == pytest.approx([40 * 128256 * 0.117e-9] * 40,
                                                                                 rel=1e-9)


def test_bad_sampling_and_a_key_of_vllm_only() -> None:
    for bad, word in (({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"temperature": -1}, "temperature"),
                      ({"top_k": -2}, "top_k"), ({"min_p": 0.1}, "min_p")):
        with pytest.raises(ScenarioError, match=word):
            variant_configs(parse_scenario(_raw("vllm-v1", bad), "t"))
    with pytest.raises(ScenarioError, match="use_flashinfer_sampler is vLLM's"):
        _cost({"name": "sglang", "use_flashinfer_sampler": True}, TOP_P)


def test_bad_sampling_exits_2_with_one_message(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_raw("vllm-v1", {"top_p": 2})))
    p = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2
    assert "workload.sampling.top_p" in p.stderr and "Traceback" not in p.stderr


def test_top_p_on_the_classic_engine_is_said_to_be_unpriced(tmp_path: Path) -> None:
    """Without deployment.engine nothing prices the sort: the run's TPOT is that of greedy sampling, and the run
    said nothing of it (a reviewer's run: 14.94 ms with and without top_p 0.9). A preset that prices it, greedy
    sampling and top-k alone get no line."""
    import yaml

    def stderr(engine: object, sampling: dict | None) -> str:
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(_raw(engine, sampling)))
        p = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(path), "--out", str(tmp_path / "o"),
                            "-q"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 0, p.stderr
        return p.stderr

    assert ("t: workload.sampling (top_p 0.95) is not priced: without deployment.engine the steps are those of "
            "greedy sampling") in stderr(None, TOP_P)
    for engine, sampling in (("vllm-v1", TOP_P), (None, None), (None, {"temperature": 0.8, "top_k": 50})):
        assert "not priced" not in stderr(engine, sampling)
