"""The Python API (``import servesim``): one call runs a scenario file or dict; the results' tables are plain
column dicts with requests.csv's and steps.csv's very columns; ``write`` gives the files ``servesim run`` writes,
byte for byte; ``load`` reads a run folder back; bad input raises ScenarioError with the CLI's message."""

from __future__ import annotations

import copy
import csv
import importlib.util
import math
import re
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import servesim
from sim.cli.main import app
from sim.output.run_folder import to_jsonable

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "naive-vs-continuous.yaml"

SMALL = {
    "name": "api-test",
    "seed": 3,
    "workload": {
        "arrival": {"type": "all_at_once"},
        "num_requests": 12,
        "prompt_len": {"type": "uniform", "min": 16, "max": 64},
        "output_len": {"type": "fixed", "value": 5},
    },
    "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
    "policy": {"type": "continuous", "max_num_seqs": 8},
    "variants": [{"name": "a"}, {"name": "b", "policy": {"type": "continuous", "max_num_seqs": 2}}],
}


@pytest.fixture(scope="module")
def small() -> servesim.Results:
    return servesim.run(SMALL)


def test_run_a_dict_returns_one_summary_per_variant(small):
    assert small.variants == ["a", "b"]
    for s in small.summary.values():
        assert s["num_requests"] == 12 and s["num_completed"] == 12
    # the cap of 2 sequences queues requests: the mean batch of b is at most 2, a's exceeds it
    assert small.summary["b"]["mean_batch_size"] <= 2.0 < small.summary["a"]["mean_batch_size"]


def test_the_dict_given_is_not_changed():
    raw = copy.deepcopy(SMALL)
    servesim.run(raw, num_requests=4, seed=9, set={"policy.max_num_seqs": 4})
    assert raw == SMALL


def test_requests_and_steps_are_column_dicts_matching_the_csv_files(small, tmp_path):
    out = small.write(tmp_path / "run")
    for table, file in ((small.requests, "requests.csv"), (small.steps, "steps.csv")):
        with open(out / file, newline="") as f:
            rows = list(csv.reader(f))
        assert list(table) == rows[0]
        lengths = {len(v) for v in table.values()}
        assert lengths == {len(rows) - 1}
        for i, row in enumerate(rows[1:]):
            for col, cell in zip(rows[0], row, strict=True):
                v = table[col][i]
                if isinstance(v, str):  # text columns (variant, outcome, reason) as written
                    assert v == cell
                elif isinstance(v, tuple):  # times of several events (preemptions): ';'-joined in the file
                    assert ([float(t) for t in cell.split(";")] if cell else []) == list(v), (col, i)
                elif cell == "":  # what never happened
                    assert v is None, (col, i)
                else:  # csv writes floats with repr: the same number back
                    assert float(cell) == v, (col, i)
    assert len(small.requests["variant"]) == 24
    assert set(small.requests["variant"]) == {"a", "b"}
    # latencies derived as summary.json's: the mean of ttft_s is the summary's mean TTFT
    ttft = [t for t, v in zip(small.requests["ttft_s"], small.requests["variant"], strict=True) if v == "a"]
    assert math.isclose(sum(ttft) / len(ttft), small.summary["a"]["ttft"]["mean"], rel_tol=1e-12)


def test_write_gives_the_files_of_servesim_run(tmp_path):
    cli_out = tmp_path / "cli"
    r = CliRunner().invoke(app, ["run", str(SCENARIO), "-n", "30", "--set", "policy.max_num_seqs=64", "-q",
                                 "--out", str(cli_out)])
    assert r.exit_code == 0, r.output
    res = servesim.run(SCENARIO, num_requests=30, set={"policy.max_num_seqs": 64})
    api_out = res.write(tmp_path / "api")
    for name in ("summary.json", "requests.csv", "steps.csv", "report.html"):
        assert (api_out / name).read_bytes() == (cli_out / name).read_bytes(), name
    assert res.table() in r.output


def test_seed_and_num_requests_override():
    a = servesim.run(SMALL, num_requests=5, seed=1)
    b = servesim.run(SMALL, num_requests=5, seed=2)
    assert a.summary["a"]["num_requests"] == 5
    assert a.requests["prompt_tokens"] != b.requests["prompt_tokens"]  # another seed, other prompts
    assert servesim.run(SMALL, num_requests=5, seed=1).requests == a.requests


def test_load_reads_a_run_folder_back(small, tmp_path):
    out = small.write(tmp_path / "run")
    back = servesim.load(out)
    assert back.summary == to_jsonable(small.summary)  # NaN (no data) is null in summary.json
    assert back.requests == small.requests
    assert back.steps == small.steps
    assert back.table() == small.table()
    assert back.scenario["name"] == "api-test"
    assert "Latency" in back.figures()
    page = back.report(tmp_path / "again.html")
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_a_loaded_run_writes_the_folders_own_files(small, tmp_path):
    # the CSV files hold no pooled ITL gaps, model or power figures: a loaded run's write rebuilt the exports
    # from them and wrote mean_itl_ms 0.0, model_id null, no energy and an empty ITL histogram (naive-vs-continuous
    # -n 50: mean_itl_ms 12.51 in the folder read); the report lost its MFU, ITL and energy likewise
    out = small.write(tmp_path / "run")
    again = servesim.load(out).write(tmp_path / "again")
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in out.iterdir())
    kept = ["report.html", "a.vllm-bench.json", "a.metrics.prom", "b.vllm-bench.json", "b.metrics.prom"]
    for name in kept:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    # .report() likewise: the folder's own page, not one rebuilt without ITL, MFU or energy
    page = servesim.load(out).report(tmp_path / "page.html")
    assert page.read_bytes() == (out / "report.html").read_bytes()
    servesim.load(out).write(out)  # over the folder it read: the same files still
    for name in kept:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_figures_and_report(small, tmp_path):
    figs = small.figures()
    assert "Latency" in figs and "Batch slots" in figs
    assert all(hasattr(f, "to_json") for f in figs.values())
    p = small.report(tmp_path / "r.html")
    assert "servesim: api-test" in p.read_text()


def test_a_report_path_that_cannot_be_a_file_is_named(small, tmp_path):
    """``.report(path)`` given a folder raised IsADirectoryError naming its own temporary file
    ('.NAME.xxxx.tmp' -> 'NAME'), given a path under a file NotADirectoryError, and given "" a bare error of the
    current folder; each is a ScenarioError naming the path, as ``.write`` gives, for a run and a loaded one."""
    folder = small.write(tmp_path / "run")
    (tmp_path / "f.txt").write_text("x")
    for res in (small, servesim.load(folder)):
        for path, needle in ((tmp_path, f"report path {tmp_path}: is a folder; name the file to write, "
                                        f"e.g. {tmp_path / 'report.html'}"),
                             (tmp_path / "f.txt" / "r.html", f"report path {tmp_path / 'f.txt' / 'r.html'}: "
                                                             f"{tmp_path / 'f.txt'} is a file, not a folder"),
                             ("", "report path: empty path")):
            with pytest.raises(servesim.ScenarioError) as e:
                res.report(path)
            assert str(e.value).startswith(needle), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "run"]  # no temporary file left


def test_compare_results_and_folders(small, tmp_path):
    other = servesim.run(SMALL, set={"policy.max_num_seqs": 4})
    cmp = servesim.compare(small, other)
    text = cmp.table()
    assert "A: a" in text and "B: b" in text
    row = next(line for line in text.splitlines() if line.startswith("requests"))
    assert row.split() == ["requests", "12", "12", "1.00", "12", "12", "1.00"]
    folder = small.write(tmp_path / "run")
    assert servesim.compare(folder, folder).cells() == servesim.compare(small, small).cells()
    assert small.compare(folder).cells()[1] == cmp.__class__(cmp.a, cmp.a).cells()[1]


def test_compare_labels_an_in_memory_run_by_its_scenario_or_as_told(small, tmp_path):
    """An in-memory run is labelled by its scenario's name (it was "B" whatever it was), a folder by its name;
    ``labels`` names both; two runs of one scenario fall back to A and B."""
    other = servesim.run(SMALL, set={"name": "api-other", "policy.max_num_seqs": 4})
    folder = small.write(tmp_path / "run-8")
    text = servesim.compare(folder, other).table()
    assert "run-8: a" in text and "api-other: a" in text
    assert text.endswith("× is B / A (A = run-8, B = api-other)\n")
    assert servesim.compare(small, other).labels() == ("api-test", "api-other")
    assert small.compare(other).labels() == ("api-test", "api-other")
    assert servesim.compare(small, small).labels() == ("A", "B")
    told = servesim.compare(small, servesim.run(SMALL, set={"policy.max_num_seqs": 4}), labels=("8 seqs", "4 seqs"))
    assert told.table().endswith("(A = 8 seqs, B = 4 seqs)\n") and "4 seqs: b" in told.table()
    assert small.compare(folder, labels=("x", "y")).labels() == ("x", "y")
    with pytest.raises(servesim.ScenarioError, match="labels must be two non-empty strings"):
        servesim.compare(small, other, labels=("only one",))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scenario": "scenarios/no-such.yaml"}, "scenarios/no-such.yaml: scenario file not found"),
        ({"scenario": SMALL, "num_requests": 0}, "num_requests must be an integer >= 1, got 0"),
        ({"scenario": SMALL, "seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"scenario": SMALL, "set": {"deployment.tp": 2}}, "deployment.tp: unknown key"),
        ({"scenario": {**SMALL, "policy": {"type": "greedy"}}}, "policy"),
        ({"scenario": 42}, "scenario must be a YAML file's path or a dict, got int"),
        # before: AttributeError ('str' object has no attribute 'items'), the --set habit in Python
        ({"scenario": SMALL, "set": "policy.max_num_seqs=4"},
         "set must map dotted keys to values, e.g. {'policy.max_num_seqs': 64}; got str 'policy.max_num_seqs=4'"),
        ({"scenario": SMALL, "set": [("policy.max_num_seqs", 4)]}, "set must map dotted keys to values"),
        # before: AttributeError ('str' object has no attribute 'begin') from the run loop, four frames down
        ({"scenario": SMALL, "progress": "yes"}, "progress must be True or False, got str 'yes'"),
    ],
)
def test_bad_input_raises_scenario_error(kwargs, message):
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(**kwargs)
    assert message in str(e.value)


def test_bad_file_gives_the_cli_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkload: {num_requests: -3}\n")
    r = CliRunner().invoke(app, ["run", str(bad), "-q", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(bad)
    assert f"error: {e.value}" in r.output


def test_load_missing_folder(tmp_path):
    with pytest.raises(servesim.ScenarioError, match="run folder not found"):
        servesim.load(tmp_path / "nothing")
    with pytest.raises(servesim.RunFolderError, match="no summary.json"):
        servesim.load(tmp_path)
    # before: TypeError from pathlib
    with pytest.raises(servesim.RunFolderError, match="run_dir must be a run folder's path, got int"):
        servesim.load(3)  # type: ignore[arg-type]


def test_to_pandas(small):
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(ImportError, match="needs pandas"):
            small.to_pandas()
        pytest.skip("pandas is not installed: checked the message instead")
    df = small.to_pandas()
    assert list(df.columns) == list(small.requests) and len(df) == 24
    assert len(small.to_pandas("steps")) == len(small.steps["variant"])
    assert list(small.to_pandas("summary")["variant"]) == ["a", "b"]


def test_to_pandas_keeps_time_columns_numeric_where_none_happened():
    # single-token answers have no TPOT: the column of Nones became dtype object, whose describe() counted
    # "unique" values and whose arithmetic with None raised where a float column gives NaN
    pytest.importorskip("pandas")
    df = servesim.run(SMALL, num_requests=3, set={"workload.output_len.value": 1}).to_pandas()
    assert df["tpot_s"].isna().all()
    times = [c for c in df.columns if c.endswith("_s") and c not in ("preempted_at_s", "resumed_at_s")]
    assert "tpot_s" in times and "first_token_s" in times
    assert {str(df[c].dtype) for c in times} == {"float64"}
    assert df["tpot_s"].describe()["count"] == 0


def test_pandas_comes_with_the_notebooks_extra(small, monkeypatch):
    """to_pandas and docs/python-api.md point to pandas: the notebooks extra installs it (and the test extra, so the
    test above runs in CI), and the message without it says how to get it."""
    import sys
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("notebooks", "test"):
        assert any(req.startswith("pandas>=") for req in extras[extra]), extra
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'servesim\[notebooks\]' or pip install pandas"):
        small.to_pandas()


def test_the_packages_public_names_are_its_api():
    """``servesim.sys`` was one of them: the package's own import showed in dir(servesim) and completions."""
    public = {n for n in dir(servesim) if not n.startswith("_")} - {"notebooks"}  # a submodule, once imported
    assert public == {n for n in servesim.__all__ if not n.startswith("_")}


def test_every_public_name_has_a_docstring():
    for name in servesim.__all__:
        obj = getattr(servesim, name)
        if callable(obj):
            assert obj.__doc__, name
    for name in ("name", "variants", "results", "requests", "steps", "to_pandas", "table", "report", "write", "figures",
                 "compare"):
        assert getattr(servesim.Results, name).__doc__, name


def test_sweep_rows():
    swept = {**SMALL, "variants": [{"name": "a"}], "sweep": {"policy.max_num_seqs": [2, 8]}}
    res = servesim.run(swept, num_requests=4)
    assert res.sweep == [{"name": "a[max_num_seqs=2]", "variant": "a", "policy.max_num_seqs": 2},
                         {"name": "a[max_num_seqs=8]", "variant": "a", "policy.max_num_seqs": 8}]
    assert list(res.summary) == [row["name"] for row in res.sweep]
    assert servesim.run(SMALL, num_requests=4).sweep == []


def test_the_api_works_without_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import servesim, sim.output.compare\n"
        f"res = servesim.run({SMALL!r}, num_requests=3)\n"
        "assert res.summary['a']['num_completed'] == 3\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


# " policy.type" and "policy ": set's keys are trimmed when applied, and padded ones slipped past the check
@pytest.mark.parametrize("key, value", [("policy.type", "fcfs"), ("policy", {"type": "fcfs"}),
                                        (" policy.type", "fcfs"), ("policy ", {"type": "fcfs"})])
def test_a_policy_object_and_set_choosing_another_policy_are_refused(key: str, value: object) -> None:
    # Before: set's policy.type replaced the object without a word, and the run was fcfs's
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(SMALL, policy=servesim.QueuePolicy(), set={key: value})
    assert str(e.value) == (f"policy= and set's {key.strip()!r} both choose the policy; give one of them (set's "
                            "policy.* limits such as policy.max_num_seqs apply to the object)")
    res = servesim.run(SMALL, policy=servesim.QueuePolicy(), set={"policy.max_num_seqs": 3})
    assert res.summary["a"]["limits"]["slot_cap"] == 3.0  # the object runs, at the limit set gives it


def test_an_empty_output_path_is_refused_in_python_as_on_the_command_line(small, tmp_path, monkeypatch) -> None:
    # Before: Results.write(""), Comparison.write("") and evaluate(out="") wrote into the current folder
    monkeypatch.chdir(tmp_path)
    for write, name in ((lambda: small.write(""), "out_dir"), (lambda: small.compare(small).write(""), "out_dir"),
                        (lambda: servesim.evaluate(servesim.QueuePolicy(), {k: v for k, v in SMALL.items()
                                                                           if k != "variants"}, out=""), "out")):
        with pytest.raises(servesim.ScenarioError) as e:
            write()
        assert str(e.value) == f"{name}: empty path; name a file or folder (. for the current folder)"
    assert list(tmp_path.iterdir()) == []


def test_an_output_folder_that_is_a_file_is_refused_in_python_as_on_the_command_line(small, tmp_path) -> None:
    # Before: Results.write and Comparison.write raised a bare FileExistsError or NotADirectoryError, and
    # evaluate(out=) the same after its runs; now one ScenarioError as --out gives, before anything is written
    (tmp_path / "f").write_text("mine")
    scenario = {k: v for k, v in SMALL.items() if k != "variants"}
    for write, name in ((small.write, "out_dir"), (small.compare(small).write, "out_dir"),
                        (lambda p: servesim.evaluate(servesim.QueuePolicy(), scenario, out=p), "out")):
        for path, why in ((tmp_path / "f", "exists and is not a folder"),
                          (tmp_path / "f" / "sub", f"{tmp_path / 'f'} is a file, not a folder")):
            with pytest.raises(servesim.ScenarioError) as e:
                write(path)
            assert str(e.value) == f"{name} {path}: {why}"
    assert [p.name for p in tmp_path.iterdir()] == ["f"] and (tmp_path / "f").read_text() == "mine"


class ShortestFirst(servesim.QueuePolicy):
    def rank(self, req):  # type: ignore[no-untyped-def]
        return (req.predicted_output_len, req.arrival, req.id)


def _warned(call) -> list[str]:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in got if issubclass(w.category, UserWarning)]


def test_python_callers_are_warned_of_a_policy_reading_a_prediction_it_has_no_predictor_for() -> None:
    # Before: only `servesim run` said so; servesim.run and evaluate ran first come first served without a word
    note = ("policy {} reads predicted_output_len, but the policy has no predictor, so it is None for every "
            "request: set its predictor (predictor: {{type: oracle}}, lognormal or buckets)")
    one = {k: v for k, v in SMALL.items() if k != "variants"}
    source = ("import servesim\n\nclass S(servesim.QueuePolicy):\n    def rank(self, req):\n"
              "        return (req.predicted_output_len, req.id)\n")
    assert _warned(lambda: servesim.run(SMALL, policy=ShortestFirst())) == [f"a: {note.format('ShortestFirst')}"]
    assert _warned(lambda: servesim.evaluate(ShortestFirst, one)) == [note.format("ShortestFirst")]
    assert _warned(lambda: servesim.evaluate(source, one)) == [note.format("(source text)")]
    oracle = {"policy.predictor": {"type": "oracle"}}
    assert _warned(lambda: servesim.run(SMALL, policy=ShortestFirst(), set=oracle)) == []
    assert _warned(lambda: servesim.evaluate(ShortestFirst(), one, set=oracle)) == []
    assert _warned(lambda: servesim.run(SMALL, policy=servesim.QueuePolicy())) == []


def _by_prediction(req):  # type: ignore[no-untyped-def]
    return (req.predicted_output_len, req.id)


class ThroughHelper(servesim.QueuePolicy):
    def rank(self, req):  # type: ignore[no-untyped-def]
        return _by_prediction(req)


class LongestPromptFirst(servesim.QueuePolicy):
    def rank(self, req):  # type: ignore[no-untyped-def]
        return (-req.prompt_len, req.id)


def test_only_the_code_a_policy_reaches_counts_as_reading_a_prediction() -> None:
    # Before: every function of the policy's module counted, so LongestPromptFirst, beside ShortestFirst in this
    # file, was warned that it reads predicted_output_len; a helper the class calls still counts
    from sim.policies.user import reads
    assert reads(ShortestFirst, "predicted_output_len") and reads(ThroughHelper, "predicted_output_len")
    assert not reads(LongestPromptFirst, "predicted_output_len")
    assert _warned(lambda: servesim.run(SMALL, policy=LongestPromptFirst())) == []


def test_the_examples_of_a_set_key_are_keys_the_scenario_has() -> None:
    """The API's docstring and its refusal of an empty key gave 'deployment.max_num_seqs' as the example of a dotted
    key: max_num_seqs is the policy's, and that key is refused as unknown. Each example now runs."""
    import re

    import sim.api

    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(str(ROOT / "scenarios" / "naive-vs-continuous.yaml"), num_requests=3, set={"": 1})
    examples = re.findall(r"'([a-z_.]+)'", str(e.value)) + re.findall(r'set=\{"([a-z_.]+)"', sim.api.__doc__ or "")
    assert len(examples) == 2, examples
    for key in examples:
        assert servesim.run(str(ROOT / "scenarios" / "naive-vs-continuous.yaml"), num_requests=3,
                            set={key: 8}).summary, key


@pytest.mark.parametrize("call, message", [
    (lambda r: r.write(None), "out_dir must be a path (text or pathlib.Path), got NoneType None"),
    (lambda r: r.write(3), "out_dir must be a path (text or pathlib.Path), got int 3"),
    (lambda r: r.report(None), "report path must be a path (text or pathlib.Path), got NoneType None"),
    (lambda r: r.to_pandas("request"), "table must be requests, steps or summary, got 'request'"),
])
def test_a_wrong_argument_type_on_the_results_is_one_scenario_error(small, call, message) -> None:
    """A notebook's res.write(None) or res.report(3) ended in os.fspath's TypeError five frames down, naming
    neither the argument nor the call; to_pandas("request") raised a bare ValueError where docs/python-api.md
    promises servesim.ScenarioError for bad input."""
    with pytest.raises(servesim.ScenarioError) as e:
        call(small)
    assert str(e.value) == message


API_DOC = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")


def _signature(fn) -> str:
    """``name(params) -> Return`` as docs/python-api.md writes it: defaults, no argument annotations."""
    import inspect

    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return f"{fn.__name__}{sig.replace(parameters=params, return_annotation=inspect.Signature.empty)}" \
        f" -> {fn.__annotations__['return']}"


def test_python_api_doc_names_every_public_name_with_its_exact_signature() -> None:
    """docs/python-api.md gave run as run(scenario, num_requests=None, seed=None, set=None): positional, which the
    keyword-only run refuses, and without progress= and policy=; evaluate's keywords, Results.name/.variants/
    .results/.compare, Comparison, RunFolderError, PolicyError, TokenBucket, Limits and __version__ were nowhere in
    docs/. The doc's "Every public name" now lists them, and this keeps it in step with the code."""
    text = " ".join(API_DOC.split())  # signatures wrap over lines
    missing = [n for n in servesim.__all__ if f"`servesim.{n}" not in text]
    assert not missing, f"not in docs/python-api.md: {missing}"
    for fn in (servesim.run, servesim.load, servesim.compare, servesim.evaluate):
        assert f"`servesim.{_signature(fn)}`" in text, _signature(fn)
    import dataclasses

    members = {
        "Results": [*(m for m in dir(servesim.Results) if not m.startswith("_")),
                    *(a for a in vars(servesim.Results(None, {})) if not a.startswith("_"))],
        "Comparison": [m for m in dir(servesim.Comparison) if not m.startswith("_")],
        "Scores": ["ok", "fitness", "reason", "error", "seeds", "summaries", "cpu_seconds"],
        "WorkloadCache": [*(m for m in dir(servesim.WorkloadCache) if not m.startswith("_")),
                          *(a for a in vars(servesim.WorkloadCache()) if not a.startswith("_"))],
    }
    scores = {f.name for f in dataclasses.fields(servesim.Scores)}
    assert set(members["Scores"]) <= scores
    for metric in sorted(scores - set(members["Scores"])):  # the metrics, listed in the evaluate section
        assert f"`{metric}`" in text or f"`{metric.rpartition('_')[0]}_*`" in text, metric
    for cls, names in members.items():
        line = next(p for p in text.split("- `servesim.") if p.startswith(f"{cls}"))
        assert not [n for n in names if f"`.{n}" not in line], (cls, [n for n in names if f"`.{n}" not in line])


def test_the_methods_written_in_every_public_name_have_the_codes_arguments() -> None:
    """`.write(out_dir)`, `.compare(other, *, labels=None)`, ...: each method the section writes with its arguments
    takes exactly those, with those defaults (strings as written: "requests", not 'requests')."""
    import inspect

    text = " ".join(API_DOC.partition("## Every public name")[2].split())
    for line in text.split("- `servesim.")[1:]:
        cls = getattr(servesim, re.match(r"\w+", line).group())
        for name, written in re.findall(r"`\.(\w+)\(([^)]*)\)`", line):
            sig = inspect.signature(getattr(cls, name))
            params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()][1:]
            code = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))[1:-1]
            assert written == code.replace("'", '"'), (cls.__name__, name, written, code)


def test_a_token_bucket_of_the_wrong_type_is_named() -> None:
    """TokenBucket("10") ended in math.isfinite's 'must be real number, not str', naming neither argument."""
    with pytest.raises(ValueError, match=r"^rate must be a finite number > 0 \(requests per second\), got '10'$"):
        servesim.TokenBucket("10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^burst must be a finite number >= 1 \(requests\), got None$"):
        servesim.TokenBucket(10, burst=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^rate must be a finite number > 0 \(requests per second\), got True$"):
        servesim.TokenBucket(True)
