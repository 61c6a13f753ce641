"""The sampler's sort (sim/engines/sampling.py): a top-p request costs vLLM a sort of each row's vocabulary each
step; greedy, top-k-only and FlashInfer-sampled requests cost nothing more, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

import servesim
from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.engines.sampling import PENALTY_HOST_TIME, SAMPLER_SORT_TIME
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec
from sim.loop.build import build
from tests.conftest import servesim as servesim_cli

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
    p = servesim_cli("run", str(path), "--out", str(tmp_path / "o"), cwd=ROOT, timeout=120)
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
        p = servesim_cli("run", str(path), "--out", str(tmp_path / "o"), "-q", cwd=ROOT, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stderr

    assert ("t: workload.sampling (top_p 0.95) is not priced: without deployment.engine the steps are those of "
            "greedy sampling") in stderr(None, TOP_P)
    for engine, sampling in (("vllm-v1", TOP_P), (None, None), (None, {"temperature": 0.8, "top_k": 50})):
        assert "not priced" not in stderr(engine, sampling)


PENALIZED = TOP_P | {"repetition_penalty": 1.1}  # ML.ENERGY v3.0's harness


def test_a_penalized_step_waits_for_the_hosts_penalty_inputs_by_hand() -> None:
    """8 rows of Llama-3.1-8B on a B200 with fp8 KV attending 800,000 tokens: the host builds their tokens into a
    tensor in 800,000 x 24.5 ns = 19.6 ms, longer than the GPU's forward (the weights' 2.6 ms and 64 KiB of KV a
    token at 6.2 TB/s, 10.6 ns: some 11 ms), so the step is the overheads (1.5 ms + 8 x 10 us, and the sort) plus
    19.6 ms; the GPU's busy time does not grow (it waits, at static power). At 8,000 tokens (0.196 ms) the forward
    is longer and the step is the forward's, as without penalties. (On an H100 with bf16 KV a token's 128 KiB take
    49 ns to read, so the forward is always the longer there.)"""
    assert PENALTY_HOST_TIME == 24.5e-9
    b200 = GPUSpec.from_name("b200")
    base = AnalyticCostModel(LLAMA8, b200, kv_dtype="fp8", linear_overlap=0.0, sampler_sort_time=SAMPLER_SORT_TIME)
    pen = AnalyticCostModel(LLAMA8, b200, kv_dtype="fp8", linear_overlap=0.0, sampler_sort_time=SAMPLER_SORT_TIME,
                            penalty_host_time=PENALTY_HOST_TIME)
    h100 = AnalyticCostModel(LLAMA8, H100, penalty_host_time=PENALTY_HOST_TIME)
    assert h100.kv_bytes_per_token / (H100.mem_bandwidth * 0.8) == pytest.approx(48.9e-9, rel=1e-3)
    long_ = StepShape(num_seqs=8, num_tokens=8, num_decode_seqs=8, kv_read_tokens=800_000, attn_pairs=800_000)
    overheads = 1.5e-3 + 8 * (1e-5 + 128256 * SAMPLER_SORT_TIME)
    assert pen.step_time(long_) == pytest.approx(overheads + 800_000 * 24.5e-9, rel=1e-12)
    assert base.step_time(long_) < pen.step_time(long_)
    assert pen.busy_times(long_) == base.busy_times(long_)
    short = StepShape(num_seqs=8, num_tokens=8, num_decode_seqs=8, kv_read_tokens=8_000, attn_pairs=8_000)
    assert pen.step_time(short) == pytest.approx(base.step_time(short), rel=1e-12)
    # the decode fast path prices the same floats as step_time, on both sides of the max
    reads = [8_000, 300_000, 800_000]
    assert pen.decode_steps([8, 8, 8], reads)[0] == [pen.step_time(StepShape(8, 8, 8, c, c)) for c in reads]
    assert pen.decode_step_time(8, 800_000) == pen.step_time(long_)
    with pytest.raises(ValueError, match="penalty_host_time"):
        AnalyticCostModel(LLAMA8, H100, penalty_host_time=-1.0)


def test_which_requests_and_engines_pay_the_penalty_inputs() -> None:
    # Before: workload.sampling refused repetition_penalty (an unknown key), and nothing priced it
    for sampling in (PENALIZED, {"temperature": 0, "repetition_penalty": 1.1}, {"presence_penalty": 0.5},
                     {"frequency_penalty": -0.5}):  # greedy too: vLLM applies penalties before the argmax
        assert _cost("vllm-v1", sampling).penalty_host_time == PENALTY_HOST_TIME, sampling
    for engine, sampling in (("vllm-v1", TOP_P), ("vllm-v1", {"repetition_penalty": 1.0}), ("sglang", PENALIZED),
                             (None, PENALIZED), ({"name": "vllm-v0", "version": "0.5"}, PENALIZED)):
        assert _cost(engine, sampling).penalty_host_time == 0.0, (engine, sampling)
    assert _cost("vllm-v1", PENALIZED).sampler_sort_time == SAMPLER_SORT_TIME  # the sort as before
    for bad, word in (({"repetition_penalty": 0}, "repetition_penalty"), ({"presence_penalty": 3}, "presence_penalty"),
                      ({"frequency_penalty": -2.5}, "frequency_penalty")):
        with pytest.raises(ScenarioError, match=word):
            variant_configs(parse_scenario(_raw("vllm-v1", bad), "t"))


def test_penalties_an_engine_does_not_price_are_said_to_be_unpriced(tmp_path: Path) -> None:
    """Only the vllm-v1 preset prices the penalties; elsewhere their steps are those of unpenalized sampling, and the
    run said nothing of it (as it once said nothing of an unpriced top-p)."""
    import yaml

    from sim.engines.sampling import unpriced_sampling_note

    def note(engine: object, sampling: dict) -> str | None:
        cfg = variant_configs(parse_scenario(_raw(engine, sampling), "t"))[0]
        return unpriced_sampling_note(cfg.deployment, cfg.sampling)

    assert note(None, {"repetition_penalty": 1.1}) == (
        "workload.sampling's penalties (repetition_penalty 1.1) are not priced: without deployment.engine the steps "
        "are those of unpenalized sampling; the vllm-v1 preset prices its sampler's penalty inputs "
        "(sim/engines/sampling.py)")
    both = note(None, PENALIZED)
    assert both is not None and both.startswith("workload.sampling (top_p 0.95) is not priced") and "penalties" in both
    assert "not priced: on engine sglang the steps" in str(note("sglang", {"presence_penalty": 0.5,
                                                                          "frequency_penalty": -0.5}))
    assert "(presence_penalty 0.5, frequency_penalty -0.5)" in str(note("sglang", {"presence_penalty": 0.5,
                                                                                  "frequency_penalty": -0.5}))
    for engine, sampling in (("vllm-v1", PENALIZED), (None, {"repetition_penalty": 1.0}), ("sglang", TOP_P)):
        assert note(engine, sampling) is None, (engine, sampling)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_raw(None, {"repetition_penalty": 1.1})))
    p = servesim_cli("run", str(path), "--out", str(tmp_path / "o"), "-q", cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "t: workload.sampling's penalties (repetition_penalty 1.1) are not priced" in p.stderr
