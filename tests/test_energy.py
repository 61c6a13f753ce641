"""The power model (sim/costs/energy.py): one step computed by hand, energy as the integral of power over steps and idle
gaps, per-request energies summing to the run's, the power cap's effect on throughput, and the shape of joules per
output token against batch size and output length."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import servesim
from sim.config.schema import ScenarioError
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.costs.energy import MEMORY_POWER_SHARE, PowerModel, clock_share, run_energy
from sim.costs.energy_time import power_over_time
from sim.hardware.gpu import GPUSpec
from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.summary import bottleneck
from tests.conftest import servesim as servesim_cli


def _scenario(*, arrival: dict, n: int, prompt: int = 256, output: int = 128, max_num_seqs: int = 64,
              gpu: str = "h100-sxm", limit: float | None = None) -> dict:
    dep: dict = {"model": "llama-3.1-8b", "gpu": gpu}
    if limit is not None:
        dep["power_limit_w"] = limit
    return {
        "name": "energy", "seed": 3,
        "workload": {"arrival": arrival, "num_requests": n,
                     "prompt_len": {"type": "fixed", "value": prompt},
                     "output_len": {"type": "fixed", "value": output}},
        "deployment": dep,
        "policy": {"type": "continuous", "max_num_seqs": max_num_seqs},
    }


def _one(sc: dict) -> tuple[RunResult, dict]:
    res = servesim.run(sc)
    name = res.variants[0]
    return res.results[0], res.summary[name]


def _record(i: int, sched: float, first: float, finish: float, prompt: int, out: int) -> RequestRecord:
    return RequestRecord(i, 0.0, sched, first, finish, prompt, out, out, 0, "completed", "", 0, -1)


def _steps(rows: list[dict]) -> dict[str, np.ndarray]:
    keys = ("start", "duration", "flops", "batch_size", "padded_rows", "prefill_tokens", "decode_tokens",
            "padding_tokens", "kv_tokens", "replica")
    return {k: np.array([r.get(k, 0) for r in rows], dtype=np.float64 if k in ("start", "duration", "flops")
                        else np.int64) for k in keys}


def test_one_step_by_hand_and_its_idle_gap() -> None:
    # 100 W idle, 500 W TDP, a 1.6667 TFLOP/s replica: at the default 60% efficiency, 1 TFLOP/s. A 10 ms step of
    # 4 GFLOP computes 4 ms (share 0.4) and streams memory the other 6 ms (share 0.6):
    # P = 100 + 400 * min(1, 0.4 + 0.75 * 0.6) = 100 + 400 * 0.85 = 440 W, E = 4.4 J; the run lasts 1.01 s, so
    # the GPU idles 1.0 s at 100 W: 100 J more.
    pm = PowerModel(idle_w=100.0, tdp_w=500.0, limit_w=500.0, gpus=1, roofline=None, peak_flops=1e12 / 0.6)
    steps = _steps([{"start": 1.0, "duration": 0.01, "flops": 4e9, "batch_size": 1, "prefill_tokens": 100}])
    r = RunResult("x", [_record(0, 1.0, 1.01, 1.01, 100, 1)], steps, np.zeros(0), np.zeros(0, dtype=np.int64),
                  duration=1.01, peak_flops=1e12 / 0.6, kv_capacity_blocks=10, block_size=16, power=pm)
    e = run_energy(r)
    assert e is not None
    assert MEMORY_POWER_SHARE == 0.75
    assert e.step_power_w[0] == pytest.approx(440.0, rel=1e-12)
    assert e.step_energy_j[0] == pytest.approx(4.4, rel=1e-12)
    assert e.idle_energy_j == pytest.approx(100.0, rel=1e-12)
    assert e.energy_j == pytest.approx(104.4, rel=1e-12)
    assert e.request_energy_j.tolist() == pytest.approx([104.4], rel=1e-12)
    # the same 4 GFLOP over two such GPUs: 2 ms of compute each (share 0.2, memory 0.8), 100 + 400 * 0.8 = 420 W
    # each uncapped, and 250 W each under a 250 W cap; two GPUs idle twice as much
    r.power = PowerModel(100.0, 500.0, 500.0, 2, None, 2e12 / 0.6)
    e2 = run_energy(r)
    assert e2 is not None and e2.step_power_w[0] == pytest.approx(840.0, rel=1e-12)
    r.power = PowerModel(100.0, 500.0, 250.0, 2, None, 2e12 / 0.6)
    e3 = run_energy(r)
    assert e3 is not None and e3.step_power_w[0] == 500.0 and e3.idle_energy_j == pytest.approx(200.0, rel=1e-12)


def test_roofline_busy_times_of_a_decode_step_by_hand() -> None:
    # A decode step of 8 rows attending 8,008 tokens on an H100 is memory-bound in both roofline parts, so its
    # memory busy time is the step time less the overheads (1.5 ms + 10 us per row), and the compute side is the
    # FLOPs over the 60%-efficient peak. The power model recovers the pairs from the recorded FLOPs.
    cost = AnalyticCostModel("llama-3.1-8b", "h100-sxm")
    shape = StepShape(8, 8, 8, 8008, 8008)
    t = float(cost.step_time(shape))
    flops = float(cost.step_flops(shape))
    compute, memory = cost.busy_times(shape)
    assert float(memory) == pytest.approx(t - 1.5e-3 - 8 * 1e-5, rel=1e-12)
    assert float(compute) == pytest.approx(flops / (989.4e12 * 0.6), rel=1e-9)
    pm = PowerModel(70.0, 700.0, 700.0, 1, cost, cost.peak_flops)
    steps = _steps([{"start": 0.0, "duration": t, "flops": flops, "batch_size": 8, "decode_tokens": 8,
                     "kv_tokens": 8008}])
    recs = [_record(i, 0.0, 0.0, t, 1000, 2) for i in range(8)]
    r = RunResult("x", recs, steps, np.zeros(0), np.zeros(0, dtype=np.int64), duration=t,
                  peak_flops=cost.peak_flops, kv_capacity_blocks=10, block_size=16, power=pm)
    e = run_energy(r)
    assert e is not None
    want = 70.0 + 630.0 * min(1.0, float(compute) / t + 0.75 * float(memory) / t)
    assert e.step_power_w[0] == pytest.approx(want, rel=1e-9)
    assert e.request_energy_j == pytest.approx(np.full(8, want * t / 8), rel=1e-9)  # equal shares


def test_vllm_v1s_per_row_overhead_is_hbm_busy_and_its_step_overhead_idle() -> None:
    # vLLM V1 (sim/engines/vllm_v1.py VLLM_V1_PER_REQUEST_BUSY) runs its host's work beside the GPU, so the step's
    # per-row seconds (10 us a row) are GPU work: a decode step of 256 rows on an H100 keeps HBM busy 2.56 ms more
    # than the roofline's parts, the step's time unchanged; the 1.5 ms step overhead stays idle. The plain cost model
    # (no engine) keeps both idle, as before.
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.build import build

    raw = _scenario(arrival={"type": "all_at_once"}, n=4)
    raw["deployment"]["engine"] = "vllm-v1"
    v1 = build(variant_configs(parse_scenario(raw, "t"))[0])[2]
    assert isinstance(v1, AnalyticCostModel) and v1.per_request_busy
    plain = AnalyticCostModel("llama-3.1-8b", "h100-sxm", linear_overlap=v1.linear_overlap,
                              attention_efficiency=v1.attention_efficiency)
    assert not plain.per_request_busy
    shape = StepShape(256, 256, 256, 256_000, 256_000)
    assert float(v1.step_time(shape)) == float(plain.step_time(shape))
    (c1, m1), (c0, m0) = v1.busy_times(shape), plain.busy_times(shape)
    assert float(c1) == float(c0)
    assert float(m1) - float(m0) == pytest.approx(256 * 1e-5, rel=1e-9)


def test_energy_is_the_integral_of_power_and_requests_sum_to_it() -> None:
    # light Poisson load: the GPU idles between bursts
    r, s = _one(_scenario(arrival={"type": "poisson", "rate": 2.0}, n=60))
    e = run_energy(r)
    assert e is not None and e.idle_energy_j > 0
    starts, dur = np.asarray(r.steps["start"]), np.asarray(r.steps["duration"])
    t0 = min(x.arrival for x in r.requests)
    t1 = t0 + r.duration
    # walk the timeline: each step at its power, each gap between steps (and before the first, after the last) idle
    assert r.power is not None
    joules, t = 0.0, t0
    for st, d, p in zip(starts, dur, e.step_power_w, strict=True):
        joules += (st - t) * r.power.idle_w + p * d
        t = st + d
    joules += (t1 - t) * r.power.idle_w
    assert s["energy"]["energy_j"] == pytest.approx(joules, rel=1e-9)
    assert s["energy"]["mean_power_w"] == pytest.approx(joules / r.duration, rel=1e-12)
    assert float(e.request_energy_j.sum()) == pytest.approx(e.energy_j, rel=1e-12)
    centres, watts = power_over_time(r, bins=50)  # type: ignore[misc]
    assert float(watts.sum() * (t1 - t0) / 50) == pytest.approx(e.energy_j, rel=1e-9)
    assert s["energy"]["j_per_output_token"] == pytest.approx(joules / s["total_output_tokens"], rel=1e-12)


def test_requests_sum_to_the_fleets_energy_in_a_cluster() -> None:
    sc = _scenario(arrival={"type": "poisson", "rate": 8.0}, n=80)
    sc["cluster"] = {"replicas": 2}
    r, s = _one(sc)
    e = run_energy(r)
    assert e is not None
    assert float(e.request_energy_j.sum()) == pytest.approx(s["energy"]["energy_j"], rel=1e-12)
    # both replicas were up the whole run: idle plus busy replica-seconds are 2 x the duration
    assert r.cluster is not None and e.up_seconds == pytest.approx(r.cluster["replica_seconds"])


def _attribute_by_masks(recs: list[RequestRecord], steps: dict[str, np.ndarray], energy_j: np.ndarray,
                        total: float) -> np.ndarray:
    """``sim.costs.energy.attribute`` as it was written before its fleet path grouped the replicas once: a mask of
    every step and every request per replica."""
    start, replica, prefill = steps["start"], steps["replica"], steps["prefill_tokens"].astype(np.float64)
    tok = prefill + steps["decode_tokens"]
    per_tok = np.divide(energy_j, tok, out=np.zeros_like(energy_j), where=tok > 0)
    req_rep = np.array([r.replica for r in recs])
    fs_all, ft_all, fin_all = (np.array([getattr(r, k) for r in recs]) for k in ("first_scheduled", "first_token",
                                                                                  "finish"))
    prompt = np.array([r.prompt_tokens for r in recs], dtype=np.float64)
    out = np.zeros(len(recs))
    for rep in np.unique(replica):
        sel = replica == rep
        st, pt, pf = start[sel], per_tok[sel], prefill[sel]
        order = np.argsort(st, kind="stable")
        st, pt, pf = st[order], pt[order], pf[order]
        c_dec, c_pre_e, c_pre_n = (np.concatenate(([0.0], np.cumsum(x))) for x in (pt, pt * pf, pf))
        mine = (req_rep == rep) & (fs_all >= 0)
        fs, ft, fin = fs_all[mine], ft_all[mine], fin_all[mine]
        ft = np.where(ft >= 0, ft, fin)
        i0, i1, i2 = (np.searchsorted(st, x, side="left") for x in (fs, ft, fin))
        pre_n = c_pre_n[i1] - c_pre_n[i0]
        pre_e = np.divide((c_pre_e[i1] - c_pre_e[i0]) * prompt[mine], pre_n, out=np.zeros(len(fs)), where=pre_n > 0)
        out[mine] = pre_e + (c_dec[i2] - c_dec[i1])
    return out * (total / float(out.sum()))


def test_a_fleets_energy_is_attributed_per_replica_as_a_mask_per_replica_did() -> None:
    """The fleet path groups the steps and the requests by replica once (a mask per replica was quadratic in the
    fleet: 0.39 s of a 0.94 s summary at 256 replicas): the same shares to the bit, with replicas interleaved, one
    replica's steps out of start order, a request never scheduled and a replica with requests but no steps."""
    from sim.costs import energy

    rng = np.random.default_rng(7)
    n = 400
    rows = [{"start": float(t), "duration": 0.01, "replica": int(rng.integers(0, 4)),
             "prefill_tokens": int(rng.integers(0, 3)) * 64, "decode_tokens": int(rng.integers(0, 9))}
            for t in np.sort(rng.uniform(0.0, 10.0, n))]
    rows[10:40] = rows[10:40][::-1]  # some steps out of start order (replica 1's among them)
    for r in rows[10:40]:
        r["replica"] = 1
    steps = _steps(rows)
    recs = []
    for i in range(60):
        sched = float(rng.uniform(0.0, 8.0))
        first = sched + float(rng.uniform(0.0, 1.0))
        rec = _record(i, sched if i != 5 else -1.0, first if i % 7 else -1.0, first + float(rng.uniform(0.0, 1.0)),
                      int(rng.integers(1, 500)), 4)
        recs.append(replace(rec, replica=4 if i == 9 else i % 4))
    res = RunResult("x", recs, steps, np.zeros(0), np.zeros(0, dtype=np.int64), duration=11.0, peak_flops=1e12,
                    kv_capacity_blocks=10, block_size=16)
    energy_j = rng.uniform(1.0, 5.0, n)
    got = energy.attribute(res, energy_j, 123.0)
    want = _attribute_by_masks(recs, steps, energy_j, 123.0)
    assert got.tobytes() == want.tobytes()
    assert got[5] == 0.0 and got[9] == 0.0 and (got > 0).sum() == 58


def test_longer_requests_draw_more() -> None:
    sc = _scenario(arrival={"type": "poisson", "rate": 4.0}, n=40)
    sc["workload"]["output_len"] = {"type": "uniform", "low": 16, "high": 512}
    r, _ = _one(sc)
    e = run_energy(r)
    assert e is not None
    out = np.array([x.output_tokens for x in r.requests])
    # not proportional: a token computed in a small batch costs more than one in a large batch (0.77 measured)
    assert np.corrcoef(out, e.request_energy_j)[0, 1] > 0.6
    assert e.request_energy_j[np.argmax(out)] > e.request_energy_j[np.argmin(out)]


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_lowering_the_cap_never_raises_throughput(workload: str) -> None:
    prompt, output = (4096, 4) if workload == "prefill" else (64, 512)
    tput, joules = [], []
    for limit in (700, 600, 500, 400, 300, 200):
        _, s = _one(_scenario(arrival={"type": "all_at_once"}, n=64, prompt=prompt, output=output, limit=limit))
        tput.append(s["total_token_throughput"])
        joules.append(s["energy"]["j_per_output_token"])
        assert s["energy"]["peak_step_power_w"] <= limit + 1e-9
    assert all(b <= a for a, b in zip(tput, tput[1:], strict=False)), tput
    # and the energy of the same work does not rise: the slower clock draws less power per operation (f^3 against f)
    assert all(b <= a for a, b in zip(joules, joules[1:], strict=False)), joules
    slow = tput[-1] / tput[0]
    if workload == "prefill":  # compute-bound: a 200 W cap (clock share 0.63) costs about a third
        assert slow < 0.75
    else:  # memory-bound decode barely notices (Ma et al. 2026)
        assert slow > 0.9


def test_a_lower_cap_never_shortens_a_step_on_any_gpu() -> None:
    """The property under the throughput test above, over every GPU preset with power figures, five seeded random
    caps between its idle power and its TDP and 200 seeded random step shapes (prefill and decode rows mixed): a
    step under a lower cap never takes less time; the most compute-bound ones take longer."""
    from sim.hardware.gpu import GPU_PRESETS

    rng = np.random.default_rng(41)
    n = 200
    rows = rng.integers(1, 257, n)
    decode = rng.integers(0, rows + 1)
    tokens = decode + rng.integers(1, 8192, n) * (rows > decode)
    kv = tokens + rng.integers(0, 100_000, n)
    shape = StepShape(rows, tokens, decode, kv, kv + rng.integers(0, 10_000, n))
    gpus = [g for g in GPU_PRESETS.values() if g.tdp_w > 0 and g.peak_flops.get("bf16", 0) > 0]
    assert len(gpus) >= 10
    for g in gpus:
        caps = [g.tdp_w, *sorted(rng.uniform(g.idle_w + 1.0, g.tdp_w, 5), reverse=True)]
        times = [np.asarray(AnalyticCostModel("llama-3.1-8b", g, compute_clock=clock_share(g.idle_w, g.tdp_w, c))
                            .step_time(shape)) for c in caps]
        for hi, lo in zip(times, times[1:], strict=False):
            assert np.all(lo >= hi), g.name
        assert np.any(times[-1] > times[0] * 1.05), g.name


def test_clock_share() -> None:
    assert clock_share(70, 700, 700) == 1.0
    assert clock_share(70, 700, 800) == 1.0
    assert clock_share(100, 500, 150) == pytest.approx((50 / 400) ** (1 / 3))  # 0.5


def test_joules_per_token_fall_with_batch_size_and_rise_with_output_length() -> None:
    by_batch = []
    for seqs in (1, 8, 64):
        _, s = _one(_scenario(arrival={"type": "closed_loop", "num_users": seqs}, n=4 * seqs, max_num_seqs=seqs))
        by_batch.append(s["energy"]["j_per_output_token"])
    assert by_batch[0] > by_batch[1] > by_batch[2], by_batch
    # at an equal batch, a longer output reads more KV per token (short prompts, so that the prefill's share of a
    # request, spread over fewer tokens, does not hide it)
    by_len = []
    for out in (128, 1024, 4096):
        _, s = _one(_scenario(arrival={"type": "closed_loop", "num_users": 32}, n=64, prompt=16, output=out,
                              max_num_seqs=32))
        by_len.append(s["energy"]["j_per_output_token"])
    assert by_len[0] < by_len[1] < by_len[2], by_len


def test_b200_below_h100_at_equal_load() -> None:
    j = {}
    for gpu in ("h100-sxm", "b200"):
        _, s = _one(_scenario(arrival={"type": "closed_loop", "num_users": 64}, n=128, gpu=gpu))
        j[gpu] = s["energy"]["j_per_output_token"]
    assert j["b200"] < j["h100-sxm"], j


def test_a_waiting_b200_draws_its_measured_idle_power() -> None:
    # fleet-sim's 8x B200 node measured 251.3 W a GPU with the model loaded and nothing running (sim/hardware/
    # presets/gpus.py); two requests 10 s apart leave the GPU waiting between them, at exactly that draw
    res = servesim.run(_scenario(arrival={"type": "poisson", "rate": 0.1}, n=2, gpu="b200"))
    e = res.summary[res.variants[0]]["energy"]
    assert e["idle_w"] == 251.3
    r = res.results[0]
    busy = float(np.asarray(r.steps["duration"]).sum())
    span = float(max(q.finish for q in r.requests) - np.asarray(r.steps["start"])[0])
    assert span - busy > 1.0 and e["idle_energy_j"] == pytest.approx(251.3 * (span - busy), rel=1e-6)


def test_bad_power_figures_are_refused() -> None:
    with pytest.raises(ScenarioError, match="deployment.power_limit_w: 50 W is outside the range of GPU h100-sxm: "
                       "above its idle 70 W"):
        servesim.run(_scenario(arrival={"type": "poisson", "rate": 1.0}, n=2, limit=50))
    with pytest.raises(ScenarioError, match="power_limit_w: 800 W is outside"):
        servesim.run(_scenario(arrival={"type": "poisson", "rate": 1.0}, n=2, limit=800))
    with pytest.raises(ValueError, match="idle_w .* must not exceed tdp_w"):
        GPUSpec("g", 1 << 30, 1e12, {"bf16": 1e14}, 1e10, tdp_w=100.0, idle_w=200.0)
    with pytest.raises(ValueError, match="tdp_w must be a finite number"):
        GPUSpec("g", 1 << 30, 1e12, {"bf16": 1e14}, 1e10, tdp_w=math.inf)


def test_a_power_cap_on_a_calibration_profile_is_refused(tmp_path: Path) -> None:
    # Before: a profile measured on an H100 under a 200 W cap ran every step at the profile's speed while its
    # power was clipped to 200 W: J per output token 0.068 -> 0.025, output tok/s 8,014 both. A profile's steps were
    # measured at the GPU's own limit; only the analytic model slows a capped clock, so the pair is refused
    import json

    root = Path(__file__).resolve().parent.parent
    cpu = root / "calibration" / "profiles" / "tiny-cpu.json"
    profile = tmp_path / "tiny-h100.json"
    profile.write_text(json.dumps({**json.loads(cpu.read_text()), "device": "NVIDIA H100 80GB HBM3"}))
    sc = _scenario(arrival={"type": "all_at_once"}, n=4, prompt=16, output=4, limit=200)
    sc["deployment"].update(model="tiny", cost_model={"type": "fitted", "profile": str(profile)})
    with pytest.raises(ScenarioError, match=r"deployment\.power_limit_w: a calibration profile's steps were "
                       r"measured at the power limit its GPU had then and cannot be slowed to another; a cap of "
                       r"200 W is modelled with cost_model analytic \(the default\)"):
        servesim.run(sc)
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = servesim_cli("run", str(path), "-o", str(tmp_path / "out"), cwd=root)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "power_limit_w" in out.stderr
    del sc["deployment"]["power_limit_w"]
    assert servesim.run(sc).summary  # the profile alone runs


def test_a_gpu_without_power_figures_has_no_energy() -> None:
    sc = _scenario(arrival={"type": "poisson", "rate": 1.0}, n=4, gpu="a10g")
    sc["deployment"]["model"] = "llama-3.2-1b"
    _, s = _one(sc)
    assert s["energy"] is None


def test_a_profile_measured_on_a_cpu_has_no_gpu_energy(tmp_path: Path) -> None:
    # Before: a scenario on the shipped tiny CPU profile (deployment.gpu left at its default, h100-sxm) reported an
    # H100's power for the CPU's steps: 514.5 W and 0.436 J per output token on validate's simulated side. A
    # profile's steps are its device's; the power figures are the scenario GPU's, so they go together only where
    # the profile was measured on a GPU.
    import json

    root = Path(__file__).resolve().parent.parent
    cpu = root / "calibration" / "profiles" / "tiny-cpu.json"
    gpu = tmp_path / "tiny-h200.json"
    gpu.write_text(json.dumps({**json.loads(cpu.read_text()), "device": "NVIDIA H200"}))
    for profile, modelled in ((cpu, False), (gpu, True)):
        sc = _scenario(arrival={"type": "poisson", "rate": 50.0}, n=8, prompt=16, output=8)
        sc["deployment"].update(model="tiny", gpu="h200", cost_model={"type": "fitted", "profile": str(profile)})
        _, s = _one(sc)
        assert (s["energy"] is not None) is modelled, profile
        # and it says CPU where a CPU timed the steps: the table read "GPU busy", the verdict "GPU-bound", the
        # report "GPU memory" with the scenario GPU's whole memory drawn over the CPU's steps
        assert s.get("device") == (None if modelled else "cpu"), profile
        device = "GPU" if modelled else "CPU"
        assert bottleneck(s).startswith(f"{device}-bound: MFU unknown, {device} busy"), profile


def test_exports_carry_the_energy() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from sim.output.benchfiles.export_metrics import openmetrics_text
    from sim.output.benchfiles.export_vllm import vllm_bench_result

    sc = _scenario(arrival={"type": "poisson", "rate": 4.0}, n=40)
    sc["deployment"]["tensor_parallel_size"] = 2
    r, s = _one(sc)
    bench = vllm_bench_result(r)
    assert bench["energy_j"] == s["energy"]["energy_j"]
    assert bench["j_per_output_token"] == pytest.approx(s["energy"]["j_per_output_token"], rel=1e-12)
    assert len(bench["energies_j"]) == len(bench["ttfts"]) == 40
    assert sum(bench["energies_j"]) == pytest.approx(bench["energy_j"], rel=1e-12)
    fams = {f.name: f for f in text_string_to_metric_families(openmetrics_text(r))}
    power = [x.value for x in fams["DCGM_FI_DEV_POWER_USAGE"].samples]
    assert max(power) <= 700.0 and min(power) >= 70.0  # one GPU of the two, between idle and the TDP
    joules = [x.value / 1000 for x in fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples]
    assert all(b >= a for a, b in zip(joules, joules[1:], strict=False))
    # the last step ends the run: one GPU's energy then is half the run's (two GPUs)
    assert 2 * joules[-1] == pytest.approx(s["energy"]["energy_j"], rel=1e-9)


def test_report_and_table_show_the_energy() -> None:
    from sim.output.report import build_report
    from sim.output.table import format_table

    r, s = _one(_scenario(arrival={"type": "poisson", "rate": 4.0}, n=20))
    page = build_report([r], {r.name: s}, "t")
    assert "<h2>Power and energy</h2>" in page and "power over time" in page
    table = format_table({r.name: s})
    rows = {line[:17].strip(): line[17:].strip() for line in table.splitlines()}
    assert rows["J / output token"] == f"{s['energy']['j_per_output_token']:.3g}"
    assert rows["mean power (W)"] == f"{s['energy']['mean_power_w']:,.0f}"


def test_host_time_is_not_gpu_work() -> None:
    # vLLM 0.5's host loop stretches every GPU part of a step (host_time_ratio 1.63): the step is longer, the GPU
    # work in it the same, so the busy times (and the power's dynamic part) are those of the engine without it
    shape = StepShape(np.array([8]), np.array([8]), np.array([8]), np.array([8008]), np.array([8008]))
    plain = AnalyticCostModel("llama-3.1-8b", "h100-sxm")
    hosted = AnalyticCostModel("llama-3.1-8b", "h100-sxm", host_time_ratio=1.63)
    assert float(hosted.step_time(shape)[0]) > float(plain.step_time(shape)[0])
    for a, b in zip(hosted.busy_times(shape), plain.busy_times(shape), strict=True):
        assert float(a[0]) == pytest.approx(float(b[0]), rel=1e-12)


def _bench_energy() -> Any:
    """benchmarks/bench_energy.py as a module (benchmarks/ is no package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_energy.py"
    spec = importlib.util.spec_from_file_location("_bench_energy", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_published_energy_rows_name_their_sources() -> None:
    import csv

    bench = _bench_energy()
    with open(bench.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    # every row names its source's address (the Serial Alice benchmark page is served over http)
    assert rows and all(r["url"].startswith(("https://", "http://")) and float(r["j_per_output_token"]) > 0
                        for r in rows)
    engines = {r["engine_version"]: bench.engine_of(r) for r in rows}
    assert engines == {"0.11.1": {"name": "vllm-v1"}, "0.5.4": {"name": "vllm-v0", "version": "0.5"},
                       "": {"name": "vllm-v1"}, "0.20.0": {"name": "vllm-v1"}}
    # ML.ENERGY v3.0's published configurations of the preset models (tensor parallel only), v2.0's one row, the
    # Serial Alice benchmark's two Mistral-7B rows (H100) and one Mixtral-8x7B row (B200), the fleet-sim study's
    # seven B200 rows (Llama-3.1-70B, 2K-128K)
    assert {r["source"]: sum(x["source"] == r["source"] for x in rows) for r in rows} == {
        "ML.ENERGY Leaderboard v3.0 (Dec 2025)": 200, "ML.ENERGY Leaderboard v2.0 (Sep 2024)": 1,
        "Serial Alice benchmark (Jun 2026)": 3, "fleet-sim B200 context-length sweep (Apr 2026)": 7}
    from sim.hardware.gpu import resolve_gpu
    from sim.hardware.models import resolve_model

    for r in rows:  # each row's conditions name a preset and a batch; its scenario builds
        assert resolve_gpu(r["gpu"]).tdp_w > 0 and resolve_model(r["model"]).num_layers > 0
        assert int(r["batch_size"]) >= 1 and int(r["num_gpus"]) >= 1 and r["weight_dtype"] in ("bf16", "fp8", "fp16")
    sc = bench.published_scenario(rows[0], 512)
    assert sc["workload"]["arrival"] == {"type": "all_at_once"} and sc["policy"]["max_num_seqs"] == 8
    # as many requests as the published run sent (1,024 chat or 198 GPQA, times the configuration's repeats); a
    # row that does not say: 512 held to 3-32 batches (Serial Alice's batch of one: 32)
    assert sc["workload"]["num_requests"] == 1024
    alice = next(r for r in rows if r["batch_size"] == "1")
    assert not alice["num_requests"] and bench.published_scenario(alice, 512)["workload"]["num_requests"] == 32
    counts = {int(r["num_requests"]) for r in rows if r["num_requests"] and "v3.0" in r["source"]}
    assert counts and all(n % 1024 == 0 or n % 198 == 0 for n in counts)
    # each row's server and harness limits as its source states them: v3.0's max-model-len and max_tokens per task
    # (configs/vllm/<task>), v2.0's 4,096 and 1,024 for 500 ShareGPT prompts sent 4 times, each counted over its
    # source's window; Serial Alice states none
    assert {(r["max_model_len"], r["max_output_tokens"], r["energy_window"]) for r in rows} == {
        ("20480", "4096", "steady_state"), ("40960", "32768", "steady_state"), ("51200", "32768", "steady_state"),
        ("4096", "1024", "until_queue_empty"), ("", "", "")} | {
        (str(c), str(2048 if c == 131072 else 512), "all_overlap") for c in (2048 << k for k in range(7))}
    # the fleet-sim sweep: every stream sent at once, each filling its context (prompt = context - output, assumed),
    # the fixed output_len it states; 8x B200 at TP 8
    sweep = next(r for r in rows if r["source"].startswith("fleet-sim") and r["max_model_len"] == "2048")
    sc = bench.published_scenario(sweep, 512)
    assert sc["workload"]["num_requests"] == sc["policy"]["max_num_seqs"] == 1725
    assert sc["workload"]["prompt_len"] == {"type": "fixed", "value": 1536}
    assert sc["workload"]["output_len"] == {"type": "fixed", "value": 512}
    assert sc["deployment"]["tensor_parallel_size"] == 8 and "sampling" not in sc["workload"]
    # Qwen3-30B-A3B-Thinking's GPQA server alone runs 51,200 tokens (its monolithic.config.yaml)
    assert {r["model"] for r in rows if r["max_model_len"] == "51200"} == {"qwen3-30b-a3b"}
    v2 = next(r for r in rows if "v2.0" in r["source"])
    sc = bench.published_scenario(v2, 512)
    assert sc["workload"]["num_requests"] == 2000 and sc["deployment"]["max_model_len"] == 4096
    # its published mean (482.8) is of lengths cut at max_tokens 1,024: the exponential is drawn so that its capped
    # lengths average that (m (1 - exp(-1024 / m)) = 482.8), not about 482.8 itself (capped: 424.9)
    out = sc["workload"]["output_len"]
    assert (out["type"], out["max"]) == ("exponential", 1024)
    assert out["mean"] * -np.expm1(-1024 / out["mean"]) == pytest.approx(482.8, rel=1e-9)
    from sim.config.scenario import parse_scenario
    from sim.loop.run import generate_workload

    drawn = [r.output_len for r in generate_workload(parse_scenario(sc, "v2")).requests]
    assert np.mean(drawn) == pytest.approx(502.264)  # seed 0's 2,000 draws (441.876 drawn about 482.8)
    with pytest.raises(ValueError, match="cannot come from lengths capped at 1024"):
        bench.uncapped_mean(1024.0, 1024)
    assert "max_model_len" not in bench.published_scenario(alice, 512)["deployment"]


def test_meta_s_fp8_rows_run_the_checkpoint_that_keeps_attention_in_bf16() -> None:
    import csv

    bench = _bench_energy()
    with open(bench.DATA, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == "llama-3.1-405b"]
    # ML.ENERGY's FP8 rows name Meta's own release (bf16 attention and first and last layers), its bf16 rows the
    # base model: each runs its checkpoint's preset, under the row's weight dtype
    runs = {(r["published_model"], r["weight_dtype"], bench.published_scenario(r, 512)["deployment"]["model"])
            for r in rows}
    assert runs == {("meta-llama/Llama-3.1-405B-Instruct-FP8", "fp8", "llama-3.1-405b-fp8"),
                    ("meta-llama/Llama-3.1-405B-Instruct", "bf16", "llama-3.1-405b")}
    # which reads more bytes a step than every matmul in FP8 (the plain preset under fp8): the bf16 attention
    from sim.costs.analytic import AnalyticCostModel

    fp8 = next(r for r in rows if r["weight_dtype"] == "fp8" and r["gpu"] == "b200" and r["batch_size"] == "8")
    meta, plain = (AnalyticCostModel(m, "b200", weight_dtype="fp8", tensor_parallel_size=4)
                   for m in (bench.model_of(fp8), "llama-3.1-405b"))
    assert meta.decode_step_time(8, 8 * 1000) > 1.1 * plain.decode_step_time(8, 8 * 1000)


def test_the_published_rows_draw_their_own_output_lengths(tmp_path: Path) -> None:
    import csv

    bench = _bench_energy()
    with open(bench.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    # every v3.0 row has its published histogram, one length per request of its run, about its published mean
    # (within half a bin: the lengths are drawn uniformly within each bin)
    for r in rows:
        lengths = bench.published_output_lengths(r)
        if "v3.0" not in r["source"]:
            assert lengths is None
            continue
        assert lengths is not None and len(lengths) == int(r["num_requests"]) and lengths.min() >= 1
        assert abs(lengths.mean() - float(r["mean_output_tokens"])) < 0.01 * float(r["mean_output_tokens"]) + 330
    gpqa = next(r for r in rows if "GPQA" in r["task"] and r["gpu"] == "h100-sxm" and r["batch_size"] == "8")
    sc = bench.published_scenario(gpqa, 512, lengths_dir=tmp_path)
    assert "output_len" not in sc["workload"] and sc["workload"]["lengths"]["sample"] == "in_order"
    table = np.loadtxt(sc["workload"]["lengths"]["file"], delimiter=",", skiprows=1, dtype=np.int64)
    assert (table[:, 0] == 200).all() and (table[:, 1] == bench.published_output_lengths(gpqa)).all()
    # GPQA's published lengths vary less than an exponential's (coefficient of variation 1)
    assert table[:, 1].std() / table[:, 1].mean() < 0.75
    res = servesim.run(sc)
    assert sorted(q.output_tokens for q in res.results[0].requests) == sorted(table[:, 1].tolist())


def _at_once_four_at_a_time(n: int = 8) -> Any:
    """``n`` requests sent at once (64 tokens in, 32 out each), at most 4 running: the bench's windows in small."""
    sc = {"name": "w", "seed": 0,
          "workload": {"arrival": {"type": "all_at_once"}, "num_requests": n,
                       "prompt_len": {"type": "fixed", "value": 64}, "output_len": {"type": "fixed", "value": 32}},
          "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm"},
          "policy": {"type": "continuous", "max_num_seqs": 4}}
    return servesim.run(sc).results[0]


def test_the_steady_state_window_counts_the_harness_s_tokens_and_batch() -> None:
    bench = _bench_energy()
    # 8 requests at once, 4 at a time, 32 tokens out each: the window runs from the 4th first token to the 3rd
    # finish (8 - 4 - 1 finished), while the first four decode together, so the running batch is 4 all through and
    # the tokens are 4 a step; energy over the window's steps (no gaps) over those tokens
    r = _at_once_four_at_a_time()
    jt, watts, tps, running = bench.steady_state(r, 4)
    first = sorted(q.first_token for q in r.requests)
    done = sorted(q.finish for q in r.requests)
    start = np.asarray(r.steps["start"])
    sel = (start >= first[3]) & (start < done[2])
    assert sel.sum() > 0 and (np.asarray(r.steps["batch_size"])[sel] == 4).all() and running == 4.0
    e = run_energy(r)
    assert e is not None
    tokens = float(np.asarray(r.steps["decode_tokens"])[sel].sum()) + sum(first[3] <= t < done[2] for t in first)
    assert jt == pytest.approx(float(e.step_energy_j[sel].sum()) / tokens, rel=1e-12)
    assert tps * jt == pytest.approx(watts, rel=1e-12)


def test_v2_counts_from_the_run_s_start_until_the_waiting_queue_empties() -> None:
    bench = _bench_energy()
    # 8 requests at once, 4 at a time: the window is every step before the one that schedules the 5th request (the
    # first with nothing waiting), so it holds the first four's prefill and decode steps and none of the rest
    r = _at_once_four_at_a_time()
    jt, watts, tps, running = bench.steady_state(r, 4, "until_queue_empty")
    last = max(q.first_scheduled for q in r.requests)
    start = np.asarray(r.steps["start"])
    sel = start < last
    assert 0 < sel.sum() < len(start) and running == 4.0
    e = run_energy(r)
    assert e is not None
    first = [q.first_token for q in r.requests]
    tokens = float(np.asarray(r.steps["decode_tokens"])[sel].sum()) + sum(t < last for t in first)
    assert tokens == 4 * 32  # the first four's every token: their first (prefill) and 31 decode tokens each
    assert jt == pytest.approx(float(e.step_energy_j[sel].sum()) / tokens, rel=1e-12)
    assert tps == pytest.approx(tokens / (last - float(start[0])), rel=1e-12)
    with pytest.raises(ValueError, match="unknown energy window 'whole'"):
        bench.steady_state(r, 4, "whole")


def test_the_all_overlap_window_holds_the_steps_where_every_request_decodes() -> None:
    bench = _bench_energy()
    # 4 requests at once, all running (the fleet-sim sweep's every stream at once): from the last first token to
    # the first finish no request waits or has ended, so every step there decodes all four, one token each
    r = _at_once_four_at_a_time(4)
    jt, watts, tps, running = bench.steady_state(r, 4, "all_overlap")
    t0 = max(q.first_token for q in r.requests)
    t1 = min(q.finish for q in r.requests)
    start = np.asarray(r.steps["start"])
    sel = (start >= t0) & (start < t1)
    assert sel.sum() > 0 and (np.asarray(r.steps["decode_tokens"])[sel] == 4).all() and running == 4.0
    e = run_energy(r)
    assert e is not None
    # the tokens streamed in the window: four a step, and the first tokens at its opening (here all four: their
    # prefills ran in one step)
    tokens = 4 * int(sel.sum()) + sum(t0 <= q.first_token < t1 for q in r.requests)
    assert tokens == 4 * 32
    assert jt == pytest.approx(float(e.step_energy_j[sel].sum()) / tokens, rel=1e-12)
    assert tps == pytest.approx(tokens / (t1 - t0), rel=1e-12)


def test_the_energy_breakdown_splits_the_error_into_power_and_time(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_energy()
    row = {"source": "s", "gpu": "g", "task": "t", "model": "m", "batch_size": "8"}
    # power exact, twice too fast: J is half (1 / (1 + 1) - 1); with the power right it stays -50%, with the time
    # right it would be exact, and the time carries all of the error
    bench.breakdown([(row, -0.5, 0.0, 1.0)])
    out = capsys.readouterr().out
    assert "J/output token over 1 rows: 50.0% (signed median -50.0%)" in out and "0 rows within 15%" in out
    cols = out.split("\n  all ")[1].split("\n")[0].split()
    assert cols == ["1", "50.0%", "-50.0%", "+0.0%", "+100.0%", "50.0%", "0.0%", "100%", "nan%"]
    # with the work's error at the published time (here: the work's joules were right, only the time was not)
    bench.breakdown([(row, -0.5, 0.0, 1.0, 0.0)])
    cols = capsys.readouterr().out.split("\n  all ")[1].split("\n")[0].split()
    assert cols[-1] == "0.0%"


def test_the_work_at_the_published_time_keeps_the_works_joules_and_pays_the_floor_for_the_time() -> None:
    bench = _bench_energy()
    # 0.5 J a token at 1,000 tok/s on GPUs idling at 200 W together: 0.2 J of floor, 0.3 J of work a token;
    # published at 500 tok/s the floor costs 0.4 J a token, the work still 0.3 J
    assert bench.work_at_published_time(0.5, 1000.0, 200.0, 500.0) == pytest.approx(0.7, rel=1e-12)
    # at the simulated throughput it is the simulated J; an unknown throughput gives NaN
    assert bench.work_at_published_time(0.5, 1000.0, 200.0, 1000.0) == pytest.approx(0.5, rel=1e-12)
    assert math.isnan(bench.work_at_published_time(0.5, 1000.0, 200.0, float("nan")))


def test_the_energy_breakdown_groups_one_gpu_rows_apart_from_tensor_parallel_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_energy()
    row = {"source": "s", "gpu": "b200", "task": "chat", "model": "m", "batch_size": "8"}
    # one GPU twice too fast with its power right; two GPUs on time with their power 20% low
    bench.breakdown([(row | {"num_gpus": "1"}, -0.5, 0.0, 1.0), (row | {"num_gpus": "2"}, -0.2, -0.2, 0.0),
                     (row | {"num_gpus": "8"}, -0.2, -0.2, 0.0)])
    out = capsys.readouterr().out
    one = out.split("\n  b200 x1, chat ")[1].split("\n")[0].split()
    tp = out.split("\n  b200 TP, chat ")[1].split("\n")[0].split()
    assert one == ["1", "50.0%", "-50.0%", "+0.0%", "+100.0%", "50.0%", "0.0%", "100%", "nan%"]
    assert tp == ["2", "20.0%", "-20.0%", "-20.0%", "+0.0%", "0.0%", "20.0%", "0%", "nan%"]


def test_the_energy_breakdown_groups_the_rows_whose_time_is_right_by_gpu_count(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_energy()
    row = {"source": "s", "gpu": "b200", "task": "chat", "model": "m", "batch_size": "64"}
    # tok/s within 10% (both signs, the edge included) joins the GPU count's group; 10.1% off, or unknown, does not
    bench.breakdown([(row | {"num_gpus": "1"}, -0.2, -0.16, 0.05), (row | {"num_gpus": "1"}, -0.1, -0.19, -0.10),
                     (row | {"num_gpus": "1"}, -0.5, 0.0, 0.101), (row | {"num_gpus": "2"}, -0.2, -0.12, 0.1),
                     (row | {"num_gpus": "4"}, 0.1, float("nan"), float("nan"))])
    out = capsys.readouterr().out
    one = out.split("\n  b200 x1, tok/s within 10% ")[1].split("\n")[0].split()
    tp = out.split("\n  b200 TP, tok/s within 10% ")[1].split("\n")[0].split()
    # n, |J|, J, W, tok/s: the medians of the two one-GPU rows and of the one two-GPU row
    assert one[:5] == ["2", "15.0%", "-15.0%", "-17.5%", "-2.5%"]
    assert tp[:5] == ["1", "20.0%", "-20.0%", "-12.0%", "+10.0%"]


def test_the_energy_rows_print_by_source_sorted_by_their_j_error(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_energy()
    rows = [{"source": s, "gpu": "b200", "num_gpus": "1", "task": "chat", "model": m, "batch_size": b,
             "max_model_len": "2048"} for s, m, b in (("B", "m1", "8"), ("A", "m2", "16"), ("B", "m3", "32"))]
    bench.by_source([(rows[0], 0.2, 0.1, -0.1), (rows[1], 0.05, 0.0, -0.05), (rows[2], -0.3, -0.2, 0.1)])
    out = capsys.readouterr().out
    # the sources in name order, each source's rows from the most negative J error up, with the source's medians
    assert out.index("A: 1 rows") < out.index("B: 2 rows") < out.index("m3") < out.index("m1")
    assert "B: 2 rows, J/token median |error| 25.0% (signed -5.0%)" in out
    assert ("m3                  b200 x1  batch    32 chat               max-model-len   2048 J  -30.0%  W  -20.0%  "
            "tok/s  +10.0%") in out


def test_the_published_itl_spread_says_what_paced_a_small_batch(capsys: pytest.CaptureFixture[str]) -> None:
    import csv

    bench = _bench_energy()
    with open(bench.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    # every v3.0 row carries its published median and p90 ITL (p90 the larger), no other source's does
    assert all((bool(r["median_itl_ms"]) and bool(r["p90_itl_ms"])) == ("v3.0" in r["source"]) for r in rows)
    assert all(float(r["p90_itl_ms"]) >= float(r["median_itl_ms"]) > 0 for r in rows if r["median_itl_ms"])
    # at batch <= 64 every H100 run is GPU-paced (the threshold sits above their widest spread), every multi-GPU
    # B200 run too, and all but three of the one-GPU B200 runs are not; larger batches and other sources: no label
    small = [r for r in rows if r["median_itl_ms"] and int(r["batch_size"]) <= 64]
    assert {bench.pacing(r) for r in small if r["gpu"] == "h100-sxm" or r["num_gpus"] != "1"} == {"GPU-paced"}
    one_b200 = [bench.pacing(r) for r in small if r["gpu"] == "b200" and r["num_gpus"] == "1"]
    assert one_b200.count("GPU-paced") == 3 and one_b200.count("host-jittered") == len(one_b200) - 3 > 20
    assert {bench.pacing(r) for r in rows if not r["median_itl_ms"] or int(r["batch_size"]) > 64} == {""}
    row = {"source": "s", "gpu": "b200", "task": "t", "model": "m", "batch_size": "8", "median_itl_ms": "10",
           "p90_itl_ms": "12.01"}
    assert bench.pacing(row) == "host-jittered" and bench.pacing(row | {"p90_itl_ms": "12"}) == "GPU-paced"
    # the summary groups the small-batch rows by it
    bench.breakdown([(row, -0.5, 0.0, 1.0), (row | {"p90_itl_ms": "11"}, 0.1, 0.1, 0.0)])
    out = capsys.readouterr().out
    assert out.count("b200, batch <= 64, host-jittered") == 1 and out.count("b200, batch <= 64, GPU-paced") == 1


def _plan_energy(**plan_keys: Any) -> dict[str, Any]:
    """An H100 priced below the L4 ($0.50 against $0.70 an hour) is the cheapest; at 2 req/s of a 1B model it
    idles at 70 W where the L4 idles at 16 W, so the L4 takes fewer joules per output token."""
    import copy

    from sim.hardware.presets.gpus import BASE_GPU_PRESETS

    hot = copy.deepcopy(BASE_GPU_PRESETS["h100-sxm"]) | {"name": "h100-cheap", "price_per_hour": 0.5}
    return {
        "name": "plan-energy", "seed": 1,
        "workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 40,
                     "prompt_len": {"type": "uniform", "low": 200, "high": 600},
                     "output_len": {"type": "uniform", "low": 20, "high": 200}},
        "deployment": {"model": "llama-3.2-1b", "max_model_len": 2048},
        "slos": {"ttft": 2.0, "tpot": 0.2},
        "plan": {"gpus": ["l4", hot], "tensor_parallel_sizes": [1], "weight_dtypes": ["bf16"],
                 "kv_dtypes": ["auto"], "max_num_seqs": [256], "enable_chunked_prefill": [True],
                 "max_gpus": 1} | plan_keys,
    }


def test_plan_names_the_deployment_with_the_fewest_joules() -> None:
    from sim.config.scenario import parse_scenario
    from sim.studies.plan_text import _joules, format_plan
    from sim.studies.planner import plan

    result = plan(parse_scenario(_plan_energy(stop_early=False)))
    best = result.fewest_joules()
    assert result.chosen is not None and result.chosen.candidate.gpu == "h100-cheap"
    assert best is not None and best.candidate.gpu == "l4"
    assert best.j_per_output_token < result.chosen.j_per_output_token
    assert result.to_dict()["fewest_joules"]["j_per_output_token"] == best.j_per_output_token
    text = format_plan(result)
    assert f"{best.candidate.label()}, {best.j_per_output_token:.4f} J at $0.70/h" in text
    # the Pareto table gives each deployment's joules per output token beside its cost, so the trade between the
    # two reads off the front; a GPU without power figures (energy: null) shows a dash
    lines = text.splitlines()
    assert "$/M out   J/out  deployment" in next(x for x in lines if x.strip().startswith("$/h"))
    for e in result.pareto_front():
        row = next(x for x in lines if x.endswith(e.candidate.label()) and x.startswith("  "))
        assert f" {e.j_per_output_token:.4f}  {e.candidate.label()}" in row
    assert _joules(float("nan")) == "     -" and _joules(0.12345) == "0.1235"


def test_plan_objective_joules_chooses_the_fewest_joules_meeting_the_slos(tmp_path: Path) -> None:
    # Before: plan could only choose the cheapest (plan.objective was refused as an unknown key); the deployment
    # with the fewest joules was named beside it, and with stop_early (the default) a costlier one was never
    # simulated at all. Under objective joules every survivor is simulated and the L4 ($0.70/h) is chosen over
    # the cheaper H100 ($0.50/h), which the text and the JSON still name as the cheapest
    from sim.config.scenario import parse_scenario
    from sim.studies.plan_text import format_plan
    from sim.studies.planner import plan

    by_cost = plan(parse_scenario(_plan_energy()))
    assert by_cost.chosen is not None and by_cost.chosen.candidate.gpu == "h100-cheap"
    assert by_cost.objective == "cost" and "cheapest" not in by_cost.to_dict()
    assert any(e.status == "not simulated" and e.candidate.gpu == "l4" for e in by_cost.evaluations)
    result = plan(parse_scenario(_plan_energy(objective="joules")))  # stop_early left at its default, true
    ch, cheap = result.chosen, result.cheapest
    assert ch is not None and ch.candidate.gpu == "l4" and ch is result.fewest_joules()
    assert cheap is not None and cheap.candidate.gpu == "h100-cheap" and cheap.meets
    assert ch.j_per_output_token < cheap.j_per_output_token
    saved = result.to_dict()
    assert saved["objective"] == "joules" and saved["chosen"]["j_per_output_token"] == ch.j_per_output_token
    assert saved["cheapest"]["cost_per_hour"] == pytest.approx(0.5)
    text = format_plan(result)
    assert f"chosen: {ch.candidate.label()} (plan.objective joules: the fewest joules per output token" in text
    assert f"cheapest simulated deployment meeting the SLOs: {cheap.candidate.label()} at $0.50/h, " in text
    assert "fewest joules per output token among" not in text  # the choice is that one
    # a bad objective: one message naming the key and the values it takes, exit 2, no traceback
    bad = tmp_path / "bad.yaml"
    raw = _plan_energy(objective="watts")
    raw["plan"]["gpus"] = ["l4"]
    bad.write_text(yaml.safe_dump(raw))
    root = Path(__file__).resolve().parent.parent
    out = servesim_cli("plan", str(bad), cwd=root)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "plan.objective: must be 'cost' or 'joules' (got 'watts')" in out.stderr


def test_plans_joules_per_token_are_the_steady_states_not_the_drains() -> None:
    # Before: plan's J/out was the run's whole energy over its output, the drain after the last arrival included (a
    # batch emptying while both GPUs stay up): plan-chat's two L40S read 0.208 J at 400 requests and 0.151 J at
    # 4,000. In the second half of the arrival window, where the plan measures what a deployment serves, it is
    # 0.144 J at both
    from sim.config.scenario import load_scenario, variant_configs
    from sim.costs.energy_time import energy_between
    from sim.loop.run import generate_workload
    from sim.metrics.summary import summarize
    from sim.studies.plan_result import output_load, steady_joules_per_token
    from sim.studies.planner import simulate_replicas

    plan_chat = Path(__file__).parent.parent / "scenarios" / "plan-chat.yaml"
    steady, whole = [], []
    for n in (400, 2000):
        sc, _ = load_scenario(plan_chat, {"workload.num_requests": n, "deployment.gpu": "l40s",
                                          "deployment.weight_dtype": "fp8", "policy.max_num_seqs": 256})
        r = simulate_replicas(variant_configs(sc)[0], generate_workload(sc), 2)
        s = summarize(r)
        steady.append(steady_joules_per_token(r, output_load(r, s["output_throughput"]),
                                              s["energy"]["j_per_output_token"]))
        whole.append(s["energy"]["j_per_output_token"])
        # the window's joules are the run's, cut at its edges: pieces from its start to its end add up to them
        t0 = min(q.arrival for q in r.requests)
        end = t0 + r.duration
        cuts = [t0 + 1e-9, t0 + 0.3 * r.duration, t0 + 0.8 * r.duration, end - 1e-9]
        pieces = [energy_between(r, a, b) for a, b in zip(cuts, cuts[1:])]
        assert sum(p for p in pieces if p is not None) == pytest.approx(s["energy"]["energy_j"], rel=1e-6)
        assert energy_between(r, t0, t0 + 1.0) is None and energy_between(r, t0 + 1.0, end + 1.0) is None
    assert whole[0] > 1.3 * whole[1]  # 0.208 J against 0.156 J
    assert steady[0] == pytest.approx(steady[1], rel=0.03) and steady[1] < whole[1]


def test_energy_is_computed_once_while_kept_and_again_for_other_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a run folder reads each run's energy four times; inside energy_kept it is computed once per result
    (the same figures), again when the result's steps or the fleet's up-time differ, and never kept outside."""
    import dataclasses

    import sim.costs.energy as energy

    r, _ = _one(_scenario(arrival={"type": "poisson", "rate": 2.0}, n=30))
    calls: list[int] = []
    real = energy._run_energy
    monkeypatch.setattr(energy, "_run_energy", lambda res, up: calls.append(id(res)) or real(res, up))
    fresh = run_energy(r)
    run_energy(r)
    assert len(calls) == 2  # outside the block: nothing kept
    with energy.energy_kept():
        kept = [run_energy(r) for _ in range(4)]
        assert len(calls) == 3 and all(e is kept[0] for e in kept)
        assert fresh is not None and kept[0] is not None
        assert kept[0].energy_j == fresh.energy_j
        assert kept[0].request_energy_j.tolist() == fresh.request_energy_j.tolist()
        run_energy(r, up=2 * r.duration)  # another up-time: other idle energy
        other = dataclasses.replace(r, steps=dict(r.steps))  # another result, equal steps in another mapping
        run_energy(other)
        assert len(calls) == 5
    run_energy(r)
    assert len(calls) == 6
    assert energy._kept is None


def test_a_pipeline_stage_waiting_in_its_bubble_draws_static_power_only() -> None:
    # Before: a pipeline's rounds had no roofline, so all of a round but its FLOPs counted as memory traffic, the
    # bubble included: a 2-stage decode of one row (m = 1, each stage idle half the round) drew 543 W per GPU (now
    # 257 W).
    # Now each stage computes its share of every micro-batch (m x work / pp of the round) and waits out the rest at
    # static power, so the round's energy above static power is the same work's on one stage group.
    from sim.costs.energy import power_model_of
    from sim.hardware.models import ModelSpec
    from sim.serving.pipeline import wrap_pipeline

    gpu = GPUSpec.from_name("h100-sxm")
    inner = AnalyticCostModel("llama-3.1-8b", "h100-sxm")
    pipe = wrap_pipeline(inner, ModelSpec.from_name("llama-3.1-8b"), gpu, pipeline_parallel_size=2)
    for rows, ctx in ((1, 1001), (4, 2000)):
        shape = StepShape(rows, rows, rows, rows * ctx, rows * ctx)
        t, flops = float(pipe.step_time(shape)), float(pipe.step_flops(shape))
        m = min(rows, 2)
        compute, memory = (float(x) * m / 2 for x in inner.busy_times(
            StepShape(rows / m, rows / m, rows / m, rows * ctx / m, rows * ctx / m)))
        pm = power_model_of(gpu, pipe, 2, None)
        assert pm is not None and pm.roofline is inner
        steps = _steps([{"start": 0.0, "duration": t, "flops": flops, "batch_size": rows, "decode_tokens": rows,
                         "kv_tokens": rows * ctx}])
        r = RunResult("x", [_record(i, 0.0, 0.0, t, ctx, 2) for i in range(rows)], steps, np.zeros(0),
                      np.zeros(0, dtype=np.int64), duration=t, peak_flops=pipe.peak_flops, kv_capacity_blocks=10,
                      block_size=16, power=pm)
        e = run_energy(r)
        assert e is not None
        dyn = gpu.tdp_w - gpu.idle_w
        assert e.step_power_w[0] == pytest.approx(2 * (gpu.idle_w + dyn * (compute / t + 0.75 * memory / t)), rel=1e-12)
        if rows == 1:  # the bubble: half the round, each stage waits for the other
            assert compute + memory < 0.51 * t and e.step_power_w[0] < 2 * 400.0
            whole_c, whole_m = (float(x) for x in inner.busy_times(shape))
            assert e.step_energy_j[0] - 2 * gpu.idle_w * t == pytest.approx(dyn * (whole_c + 0.75 * whole_m), rel=1e-12)


def test_power_over_time_stays_under_the_boards_limit_when_steps_outlast_a_bin() -> None:
    # Static batches of 16 long prompts: each batch's padded prefill is one step of several seconds, longer than
    # the chart's bins. Put whole into the bin where it started, such a step drew 8,475 W on one 400 W A100 there
    # (and idle power in the bins it went on through); spread over the bins it runs through, no bin passes the
    # board's limit, and the curve still integrates to the run's energy.
    sc = _scenario(arrival={"type": "poisson", "rate": 6.0}, n=120, prompt=3000, output=64, gpu="a100-80gb")
    sc["policy"] = {"type": "static", "batch_size": 16, "max_wait": 0.5}
    sc["kv_cache"] = {"type": "contiguous", "reserve": "max_model_len"}
    sc["deployment"]["max_model_len"] = 4096
    r, s = _one(sc)
    bins = 200
    width = r.duration / bins
    assert float(np.max(np.asarray(r.steps["duration"]))) > 2 * width  # the case: a step spans bins
    curve = power_over_time(r, bins=bins)
    assert curve is not None
    _, watts = curve
    assert float(watts.max()) <= s["energy"]["power_limit_w"] * s["energy"]["gpus_per_replica"] + 1e-6
    assert float(watts.min()) >= s["energy"]["idle_w"] - 1e-6
    assert float(watts.sum() * width) == pytest.approx(s["energy"]["energy_j"], rel=1e-9)


def test_power_over_time_follows_an_autoscaled_fleets_size() -> None:
    # One L4 (72 W) serves until the autoscaler's first replica is ordered at 45 s; then up to 8. The chart put
    # the fleet's mean size (6 replicas) at idle power into every bin, so its first bins read 138 W, nearly twice
    # what the one GPU up can draw; each bin now counts the replicas paid for in it.
    res = servesim.run(Path(__file__).resolve().parent.parent / "scenarios" / "autoscale-memory-bound.yaml",
                       num_requests=80)
    r, s = res.results[1], res.summary[res.variants[1]]  # scale-on-busy
    assert r.cluster is not None and r.cluster["replicas_max"] > r.cluster["replicas_start"] == 1
    first_order = min(x["provisioned"] for x in r.cluster["per_replica"] if x["provisioned"] > 0)
    curve = power_over_time(r, bins=200)
    assert curve is not None
    centres, watts = curve
    width = r.duration / 200
    alone = centres + width / 2 <= first_order
    assert alone.sum() >= 3
    assert float(watts[alone].max()) <= s["energy"]["power_limit_w"] + 1e-6
    assert float(watts.sum() * width) == pytest.approx(s["energy"]["energy_j"], rel=1e-9)


def test_a_scenarios_energy_is_computed_once_for_its_summary_and_its_run_folder(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Path) -> None:
    """The summary's energy is kept for the run folder (ScenarioRun.energy), whose report and exports read it
    again: one pass over the steps and requests a variant, not one for the summary and one for the folder."""
    import json

    import sim.costs.energy as energy
    from sim.config.scenario import parse_scenario
    from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run

    calls: list[str] = []
    real = energy._run_energy
    monkeypatch.setattr(energy, "_run_energy", lambda result, up: calls.append(result.name) or real(result, up))
    sc = _scenario(arrival={"type": "poisson", "rate": 8.0}, n=60)
    sc["variants"] = [{"name": "a"}, {"name": "b", "policy": {"type": "continuous", "max_num_seqs": 4}}]
    run = run_scenario(prepare_scenario(parse_scenario(sc)))
    out = write_scenario_run(run, tmp_path / "run")
    assert calls == ["a", "b"]
    summary = json.loads((out / "summary.json").read_text())["variants"]
    assert summary["a"]["energy"] == run.summaries["a"]["energy"] and summary["a"]["energy"]["energy_j"] > 0
