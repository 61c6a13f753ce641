"""Prefill/decode disaggregation (sim/loop/disagg): the transfer arithmetic, a request's exact path through both pools,
decode admission bounded by its KV, bad input, and the lesson's published range (DistServe, Splitwise)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sim.config.scenario import load_scenario, parse_scenario, variant_configs
from sim.config.schema import ScenarioError, json_schema
from sim.hardware.models import ModelSpec
from sim.loop.disagg.config import LINK_PRESETS, DisaggConfig, KVLinkConfig
from sim.loop.disagg.kv_transfer import KVLink, kv_bytes
from sim.loop.run import generate_workload, run_scenario, simulate_variant
from tests.conftest import servesim

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "scenarios" / "lesson-disaggregation.yaml"


def _raw(disagg: dict, *, requests: int = 1, rate: float = 1.0, prompt: int = 1000, output: int = 20,
         **deployment) -> dict:
    return {
        "name": "dg", "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": rate}, "num_requests": requests,
                     "prompt_len": {"type": "fixed", "value": prompt},
                     "output_len": {"type": "fixed", "value": output}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096, **deployment},
        "variants": [{"name": "pd", "disaggregation": disagg}],
    }


def _run(raw: dict):
    sc = parse_scenario(raw)
    cfg = variant_configs(sc)[0]
    return simulate_variant(cfg, generate_workload(sc))


def test_link_transfer_time_and_fifo_queue_are_exact() -> None:
    link = KVLink(bandwidth=50e9, latency=20e-6, tensor_parallel_size=2)
    nbytes = 1000 * 131072.0
    # two shards in parallel, each half the bytes, each on its own 50 GB/s link
    assert link.transfer_time(nbytes) == 20e-6 + nbytes / 2 / 50e9
    s1, e1 = link.send(1.0, nbytes)
    s2, e2 = link.send(1.0, nbytes)  # ready at the same time: waits for the first
    assert (s1, e1) == (1.0, 1.0 + link.transfer_time(nbytes))
    assert (s2, e2) == (e1, e1 + link.transfer_time(nbytes))
    s3, _ = link.send(10.0, nbytes)  # the link idled meanwhile
    assert s3 == 10.0
    assert link.bytes_moved == 3 * nbytes


def test_kv_bytes_follow_the_model_and_kv_dtype() -> None:
    m = ModelSpec.from_name("llama-3.1-8b")
    # 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token in bf16, half in fp8
    assert m.kv_bytes_per_token("bf16") == 131072
    assert m.kv_bytes_per_token("fp8") == 65536
    assert kv_bytes(3000, m.kv_bytes_per_token("bf16")) == 3000 * 131072


def test_presets_and_overrides() -> None:
    assert set(LINK_PRESETS) == {"nvlink", "infiniband", "roce", "pcie"}
    link = DisaggConfig.model_validate({"kv_link": {"kind": "roce", "latency_s": 0.001}}).kv_link
    assert link.bandwidth == LINK_PRESETS["roce"][0] * 1e9 and link.latency == 0.001
    assert DisaggConfig.model_validate({"prefill": {"replicas": 3}, "decode": {"replicas": 2}}).ratio == "3P2D"
    d = DisaggConfig.model_validate({"xpyd": "2P1D", "decode": {"router": "least_kv"}})
    # lowercase was refused as 'not of the form xPyD' though it spells the same split; it is vLLM's spelling now
    lower = DisaggConfig.model_validate({"xpyd": "2p1d", "decode": {"router": "least_kv"}})
    assert (lower.xpyd, lower.ratio, lower.prefill.replicas, lower.decode.replicas) == ("2P1D", "2P1D", 2, 1)
    with pytest.raises(ValueError, match="xpyd 3p1d says 1 decode replica, decode.replicas says 2"):
        DisaggConfig.model_validate({"xpyd": "3p1d", "decode": {"replicas": 2}})
    assert (d.prefill.replicas, d.decode.replicas, d.decode.router, d.ratio) == (2, 1, "least_kv", "2P1D")
    for bad, needle in (({"xpyd": "2x1"}, "form xPyD"), ({"xpyd": "2P1D", "prefill": {"replicas": 3}}, "says")):
        with pytest.raises(ValueError, match=needle):
            DisaggConfig.model_validate(bad)


def test_one_request_ttft_is_prefill_plus_transfer_plus_first_decode_step() -> None:
    result, reqs, _ = _run(_raw({"kv_link": {"kind": "infiniband"}, "decode": {"deployment":
                                                                                {"tensor_parallel_size": 2}}}))
    (r,) = result.requests
    assert r.outcome == "completed" and r.output_tokens == 20 and r.replica == 1  # the decode replica
    s = result.steps
    pre = s["replica"] == 0
    dec = s["replica"] == 1
    assert int(pre.sum()) == 1 and s["prefill_tokens"][pre][0] == 1000  # the whole prompt in one step
    # decode: one step computes the last prompt token (the first output token), then 19 decode steps
    assert int(dec.sum()) == 20 and s["decode_tokens"][dec].sum() == 20
    prefill_end = float(s["start"][pre][0] + s["duration"][pre][0])
    link = LINK_PRESETS["infiniband"]
    transfer = link[1] + 1000 * 131072 / (link[0] * 1e9)  # prefill TP 1: one link
    first_decode = float(s["duration"][dec][0])
    assert float(s["start"][dec][0]) == pytest.approx(prefill_end + transfer, rel=1e-12)
    assert r.first_token - r.arrival == pytest.approx(prefill_end - r.arrival + transfer + first_decode, rel=1e-12)
    d = result.disaggregation
    assert d is not None and d["transfer_bytes"].tolist() == [1000 * 131072.0]
    # the decode replica holds the received prompt's KV from its admission: 1000 tokens, 63 blocks of 16
    assert s["kv_tokens"][dec][0] == 1000 and s["kv_blocks_used"][dec][0] == 63
    assert np.all(s["kv_tokens"] >= 0)


def test_summary_reports_transfers_and_pools() -> None:
    sc, raw = load_scenario(LESSON, {"workload.num_requests": 120})
    sc = sc.model_copy(update={"variants": [v for v in sc.variants if v.name == "2P2D"]})
    s = run_scenario(sc).summaries["2P2D"]
    d = s["disaggregation"]
    assert d["ratio"] == "2P2D" and d["num_transfers"] == s["num_completed"] == 120
    assert d["bytes_moved"] == s["total_input_tokens"] * 131072
    assert d["transfer"]["p50"] >= LINK_PRESETS["infiniband"][1]
    assert set(d["pools"]) == {"prefill", "decode"}
    for p in d["pools"].values():
        assert 0.0 < p["busy_fraction"] <= 1.0 and 0.0 <= p["kv_usage_mean"] <= 1.0
    assert s["num_replicas"] == 4 and s["cluster"]["gpu_hours"] == pytest.approx(4 * s["duration"] / 3600)
    # TTFT counts the trip to the decode pool: never below the prefill's own first token
    assert s["ttft"]["p50"] >= d["prefill_ttft"]["p50"]


def test_decode_admission_waits_for_kv() -> None:
    # a decode replica of 80 blocks (1,280 tokens) holds one 1,000-token request at a time: the others wait
    result, _, _ = _run(_raw({"decode": {"deployment": {"num_gpu_blocks": 80}}}, requests=6, rate=1000.0,
                             output=50, max_model_len=1200))
    assert all(r.outcome == "completed" for r in result.requests)
    s = result.steps
    dec = s["replica"] == 1
    assert s["kv_blocks_used"][dec].max() <= 80
    assert s["num_running"][dec].max() == 1
    d = result.disaggregation
    assert d is not None
    wait = d["decode_admitted"] - d["transfer_end"]
    assert wait.max() > 0.05  # queued behind the one before it


def test_bad_disaggregation_input_is_one_clear_error(tmp_path: Path) -> None:
    import yaml

    for disagg, needle in (({"prefill": {"deployment": {"gpuu": "a100-80gb"}}}, "gpuu"),
                           ({"kv_link": {"kind": "ethernet"}}, "kind"),
                           ({"decode": {"policy": {"type": "continuous", "max_num_seqs": 0}}}, "max_num_seqs"),
                           ({"decode": {"deployment": {"kv_dtype": "fp8"}}}, "kv_dtype")):
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump(_raw(disagg)))
        proc = servesim("run", str(p), "-o", str(tmp_path / "out"), cwd=ROOT)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_the_same_bad_pool_value_in_two_variants_is_one_error() -> None:
    """lesson-disaggregation with prefill replicas 0 in both 2P2D and 3P1D printed one line per variant, which read
    as two problems; the mistake is said once, naming both variants."""
    import yaml

    raw = yaml.safe_load((ROOT / "scenarios" / "lesson-disaggregation.yaml").read_text())
    for v in raw["variants"][1:3]:
        v["disaggregation"]["prefill"]["replicas"] = 0
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, "lesson.yaml")
    assert str(e.value) == ("lesson.yaml: variants 1 and 2 (2P2D, 3P1D): disaggregation.prefill.replicas: must be "
                            "greater than or equal to 1 (got 0)")
    raw["variants"][2]["disaggregation"]["prefill"]["replicas"] = -1  # two values: two problems, each its line
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, "lesson.yaml")
    assert str(e.value).splitlines() == [
        "lesson.yaml: variants.1.disaggregation.prefill.replicas: must be greater than or equal to 1 (got 0)",
        "lesson.yaml: variants.2.disaggregation.prefill.replicas: must be greater than or equal to 1 (got -1)"]


def test_the_same_bad_value_at_the_top_and_in_variants_is_one_error() -> None:
    """A sweep of cluster.router sets the top-level cluster and the colocated variants' own: a misspelt router
    printed the same message twice, once for the top level and once for variants 0 and 3, which read as two
    problems (and `serve --policy fcfss` likewise for policy.type). One line now names the top-level key and the
    variants that share the mistake."""
    import yaml

    raw = yaml.safe_load((ROOT / "scenarios" / "lesson-disaggregation.yaml").read_text())
    raw["cluster"] = {"replicas": 1, "router": "leastkv"}
    for i in (0, 3):
        raw["variants"][i]["cluster"]["router"] = "leastkv"
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, "lesson.yaml")
    (line,) = str(e.value).splitlines()
    assert line.startswith("lesson.yaml: cluster.router (and in variants 0 and 3 (colocated, colocated-chunked)): "
                           "not a router's name; did you mean least_kv?"), line
    raw["variants"][0]["cluster"]["router"] = "round_robin"  # one variant: named alone
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, "lesson.yaml")
    (line,) = str(e.value).splitlines()
    assert line.startswith("lesson.yaml: cluster.router (and in variant 3 (colocated-chunked)): not a router's"), line


@pytest.mark.parametrize("gbps", [1e-300, 1e-4, 0.0])
def test_a_kv_link_slower_than_1_mb_s_is_refused(gbps: float) -> None:
    # Before: bandwidth_gbps 1e-300 ran (exit 0) with transfers of 2.7e300 s, past which every decode step was
    # lost to rounding: TPOT p50 0.0 ms and E2EL p50 2.7e300 s for 40 completed requests.
    with pytest.raises(ValidationError, match="bandwidth_gbps"):
        KVLinkConfig(bandwidth_gbps=gbps)
    assert KVLinkConfig(bandwidth_gbps=1e-3).bandwidth == 1e6


def test_bandwidth_gbps_says_it_counts_bytes_not_bits() -> None:
    # "gbps" reads as gigabits per second to anyone who sizes networks, and a 400 Gb/s NIC written as 400 made the
    # link 8x faster than it is; the key is GB/s (bytes, as the presets), which the schema an editor completes from
    # and docs/clusters.md now say in so many words
    desc = KVLinkConfig.model_json_schema()["properties"]["bandwidth_gbps"]["description"]
    assert "not bits: a 400 Gb/s NIC is 50" in desc
    assert KVLinkConfig(bandwidth_gbps=50).bandwidth == LINK_PRESETS["infiniband"][0] * 1e9 == 50e9
    assert "not gigabits: a 400 Gb/s NIC is 50" in (ROOT / "docs" / "clusters.md").read_text()


def test_schema_has_the_section() -> None:
    text = json.dumps(json_schema())
    assert "DisaggConfig" in text and "kv_link" in text


def test_disaggregation_and_cluster_exclude_each_other() -> None:
    raw = _raw({})
    raw["variants"][0]["cluster"] = {"replicas": 2}
    with pytest.raises(ScenarioError, match="exclude each other"):
        _run(raw)


@pytest.mark.parametrize(("deployment", "needle"), [
    ({"pipeline_parallel_size": 2}, "pipeline_parallel_size > 1 is not modelled"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance": {"type": "geometric",
                                                                                  "rate": 0.5}}},
     "speculative is not modelled"),
])
def test_what_the_pools_do_not_model_is_refused(deployment: dict, needle: str) -> None:
    raw = _raw({})
    raw["variants"][0]["deployment"] = deployment
    with pytest.raises(ScenarioError, match=needle):
        _run(raw)


@pytest.mark.parametrize(("policy", "message"), [
    # before: "policy: Unable to extract tag using discriminator 'type'" (pydantic's words) and
    # "policy.continuous.max_num_seqz: Extra inputs are not permitted"
    ({"max_num_seqs": 8}, "policy.type: required key is missing"),
    ({"type": "continuous", "max_num_seqz": 8}, "policy.max_num_seqz: unknown key"),
])
def test_a_pools_bad_policy_is_worded_as_the_files_own_policy(policy: dict, message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(_raw({"prefill": {"policy": policy}}))
    assert str(e.value) == f"scenario: variants.0.disaggregation.prefill: {message}"


# ---- the lesson ----------------------------------------------------------------------------------------------
def _lesson(seed: int, slos: dict | None = None) -> dict[str, dict]:
    over = {"seed": seed, **({f"slos.{k}": v for k, v in slos.items()} if slos else {})}
    sc, _ = load_scenario(LESSON, over)
    sc = sc.model_copy(update={"variants": [v for v in sc.variants if v.name in ("colocated", "2P2D")]})
    return run_scenario(sc).summaries


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lesson_disaggregation_raises_goodput_under_tight_slos(seed: int) -> None:
    s = _lesson(seed)
    gain = s["2P2D"]["goodput"] / s["colocated"]["goodput"]
    # DistServe and Splitwise: higher goodput under tight TTFT and TPOT SLOs (measured 1.33, 1.14, 1.17)
    assert 1.1 <= gain <= 1.6, f"seed {seed}: 2P2D / colocated goodput = {gain:.2f}, outside 1.1-1.6"
    # because the decodes no longer stall for prompts
    assert s["2P2D"]["tpot"]["p99"] < 0.7 * s["colocated"]["tpot"]["p99"]


def test_lesson_gain_vanishes_under_loose_slos() -> None:
    s = _lesson(0, {"ttft": 2.0, "tpot": 0.05})
    gain = s["2P2D"]["goodput"] / s["colocated"]["goodput"]
    assert gain <= 1.02, f"2P2D / colocated goodput = {gain:.3f} under loose SLOs"


def test_report_has_the_disaggregation_section(tmp_path: Path) -> None:
    from sim.loop.run import write_scenario_run
    from sim.output.report.disagg import fig_disagg

    sc, raw = load_scenario(LESSON, {"workload.num_requests": 60})
    run = run_scenario(sc, raw)
    fig = fig_disagg(run.results, run.summaries)
    assert fig is not None
    names = [t.name for t in fig.data]
    # busy and KV-use bars per disaggregated run, and its transfer-time curve; colocated runs draw nothing here
    assert names == ["2P2D: busy", "2P2D: KV use", "2P2D: transfer", "3P1D: busy", "3P1D: KV use", "3P1D: transfer"]
    curve = fig.data[2]
    assert curve.y[-1] == 1.0 and np.all(np.diff(curve.x) >= 0)
    out = write_scenario_run(run, tmp_path / "out", raw)
    page = (out / "report.html").read_text()
    assert "Disaggregation" in page and "transfer p99 (ms)" in page
    import csv

    with open(out / "transfers.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 60 and {r["variant"] for r in rows} == {"2P2D", "3P1D"}
    for row in rows:  # the link's arithmetic, row by row (InfiniBand preset, TP 1)
        t = float(row["transfer_end_s"]) - float(row["transfer_start_s"])
        assert t == pytest.approx(20e-6 + float(row["bytes"]) / 50e9, rel=1e-9)
        assert int(row["bytes"]) == int(row["prompt_tokens"]) * 131072  # a whole number (it read 514457600.0)
    assert fig_disagg([r for r in run.results if r.disaggregation is None], run.summaries) is None


def test_plan_searches_splits_and_picks_one_where_colocated_misses() -> None:
    from sim.config.schema import PlanConfig
    from sim.studies.planner import plan

    sc, _ = load_scenario(LESSON, {"workload.num_requests": 300})
    sc = sc.model_copy(update={"variants": [], "plan": PlanConfig.model_validate({
        "gpus": ["h100-sxm"], "tensor_parallel_sizes": [1], "weight_dtypes": ["bf16"], "kv_dtypes": ["auto"],
        "max_num_seqs": [256], "enable_chunked_prefill": [False], "max_gpus": 5, "percentile": 90,
        "disaggregation": {"kv_link": {"kind": "infiniband"}}})})
    res = plan(sc)
    labels = {e.candidate.label().split(" x ")[0]: e for e in res.evaluations}
    # every split of 2..5 replicas is a candidate, priced like the colocated fleet of the same size
    assert {"1P1D", "2P1D", "1P2D", "2P2D", "1P3D", "3P1D", "4P1D"} <= set(labels)
    assert labels["2P2D"].candidate.cost_per_hour == labels["4"].candidate.cost_per_hour
    # measured: 4 colocated replicas miss the p90 TPOT bound (16.4 ms > 15 ms), 2P2D meets both (399 ms, 10.9 ms)
    assert labels["4"].status == "missed" and labels["2P2D"].status == "met"
    assert res.chosen is not None and res.chosen.candidate.prefill_replicas == 2
    assert res.chosen.candidate.replicas == 4
    # an xPyD row has its joules (its pools' GPUs', sim/costs/pooled_power.py), as the same H100s colocated do
    from sim.studies.plan_text import format_plan

    assert math.isfinite(labels["2P2D"].j_per_output_token) and labels["2P2D"].j_per_output_token > 0
    assert "(-: a GPU without power figures)" in format_plan(res)


def test_plan_without_the_section_has_no_splits() -> None:
    from sim.config.schema import PlanConfig
    from sim.studies.planner import plan

    sc, _ = load_scenario(LESSON, {"workload.num_requests": 100})
    sc = sc.model_copy(update={"variants": [], "plan": PlanConfig.model_validate({
        "gpus": ["h100-sxm"], "tensor_parallel_sizes": [1], "weight_dtypes": ["bf16"], "kv_dtypes": ["auto"],
        "max_num_seqs": [256], "enable_chunked_prefill": [False], "max_gpus": 3})})
    assert all(e.candidate.prefill_replicas == 0 for e in plan(sc).evaluations)


@pytest.mark.parametrize("seed", range(6))
def test_every_request_ends_once_and_kv_accounting_stays_sound(seed: int) -> None:
    """Seeded random splits, loads, decode caches and policies: every request ends (completed, or rejected by
    a pool's admission), the decode pool's KV never goes past its capacity nor below zero, and every block is
    free at the end."""
    rng = np.random.default_rng(seed)
    x, y = (int(v) for v in rng.integers(1, 4, size=2))
    disagg = {"prefill": {"replicas": x, "policy": {"type": "continuous",
                                                    "enable_chunked_prefill": bool(rng.integers(2)),
                                                    "max_num_batched_tokens": 4096}},
              "decode": {"replicas": y, "router": ["round_robin", "least_outstanding", "least_kv"][seed % 3],
                         "deployment": {"num_gpu_blocks": int(rng.integers(300, 1200))}},
              "kv_link": {"kind": ["nvlink", "infiniband", "roce", "pcie"][seed % 4]}}
    raw = _raw(disagg, requests=80, rate=float(rng.uniform(5, 60)), output=int(rng.integers(2, 60)),
               prompt=int(rng.integers(50, 3000)))
    if seed % 2:
        raw["admission"] = {"max_queue_len": 5}
    result, reqs, _ = _run(raw)
    assert sorted(r.id for r in result.requests) == list(range(80))
    assert all(r.outcome in ("completed", "rejected") for r in result.requests)
    done = [r for r in result.requests if r.outcome == "completed"]
    assert all(r.output_tokens == r.target_output_tokens and r.first_token >= r.arrival for r in done)
    s = result.steps
    assert np.all(s["kv_tokens"] >= 0) and np.all(s["kv_blocks_used"] <= s["kv_capacity_blocks"])
    d = result.disaggregation
    assert d is not None and np.all(d["transfer_end"] >= d["transfer_start"]) and np.all(
        d["transfer_start"] >= d["prefill_end"])


def test_closed_loop_users_wait_for_the_decode_pool() -> None:
    raw = _raw({"decode": {"replicas": 2}}, requests=30, output=30)
    raw["workload"]["arrival"] = {"type": "closed_loop", "num_users": 3, "think_time": {"type": "fixed",
                                                                                        "value": 0.1}}
    result, _, _ = _run(raw)
    assert all(r.outcome == "completed" for r in result.requests)
    by_user: dict[int, list] = {}
    for r in result.requests:
        by_user.setdefault(r.session_id, []).append(r)
    for rs in by_user.values():  # a user's next request leaves a think time after its previous one ended
        rs.sort(key=lambda r: r.arrival)
        for a, b in zip(rs, rs[1:], strict=False):
            assert b.arrival == pytest.approx(a.finish + 0.1, abs=1e-12)


def test_workload_failures_are_refused_at_load(tmp_path: Path) -> None:
    import yaml

    raw = _raw({})
    raw["workload"]["failures"] = {"fraction": 0.1, "after": {"type": "fixed", "value": 0.5}}
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(raw))
    proc = servesim("run", str(p), "-o", str(tmp_path / "o"), cwd=ROOT)
    assert proc.returncode == 2 and "workload.failures" in proc.stderr and "Traceback" not in proc.stderr


def test_run_table_shows_the_disaggregation_rows_only_when_a_run_has_them() -> None:
    from sim.output.table import format_table

    sc, _ = load_scenario(LESSON, {"workload.num_requests": 40})
    summaries = run_scenario(sc).summaries
    text = format_table(summaries)
    assert "KV transfer p99 (ms)" in text and "decode pool busy" in text
    assert "KV transfer" not in format_table({"colocated": summaries["colocated"]})


def test_pools_on_different_gpus_are_priced_each_at_its_own_rate() -> None:
    # Splitwise's point: prompts on the fast GPU, decodes on a cheaper one
    from sim.hardware.gpu import GPUSpec
    from sim.metrics.summary import summarize

    result, _, _ = _run(_raw({"prefill": {"deployment": {"tensor_parallel_size": 2}},
                              "decode": {"replicas": 2, "deployment": {"gpu": "a100-80gb"}}}, requests=20, rate=5.0))
    h100, a100 = GPUSpec.from_name("h100-sxm").price_per_hour, GPUSpec.from_name("a100-80gb").price_per_hour
    c = result.cluster
    assert c is not None
    hours = result.duration / 3600
    assert c["cost_usd"] == pytest.approx(hours * (2 * h100 + 2 * a100), rel=1e-12)
    assert c["gpu_hours"] == pytest.approx(4 * hours, rel=1e-12)
    pools = summarize(result)["disaggregation"]["pools"]
    assert (pools["prefill"]["gpu"], pools["prefill"]["tensor_parallel_size"]) == ("h100-sxm", 2)
    assert (pools["decode"]["gpu"], pools["decode"]["replicas"]) == ("a100-80gb", 2)
    # TP 2 prefill: each GPU sends its half of the KV on its own link
    d = result.disaggregation
    assert d is not None
    link = LINK_PRESETS["infiniband"]
    assert np.allclose(d["transfer_end"] - d["transfer_start"], link[1] + d["transfer_bytes"] / 2 / (link[0] * 1e9),
                       rtol=1e-12, atol=0)
