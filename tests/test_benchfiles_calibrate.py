"""calibrate --from-bench: knobs planted in simulated measurements with 5% seeded noise come back (issue 14)."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibration.bench_fit import calibrate_from_bench, plant_measurements, profile_dict, with_knobs
from sim.config.scenario import load_scenario, variant_configs
from sim.loop.build import build
from sim.loop.run import simulate_variant
from sim.output.benchfiles.common import BenchRun
from sim.output.benchfiles.stats import run_stats
from sim.output.benchfiles.validate import rebuild_workload
from tests.conftest import servesim

DATA = Path(__file__).parent / "data" / "bench"
ROOT = Path(__file__).parent.parent
PLANTED = {"compute_efficiency": 0.45, "bandwidth_efficiency": 0.7, "step_overhead": 3e-3,
           "per_request_overhead": 1e-5}
# (request rate, mean prompt, mean output): a load sweep over mixes, as a user's benchmark files would be
LOADS = [(1, 1500, 60), (4, 300, 150), (8, 800, 100), (16, 200, 200), (2, 3000, 40), (12, 500, 120)]


def measured_runs(cfg, n: int = 60, seed: int = 7) -> list[BenchRun]:
    """Simulated 'measurements' with the planted knobs; each request's TTFT and decode time get 5% lognormal
    noise (seeded), and the statistics are recomputed as vLLM would from the noisy values."""
    rng = np.random.default_rng(seed)
    runs = []
    for i, (rate, pmean, omean) in enumerate(LOADS):
        ins = np.clip(rng.lognormal(np.log(pmean), 0.5, n).astype(int), 8, 3500)
        outs = np.clip(rng.exponential(omean, n).astype(int) + 20, 20, 500)
        arrivals = np.cumsum(rng.exponential(1 / rate, n))
        run = BenchRun(source=f"load{i}", request_rate=float(rate), input_lens=ins.tolist(),
                       output_lens=outs.tolist(), arrival_times_s=arrivals.tolist())
        runs.append(plant_measurements(cfg, run, PLANTED, rng))
    return runs


@pytest.fixture(scope="module")
def cfg():
    sc, _ = load_scenario(DATA / "scenario.yaml")
    return variant_configs(sc)[0]


def _decode_step(cfg, knobs: dict[str, float], rows: int, context: int) -> float:
    return build(with_knobs(cfg, knobs))[2].decode_step_time(rows, context)


@pytest.mark.parametrize("seed", [7, 1, 2])
def test_planted_knobs_recovered_from_noisy_measurements(cfg, seed: int) -> None:
    fit = calibrate_from_bench(cfg, measured_runs(cfg, seed=seed), holdout_every=0)
    got = fit.knobs
    assert got["compute_efficiency"] == pytest.approx(PLANTED["compute_efficiency"], rel=0.02)
    # What these files determine is the decode step itself: the per-step overhead and the bandwidth term both add
    # a constant to every decode step, and only the KV reads (a few % of the bytes here) tell them apart, so
    # their split is not identifiable at this noise. Measured over seeds 7, 1, 2, 3: compute -0.8%..+0.0%;
    # bandwidth -15%..-1%; step overhead -65%..-3% (seed 7's -2.6% was luck); the decode step -0.6%..+0.2%.
    for rows, context in [(1, 500), (8, 1000), (32, 2000)]:
        assert _decode_step(cfg, got, rows, context) == pytest.approx(_decode_step(cfg, PLANTED, rows, context),
                                                                      rel=0.02)
    assert got["per_request_overhead"] == PLANTED["per_request_overhead"]  # not fitted by default: its default
    assert fit.train_median_abs_error < 0.02


def test_holdout_errors_and_profile_used_by_a_scenario(cfg, tmp_path: Path) -> None:
    runs = measured_runs(cfg, n=40, seed=3)
    fit = calibrate_from_bench(cfg, runs, holdout_every=3)
    assert len(fit.train) == 4 and len(fit.heldout) == 2
    med = fit.heldout_median_abs_error()
    assert med is not None and med < 0.1
    prof = tmp_path / "knobs.json"
    prof.write_text(json.dumps(profile_dict(fit, model="llama-3.1-8b", gpu="a100-80gb")))
    sc, _ = load_scenario(DATA / "scenario.yaml", {"deployment.cost_model": {"type": "analytic", "profile": str(prof)}})
    other = variant_configs(sc)[0]
    wl, _ = rebuild_workload(runs[0])
    a, _, _ = simulate_variant(other, wl)
    b, _, _ = simulate_variant(with_knobs(cfg, fit.knobs), wl)
    assert run_stats(a) == run_stats(b)


def test_one_file_is_refused_and_cli_errors_exit_2(cfg, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        calibrate_from_bench(cfg, measured_runs(cfg, n=10)[:1])
    base = ["calibrate", "--from-bench", str(DATA / "vllm_detailed.json"), "--model", "llama-3.1-8b"]
    r = servesim(*base, cwd=tmp_path)
    assert r.returncode == 2 and "--from-bench needs --gpu" in r.stderr and "Traceback" not in r.stderr
    r = servesim(*base, "--gpu", "a100-80gb", "--knobs", "speed", cwd=tmp_path)
    assert r.returncode == 2 and "--knobs: unknown speed" in r.stderr
    prof = str(ROOT / "calibration" / "profiles" / "tiny-cpu.json")
    r = servesim(*base, "--profile", prof, cwd=tmp_path)
    assert r.returncode == 2 and "--from-bench --profile needs --scenario" in r.stderr
    r = servesim(*base, "--from-bench", str(DATA / "vllm_detailed.json"), "--profile", prof, "--scenario",
                 str(ROOT / "calibration" / "scenarios" / "validate-tiny.yaml"), "--variant", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "--variant 'nope': the scenario has static, continuous, chunked, preempt" in r.stderr


def test_the_gpu_defaults_to_the_scenarios(tmp_path: Path) -> None:
    """--from-bench --scenario without --gpu fits on the scenario's GPU (a100-80gb here); it was refused as
    needing --gpu, and a user who then typed the usual h100-sxm fitted an H100 to an A100's files."""
    data = json.loads((DATA / "vllm_detailed.json").read_text())
    files = []
    for rate in (2.0, 4.0):
        f = tmp_path / f"rate{rate:g}.json"
        f.write_text(json.dumps(data | {"request_rate": rate, "max_concurrent_requests": 9}))
        files.append(str(f))
    r = servesim("calibrate", "--from-bench", *files, "--scenario", str(DATA / "scenario.yaml"), "--holdout-every",
                 "0", "--out", "knobs.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prof = json.loads((tmp_path / "knobs.json").read_text())
    assert (prof["model"], prof["gpu"]) == ("llama-3.1-8b", "a100-80gb")
    # a metric the files hold but the fit leaves out is 'not fitted' here; it read validate's 'not compared'
    assert "skipped: " in r.stderr and "not compared" not in r.stderr
    assert "max_concurrent_requests: not fitted: the peak of requests in flight has no simulated counterpart" \
        in r.stderr, r.stderr


def test_a_scale_and_step_overhead_on_an_engine_profile_are_recovered(tmp_path: Path) -> None:
    """calibrate --from-bench --profile: a live server planted as the tiny engine's CPU profile x 2.5 + 4 ms per
    step with 5 ms of HTTP path per token (5% seeded noise per request) is fitted back from two loads and predicts
    the third; the profile as it is (the unfitted reference) predicts it far worse."""
    from calibration.bench_fit import POOLED, profile_family

    sc, _ = load_scenario(ROOT / "calibration" / "scenarios" / "validate-tiny.yaml")
    tiny = next(c for c in variant_configs(sc) if c.name == "continuous")
    fam = profile_family(str(ROOT / "calibration" / "profiles" / "tiny-cpu.json"))
    planted = {"scale": 2.5, "step_overhead": 4e-3, "request_latency_s": 5e-3}
    rng = np.random.default_rng(5)
    runs = []
    for i, rate in enumerate((20.0, 40.0, 60.0)):
        ins = np.clip(rng.lognormal(np.log(60), 0.6, 80).astype(int), 4, 300)
        outs = np.clip(rng.exponential(24, 80).astype(int) + 2, 2, 96)
        run = BenchRun(source=f"load{i}", request_rate=rate, input_lens=ins.tolist(), output_lens=outs.tolist(),
                       arrival_times_s=np.cumsum(rng.exponential(1 / rate, 80)).tolist())
        runs.append(plant_measurements(tiny, run, planted, rng, family=fam))
    # a second observation of the middle load: --holdout-load holds out both, and averages them too
    again = BenchRun(source="load1-again", request_rate=40.0, input_lens=runs[1].input_lens,
                     output_lens=runs[1].output_lens, arrival_times_s=runs[1].arrival_times_s)
    runs.append(plant_measurements(tiny, again, planted, rng, family=fam))
    with pytest.raises(ValueError, match="--holdout-load 50: needs files at that load and at others; the loads "
                                         "are 20, 40, 60"):
        calibrate_from_bench(tiny, runs, family=fam, holdout_load=50.0)
    for bad in (math.nan, math.inf, 0.0, -40.0):
        with pytest.raises(ValueError, match=r"^--holdout-load must be a finite number > 0 \(requests/s or "
                                             rf"concurrency\), got {bad:g}$"):
            calibrate_from_bench(tiny, runs, family=fam, holdout_load=bad)
    fit = calibrate_from_bench(tiny, runs, family=fam, holdout_load=40.0)
    assert fit.heldout == ["load1", "load1-again"]
    pooled = fit.heldout_errors[POOLED]
    assert max(abs(pooled[k]) for k in ("mean_ttft", "median_ttft", "mean_tpot", "median_tpot")) < 0.1
    assert fit.knobs["scale"] == pytest.approx(2.5, rel=0.1)
    assert fit.knobs["step_overhead"] == pytest.approx(4e-3, rel=0.2)
    assert fit.knobs["request_latency_s"] == pytest.approx(5e-3, rel=0.2)
    keys = ("mean_ttft", "median_ttft", "mean_tpot", "median_tpot")
    after = fit.heldout_errors["load1"]
    before = fit.heldout_errors_unfitted["load1"]
    assert max(abs(after[k]) for k in keys) < 0.1 < min(abs(before[k]) for k in keys)
    assert fit.train_median_abs_error <= fit.train_median_abs_error_unfitted
    assert fit.train_rms_log_error <= fit.train_rms_log_error_unfitted
    prof = profile_dict(fit, model="tiny", gpu="none")
    assert prof["kind"] == "servesim-live-fit" and prof["cost_model"]["type"] == "fitted"


def test_a_fit_never_ends_worse_than_the_profile_as_it_is() -> None:
    """Files that the engine profile as it is describes exactly (no step overhead, no HTTP path): the solver works
    on logarithms inside the bounds and never reaches a knob of 0, so before the comparison it ended above the
    profile's own error (observed as a flaky test_live on a busy machine); now the profile itself comes back."""
    from calibration.bench_fit import PROFILE_UNFITTED, profile_family

    sc, _ = load_scenario(ROOT / "calibration" / "scenarios" / "validate-tiny.yaml")
    tiny = next(c for c in variant_configs(sc) if c.name == "continuous")
    fam = profile_family(str(ROOT / "calibration" / "profiles" / "tiny-cpu.json"))
    rng = np.random.default_rng(3)
    runs = []
    for i, rate in enumerate((20.0, 60.0)):
        ins = np.clip(rng.lognormal(np.log(60), 0.6, 40).astype(int), 4, 300)
        outs = np.clip(rng.exponential(24, 40).astype(int) + 2, 2, 96)
        run = BenchRun(source=f"load{i}", request_rate=rate, input_lens=ins.tolist(), output_lens=outs.tolist(),
                       arrival_times_s=np.cumsum(rng.exponential(1 / rate, 40)).tolist())
        runs.append(plant_measurements(tiny, run, PROFILE_UNFITTED, rng, noise=0.0, family=fam))
    fit = calibrate_from_bench(tiny, runs, family=fam, holdout_every=0, max_iter=2)
    assert fit.knobs == PROFILE_UNFITTED
    assert fit.train_rms_log_error == fit.train_rms_log_error_unfitted == pytest.approx(0.0, abs=1e-12)
    assert fit.train_median_abs_error == fit.train_median_abs_error_unfitted


def test_knobs_on_a_bound_are_named() -> None:
    """calibrate warns when the fit ends on a physical bound (observed on a busy machine: scale at its floor)."""
    from calibration.bench_fit import BenchFit, knobs_at_bounds, profile_family

    fam = profile_family("p.json")
    fit = BenchFit({"scale": 0.1, "step_overhead": 2e-3, "request_latency_s": 1.0}, [], [], 0.1, family=fam)
    assert knobs_at_bounds(fit, fam.free) == ["scale at its floor 0.1", "request_latency_s at its ceiling 1"]
    assert knobs_at_bounds(fit, ("step_overhead",)) == []
    analytic = BenchFit({"compute_efficiency": 0.02, "bandwidth_efficiency": 0.5, "step_overhead": 1e-3,
                         "per_request_overhead": 1e-5}, [], [], 0.1)
    assert knobs_at_bounds(analytic, ("compute_efficiency", "bandwidth_efficiency")) == [
        "compute_efficiency at its floor 0.02"]


def two_rate_files(tmp_path: Path) -> list[str]:
    """``--from-bench`` arguments for two copies of a vllm bench file at 4 and 8 req/s."""
    data = json.loads((DATA / "vllm_detailed.json").read_text())
    files = []
    for rate in (4.0, 8.0):
        (tmp_path / f"r{rate:g}.json").write_text(json.dumps({**data, "request_rate": rate}))
        files += ["--from-bench", str(tmp_path / f"r{rate:g}.json")]
    return files


def test_from_bench_fits_the_model_the_benchmarks_served_not_the_engines_default(tmp_path: Path) -> None:
    # Before: without --model, --from-bench fitted the knobs on the engine calibration's default model, tiny, even
    # with a --scenario of llama-3.1-8b (its model was overwritten): a profile for 'tiny' whose step overhead made
    # up for the missing 8 billion parameters, and no word about it.
    files = two_rate_files(tmp_path)
    base = ["calibrate", *files, "--gpu", "a100-80gb", "--holdout-every", "0"]

    def fit(*args: str) -> dict:
        r = servesim(*base, *args, "-o", str(tmp_path / "k.json"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return json.loads((tmp_path / "k.json").read_text())

    r = servesim(*base, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --from-bench needs --model (the model the benchmarks served) or --scenario")
    # Before: nan was refused as "needs files at that load and at others", a value with none
    r = servesim(*base, "--model", "llama-3.1-8b", "--holdout-load", "nan", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --holdout-load must be a finite number > 0 (requests/s or concurrency), got nan"), r.stderr
    by_scenario = fit("--scenario", str(DATA / "scenario.yaml"))
    by_model = fit("--scenario", str(DATA / "scenario.yaml"), "--model", "llama-3.1-8b")
    assert by_scenario["model"] == by_model["model"] == "llama-3.1-8b"
    assert by_scenario["cost_model"] == by_model["cost_model"]


def test_a_fit_to_files_whose_requests_the_variant_rejects_is_refused(cfg) -> None:
    # Before: a --scenario whose max_model_len is below some of the files' requests fitted the knobs to runs without
    # them (compute efficiency 0.29 for a planted 0.6, "training median |error| 1.4%"), and below all of them to
    # runs of nothing (every metric 0: "training median |error| 100.0%", the defaults written as a profile), exit 0.
    import dataclasses

    from sim.config.schema import ScenarioError

    runs = measured_runs(cfg, n=10, seed=3)[:2]
    short = dataclasses.replace(cfg, deployment=cfg.deployment.model_copy(update={"max_model_len": 512}))
    longest = max(i + o for i, o in zip(runs[0].input_lens, runs[0].output_lens, strict=True))
    assert longest > 512
    with pytest.raises(ScenarioError, match=r"load0: the simulated variant cb rejects \d+ of the benchmark's 10 "
                       r"requests, which the benchmark served \(prompt\+output [\d-]+ tokens exceeds max_model_len 512 "
                       r"\(\d+\)\): no fit to it"):
        calibrate_from_bench(short, runs, holdout_every=0)


def test_a_calibrations_memo_answers_as_a_new_simulation_does(cfg, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fit's last knobs and the unfitted ones were simulated again after it (5 of a fit's ~42 evaluations), and
    # every evaluation rebuilt each file's workload: a SimMemo keeps them for one calibration
    import sim.loop.run

    from calibration.bench_fit import SimMemo, simulate_runs

    runs = measured_runs(cfg, n=10, seed=3)[:2]
    memo = SimMemo()
    fresh = simulate_runs(cfg, runs, PLANTED)
    assert simulate_runs(cfg, runs, PLANTED, memo=memo) == fresh and len(memo.workloads) == 2
    monkeypatch.setattr(sim.loop.run, "simulate_variant", None)  # asked again: nothing is simulated
    assert simulate_runs(cfg, runs, PLANTED, memo=memo) == fresh


def test_a_holdout_that_leaves_one_file_to_fit_is_refused(cfg) -> None:
    # Before: --holdout-every 1 on three files fitted the knobs to one file ("fitted on 1 runs"), which a single
    # file given alone is refused for.
    runs = measured_runs(cfg, n=10, seed=3)[:3]
    with pytest.raises(ValueError, match=r"--holdout-every 1 leaves 1 of the 3 benchmark runs to fit: knobs are never "
                       "fitted to one; hold out fewer"):
        calibrate_from_bench(cfg, runs, holdout_every=1)
    with pytest.raises(ValueError, match=r"--holdout-load 4 leaves 1 of the 3 benchmark runs to fit"):
        calibrate_from_bench(cfg, [runs[0], runs[1], dataclasses.replace(runs[2], request_rate=4.0)],
                             holdout_load=4.0)


@pytest.mark.parametrize("args, message", [
    (["--from-bench", "a.json", "--repeats", "3"], "--repeats applies to the engine's calibration, not to --from-bench"),
    (["--from-bench", "a.json", "--dtype", "bf16"], "--dtype applies to the engine's calibration, not to --from-bench"),
    (["--from-bench", "a.json", "--device", "cuda"], "--device applies to the engine's calibration"),
    (["--scenario", "s.yaml"], "--scenario applies to --from-bench (fitting benchmark files), not to the engine's "
                               "calibration"),
    (["--holdout-every", "2"], "--holdout-every applies to --from-bench"),
    (["--knobs", "step_overhead"], "--knobs applies to --from-bench"),
])
def test_each_modes_options_are_refused_in_the_other(tmp_path: Path, args: list[str], message: str) -> None:
    # Before: calibrate --from-bench dropped the engine's --repeats, --dtype, --device... and the engine's
    # calibration dropped --scenario, --knobs, --holdout-every, --profile, running without them, exit 0.
    r = servesim("calibrate", *args, "--model", "tiny", "--gpu", "a100-80gb", "-o", str(tmp_path / "p.json"),
                 cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p.json").exists()


def test_a_failed_write_leaves_the_previous_profile_whole(tmp_path: Path) -> None:
    # Before: calibrate wrote its profile with Path.write_text, which empties the file first: a write that failed
    # (disk full; here the process's file-size limit) left the earlier profile at that path cut short, its
    # knobs lost, behind "error: --out ...: cannot write".
    import resource
    import signal

    files = two_rate_files(tmp_path)
    out = tmp_path / "k.json"
    before = json.dumps({"kind": "servesim-analytic-knobs", "note": "an earlier fit"})
    out.write_text(before)

    def small_files() -> None:  # in the child: writes past 200 bytes fail (EFBIG) instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    r = subprocess.run([sys.executable, "-m", "sim.cli.main", "calibrate", *files, "--model", "llama-3.1-8b", "--gpu",
                        "a100-80gb", "--holdout-every", "0", "-o", str(out)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=300, preexec_fn=small_files)
    assert r.returncode == 2 and f"error: --out {out}: cannot write" in r.stderr, r.stderr
    assert out.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "r4.json", "r8.json"]


def test_a_file_given_twice_is_refused(tmp_path: Path) -> None:
    # Before: the same file under two spellings was read twice and the fit weighted it double (exit 0, "fitted
    # on 2 runs"); validate --against compared it twice.
    files = two_rate_files(tmp_path)
    again = ["--from-bench", f"./{Path(files[1]).name}"]
    r = servesim("calibrate", *files, *again, "--gpu", "a100-80gb", "--scenario", str(DATA / "scenario.yaml"),
                 "--holdout-every", "0", "-o", "k.json", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: r4.json: given twice (also as {files[1]})\n")
    assert not (tmp_path / "k.json").exists()
    r = servesim("validate", str(DATA / "scenario.yaml"), "--against", files[1], files[1], "--out", "v", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: {files[1]}: given twice\n")
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("out, message", [("d", "--out d: is a folder, give a file name"),
                                          ("f/k.json", "--out f/k.json: f is a file, not a folder")])
def test_an_unwritable_profile_path_is_refused_before_the_fit(tmp_path: Path, out: str, message: str) -> None:
    # Before: the fit ran (tens of simulations) and then "cannot write: Is a directory", or "File exists" for a
    # file where a folder of the path should be.
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    r = servesim("calibrate", *two_rate_files(tmp_path), "--gpu", "a100-80gb", "--scenario", str(DATA / "scenario.yaml"),
                 "--holdout-every", "0", "-o", out, cwd=tmp_path)
    assert (r.returncode, r.stderr, r.stdout) == (2, f"error: {message}\n", "")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder that takes no file")
def test_a_folder_that_takes_no_file_is_refused_before_the_measuring(tmp_path: Path) -> None:
    # Before: `calibrate --model tiny --out /proc/x.json` measured the engine for 13 s (minutes on a GPU grid), then
    # "cannot write"; a folder that exists but takes no file (read-only, /proc) passed the check above
    r = servesim("calibrate", "--model", "tiny", "--repeats", "1", "-q", "-o", "/proc/servesim-profile.json",
                 cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""  # "calibrated tiny on cpu ..." came first
    assert r.stderr.startswith("error: --out /proc/servesim-profile.json: cannot write in /proc: ")


def test_a_field_a_file_could_not_give_is_said_before_the_fit(tmp_path: Path) -> None:
    # Before: a request_rate of -3 was skipped without a word and the file fitted as every request at t=0
    # (validate --against lists the same line in its report)
    data = json.loads((DATA / "vllm_detailed.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**data, "request_rate": -3}))
    r = servesim("calibrate", *two_rate_files(tmp_path), "--from-bench", "bad.json", "--gpu", "a100-80gb", "--scenario",
                 str(DATA / "scenario.yaml"), "--holdout-every", "0", "-o", "k.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == "skipped: bad.json: request_rate: not a positive number or 'inf'"


def test_files_of_another_model_are_refused_before_the_fit(tmp_path: Path) -> None:
    """calibrate --from-bench --model llama-3.1-8b fitted the 8B's knobs to a file of Llama-3.1-70B without a word
    (validate --against refuses such a file as well)."""
    data = json.loads((DATA / "vllm_detailed.json").read_text())
    (tmp_path / "70b.json").write_text(json.dumps({**data, "model_id": "meta-llama/Llama-3.1-70B-Instruct"}))
    r = servesim("calibrate", "--from-bench", "70b.json", "--from-bench", str(DATA / "vllm_detailed.json"),
                 "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "-o", "k.json", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: 70b.json: the benchmark served meta-llama/Llama-3.1-70B-Instruct (the preset llama-3.1-70b), but the "
        "fit simulates llama-3.1-8b; to fit that model give --model llama-3.1-70b"), r.stderr
    assert not (tmp_path / "k.json").exists()
