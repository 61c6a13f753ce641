"""Pipeline parallelism (sim/serving/pipeline.py): stage memory, round times, bubbles, the scenario keys, and the lesson's
range (GPipe's bubble at one micro-batch, gone with one micro-batch per stage)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import load_scenario, parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.hardware.capacity import capacity_table
from sim.hardware.gpu import resolve_gpu
from sim.hardware.kv_budget import kv_budget
from sim.hardware.models import ModelSpec, resolve_model
from sim.loop.build import build
from sim.loop.run import run_scenario
from sim.serving.pipeline import (
    LINK_PRESETS,
    PipelineCostModel,
    resolve_link,
    stage_model,
    stage_models,
    wrap_pipeline,
)

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
M70 = resolve_model("llama-3.1-70b")
H100 = resolve_gpu("h100-sxm")


def pipeline(pp: int = 4, link: str = "nvlink") -> PipelineCostModel:
    cost = wrap_pipeline(AnalyticCostModel(M70, H100), M70, H100, pipeline_parallel_size=pp, link=link)
    assert isinstance(cost, PipelineCostModel)
    return cost


def test_one_stage_is_the_cost_model_itself() -> None:
    inner = AnalyticCostModel(M70, H100)
    assert wrap_pipeline(inner, M70, H100, pipeline_parallel_size=1) is inner
    assert stage_models(M70, 1) == [M70] and stage_model(M70, 1, len) is M70


def test_stage_holds_its_layers_weights_and_kv() -> None:
    stages = stage_models(M70, 4)
    assert [st.num_layers for st in stages] == [20] * 4  # 80 layers over 4 stages
    # vLLM's get_pp_indices: 32 / 3 gives the remainder to the stages before the last (which holds the LM head)
    assert [st.num_layers for st in stage_models(resolve_model("llama-3.1-8b"), 3)] == [11, 11, 10]
    whole = kv_budget(M70, H100, tensor_parallel_size=4)
    first, middle, _, last = (kv_budget(st, H100) for st in stages)
    # a stage's KV per token is a quarter of the model's, as with tp=4 (8 KV heads split in 4)
    assert middle.bytes_per_token * 4 == 2 * 80 * 8 * 128 * 2  # K and V, 80 layers, 8 KV heads of 128, bf16
    assert middle.bytes_per_token == whole.bytes_per_token
    # weights per GPU: a quarter of the layers; the embedding on the first stage, the LM head on the last (vLLM's
    # PPMissingLayer elsewhere), where tp=4 splits both over every GPU
    matrix = M70.shard(1).embedding_params * 2  # bf16 bytes of one vocabulary x hidden matrix
    assert first.weight_bytes - middle.weight_bytes == matrix
    assert last.weight_bytes - middle.weight_bytes == matrix + 8192 * 2  # and the final norm
    assert middle.weight_bytes == M70.shard(1).weight_bytes("bf16") // 4 - 2 * matrix // 4 - 8192 * 2 // 4
    # the sampler's logits are reserved on the last stage only, as vLLM's profile samples there only
    assert last.activation_reserve - middle.activation_reserve == 256 * M70.vocab_size * 4 * 2
    assert first.activation_reserve == middle.activation_reserve
    with pytest.raises(ValueError, match="exceeds"):
        stage_models(M70, 81)


def test_a_tied_lm_head_keeps_the_embedding_on_the_last_stage_too() -> None:
    # vLLM's Llama: embed_tokens on the first rank, or on the last when the LM head is tied to it
    tied = resolve_model("llama-3.2-1b")
    assert tied.tie_word_embeddings
    first, middle, _, last = (st.shard(1) for st in stage_models(tied, 4))  # 16 layers: 4 a stage
    rows = tied.vocab_size * tied.hidden_size
    assert (first.stored_params - middle.stored_params, last.stored_params - middle.stored_params) == (rows, rows + 2048)


def test_the_stage_that_holds_the_fewest_kv_tokens_sizes_the_cache_as_vllm_lays_the_stages_out() -> None:
    # every stage's GPU was counted with the whole embedding and LM head, so at tp1 pp8 Llama-3.1-70B read 1,278,560
    # KV tokens where vLLM (embedding on the first stage, LM head on the last, the minimum of the workers' blocks)
    # gives 1,329,872: the last stage (LM head, final norm, the sampler's logits) binds
    from sim.hardware.capacity import capacity_table

    blocks = [kv_budget(st, H100).num_gpu_blocks for st in stage_models(M70, 8)]
    assert min(blocks) == blocks[-1] == 1_329_872 // 16 and blocks[0] > blocks[-1] and len(set(blocks[1:-1])) == 1
    [row] = capacity_table("llama-3.1-70b", "h100-sxm", contexts=[4096], weight_dtypes=["bf16"], kv_dtypes=["auto"],
                           tensor_parallel_sizes=[1], pipeline_parallel_sizes=[8]).rows
    assert row.capacity_tokens == 1_329_872
    built = build(variant_configs(parse_scenario(_scenario(pipeline_parallel_size=8)))[0])[3]  # a run: the same
    assert built.budget.weight_bytes == stage_models(M70, 8)[-1].shard(1).weight_bytes("bf16")
    doc = (Path(__file__).resolve().parent.parent / "docs" / "engines-and-hardware.md").read_text()
    assert "1,329,872 KV tokens at tp1 pp8" in doc and "1,278,560" not in doc


def test_round_is_one_micro_batch_through_every_stage_plus_hops() -> None:
    pp = pipeline()
    inner = pp.inner
    assert isinstance(inner, AnalyticCostModel)
    bw, lat = LINK_PRESETS["nvlink"]
    hop = lat + 8192 * 2 / bw  # one decode token's activations, bf16
    one = StepShape(1, 1, 1, 500, 500)
    assert pp.step_time(one) == pytest.approx(inner.step_time(one) + 3 * hop, rel=1e-12)
    # 8 rows: 4 micro-batches of 2 rows; the host overhead of all 8 rows once
    eight, two = StepShape(8, 8, 8, 4000, 4000), StepShape(2, 2, 2, 1000, 1000)
    o8 = inner.step_overhead + 8 * inner.per_request_overhead
    o2 = inner.step_overhead + 2 * inner.per_request_overhead
    hop2 = lat + 2 * 8192 * 2 / bw
    # with a micro-batch per stage the last stage paces the round: its 20 layers and the LM head (128,256 x 8,192
    # weights, 1.2 layers' worth), which no other stage shares, for each of the 4 micro-batches; before, the head was
    # spread over the stages with the layers and the 3 hops bound instead
    head2 = inner.lm_head_time(2)
    assert head2 > hop2
    assert pp.step_time(eight) == pytest.approx(o8 + inner.step_time(two) - o2 + 3 * head2, rel=1e-12)
    assert pp.peak_flops == 4 * inner.peak_flops
    assert pp.step_flops(eight) == inner.step_flops(eight)


def test_arrays_give_the_scalars() -> None:
    pp = pipeline()
    rows = [1, 2, 3, 7, 64]
    arr = pp.step_time(StepShape(np.array(rows), np.array(rows), np.array(rows), np.array(rows) * 300,
                                 np.array(rows) * 300))
    assert list(arr) == [pp.step_time(StepShape(n, n, n, n * 300, n * 300)) for n in rows]
    times, _ = pp.decode_steps(rows, [n * 300 for n in rows])
    assert times == list(arr)


def test_stage_busy_inverts_the_round() -> None:
    pp = pipeline()
    rows = np.array([1, 2, 4, 16])
    tokens = rows.copy()
    dur = np.array([pp.step_time(StepShape(n, n, n, n * 300, n * 300)) for n in rows])
    busy = pp.stage_busy(rows, tokens, dur)
    inner = pp.inner
    assert isinstance(inner, AnalyticCostModel)
    for n, b, d in zip(rows, busy, dur, strict=True):
        m = min(n, 4)
        mb = StepShape(n / m, n / m, n / m, n / m * 300, n / m * 300)
        work = inner.step_time(mb) - inner.step_overhead - n / m * inner.per_request_overhead
        assert b == pytest.approx(m * work / 4, rel=1e-9) and 0 < b <= d  # a stage is busy within its step
    util = busy / dur
    # full (16 rows), the stages wait on the last one's LM head: 0.928, not above 0.95 as with the head spread evenly
    assert 0.24 < util[0] < 0.25 and util[1] == pytest.approx(2 * util[0], rel=0.02) and 0.92 < util[3] < 0.94


def test_the_last_stage_sorts_every_micro_batch() -> None:
    """The sampler's sort (workload.sampling top-p, sim/engines/sampling.py) runs on the last stage, once per
    micro-batch: a 256-row decode round of Llama-3.1-8B over 4 stages (4 micro-batches of 64 rows, 0.960 ms of sort
    each) is the last stage's layers, LM head and 4 sorts, 3.84 ms more than without a sort (the last stage paces
    both: its LM head outlasts the 3 hops), not the one micro-batch's sort of the layers' even split (0.96 ms). The
    stages' busy time gives back the micro-batches' work, each with its sort."""
    m8 = resolve_model("llama-3.1-8b")
    plain, sorted_ = (wrap_pipeline(AnalyticCostModel(m8, H100, sampler_sort_time=t), m8, H100,
                                    pipeline_parallel_size=4, link="nvlink") for t in (0.0, 0.117e-9))
    assert isinstance(plain, PipelineCostModel) and isinstance(sorted_, PipelineCostModel)
    shape = StepShape(256, 256, 256, 256_000, 256_000)
    sort = 64 * 128256 * 0.117e-9  # one micro-batch's
    hops = 3 * plain.hop_time(64)
    assert plain.inner.lm_head_time(64) > hops / 3
    assert sorted_.step_time(shape) - plain.step_time(shape) == pytest.approx(4 * sort, rel=1e-9)
    mb = StepShape(64, 64, 64, 64_000, 64_000)
    work = sorted_.inner.step_time(mb) - plain.inner.step_overhead - 64 * plain.inner.per_request_overhead
    busy = sorted_.stage_busy(np.array([256]), np.array([256]), np.array([sorted_.step_time(shape)]))
    assert busy[0] == pytest.approx(4 * work / 4, rel=1e-9)


def test_links() -> None:
    assert resolve_link("auto", H100)[0] == "nvlink"
    assert resolve_link("auto", resolve_gpu("l40s"))[0] == "pcie"  # no NVLink
    slow, fast = pipeline(link="infiniband"), pipeline(link="nvlink")
    one = StepShape(1, 1, 1, 500, 500)
    assert slow.step_time(one) - fast.step_time(one) == pytest.approx(3 * (20e-6 - 5e-6 + 16384 / 50e9 - 16384 / 450e9))


def _scenario(**dep) -> dict:
    return {"workload": {"arrival": {"type": "poisson", "rate": 1}, "num_requests": 10,
                         "prompt_len": {"type": "fixed", "value": 64}, "output_len": {"type": "fixed", "value": 8}},
            "deployment": {"model": "llama-3.1-70b", "gpu": "h100-sxm", "max_model_len": 4096, **dep}}


def test_scenario_builds_a_pipeline_and_refuses_too_many_stages() -> None:
    _, _, cost, built = build(variant_configs(parse_scenario(_scenario(pipeline_parallel_size=4)))[0])
    assert isinstance(cost, PipelineCostModel) and cost.pipeline_parallel_size == 4 and cost.link == "nvlink"
    assert built.budget.weight_bytes < 40 * 2**30  # a quarter of 141 GB of bf16 weights, and the embeddings
    with pytest.raises(ScenarioError, match="pipeline_parallel_size=81 exceeds"):
        build(variant_configs(parse_scenario(_scenario(pipeline_parallel_size=81)))[0])
    with pytest.raises(ScenarioError, match="pipeline_link"):
        parse_scenario(_scenario(pipeline_parallel_size=2, pipeline_link="carrier-pigeon"))


def test_cli_refuses_a_bad_degree_with_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("workload: {arrival: {type: poisson, rate: 1}, num_requests: 4, prompt_len: {type: fixed, value: 8}, "
                 "output_len: {type: fixed, value: 8}}\n"
                 "deployment: {model: llama-3.1-8b, pipeline_parallel_size: 40}\n")
    res = CliRunner().invoke(app, ["run", str(f), "-q", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "exceeds" in res.output and "Traceback" not in res.output


@pytest.fixture(scope="module")
def bubbles() -> dict[int, dict]:
    path = SCENARIOS / "lesson-pipeline-bubbles.yaml"
    scenario, raw = load_scenario(path, {"workload.num_requests": 32})
    run = run_scenario(scenario, raw, source=str(path))
    return {int(k.split("num_users=")[1].rstrip("]")): v for k, v in run.summaries.items()}


def test_lesson_bubble_is_gpipes_at_one_micro_batch_and_gone_at_one_per_stage(bubbles) -> None:
    # GPipe (Huang et al. 2019): bubble (p - 1) / (m + p - 1) = 0.75 for p = 4, m = 1; the host overhead and the
    # hops add a little. Measured (32 requests): 0.757, 0.514, 0.070, 0.071 (0.029, 0.031 before the last stage
    # computed the LM head alone: with a micro-batch per stage the other three wait on it, 1.2 layers' worth of 80)
    b = {u: s["pipeline"]["bubble_fraction"] for u, s in bubbles.items()}
    assert 0.74 <= b[1] <= 0.80
    assert 0.48 <= b[2] <= 0.56  # two micro-batches: each stage works half the time
    assert 0.05 < b[4] < 0.09 and 0.05 < b[16] < 0.09
    assert b[1] > b[2] > b[4]
    assert bubbles[1]["pipeline"]["mean_micro_batches"] == 1.0 and bubbles[16]["pipeline"]["mean_micro_batches"] == 4.0


def test_lesson_throughput_follows_the_micro_batches_not_the_latency(bubbles) -> None:
    tput = {u: s["output_throughput"] for u, s in bubbles.items()}
    tpot = {u: s["tpot"]["mean"] for u, s in bubbles.items()}
    assert tput[4] / tput[1] == pytest.approx(4.0, rel=0.05)
    assert tput[16] / tput[4] > 3.5  # 4 rows per micro-batch: still bandwidth-bound, almost free
    # one token still crosses all four stages; full, the last stage (layers and LM head) paces the round: +5%
    assert max(tpot.values()) / min(tpot.values()) < 1.06


def test_report_has_the_pipeline_section_only_when_pipelined(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "lesson-pipeline-bubbles.yaml"), "-q", "-o", str(out),
                                   "--set", "workload.num_requests=8"])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "Pipeline stages" in page and "GPipe m" in page and "stage utilisation" in page
    assert "Host tier of the prefix cache" not in page


def test_the_pipeline_charts_bars_stand_on_their_ticks() -> None:
    """Grouped bars kept a slot for each of the lesson's four runs at every micro-batch count, so the run alone at
    1 micro-batch stood at 0.7 and the one at 2 at 1.9, beside their ticks, on an axis ticked every 0.5 (seen in
    chromium). The bars at one count now share its tick, side by side, and the axis ticks whole counts."""
    from types import SimpleNamespace

    from sim.output.report.pipeline import BAR_SPAN, fig_pipeline

    def run(name: str, counts: list[int]) -> SimpleNamespace:
        by = [{"micro_batches": m, "stage_utilization": m / 4, "time_fraction": 1.0} for m in counts]
        return SimpleNamespace(name=name, pipeline={"pipeline_parallel_size": 4, "by_micro_batches": by})

    fig = fig_pipeline([run("u1", [1]), run("u2", [2]), run("u4", [4]), run("u16", [3, 4])])  # type: ignore[list-item]
    assert fig is not None
    spans = {(t.name, x): (round(x + o, 12), round(x + o + w, 12)) for t in fig.data if t.type == "bar"
             for x, o, w in zip(t.x, t.offset, t.width, strict=True)}
    assert BAR_SPAN == 0.8
    assert spans == {("u1", 1): (0.6, 1.4), ("u2", 2): (1.6, 2.4), ("u16", 3): (2.6, 3.4), ("u4", 4): (3.6, 4.0),
                     ("u16", 4): (4.0, 4.4)}
    assert (fig.layout.xaxis.tick0, fig.layout.xaxis.dtick, tuple(fig.layout.xaxis.range)) == (1, 1, (0.5, 4.5))


def test_capacity_lists_every_split_of_a_gpu_count() -> None:
    from sim.hardware.capacity import capacity_table, format_capacity

    t = capacity_table("llama-3.1-70b", "h100-sxm", num_gpus=8, weight_dtypes=["bf16"], kv_dtypes=["auto"])
    assert [(r.tensor_parallel_size, r.pipeline_parallel_size) for r in t.rows] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    by = {r.pipeline_parallel_size: r for r in t.rows}
    # every split holds about the same KV (the layers or the heads are divided 8 ways); stages repeat the
    # embedding and LM head, so a deeper pipeline keeps a little less
    assert by[8].kv_bytes_per_token == by[1].kv_bytes_per_token == 2 * 10 * 8 * 128 * 2
    assert by[8].capacity_tokens < by[4].capacity_tokens < by[2].capacity_tokens < by[1].capacity_tokens
    assert by[8].capacity_tokens > 0.9 * by[1].capacity_tokens
    assert by[2].sessions_per_gpu[0] == by[2].sessions[0] / 8
    assert t.row("bf16", "auto", 2, 4) is by[4]
    text = format_capacity(t)
    assert " tp pp " in text and "pp: pipeline stages" in text
    plain = format_capacity(capacity_table("llama-3.1-70b", "h100-sxm", tensor_parallel_sizes=[4]))
    assert " pp " not in plain  # the default table is as it was


def test_capacity_cli_gpus_and_bad_pp(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "4",
                                   "--weight-dtype", "bf16", "--kv-dtype", "auto", "--json"])
    assert res.exit_code == 0, res.output
    import json

    rows = json.loads(res.stdout)["rows"]
    assert [(r["tensor_parallel_size"], r["pipeline_parallel_size"]) for r in rows] == [(1, 4), (2, 2), (4, 1)]
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--pp", "64"])
    assert res.exit_code == 2 and "exceeds" in res.output and "Traceback" not in res.output


def test_plan_searches_tp_x_pp(tmp_path: Path) -> None:
    from sim.studies.planner import plan

    f = tmp_path / "plan.yaml"
    f.write_text("""
name: plan-pp
workload: {arrival: {type: poisson, rate: 2}, num_requests: 100, prompt_len: {type: fixed, value: 512},
           output_len: {type: fixed, value: 128}}
deployment: {model: llama-3.1-70b, gpu: h100-sxm, max_model_len: 4096}
slos: {ttft: 2.0, tpot: 0.1}
plan: {gpus: [h100-sxm], tensor_parallel_sizes: [1, 2, 4], pipeline_parallel_sizes: [1, 2, 4, 96],
       weight_dtypes: [bf16], kv_dtypes: [auto], max_num_seqs: [64], enable_chunked_prefill: [true], max_gpus: 4,
       stop_early: false}
""")
    sc, _ = load_scenario(f)
    r = plan(sc)
    got = {(e.candidate.tensor_parallel_size, e.candidate.pipeline_parallel_size, e.candidate.replicas): e
           for e in r.evaluations}
    # every tp x pp x replicas of at most 4 GPUs; 96 stages exceed the 80 layers and are skipped
    assert set(got) == {(1, 1, 1), (1, 1, 2), (1, 1, 3), (1, 1, 4), (2, 1, 1), (2, 1, 2), (4, 1, 1),
                        (1, 2, 1), (1, 2, 2), (2, 2, 1), (1, 4, 1)}
    assert got[(1, 1, 1)].status == "pruned" and got[(1, 1, 1)].bound == "memory"  # 141 GB on one H100
    assert got[(1, 4, 1)].status == "met" and got[(1, 4, 1)].candidate.num_gpus == 4
    assert "pp4" in got[(1, 4, 1)].candidate.label() and got[(2, 2, 1)].candidate.to_dict()["pipeline_parallel_size"] == 2
    # a pipeline's TPOT is the whole model's on one stage group: tp4 decodes faster than pp4 on the same 4 GPUs
    assert got[(4, 1, 1)].latency["tpot"] < got[(1, 4, 1)].latency["tpot"]
    assert r.chosen is not None and r.chosen.candidate.num_gpus == 2


@pytest.mark.parametrize("section", ["pipeline", "host"])
def test_real_engine_refuses_what_it_does_not_run(section: str) -> None:
    pytest.importorskip("torch")
    from realengine.engine import engine_config

    raw = _scenario(pipeline_parallel_size=2) if section == "pipeline" else {
        **_scenario(), "kv_cache": {"type": "paged", "enable_prefix_caching": True, "host_cache": {"size_gib": 1}}}
    cfg = variant_configs(parse_scenario(raw))[0]
    with pytest.raises(ScenarioError, match="pipeline_parallel_size" if section == "pipeline" else "host_cache"):
        engine_config(cfg, model_spec="tiny")


def test_fast_path_gives_the_steps_of_stepping_one_by_one() -> None:
    from sim.loop.run import generate_workload, simulate_variant

    raw = _scenario(pipeline_parallel_size=4)
    raw["workload"] = {"arrival": {"type": "poisson", "rate": 4}, "num_requests": 60,
                       "prompt_len": {"type": "uniform", "low": 16, "high": 600},
                       "output_len": {"type": "uniform", "low": 2, "high": 200}}
    sc = parse_scenario(raw)
    cfg = variant_configs(sc)[0]
    wl = generate_workload(sc)
    fast, _, _ = simulate_variant(cfg, wl, fast_path=True)
    slow, _, _ = simulate_variant(cfg, wl, fast_path=False)
    for k in fast.steps:
        assert np.array_equal(fast.steps[k], slow.steps[k]), k
    assert [(r.id, r.first_token, r.finish) for r in fast.requests] == \
        [(r.id, r.first_token, r.finish) for r in slow.requests]
    assert fast.pipeline == slow.pipeline


def test_verdict_names_the_bubble_when_stages_idle(bubbles) -> None:
    from sim.metrics.verdict import rank_limits

    v = rank_limits(bubbles[1])
    assert v.names[0] == "pipeline bubbles" and "1.0 micro-batches in flight for 4 stages" in v.text
    # 7% idle (the stages wait on the last one's LM head): second to the memory bandwidth
    assert rank_limits(bubbles[16]).names == ["bandwidth-bound", "pipeline bubbles"]


def test_uneven_stages_set_the_pace_once_full() -> None:
    m8 = resolve_model("llama-3.1-8b")
    inner = AnalyticCostModel(m8, H100)
    pp = wrap_pipeline(inner, m8, H100, pipeline_parallel_size=3)
    assert isinstance(pp, PipelineCostModel) and pp.stage_share == 11 / 32  # 11 + 11 + 10 layers
    big, mb = StepShape(48, 48, 48, 48 * 1000, 48 * 1000), StepShape(16, 16, 16, 16000, 16000)
    o = inner.step_overhead + 48 * inner.per_request_overhead
    work = inner.step_time(mb) - inner.step_overhead - 16 * inner.per_request_overhead
    # three micro-batches of 16 rows: the slowest stage computes all three per round, longer than one micro-batch's
    # trip through the stages: of the 11-layer stages and the last (10 layers and the LM head, 2.4 layers' worth of
    # the 8B), the last (before, 11/32 of the whole work, the head's time spread over the stages)
    head = inner.lm_head_time(16)
    assert (work - head) * 10 / 32 + head > (work - head) * 11 / 32
    assert pp.step_time(big) == pytest.approx(o + 3 * ((work - head) * 10 / 32 + head), rel=1e-12)
    busy = pp.stage_busy(np.array([48]), np.array([48]), np.array([pp.step_time(big)]))
    assert busy[0] == pytest.approx(3 * work / 3, rel=1e-9)


def test_uneven_stages_utilisation_is_read_with_the_stages_own_shares() -> None:
    """DeepSeek-V2-Lite over 4 stages: the first holds the dense layer, so step_time weighs each stage by its own
    GPU time (``stages``). Before, stage_busy read the round with the layers' even shares: 3.0% more busy than the
    micro-batches' work at 64 and 256 decode rows (stage_utilization 0.808 where it is 0.784 at 64 rows)."""
    model = resolve_model("deepseek-v2-lite")
    inner = AnalyticCostModel(model, H100)
    pp = wrap_pipeline(inner, model, H100, pipeline_parallel_size=4)
    assert isinstance(pp, PipelineCostModel) and pp.stages
    rows = np.array([1.0, 4.0, 16.0, 64.0, 256.0])
    dur = np.array([pp.step_time(StepShape(n, n, n, n * 1000, n * 1000)) for n in rows])
    zero = np.zeros_like(rows)
    steps = {"batch_size": rows, "padded_rows": zero, "prefill_tokens": zero, "decode_tokens": rows,
             "padding_tokens": zero, "duration": dur, "kv_tokens": rows * 1000}
    m = np.minimum(rows, 4)
    work = np.array([inner.step_time(StepShape(n / k, n / k, n / k, n / k * 1000, n / k * 1000))
                     - inner.step_overhead - n / k * inner.per_request_overhead for n, k in zip(rows, m, strict=True)])
    want = m * work / 4
    for k, n in enumerate(rows):
        one = {key: v[k : k + 1] for key, v in steps.items()}
        assert pp.summary(one)["stage_utilization"] == pytest.approx(want[k] / dur[k], rel=1e-9), n


def test_deepseeks_dense_layers_lie_on_the_stages_that_hold_them() -> None:
    # Before: every stage kept the whole model's first_k_dense_replace (3 dense layers each), so a stage of 3 layers
    # (deepseek-v3 at pp 16: [3, 4, ..., 4, 3]) was refused ("first_k_dense_replace must be in [0, num_layers)")
    # and every stage's weights counted 3 dense layers it does not hold
    model = resolve_model("deepseek-v3")
    stages = stage_models(model, 16)
    assert [s.first_k_dense_replace for s in stages] == [3] + [0] * 15
    for tp in (1, 8):  # untied: the stages' weights add up to the model's
        assert sum(s.shard(tp).weight_bytes("fp8") for s in stages) == model.shard(tp).weight_bytes("fp8")
    assert [s.first_k_dense_replace for s in stage_models(model, 61)][:4] == [1, 1, 1, 0]  # all-dense stages
    (row,) = capacity_table("deepseek-v3", "h200", contexts=[4096], weight_dtypes=["fp8"], kv_dtypes=["auto"],
                            tensor_parallel_sizes=[1], pipeline_parallel_sizes=[16]).rows
    assert row.fits


def test_a_quantized_checkpoints_unconverted_layers_lie_on_the_stages_that_hold_them() -> None:
    """Meta's Llama-3.1-405B-FP8 keeps every attention and the first and last layers' MLP in bf16
    (sim/hardware/quant.py); each stage was given the whole model's counts (126 attention layers on a stage of 16),
    so `servesim capacity --model llama-3.1-405b-fp8 --tp 1 --pp 8` failed with 'unquantized_attention_layers must
    be in [0, num_layers], got 126'. Each stage now counts the unconverted layers among its own."""
    m = resolve_model("llama-3.1-405b-fp8")
    stages = stage_models(m, 8)
    assert [st.num_layers for st in stages] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert [st.unquantized_attention_layers for st in stages] == [st.num_layers for st in stages]
    assert [st.unquantized_mlp_layers for st in stages] == [1, 0, 0, 0, 0, 0, 0, 1]  # layers 0 and 125
    # the stages' fp8 weights add up to the model's (each stage rounds up to a whole byte)
    whole = m.shard(1).weight_bytes("fp8")
    assert 0 <= sum(st.shard(1).weight_bytes("fp8") for st in stages) - whole < 8
    [row] = capacity_table("llama-3.1-405b-fp8", "h200", contexts=[4096], weight_dtypes=["fp8"], kv_dtypes=["auto"],
                           tensor_parallel_sizes=[1], pipeline_parallel_sizes=[8]).rows
    assert row.capacity_tokens == 1_080_064
    # a layout the quant module writes for other counts: the first layers' attention, the MLP of the first and last
    odd = dataclasses.replace(resolve_model("llama-3.1-8b"), unquantized_attention_layers=12, unquantized_mlp_layers=3)
    assert [(st.unquantized_attention_layers, st.unquantized_mlp_layers) for st in stage_models(odd, 4)] == \
        [(8, 2), (4, 0), (0, 0), (0, 1)]


def test_opt_keeps_its_embeddings_projections_and_lm_head_on_every_stage_as_vllm_builds_them() -> None:
    """vLLM's OPTDecoder builds embed_tokens, embed_positions, project_in/out and the final norm on every rank, and
    OPTForCausalLM its LM head (tied to the embedding), with no PPMissingLayer (vllm/model_executor/models/opt.py;
    Llama's layout puts the embedding on the first rank, the norm and the head on the last). servesim gave OPT
    Llama's layout: a middle stage of OPT-13B had no embedding (257 M parameters, 0.48 GiB in bf16, too few) and
    the last no position table. Every OPT stage now holds what the whole model holds besides its layers, OPT-350M's
    project_in/out (512 <-> 1024) included."""
    opt = resolve_model("opt-13b")
    whole = opt.shard(1)
    # the sampler's logits, though, only where vLLM's profile run samples: the last rank
    reserves = [kv_budget(st, H100).activation_reserve for st in stage_models(opt, 4)]
    assert reserves[0] == reserves[1] == reserves[2] == reserves[3] - 256 * 50272 * 4 * 2
    for st in stage_models(opt, 4):  # 10 layers each
        s = st.shard(1)
        assert (s.embedding_params, s.lm_head_params) == (whole.embedding_params, whole.lm_head_params)
        layers = whole.other_params - 2 * 5120  # the final LayerNorm's weight and bias, on every stage
        assert s.other_params == layers // 4 + 2 * 5120
    small = ModelSpec.from_hf_config({
        "model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "ffn_dim": 4096,
        "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
        "do_layer_norm_before": False, "enable_bias": True, "tie_word_embeddings": True}, name="opt-350m")
    proj = 2 * 512 * 1024
    for st in stage_models(small, 3):
        s = st.shard(1)
        assert s.body_matmul_params == 8 * s.layer_matmul_params + proj
        assert s.embedding_params == small.shard(1).embedding_params


def test_a_stage_of_dense_layers_and_a_stage_of_moe_layers_are_each_timed_as_what_they_hold() -> None:
    """DeepSeek's first_k_dense_replace dense layers lie on the first stages (stage_models, 8bb72eb), but the round
    split the whole model's work by layer count, so a stage of dense MLPs was timed like a stage of MoE layers. Here
    two layers, the first dense and the second MoE, over two stages: each stage's time is the analytic time of a
    one-layer model of its own kind (the dense one with DeepSeek's dense MLP, no LM head; the MoE one with the head),
    where before each was half of the two layers' work."""
    ds = dataclasses.replace(resolve_model("deepseek-v3"), num_layers=2, first_k_dense_replace=1)
    inner = AnalyticCostModel(ds, H100, weight_dtype="fp8")
    pp = wrap_pipeline(inner, ds, H100, pipeline_parallel_size=2, weight_dtype="fp8")
    assert isinstance(pp, PipelineCostModel) and len(pp.stages) == 2
    dense = AnalyticCostModel(dataclasses.replace(ds, num_layers=1, num_experts=0, num_experts_per_tok=0,
                                                  n_shared_experts=0, first_k_dense_replace=0), H100, weight_dtype="fp8")
    moe = AnalyticCostModel(dataclasses.replace(ds, num_layers=1, first_k_dense_replace=0), H100, weight_dtype="fp8")
    rows = 64  # two micro-batches of 32 decode rows, 1,000 tokens of context each
    mb = StepShape(32, 32, 32, 32 * 1000, 32 * 1000)
    over = inner.step_overhead + 32 * inner.per_request_overhead
    head = inner.lm_head_time(32)
    # the dense stage (first: no LM head) and the MoE stage (last: the LM head and the sampler)
    t_dense = dense.step_time(mb) - over - dense.lm_head_time(32)
    t_moe = moe.step_time(mb) - over - moe.lm_head_time(32) + head
    assert t_moe > 3 * t_dense  # 32 tokens touch ~31 of 256 experts, each a third of the dense MLP's width (18432)
    hop = pp.hop_time(32)
    expect = inner.step_overhead + rows * inner.per_request_overhead + max(t_dense + t_moe + hop, 2 * max(t_dense, t_moe))
    assert pp.step_time(StepShape(rows, rows, rows, rows * 1000, rows * 1000)) == pytest.approx(expect, rel=1e-12)
    # a model without dense layers keeps the layers' shares (byte-identical rounds)
    assert wrap_pipeline(AnalyticCostModel(M70, H100), M70, H100, pipeline_parallel_size=4).stages == ()


def test_opts_project_in_is_timed_on_the_first_stage_and_project_out_on_the_last() -> None:
    """vLLM's OPTDecoder builds project_in/out on every rank but computes project_in on the first only and
    project_out on the last only; the round split the whole model's work by layer count, both projections spread
    over the stages. OPT-350M (512 <-> 1024) over 3 stages of 8 layers: at one decode row (weights read, memory
    bound) the first stage takes one 512 x 1024 bf16 matrix longer than the middle one, the middle one no
    projection, and the round's pace is the last stage's (project_out and the LM head)."""
    small = ModelSpec.from_hf_config({
        "model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "ffn_dim": 4096,
        "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
        "do_layer_norm_before": False, "enable_bias": True, "tie_word_embeddings": True}, name="opt-350m")
    inner = AnalyticCostModel(small, H100)
    pp = wrap_pipeline(inner, small, H100, pipeline_parallel_size=3)
    assert isinstance(pp, PipelineCostModel) and len(pp.stages) == 3
    one = StepShape(1, 1, 1, 100, 100)
    over = inner.step_overhead + inner.per_request_overhead
    first, middle, last = (st.step_time(one) - over - st.lm_head_time(1) for st in pp.stages)
    bw = H100.mem_bandwidth * inner.bandwidth_efficiency
    assert first - middle == pytest.approx(512 * 1024 * 2 / bw, rel=1e-9)  # project_in's bf16 weights
    assert last - middle == pytest.approx(512 * 1024 * 2 / bw, rel=1e-9)  # project_out's
    assert first + middle + last == pytest.approx(inner.step_time(one) - over - inner.lm_head_time(1), rel=1e-12)
    # three micro-batches of one row: the last stage (project_out, LM head) sets the pace
    head, hop = inner.lm_head_time(1), pp.hop_time(1)
    expect = inner.step_overhead + 3 * inner.per_request_overhead + max(first + middle + last + head + 2 * hop,
                                                                        3 * (last + head))
    assert pp.step_time(StepShape(3, 3, 3, 300, 300)) == pytest.approx(expect, rel=1e-12)
    # memory: every stage still holds both projections
    assert all(st.shard(1).body_matmul_params == 8 * st.shard(1).layer_matmul_params + 2 * 512 * 1024
               for st in stage_models(small, 3))


def test_the_hosts_penalty_time_is_paid_once_a_round_not_once_a_stage() -> None:
    """cb290d3 timed each stage of a dense-first MoE pipeline with its own cost model, the host's penalty inputs
    (``penalty_host_time``, vLLM v1's async scheduling) included, and summed the stages: a round of one row over two
    stages paid the host's 2.45 ms twice (6.4 ms, not 4.0). The stages now only split the body; the host's time lies
    in the round once, as the whole model's step has it."""
    ds = dataclasses.replace(resolve_model("deepseek-v3"), num_layers=4, first_k_dense_replace=1)
    inner = AnalyticCostModel(ds, H100, weight_dtype="fp8", penalty_host_time=24.5e-9)
    pp = wrap_pipeline(inner, ds, H100, pipeline_parallel_size=2, weight_dtype="fp8")
    assert isinstance(pp, PipelineCostModel) and len(pp.stages) == 2
    one = StepShape(1, 1, 1, 100_000, 100_000)  # host-bound: 100k context tokens x 24.5 ns > the GPU's forward
    assert pp.step_time(one) == pytest.approx(inner.step_time(one) + pp.hop_time(1), rel=1e-12)
