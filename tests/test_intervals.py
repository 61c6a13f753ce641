"""sim/metrics/intervals.py and bench_published's leave-one-source-out coverage: the 80% intervals against hand
computations, and ``servesim run --interval`` writing them while a plain run writes what it did before."""

from __future__ import annotations

import html
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_cli import VALID, invoke

from sim.loop.build import build
from sim.metrics.intervals import ERROR_QUANTILES, interval_80, interval_lines, source_percentiles
from sim.output.benchfiles.validate import rebuild_workload

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_published", ROOT / "benchmarks" / "bench_published.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_published"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_interval_by_hand():
    lo_d, hi_d = ERROR_QUANTILES["decode speed"]
    lo_t, hi_t = ERROR_QUANTILES["throughput"]
    lo_f, hi_f = ERROR_QUANTILES["TTFT"]
    iv = interval_80({"tpot": {"mean": 0.010, "p50": None}, "output_throughput": 1000.0, "ttft": {"mean": 0.1},
                      "request_throughput": 0.0, "e2el": {"p99": 2.0}})
    # a time measured as predicted x (1 + error); a rate as predicted / (1 + error)
    assert iv == {"tpot.mean": pytest.approx([0.010 * (1 + lo_d), 0.010 * (1 + hi_d)]),
                  "ttft.mean": pytest.approx([0.1 * (1 + lo_f), 0.1 * (1 + hi_f)]),
                  "output_throughput": pytest.approx([1000 / (1 + hi_t), 1000 / (1 + lo_t)])}
    assert "e2el.p99" not in iv  # tails: the development rows are means and rates
    lines = interval_lines({"a": {"interval_80": iv}, "b": {}})
    assert lines[0] == ("80% interval (published measurements; leave-one-source-out coverage TTFT 76.2%, decode speed "
                        "77.3%, throughput 79.1%, E2E 84.7%; target 70-90%):")
    assert lines[1] == (f"  a: ttft.mean {100 * (1 + lo_f):.1f}-{100 * (1 + hi_f):.1f} ms; tpot.mean "
                        f"{10 * (1 + lo_d):.1f}-{10 * (1 + hi_d):.1f} ms; output_throughput "
                        f"{1000 / (1 + hi_t):,.0f}-{1000 / (1 + lo_t):,.0f}/s")
    assert lines[2] == "  b: no metric with an interval"


def test_e2el_intervals_are_in_seconds_as_the_tables_e2el_rows():
    """The table's E2EL rows are in s; their intervals were printed in ms (e2el.mean 1,895.0-4,018.4 ms beside
    E2EL p50 (s) 2.18), a unit to convert by hand while reading one against the other."""
    lo_e, hi_e = ERROR_QUANTILES["E2E"]
    iv = interval_80({"e2el": {"mean": 3.0, "p50": 2.0}, "ttft": {"mean": 0.1}})
    (line,) = interval_lines({"a": {"interval_80": iv}})[1:]
    assert line == (f"  a: ttft.mean {100 * (1 + ERROR_QUANTILES['TTFT'][0]):.1f}-"
                    f"{100 * (1 + ERROR_QUANTILES['TTFT'][1]):.1f} ms; e2el.mean {3 * (1 + lo_e):.2f}-"
                    f"{3 * (1 + hi_e):.2f} s; e2el.p50 {2 * (1 + lo_e):.2f}-{2 * (1 + hi_e):.2f} s")


# a source of many rows far off and two small ones: by rows, a's eight would set every percentile
LOPSIDED = [("a", 1.0)] * 8 + [("b", 0.0), ("b", 0.1), ("c", -0.1), ("c", 0.05)]


def test_source_percentiles_weigh_each_source_the_same():
    # a's rows weigh 1/8 each, b's and c's 1/2: in error order -0.1 (c, share 0.5 of 3), 0.0 (b, 1.0), 0.05 (c,
    # 1.5), 0.1 (b, 2.0), then a's 1.0 (2.125 ... 3.0): p10 (0.3) is -0.1, p50 (1.5) 0.05, p90 (2.7) 1.0, where by
    # rows (numpy's default) the median would be a's 1.0 and the 10th percentile 0.005
    assert source_percentiles(LOPSIDED, (10, 50, 90)) == [-0.1, 0.05, 1.0]
    assert source_percentiles([("x", 0.3)], (0, 100)) == [0.3, 0.3]
    with pytest.raises(ValueError, match="no errors"):
        source_percentiles([])


def test_source_percentiles_are_numpys_weighted_inverted_cdf():
    np = pytest.importorskip("numpy")
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("np.percentile takes weights from numpy 2.0")
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        pairs = [(str(s), float(x)) for s, x in zip(rng.integers(0, 5, n), np.round(rng.normal(size=n), 1),
                                                    strict=True)]
        counts = {s: sum(t == s for t, _ in pairs) for s, _ in pairs}
        qs = [float(q) for q in rng.uniform(0, 100, 3)]
        want = np.percentile([x for _, x in pairs], qs, weights=[1 / counts[s] for s, _ in pairs],
                             method="inverted_cdf")
        assert source_percentiles(pairs, qs) == pytest.approx(list(want), abs=0)


def test_leave_one_source_out_coverage_by_hand():
    bench = _bench()
    # source a's rows are judged against b's and c's errors only, and so on, each source weighing the same
    inside, total, alone = bench.loso_coverage(LOPSIDED)
    # a: others -0.1, 0.0, 0.05, 0.1 at 1/2 each -> [-0.1, 0.1]: its eight 1.0 out
    # b: others -0.1, 0.05 at 1/2, eight 1.0 at 1/8 -> [-0.1, 1.0]: 0.0 and 0.1 in (by rows [0.035, 1.0]: 0.0 out)
    # c: others 0.0, 0.1 at 1/2, eight 1.0 at 1/8 -> [0.0, 1.0]: 0.05 in, -0.1 out (by rows [0.09, 1.0]: both out)
    assert (inside, total, alone) == (3, 12, [])
    assert bench.loso_coverage([("a", 0.1)]) == (0, 0, ["a"])


def test_write_intervals_puts_the_reports_figures_in_place(tmp_path):
    """--write-intervals: the constants servesim applies are the run's percentiles and coverage, written by the
    script, so the README's table and sim/metrics/intervals.py cannot drift apart (they did: the README's decode
    interval was the 940-row run's [-23.5%, +67.3%] while the module applied the 924-row run's [-10.9%, +73.3%])."""
    bench = _bench()
    shifted = [(s, x + 0.5) for s, x in LOPSIDED]
    by_class = {"TTFT": LOPSIDED, "decode speed": shifted, "throughput": LOPSIDED, "E2E": [("a", 0.2), ("a", 0.3)]}
    copy = tmp_path / "intervals.py"
    source = (ROOT / "sim" / "metrics" / "intervals.py").read_text()
    copy.write_text(source)
    bench.write_intervals(by_class, copy)
    ns: dict = {}
    exec(bench.INTERVAL_BLOCK.search(copy.read_text()).group(0), ns)
    # LOPSIDED by hand (test_source_percentiles_weigh_each_source_the_same, test_leave_one_source_out_coverage_by_hand)
    assert ns["ERROR_QUANTILES"] == {"TTFT": (-0.1, 1.0), "decode speed": (0.4, 1.5), "throughput": (-0.1, 1.0),
                                     "E2E": (0.2, 0.3)}
    assert ns["LOSO_COVERAGE"] == {"TTFT": 3 / 12, "decode speed": 3 / 12, "throughput": 3 / 12, "E2E": None}
    # nothing else in the file moves, and the layout is the module's own (two classes a line)
    assert bench.INTERVAL_BLOCK.sub("", copy.read_text()) == bench.INTERVAL_BLOCK.sub("", source)
    assert '"TTFT": (-0.100, 1.000), "decode speed": (0.400, 1.500),\n' in copy.read_text()
    with pytest.raises(ValueError, match="no E2E rows"):
        bench.interval_constants({k: v for k, v in by_class.items() if k != "E2E"})


def test_write_intervals_beside_fit_is_refused(monkeypatch, capsys):
    """--fit runs the held-out calibration and no report, so --write-intervals beside it was dropped without a word
    (after the fit's minutes); it is refused first, exit 2, as beside the options that change the report's rows."""
    bench = _bench()

    def fit(*_args):
        raise AssertionError("the fit ran")

    monkeypatch.setattr(bench, "fit", fit)
    monkeypatch.setattr(sys, "argv", ["bench_published.py", "--fit", "--write-intervals"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: --write-intervals writes the report's intervals; --fit runs no report\n"


def test_readme_states_the_intervals_servesim_applies():
    """The README's table of published errors prints each class's 80% interval and coverage; they must be those of
    sim/metrics/intervals.py, which `run --interval`, `validate --against` and `plan` apply."""
    from sim.metrics.intervals import LOSO_COVERAGE

    readme = (ROOT / "README.md").read_text()
    for cls, (lo, hi) in ERROR_QUANTILES.items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| {cls} ") and "%]" in line)
        cover = LOSO_COVERAGE[cls]
        assert f"[{lo:+.1%}, {hi:+.1%}]" in row, (cls, row)
        assert row.rstrip(" |").endswith(f"{cover:.0%}" if cover is not None else "one source"), (cls, row)


def test_source_is_the_document():
    bench = _bench()
    row = {"source": "github:pytorch-labs/gpt-fast@32971d3:README.md"}
    assert bench.source_of(row) == bench.source_of({"source": "github:pytorch-labs/gpt-fast@744c927:README.md"})
    chart = {"source": "github:vllm-project/vllm-project.github.io@c3a01c4:assets/figures/perf-v060/llama8B.png"}
    assert bench.source_of(chart) == "vllm-project.github.io:_posts/2024-09-05-perf-update.md"


def test_own_rows_run_as_their_source_states():
    """benchmarks/data/published-own/: each row becomes the run its notes describe (settings, metric, source)."""
    bench = _bench()
    rows = bench.read_rows([bench.OWN_DATA])
    by = {(r["metric"], r["batch_or_concurrency"], r["request_rate"], r["settings"]): r for r in rows}
    lat = next(r for k, r in by.items() if k[0] == "batch_latency_s" and k[1] == "16")
    case = bench.case_of(lat, 3000)
    # benchmark_latency's batch: 16 requests at t=0, its avg_latency the time until the last of them ended, so 16
    # requests in that time (a preempted request ends after the others: the mean E2E latency would be shorter)
    assert (case.key, case.run.aggregates, len(case.run.input_lens)) == (
        "request_throughput", {"request_throughput": 16 / 84.2203}, 16)
    from sim.loop.run import simulate_variant
    res, _, _ = simulate_variant(case.cfg, bench.rebuild_workload(case.run)[0], name="latency")
    assert bench.predict([case]) == [pytest.approx(84.2203 / res.duration - 1)]  # measured / simulated - 1
    assert case.cfg.deployment.max_model_len == 91680 and case.cfg.deployment.serving is None
    assert case.cfg.deployment.engine.name == "vllm-v0" and bench.metric_of(lat)[0] == "E2E"
    ttft = next(r for k, r in by.items() if k[0] == "ttft_ms_mean" and "max_num_seqs=128" in k[3])
    case = bench.case_of(ttft, 3000)
    assert case.key == "mean_ttft" and case.run.request_rate == float(ttft["request_rate"])
    assert case.run.aggregates["mean_ttft"] == pytest.approx(float(ttft["value"]) / 1000)
    assert len(case.run.input_lens) == 1000 and case.cfg.deployment.serving is not None  # through vllm serve
    assert (case.cfg.policy.max_num_seqs, case.cfg.policy.max_num_batched_tokens) == (128, 512)
    assert case.cfg.policy.enable_chunked_prefill is True
    mi = next(r for r in rows if r["gpu"].startswith("MI300X"))
    assert bench.case_of(mi, 3000).cfg.deployment.engine.enforce_eager is True
    qwen = next(r for r in rows if r["model"] == "Qwen2-7B" and "gpu_memory_utilization=0.25" in r["settings"])
    dep = bench.case_of(qwen, 3000).cfg.deployment
    assert (dep.model, dep.gpu, dep.gpu_memory_utilization, dep.engine.name) == ("qwen2.5-7b", "a100-80gb", 0.25,
                                                                                  "vllm-v1")
    # --max-concurrency 16 at rate inf: 300 requests from a closed loop of 16 users
    sweep = next(r for r in rows if "mushfiqrahman" in r["source"] and r["batch_or_concurrency"] == "16")
    case = bench.case_of(sweep, 3000)
    assert (case.run.max_concurrency, case.run.request_rate, len(case.run.input_lens)) == (16, None, 300)
    wl, _ = rebuild_workload(case.run)
    assert wl.closed_loop is not None and wl.closed_loop.num_users == 16
    # LMDeploy 0.1's static benchmark: 6 rounds of 64 threads, TurboMind's cache of 1000 blocks of 128 tokens from
    # the benchmark script (benchmark_7b.sh: cache_max_entry_count 1000), 128 sequences, each step every admitted
    # prompt whole (max_context_token_num 4 x 4096 is ContextDecode's sub-batch, not a step's budget)
    static = next(r for r in rows if "lmdeploy" in r["source"] and r["model"] == "llama2-7b"
                  and r["batch_or_concurrency"] == "64" and r["input_len"] == "2048" and r["output_len"] == "2048"
                  and r["metric"] == "ttft_s_mean")
    case = bench.case_of(static, 3000)
    dep = case.cfg.deployment
    assert (dep.model, dep.engine.name, dep.num_gpu_blocks, dep.block_size, dep.max_model_len) == (
        "llama-2-7b", "lmdeploy", 1000, 128, 4096)
    limits = build(case.cfg)[0].limits
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (128, 128 * 4096)
    assert (case.run.max_concurrency, len(case.run.input_lens), case.key) == (64, 384, "mean_ttft")
    # TurboMind's Python API, no HTTP server: the client's own Python time a request, no tokenizer or detokenizer
    assert (dep.serving.request_handling_s, dep.serving.tokenize_s_per_token, dep.serving.detokenize_s_per_token) == (
        bench.PROFILE_GENERATION_SUBMIT_S, 0.0, 0.0)
    # dstack's TGI-against-vLLM runs on 8x MI300X: vLLM 0.6.3 (V0) served with the model's own 131072-token
    # context, 128 sonnet prompts at once whose outputs end at the end of sequence under the 150 asked for
    rocm = next(r for r in rows if "amd/inference/vllm" in r["source"] and r["batch_or_concurrency"] == "128"
                and r["metric"] == "ttft_ms_mean")
    case = bench.case_of(rocm, 3000)
    dep = case.cfg.deployment
    assert (dep.model, dep.gpu, dep.engine.name, dep.engine.version, dep.max_model_len) == (
        "llama-3.1-405b", "mi300x", "vllm-v0", "0.6", 131072)
    assert dep.serving is not None and len(case.run.input_lens) == 128 and max(case.run.output_lens) == 150
    assert sum(case.run.output_lens) / 128 == pytest.approx(7588 / 128, abs=0.5)
    # its TGI server: --max-input-tokens 125000 (prefill budget 125050) under --max-total-tokens 130000, run as TGI
    # ran it: a prompt bounded by max_input_tokens, prompt + output by max_model_len
    tgi = next(r for r in rows if "amd/inference/tgi" in r["source"] and r["input_len"] == "64000")
    case = bench.case_of(tgi, 3000)
    limits = build(case.cfg)[3].limits
    assert (case.cfg.deployment.engine.name, limits.max_prompt_len, limits.max_num_batched_tokens,
            limits.max_model_len) == ("tgi", 125000, 125050, 130000)
    # France Travail's run files: 4 workers in a closed loop through happy_vllm's HTTP server, the run's 625
    # queries, the median total query time an E2E row
    ft = next(r for r in rows if "Llama-3.1-8B/vllm_063" in r["source"] and r["batch_or_concurrency"] == "4"
              and r["metric"] == "e2el_s_median")
    case = bench.case_of(ft, 3000)
    assert (case.run.max_concurrency, len(case.run.input_lens), case.key, bench.metric_of(ft)[0]) == (
        4, 625, "median_e2el", "E2E")
    assert case.cfg.deployment.serving is not None and case.cfg.deployment.max_model_len == 131072
    assert case.run.input_lens == [1003] * 625 and case.run.output_lens == [128] * 625
    # the Llama-3.3-70B report's two GPUs are H100 NVL (94 GB): vLLM 0.7.1 reported its KV cache use as a share of
    # 5669 blocks (every run's gpu_cache_usage is k/5669), 90,704 tokens, which bf16 weights of 65.7 GiB a GPU
    # leave only on 94 GB; on 80 GB servesim's rule leaves 202 blocks and refuses max_model_len 30000. vLLM's
    # own figure for the Llama-3.1-8B report on A100-80GB, 28193 blocks, is servesim's 28539 within 1.3%
    for report, gpu, blocks in (("2xH100/Llama-3.3-70b/vllm_071", "h100-nvl", 5340),
                                ("Llama-3.1-8B/vllm_063", "a100-80gb", 28539)):
        ft = next(r for r in rows if report in r["source"] and r["metric"] == "ttft_s_median")
        cfg = bench.case_of(ft, 3000).cfg
        assert (cfg.deployment.gpu, build(cfg)[3].budget.num_gpu_blocks) == (gpu, blocks)
    # nine sources: the reports of one tool and team count as one
    assert {bench.source_of(r) for r in rows} == {"benchmarks:comparison/h100sxm5_vs_mi300x/README.md",
                                                  "benchmarks:nvidia/8xh100/README.md", "vLLM-benchmarking:README.md",
                                                  "https://mushfiqrahman.dev/?p=1668",
                                                  "lmdeploy:docs/en/benchmark/a100_fp16.md",
                                                  "benchmarks:amd/inference/README.md",
                                                  "results_benchmark_llm_serving:README.md",
                                                  "https://blogs.oracle.com/cloud-infrastructure/post/serving-llama-"
                                                  "31-405b-model-with-amd-mi300x-gpus",
                                                  "llm-perf-bench:README.md"}
    with pytest.raises(ValueError, match="settings: unknown key 'max_batch'"):
        bench.settings_of({"settings": "max_batch=4"})


def test_run_interval_flag(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "iv").mkdir()
    result, out = invoke(tmp_path / "plain", VALID)
    assert result.exit_code == 0, result.output
    plain = json.loads((out / "summary.json").read_text())
    assert all("interval_80" not in v for v in plain["variants"].values())  # off: the run writes what it did
    result, out = invoke(tmp_path / "iv", VALID, args=("--interval",))
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    for name, v in summary["variants"].items():
        assert v.pop("interval_80") == interval_80(v)  # floats round-trip through JSON exactly
        assert v == plain["variants"][name]  # nothing else moved
    assert "80% interval (published measurements" in result.stdout
    # the report shows the lines the terminal printed, each variant's under the table; a plain run's has none
    report = (out / "report.html").read_text()
    lines = interval_lines(summary["variants"] | {n: v | {"interval_80": interval_80(v)}
                                                  for n, v in summary["variants"].items()})
    assert f'<p class="note">{html.escape(lines[0])}</p>' in report
    for line in lines[1:]:
        assert f"<li>{html.escape(line.strip())}</li>" in report
    assert "80% interval" not in (tmp_path / "plain" / "out" / "report.html").read_text()


def test_a_variant_on_an_engine_profile_gets_no_interval(tmp_path):
    # Before: `run --interval` on a CPU profile of the tiny model printed GPU servers' errors as its interval
    # (TTFT p50 1.0-4.6 ms), as if they said anything about the profile's measured steps
    profile = str(Path(__file__).parent.parent / "calibration" / "profiles" / "tiny-cpu.json")
    doc = VALID | {"deployment": VALID["deployment"] | {"model": "tiny", "max_model_len": 512},
                   "variants": [{"name": "prof", "deployment": {"cost_model": {"type": "fitted", "profile": profile}}},
                                {"name": "roof"}]}
    result, out = invoke(tmp_path, doc, args=("--interval",))
    assert result.exit_code == 0, result.output
    v = json.loads((out / "summary.json").read_text())["variants"]
    assert v["prof"]["interval_80"] == {} and v["prof"]["interval_80_none"].startswith(
        f"its steps come from the engine profile {profile}, not the analytic model")
    assert v["roof"]["interval_80"] and "interval_80_none" not in v["roof"]
    assert f"  prof: none: its steps come from the engine profile {profile}" in result.stdout


def test_published_lengths_and_textless_streams(tmp_path):
    """A row with ``lengths=FILE`` runs the requests its source published, and its statistics count a request whose
    stream carried no text (output length 0) as benchmark_serving.py does: TTFT 0 and no output tokens."""
    from sim.loop.run import simulate_variant

    bench = _bench()
    (tmp_path / "lengths.csv").write_text("input_len,output_len\n100,0\n50,3\n80,0\n30,5\n200,1\n")
    row = {"source": "github:o/r@1:README.md", "engine": "vLLM v0.6.3", "model": "Llama-3.1-8B",
           "gpu": "H100-SXM-80GB", "tp": "1", "weight_dtype": "bf16", "kv_dtype": "auto", "workload": "QPS=16",
           "input_len": "92", "output_len": "2", "request_rate": "16", "metric": "ttft_ms_mean", "value": "50",
           "unit": "ms", "settings": "lengths=lengths.csv", bench.DIR_KEY: str(tmp_path)}
    case = bench.case_of(row, 3000)
    # the engine prefilled every prompt and sampled one token (its end of sequence) for the textless ones
    assert (case.run.input_lens, case.run.output_lens) == ([100, 50, 80, 30, 200], [1, 3, 1, 5, 1])
    assert case.textless == [True, False, True, False, False]
    wl, _ = rebuild_workload(case.run)
    result, _, _ = simulate_variant(case.cfg, wl, name="row")
    reqs = sorted(result.requests, key=lambda r: r.id)
    assert [r.prompt_tokens for r in reqs] == [100, 50, 80, 30, 200]  # sent in the published order
    stats = bench.client_stats(result, case.textless)
    ttft = [r.first_token - r.arrival for r in reqs]
    assert stats["mean_ttft"] == pytest.approx((ttft[1] + ttft[3] + ttft[4]) / 5)  # zeros in the mean
    assert stats["output_throughput"] == pytest.approx(9 / result.duration)  # 0 + 3 + 0 + 5 + 1 tokens
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in (reqs[1], reqs[3])]
    assert stats["mean_tpot"] == pytest.approx(sum(tpot) / 2)
    assert stats["request_throughput"] == pytest.approx(5 / result.duration)
    # a lengths file that does not match the run is refused, not misread
    with pytest.raises(ValueError, match="5 simulated requests for 4 published lengths"):
        bench.client_stats(result, case.textless[:4])


def test_warmup_request_caches_the_first_prompt():
    """vLLM's serving benchmark sends the first prompt once before the run; on the V1 engine (prefix caching on by
    default) the run's first request then finds its prompt cached, and the client's statistics leave the warm-up
    out."""
    from sim.loop.run import simulate_variant
    from sim.serving.request import RequestSpec
    from sim.workload.generator import GeneratedWorkload

    bench = _bench()
    wl = GeneratedWorkload(tuple(RequestSpec(i, 0.0, 1024, 8) for i in range(3)))
    out = bench.warmup_request(wl, lambda w: 5.0 if [r.output_len for r in w.requests] == [1] else -1.0)
    warm, first, second, third = out.requests
    # the warm-up: the first prompt, one token (its length only moves the start), then the run from t = 5 s
    assert (warm.id, warm.arrival, warm.prompt_len, warm.output_len, warm.hash_ids) == (0, 0.0, 1024, 1, (0, 1))
    assert [(r.id, r.arrival, r.output_len) for r in (first, second, third)] == [(1, 5.0, 8), (2, 5.0, 8), (3, 5.0, 8)]
    assert first.hash_ids == warm.hash_ids and second.hash_ids == third.hash_ids == ()
    rows = bench.read_rows([bench.OWN_DATA])
    qwen = next(r for r in rows if r["model"] == "Qwen2-7B" and r["metric"] == "ttft_ms_mean"
                and "num_prompts=1;" in r["settings"])
    case = bench.case_of(qwen, 3000)
    assert case.warmup and case.cfg.deployment.engine.name == "vllm-v1"
    assert not bench.case_of(qwen, 3000, online=False).warmup  # no serving benchmark, no warm-up
    dstack = next(r for r in rows if "dstack" in r["source"] and r["metric"] == "ttft_ms_mean")
    assert not bench.case_of(dstack, 3000).warmup  # V0: prefix caching off by default
    # simulated: the cached prompt computes only its last block, so the first token comes far sooner than the
    # same prompt's uncached TTFT
    cold, _, _ = simulate_variant(case.cfg, bench.rebuild_workload(case.run)[0], name="cold")
    warmed = bench.warmup_request(bench.rebuild_workload(case.run)[0],
                                  lambda w: simulate_variant(case.cfg, w, name="w")[0].requests[0].finish)
    hot, _, _ = simulate_variant(case.cfg, warmed, name="hot")
    ttft = {r.id: r.first_token - r.arrival for r in hot.requests}
    assert ttft[1] < 0.5 * (cold.requests[0].first_token - cold.requests[0].arrival)
    stats = bench.client_stats(hot, [False], skip=1)
    assert stats["mean_ttft"] == pytest.approx(ttft[1])
    assert stats["request_throughput"] == pytest.approx(1 / (hot.requests[1].finish - hot.requests[1].arrival))


def test_earlier_runs_leave_their_prompts_cached():
    """A run after others on the same V1 server (the same seed's random prompts) finds the earlier runs' prompts in
    the prefix cache: each run follows its own warm-up once the one before has finished, the statistics are the
    run's alone (its ITLs too), and its cached first prompts reach their first token far sooner."""
    from sim.serving.request import RequestSpec
    from sim.workload.generator import GeneratedWorkload

    bench = _bench()
    wl = GeneratedWorkload(tuple(RequestSpec(i, 0.0, 1024, 8) for i in range(3)))
    ends = iter([1.0, 4.0, 5.0])  # the first warm-up, the earlier run, the second warm-up
    out, skip = bench.server_history(wl, (2,), lambda w: next(ends))
    assert skip == 4 and [r.id for r in out.requests] == list(range(7))
    assert [(r.arrival, r.output_len) for r in out.requests] == [(0.0, 1), (1.0, 8), (1.0, 8), (4.0, 1), (5.0, 8),
                                                                 (5.0, 8), (5.0, 8)]
    ids = [r.hash_ids for r in out.requests]
    assert ids[0] == ids[1] == ids[3] == ids[4] == (0, 1) and ids[2] == ids[5] == (2, 3) and ids[6] == (4, 5)
    rows = bench.read_rows([bench.OWN_DATA])
    after = next(r for r in rows if r["metric"] == "ttft_ms_mean" and "num_prompts=30;gpu_memory_utilization=0.5;"
                 "earlier_runs=50" in r["settings"])
    case = bench.case_of(after, 3000)
    assert case.earlier == (50,) and case.warmup
    fresh = next(r for r in rows if r["metric"] == "ttft_ms_mean" and r["settings"].endswith(
        "num_prompts=50;gpu_memory_utilization=0.5"))
    assert bench.case_of(fresh, 3000).earlier == ()
    [cached, cold] = [dict(zip(("ttft", "itl"), bench.predict([c]) + bench.predict(
        [bench.replace(c, key="mean_itl", run=bench.replace(c.run, aggregates={"mean_itl": 0.015}))]), strict=True))
        for c in (case, bench.replace(case, earlier=()))]
    # errors are measured / simulated - 1: the cached run's simulated TTFT is far shorter
    assert cached["ttft"] > 2 * cold["ttft"] + 1
    assert abs(cached["itl"] - cold["itl"]) < 0.2  # the earlier runs' gaps are not the run's
    with pytest.raises(ValueError, match="earlier_runs"):
        bench.case_of(after | {"settings": "max_concurrency=4;earlier_runs=50"}, 3000)


def test_published_rows_run_on_the_checkpoint_they_name():
    """dstack's H100 rows name Meta's FP8 checkpoint (attention in bf16, sim/hardware/quant.py), its MI300X rows
    AMD's, whose every matmul is FP8: each runs on its own preset."""
    bench = _bench()
    rows = bench.read_rows([bench.OWN_DATA])
    models = {r["weight_dtype"]: bench.case_of(r, 30).cfg.deployment.model for r in rows
              if "405B" in r["model"] and r["weight_dtype"].startswith("fp8")}
    # Oracle's post names no checkpoint: the base preset, every matmul in FP8 as the weight column says
    assert models == {"fp8 (meta-llama/Llama-3.1-405B-FP8)": "llama-3.1-405b-fp8",
                      "fp8 (amd/Llama-3.1-405B-Instruct-FP8-KV)": "llama-3.1-405b",
                      "fp8 (the post's 'Llama 3.1 405B FP8 model'; checkpoint not named)": "llama-3.1-405b"}


def test_oracle_mi300x_rows_run_as_vllm_benchmark_scripts_ran_them():
    """Oracle's Llama-3.1-405B FP8 post (8x MI300X, October 2024): benchmark_latency's batches of 1-256 and
    benchmark_throughput's 1000 prompts, each on vLLM 0.6's V0 preset at TP 8 with the scripts' defaults: the
    model's 131072 tokens and chunked prefill off (the scripts pass --enable-chunked-prefill as False), so a step
    may hold 131072 prompt tokens; a batch's time is its requests over that time."""
    bench = _bench()
    rows = [r for r in bench.read_rows([bench.OWN_DATA]) if "blogs.oracle.com" in r["source"]]
    assert len({bench.source_of(r) for r in rows}) == 1 and len(rows) == 11
    assert sorted(int(r["batch_or_concurrency"]) for r in rows if r["metric"] == "batch_latency_s") == [
        1, 2, 4, 8, 16, 32, 64, 128, 256]
    lat = next(r for r in rows if r["metric"] == "batch_latency_s" and r["batch_or_concurrency"] == "256")
    case = bench.case_of(lat, 3000)
    dep = case.cfg.deployment
    assert (dep.model, dep.gpu, dep.tensor_parallel_size, dep.weight_dtype) == ("llama-3.1-405b", "mi300x", 8, "fp8")
    assert (dep.engine.name, dep.engine.version, dep.serving) == ("vllm-v0", "0.6", None)
    policy = build(case.cfg)[0]
    assert (policy.enable_chunked_prefill, policy.limits.max_num_batched_tokens, policy.limits.max_model_len) == (
        False, 131072, 131072)
    assert case.run.input_lens == [128] * 256 and case.run.output_lens == [128] * 256
    assert case.run.aggregates == {"request_throughput": 256 / 17.75} and bench.metric_of(lat)[0] == "E2E"
    thr = bench.case_of(next(r for r in rows if r["output_len"] == "2048"), 3000)
    assert len(thr.run.input_lens) == 1000 and thr.run.aggregates == {"output_throughput": 2794.0}


def test_mlc_llm_perf_bench_rows_are_batch_one_decodes_over_pcie_gpus():
    """MLC's llm-perf-bench vLLM column (vLLM of 2023-10-06): one request of a 7-token prompt and 256 output tokens
    through benchmark_latency.py, tok/s the output over the whole generate(), Llama-2-70B at tensor parallel over
    every GPU of A10Gs and RTX 4090s (no NVLink on either preset), AWQ rows in 4-bit, on vllm-v0's oldest version."""
    bench = _bench()
    rows = [r for r in bench.read_rows([bench.OWN_DATA]) if "llm-perf-bench" in r["source"]]
    assert len(rows) == 5 and {bench.source_of(r) for r in rows} == {"llm-perf-bench:README.md"}
    for r in rows:
        case = bench.case_of(r, 3000)
        dep = case.cfg.deployment
        assert (dep.model, dep.tensor_parallel_size, dep.engine.name, dep.engine.version) == (
            "llama-2-70b", int(r["num_gpus"]), "vllm-v0", "0.5")
        assert dep.gpu in ("a10g", "rtx-4090") and bench.resolve_gpu(dep.gpu).nvlink_bandwidth == 0
        assert dep.weight_dtype == ("int4" if "AWQ" in r["weight_dtype"] else "fp16")
        assert (case.run.input_lens, case.run.output_lens) == ([7], [256])
        assert case.run.aggregates == {"mean_e2el": pytest.approx(256 / float(r["value"]))}
        assert bench.metric_of(r)[0] == "decode speed"


def test_v0_host_time_ratio_diagnostic():
    """--v0-host-time-ratio R runs every vllm-v0 row with that host time ratio (0: the roofline and the serving
    layer alone) and leaves the other engines' rows as they were; a ratio given stands without the preset's cap on
    a decode step's host time. A France Travail vLLM 0.4.3 row at one user: 0.5's 1.63 alone makes it 46% too
    slow, capped at V0's measured host time (the preset) 7%, and 0 too fast (docs/throughput-residuals.md)."""
    bench = _bench()
    rows = bench.read_rows([bench.OWN_DATA])
    old = next(r for r in rows if r["engine"].startswith("vLLM v0.4.3") and r["batch_or_concurrency"] == "1"
               and r["metric"] == "e2el_s_median" and r["gpu"].startswith("A100-80GB"))
    default, host0 = bench.case_of(old, 30), bench.case_of(old, 30, v0_host_ratio=0.0)
    whole = bench.case_of(old, 30, v0_host_ratio=1.63)
    assert default.cfg.deployment.engine.host_time_ratio is None  # the version's: 1.63, capped
    assert host0.cfg.deployment.engine.host_time_ratio == 0.0
    err_default, err_host0, err_whole = bench.predict([default, host0, whole])
    assert err_whole < -0.4 < -0.1 < err_default < 0 < err_host0  # simulated E2E slower than measured, then faster
    v1 = next(r for r in rows if r["model"] == "Qwen2-7B" and "gpu_memory_utilization=0.25" in r["settings"])
    assert bench.case_of(v1, 30, v0_host_ratio=0.0).cfg == bench.case_of(v1, 30).cfg


def test_the_groups_of_misses_and_what_the_median_needs():
    """bench_published's pointers to what to look at next: the rows within a class's target and how many the median
    needs (the middle row of an odd count, both middle rows of an even one), and the groups with the most rows
    beyond 25%, most first (ties: the larger group, then the key), groups without a miss left out."""
    bench = _bench()
    assert bench.median_needs([0.1, -0.3, 0.19, 0.5, -0.2], 0.2) == (3, 3)  # median |error| 0.2: met
    assert bench.median_needs([0.1, -0.3, 0.25, 0.5], 0.2) == (1, 3)
    keyed = [(("a", "x"), 0.3), (("a", "x"), -0.4), (("a", "x"), 0.1), (("b", "y"), 0.26), (("b", "y"), 0.3),
             (("c", "z"), 0.25), (("d", "w"), -0.9), (("d", "w"), 0.0), (("d", "w"), 0.0), (("d", "w"), 0.0)]
    assert bench.miss_groups(keyed) == [(("a", "x"), 2, 1, 3, 0.1), (("b", "y"), 2, 2, 2, 0.28),
                                        (("d", "w"), 1, 0, 4, 0.0)]
    assert bench.miss_groups(keyed, limit=1) == [(("a", "x"), 2, 1, 3, 0.1)]


_GPT_FAST_ROWS = """source,primary_or_secondary,engine,model,gpu,num_gpus,tp,weight_dtype,kv_dtype,workload,input_len,output_len,batch_or_concurrency,request_rate,metric,value,unit,notes
github:pytorch-labs/gpt-fast@32971d3:README.md,primary,"gpt-fast (PyTorch, torch.compile)",Llama-2-7B,A100-SXM-80GB (330W cap),1,1,bf16,bf16,batch-1 decode,5,200,1,n/a,tok_s_batch1,104.9,tok/s,
github:pytorch-labs/gpt-fast@32971d3:README.md,primary,"gpt-fast (PyTorch, torch.compile)",Llama-2-7B,A100-SXM-80GB (330W cap),1,1,int8 (weight-only),bf16,batch-1 decode,5,200,1,n/a,tok_s_batch1,155.58,tok/s,
github:pytorch-labs/gpt-fast@32971d3:README.md,primary,"gpt-fast (PyTorch, torch.compile)",Llama-2-7B,A100-SXM-80GB (330W cap),1,1,"int4 (weight-only, group 32)",bf16,batch-1 decode,5,200,1,n/a,tok_s_batch1,196.8,tok/s,
"""


def test_gpt_fasts_weight_only_rows_run_at_pytorchs_share(tmp_path):
    """gpt-fast's int8 and int4 rows run its (torchao's) weight-only kernels: their weights stream at
    TORCH_WEIGHT_ONLY_BANDWIDTH's share; its bf16 rows and other engines' rows set nothing. gpt-fast's rows
    are three of the shared development set's (written here: a clean checkout has no ../shared), the other
    engines' the repository's own."""
    from sim.costs.analytic import TORCH_WEIGHT_ONLY_BANDWIDTH

    bench = _bench()
    (tmp_path / "gpt-fast.csv").write_text(_GPT_FAST_ROWS)
    rows = [r for r in bench.read_rows([tmp_path / "gpt-fast.csv", bench.OWN_DATA]) if r["metric"] == "tok_s_batch1"]
    assert sum(r["engine"].startswith("gpt-fast") for r in rows) == 3 and len(rows) > 3
    seen = set()
    for r in rows:
        wd = r["weight_dtype"].split()[0]
        share = bench.case_of(r, 1).cfg.deployment.cost_model.weight_only_bandwidth
        if r["engine"].startswith("gpt-fast") and wd in ("int8", "int4"):
            assert share == TORCH_WEIGHT_ONLY_BANDWIDTH[wd]
            seen.add(wd)
        else:
            assert share is None
    assert seen == {"int8", "int4"}


def test_a_stated_prompt_count_is_read_and_a_length_of_500_is_not_one():
    """A row's workload text gives its request count only as "N [kind] prompts": TensorRT-LLM's ISL=500 and
    OSL=500 rows once ran 500 requests because the text held "500" anywhere (they state no count: the default)."""
    bench = _bench()
    base = next(r for r in bench.read_rows([bench.OWN_DATA]) if r["metric"] == "output_tok_s")
    counts = {text: len(bench.case_of({**base, "settings": "", "workload": text}, 3000).run.input_lens)
              for text in ("ISL=500,OSL=2000 fixed, offline", "ISL=5000,OSL=500 fixed, offline",
                           "Decode-heavy: 500 sonnet prompts ~462 in / 256 out, QPS inf", "ShareGPT 200 prompts")}
    assert list(counts.values()) == [3000, 3000, 500, 200]
