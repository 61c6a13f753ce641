"""The vllm bench serve reader: units, deployment hints, and malformed fields named with their file."""

from pathlib import Path

import pytest

from sim.output.benchfiles import BenchFileError, read_vllm_bench
from sim.output.benchfiles.validate import rebuild_workload

DATA = Path(__file__).parent / "data" / "bench"


def test_detailed_file_reads_lists_in_seconds_and_aggregates_ms_to_s() -> None:
    run = read_vllm_bench(DATA / "vllm_detailed.json")
    assert run.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert run.request_rate == 4.0 and run.burstiness == 1.0 and run.max_concurrency is None
    assert run.input_lens == [100, 200, 300] and run.output_lens == [3, 3, 3]
    assert run.ttfts_s == [0.03, 0.04, 0.08]
    assert run.aggregates["mean_ttft"] == pytest.approx(0.05)
    assert run.aggregates["p99_e2el"] == pytest.approx(0.0894)
    assert run.skipped == []


def test_aggregate_only_file_skips_the_bad_field_and_keeps_the_rest() -> None:
    path = DATA / "vllm_aggregate.json"
    run = read_vllm_bench(path)
    assert run.request_rate is None  # "inf": all requests at once
    assert run.max_concurrency == 8
    assert run.aggregates == {"mean_ttft": pytest.approx(0.0125), "mean_e2el": pytest.approx(0.1)}
    assert run.skipped == [f"{path}: p99_ttft_ms: not a non-negative number",
                           f"{path}: input_lens: absent (saved without --save-detailed), and completed, "
                           "total_input_tokens and total_output_tokens not all there: the lengths are unknown"]


def test_file_with_nothing_readable_raises_one_message_naming_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"model_id": "m"}')
    with pytest.raises(BenchFileError, match=r"x\.json: no metrics"):
        read_vllm_bench(bad)
    bad.write_text("[1, 2")
    with pytest.raises(BenchFileError, match=r"x\.json: not readable JSON"):
        read_vllm_bench(bad)


def test_a_file_too_large_or_nested_too_deeply_is_one_message(tmp_path: Path, monkeypatch) -> None:
    # Before: `validate --against /dev/zero` read without end (and `cost_model: {type: analytic, profile:
    # /dev/zero}` likewise), and a file of 200,000 nested lists ended in json's RecursionError traceback
    from sim.output.benchfiles import common
    from sim.output.benchfiles.genai_perf import read_genai_perf
    from sim.output.benchfiles.guidellm import read_guidellm
    from sim.output.benchfiles.knobs import read_knob_profile
    from sim.output.benchfiles.validate import read_bench_files

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    big = tmp_path / "big.json"
    big.write_text("[" + "0, " * 400_000 + "0]")  # 1.2 MB
    monkeypatch.setattr(common, "MAX_BENCH_BYTES", 1 << 20)
    monkeypatch.setattr(common, "MAX_BENCH_FILE_BYTES", 1 << 20)
    for read in (lambda p: read_bench_files([p]), read_vllm_bench, read_genai_perf, read_guidellm, read_knob_profile):
        with pytest.raises(BenchFileError, match=r"deep\.json: not readable JSON \(nested too deeply\)$"):
            read(deep)
        with pytest.raises(BenchFileError, match=r"big\.json: larger than 1 MiB, too large for a benchmark file$"):
            read(big)


def test_a_detailed_file_past_the_stream_cap_is_read_without_its_unread_lists(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm bench serve --save-detailed writes each request's token gaps and text, some 27 kB a request of 1,000
    tokens: past 20,000 requests the file passed the 512 MiB cap and was refused, though servesim reads neither list.
    A regular file is now taken up to its own cap, judged by its size, and the two lists are cut before parsing, texts
    holding brackets, quotes and the key's own name included; a stream (/dev/zero) keeps the smaller cap."""
    import json

    from sim.output.benchfiles import common

    n = 100
    doc = json.loads((DATA / "vllm_detailed.json").read_text())
    doc |= {"num_prompts": n, "input_lens": [100] * n, "output_lens": [500] * n, "ttfts": [0.05] * n,
            "itls": [[0.02] * 499] * n,
            "generated_texts": [f'"itls": [[1]], {{"x": "]"}} \\ \u00e9 {i} ' * 200 for i in range(n)],
            "errors": [""] * n}
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    assert big.stat().st_size > 1 << 20
    cut = json.loads(common._without_unread(big.read_bytes()))  # the two lists never parsed
    assert cut["itls"] is None and cut["generated_texts"] is None and cut["errors"] == [""] * n
    monkeypatch.setattr(common, "MAX_BENCH_BYTES", 1 << 20)
    run = read_vllm_bench(big)
    assert run.input_lens == [100] * n and run.output_lens == [500] * n and run.ttfts_s == [0.05] * n
    assert run.skipped == [] and run.aggregates["mean_ttft"] == pytest.approx(0.05)
    monkeypatch.setattr(common, "MAX_BENCH_FILE_BYTES", 1 << 20)
    with pytest.raises(BenchFileError, match=r"big\.json: larger than 1 MiB, too large for a benchmark file$"):
        read_vllm_bench(big)
    if Path("/dev/zero").exists():
        with pytest.raises(BenchFileError, match=r"zero: larger than 1 MiB, too large for a benchmark file$"):
            read_vllm_bench("/dev/zero")


def test_mismatched_list_lengths_skip_per_request_data(tmp_path: Path) -> None:
    f = tmp_path / "y.json"
    f.write_text(
        '{"mean_ttft_ms": 1.0, "input_lens": [1, 2], "output_lens": [1], "ttfts": [0.1, 0.2], "itls": [[], []]}'
    )
    run = read_vllm_bench(f)
    assert run.input_lens == [] and run.aggregates == {"mean_ttft": pytest.approx(0.001)}
    assert run.skipped == [f"{f}: output_lens: length 1 != input_lens' 2; per-request comparison skipped"]


def test_a_workload_that_cannot_be_rebuilt_names_the_list_at_fault(tmp_path: Path) -> None:
    # Before: "no per-request lengths and no length statistics" although input_lens was there; the short ttfts
    # list that made the reader drop the per-request data went unnamed.
    f = tmp_path / "z.json"
    f.write_text('{"mean_ttft_ms": 1.0, "input_lens": [1, 2], "output_lens": [1, 1], "ttfts": [0.1]}')
    with pytest.raises(BenchFileError) as e:
        rebuild_workload(read_vllm_bench(f))
    assert str(e.value) == (f"{f}: no per-request lengths and no length statistics: cannot rebuild the workload; "
                            "ttfts: length 1 != input_lens' 2; per-request comparison skipped")


def test_a_request_count_other_than_the_lists_is_named(tmp_path: Path) -> None:
    # Before: num_prompts 7 over 2-entry lists was read without a word (the lists silently won).
    f = tmp_path / "c.json"
    f.write_text('{"num_prompts": 7, "mean_ttft_ms": 1.0, "input_lens": [1, 2], "output_lens": [1, 1], '
                 '"ttfts": [0.1, 0.2]}')
    run = read_vllm_bench(f)
    assert run.input_lens == [1, 2]
    assert run.skipped == [f"{f}: num_prompts: 7, but input_lens holds 2 requests; the lists are used"]
    f.write_text('{"num_prompts": 2, "input_lens": [1, 2], "output_lens": [1, 1], "ttfts": [0.1, 0.2]}')
    assert read_vllm_bench(f).skipped == []


def test_a_negative_ttft_drops_the_per_request_lists(tmp_path: Path) -> None:
    # Before: ttfts of -1.0 s were read as measured first-token times.
    f = tmp_path / "n.json"
    f.write_text('{"mean_ttft_ms": 1.0, "input_lens": [1, 2], "output_lens": [1, 1], "ttfts": [0.1, -1.0]}')
    run = read_vllm_bench(f)
    assert run.input_lens == [] and run.ttfts_s == []
    assert run.skipped == [f"{f}: ttfts: not all non-negative numbers; per-request comparison skipped"]


@pytest.mark.parametrize("written", ['"inf"', "Infinity"])
def test_a_constant_rate_burstiness_is_read_as_infinite(tmp_path: Path, written: str) -> None:
    """vLLM draws evenly spaced arrivals for --burstiness inf; its result JSON holds it as json.dump writes it
    (Infinity), and servesim's own export of a constant-rate run as "inf" (a string, as request_rate's "inf"). Both
    were skipped as 'not a positive number' and the workload rebuilt as Poisson (burstiness 1)."""
    f = tmp_path / "c.json"
    f.write_text('{"request_rate": 2.0, "burstiness": ' + written + ', "num_prompts": 3, "input_lens": [1, 2, 3], '
                 '"output_lens": [1, 1, 1], "ttfts": [0.1, 0.2, 0.1]}')
    run = read_vllm_bench(f)
    assert run.burstiness == float("inf") and run.skipped == []
    times = [r.arrival for r in rebuild_workload(run)[0].requests]
    assert times == pytest.approx([0.5, 1.0, 1.5])  # evenly spaced at 2 req/s, as vLLM sends them
