"""The command line on bad input: one clear message naming the field and the reason, exit code 2, no traceback,
and no run folder written. Hand-picked cases first, then hypothesis feeding mutated scenarios."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import parse_scenario
from sim.config.schema import ScenarioError
from sim.loop.run import prepare_scenario
from tests.conftest import servesim

ROOT = Path(__file__).resolve().parent.parent

# A small valid scenario touching every section; the cases below break one thing in it.
VALID: dict[str, Any] = {
    "name": "cli-test",
    "seed": 7,
    "workload": {
        "arrival": {"type": "poisson", "rate": 20.0},
        "num_requests": 6,
        "prompt_len": {"type": "uniform", "min": 16, "max": 64},
        "output_len": {"type": "fixed", "value": 4},
    },
    "deployment": {
        "model": "llama-3.2-1b",
        "gpu": "l4",
        "gpu_memory_utilization": 0.9,
        "max_model_len": 1024,
        "block_size": 16,
    },
    "policy": {"type": "continuous", "max_num_seqs": 8, "enable_chunked_prefill": True, "max_num_batched_tokens": 256},
    "admission": {"max_queue_len": 50, "max_queue_delay": 30.0},
    "slos": {"ttft": 1.0, "tpot": 0.1},
    "variants": [
        {"name": "a"},
        {"name": "b", "deployment": {"block_size": 32}, "kv_cache": {"type": "paged", "enable_prefix_caching": True}},
    ],
}


def invoke(tmp_path: Path, scenario: Any | None = None, *, text: str | None = None, args: tuple[str, ...] = ()):
    """Run ``servesim run`` in-process on a scenario (a dict or YAML text) written to tmp_path."""
    path = tmp_path / "scenario.yaml"
    if text is None:
        text = yaml.safe_dump(scenario, sort_keys=False)
    path.write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q", *args])
    return result, out


def assert_clean_error(result, out: Path, *needles: str) -> str:
    """Exit code 2, stderr one ``error:`` line holding every needle, nothing on stdout, no traceback, no output."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output
    assert result.stdout == ""
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists()
    return err


def test_valid_scenario_runs(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, VALID)
    assert result.exit_code == 0, result.output
    assert "a: " in result.stdout and "b: " in result.stdout
    for f in ("summary.json", "requests.csv", "steps.csv", "report.html"):
        assert (out / f).is_file()


def test_the_closing_line_names_every_file_written(tmp_path: Path) -> None:
    """The run folder holds 8 files; the closing line once named 4 (summary, requests, steps, report)."""
    result, out = invoke(tmp_path, VALID)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("wrote "))
    assert lines[first].startswith(f"wrote {out}/: summary.json, requests.csv, steps.csv, report.html")
    listed = lines[first].partition("/: ")[2].split(", ") + lines[first + 1].partition("): ")[2].split(", ")
    assert lines[first + 1].startswith("and per variant (")
    on_disk = sorted(p.name for p in out.iterdir())
    assert sorted(listed) == on_disk
    assert on_disk == ["a.metrics.prom", "a.vllm-bench.json", "b.metrics.prom", "b.vllm-bench.json", "report.html",
                       "requests.csv", "steps.csv", "summary.json"]


def _with(path: str, value: Any) -> dict:
    """VALID with a dotted path set (creating levels)."""
    d = copy.deepcopy(VALID)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[keys[-1]] = value
    return d


def _without(path: str) -> dict:
    d = copy.deepcopy(VALID)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    del node[keys[-1]]
    return d


CASES = {
    "unknown top-level key": (_with("replicas", 2), ["replicas", "unknown key"]),
    "unknown nested key": (_with("workload.arrival.burst", 3), ["workload.arrival.burst", "unknown key"]),
    "unknown key in a variant's deployment": (
        _with("variants.1.deployment.blocksize", 8),
        ["variants.1.deployment.blocksize", "unknown key"],
    ),
    "wrong type": (_with("workload.num_requests", "many"), ["workload.num_requests", "integer", "'many'"]),
    "wrong type of a section": (_with("slos", [1, 2]), ["slos", "mapping"]),
    "negative rate": (_with("workload.arrival.rate", -3), ["workload.arrival.rate", "greater than 0", "-3"]),
    "unknown arrival type": (_with("workload.arrival.type", "poison"), ["workload.arrival.type", "poison", "poisson"]),
    "missing required key": (_without("workload.arrival.rate"), ["workload.arrival.rate", "missing"]),
    "missing trace file": (
        _with("workload", {"arrival": {"type": "trace", "trace": "no/such/trace.csv"}}),
        ["workload.arrival.trace", "not found", "trace.csv"],
    ),
    "block size 0": (_with("deployment.block_size", 0), ["deployment.block_size", "greater than or equal to 1"]),
    "block size 0 in a variant": (
        _with("variants.1.deployment.block_size", 0),
        ["variants.1.deployment.block_size", "greater than or equal to 1"],
    ),
    "model does not fit": (
        _with("deployment", {"model": "llama-3.1-70b", "gpu": "l4", "max_model_len": 4096}),
        ["deployment", "llama-3.1-70b does not fit", "l4", "GiB"],
    ),
    "unknown model": (_with("deployment.model", "llama-9"), ["deployment.model", "unknown model", "llama-9"]),
    "unknown gpu": (_with("deployment.gpu", "tpu-v9"), ["deployment.gpu", "unknown GPU", "tpu-v9"]),
    # the names a vLLM user has at hand: the model id served (read as a config.json path: "file not found") and
    # nvidia-smi's GPU name; the error now names the preset that is that model or chip
    "a Hugging Face model id": (
        _with("deployment.model", "meta-llama/Llama-3.1-8B-Instruct"),
        ["deployment.model", "file not found", "the preset for 'meta-llama/Llama-3.1-8B-Instruct' is 'llama-3.1-8b' "
         "(a Hugging Face model id is not downloaded)"],
    ),
    # named once: "did you mean" (the hint after the preset list said it again)
    "a model preset misspelt": (_with("deployment.model", "llama3-8b"), ["unknown model 'llama3-8b'; did you mean "
                                                                         "'llama-3-8b'?"]),
    "nvidia-smi's gpu name": (
        _with("deployment.gpu", "NVIDIA H100 80GB HBM3"),
        ["deployment.gpu", "unknown GPU", "the preset for 'NVIDIA H100 80GB HBM3' is 'h100-sxm'"],
    ),
    "max_model_len larger than the KV cache": (
        _with("deployment", {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 100000}),
        ["deployment.max_model_len", "100000", "larger than the KV cache"],
    ),
    "max_model_len beyond the model's context": (
        _with("deployment.max_model_len", 10**6),
        ["deployment.max_model_len", "context"],
    ),
    "duplicate variant names": (_with("variants.1.name", "a"), ["variants", "unique", "'a'"]),
    "bad sweep key": (_with("sweep", {"polcy.max_num_seqs": [1, 2]}), ["sweep", "polcy.max_num_seqs"]),
    "bad sweep value": (_with("sweep", {"policy.max_num_seqs": [4, -1]}), ["policy.max_num_seqs", "-1"]),
    "sweep key that exists nowhere": (
        _with("sweep", {"policy.max_num_seq": [4, 8]}),
        ["sweep", "policy.max_num_seq", "unknown key", "did you mean policy.max_num_seqs"],
    ),
    "sweep key no variant has": (
        _with("sweep", {"policy.batch_size": [4, 8]}),  # a static policy's key; every variant runs continuous
        ["sweep", "policy.batch_size", "no variant"],
    ),
}


@pytest.mark.parametrize("scenario,needles", CASES.values(), ids=list(CASES))
def test_bad_scenario(tmp_path: Path, scenario: dict, needles: list[str]) -> None:
    result, out = invoke(tmp_path, scenario)
    assert_clean_error(result, out, *needles)


TEXT_CASES = {
    "invalid YAML": ("name: [unclosed\nseed: 1\n", ["not valid YAML", "line "]),
    "YAML that is a list": ("- name: a\n- name: b\n", ["mapping", "list"]),
    "empty file": ("", ["mapping", "empty"]),
    "tabs": ("name: x\n\tseed: 1\n", ["not valid YAML"]),
}


@pytest.mark.parametrize("text,needles", TEXT_CASES.values(), ids=list(TEXT_CASES))
def test_bad_yaml(tmp_path: Path, text: str, needles: list[str]) -> None:
    result, out = invoke(tmp_path, text=text)
    assert_clean_error(result, out, "scenario.yaml", *needles)


def test_nonexistent_scenario_path(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(tmp_path / "nope.yaml"), "--out", str(out)])
    assert_clean_error(result, out, "nope.yaml", "not found")


def test_scenario_path_is_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(tmp_path), "--out", str(out)])
    assert_clean_error(result, out, str(tmp_path), "not a file")


@pytest.mark.parametrize(
    "args,needles",
    [
        (("--set", "seed"), ["--set", "KEY=VALUE"]),
        (("--set", "workload.arrival.rate=-1"), ["workload.arrival.rate", "greater than 0"]),
        (("--set", "workload.arrival.rate=[1"), ["--set workload.arrival.rate"]),
        (("--set", "variants.5.name=x"), ["--set", "variants.5", "no item"]),
        (("--set", "deployment..gpu=l4"), ["--set", "empty part"]),
        (("--num-requests", "0"), ["--num-requests", ">= 1"]),
    ],
)
def test_bad_options(tmp_path: Path, args: tuple[str, ...], needles: list[str]) -> None:
    result, out = invoke(tmp_path, VALID, args=args)
    assert_clean_error(result, out, *needles)


def test_set_indexes_lists(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, VALID, args=("--set", "variants.1.name=renamed"))
    assert result.exit_code == 0, result.output
    assert "renamed: " in result.stdout


def test_out_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(VALID))
    out = tmp_path / "taken"
    out.write_text("not a folder")
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: --out")
    assert out.read_text() == "not a folder"


@pytest.mark.parametrize("command", [
    ["run", "{s}", "-q", "--out"], ["sweep", "{s}", "-q", "--sweep", "seed=1,2", "--out"], ["compare", "a", "b", "-o"],
    ["validate", "{s}", "--against", "x.json", "--out"], ["engine", "run", "{s}", "--out"],
    ["tournament", "t.yaml", "--out"], ["observe", "{s}", "--endpoint", "http://127.0.0.1:9/v1", "--out"],
    ["engine", "quality", "--json"], ["serve", "{s}", "--log"],
])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path: Path, monkeypatch, command) -> None:
    # Before: Path("") is ".", so `run --out ""` (an unset shell variable) wrote summary.json, report.html and the
    # rest into the current folder, among the user's own files.
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(VALID))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [a.format(s="s.yaml") for a in command] + [""])
    flag = "--out" if command[-1] == "-o" else command[-1]
    assert (result.exit_code, result.stderr) == (
        2, f"error: {flag}: empty path; name a file or folder (. for the current folder)\n"), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("command, name", [
    (["run", ""], "scenario"), (["plan", ""], "scenario"), (["compare", "", "b"], "run_a"),
    (["validate", "{s}", "--profile", ""], "--profile"), (["calibrate", "--from-bench", ""], "--from-bench"),
    (["validate", "{s}", "--against", "x.json", ""], "FILE"), (["serve", ""], "scenario"),
])
def test_an_empty_input_path_is_named_not_read_as_the_current_folder(tmp_path: Path, monkeypatch, command,
                                                                     name) -> None:
    # Before: `servesim run ""` (an unset shell variable) said "error: .: not a file (a scenario is a YAML file)",
    # naming neither the argument nor the empty value. Not "(. for the current folder)" as --out says: `servesim
    # run .` is refused as "not a file", --profile . and --from-bench . alike
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(VALID))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [a.format(s="s.yaml") for a in command])
    assert (result.exit_code, result.stderr) == (
        2, f"error: {name}: empty path; name the file or folder to read\n"), result.output


def test_an_empty_path_from_python_is_named() -> None:
    from sim.api import RunFolderError, load, run

    with pytest.raises(ScenarioError, match=r"^scenario path is empty \(''\); name a scenario YAML file$"):
        run("")
    with pytest.raises(RunFolderError, match=r"^run folder path is empty \(''\); name a folder written"):
        load("")


@pytest.mark.parametrize("command, value", [
    (["observe", "{s}", "--endpoint", "http://127.0.0.1:9/v1"], "inf"), (["engine", "run", "{s}"], "nan"),
    (["validate", "{s}", "--profile", "calibration/profiles/tiny-cpu.json"], "inf"),
])
def test_time_scale_is_checked_alike_wherever_arrivals_meet_the_wall_clock(tmp_path: Path, command, value) -> None:
    # Before: observe let --time-scale inf through (`not v >= 0`) and waited forever for the first arrival; the
    # engine and validate had checks of their own, one line each (sim.workload.arrivals.time_scale_problem now).
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(VALID))
    r = servesim(*[a.format(s=tmp_path / "s.yaml") for a in command], "--time-scale", value, "--out",
                 str(tmp_path / "out"), cwd=ROOT, timeout=120)
    assert (r.returncode, r.stderr) == (2, f"error: --time-scale must be a finite number >= 0, got {value}\n")
    assert not (tmp_path / "out").exists()


def test_no_traceback_reaches_the_terminal(tmp_path: Path) -> None:
    """The real entry point, in a subprocess: what a user sees on a bad file is one line."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with("deployment.block_size", 0)))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli.main", "run", str(path), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: deployment.block_size: must be greater than or equal to 1 (got 0)"
    ]
    assert proc.stdout == ""
    assert not out.exists()


# ---- property tests: random malformations of VALID ------------------------------------------------------------
def _leaves(d: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths of every scalar leaf (bools included)."""
    if isinstance(d, dict):
        return [p for k, v in d.items() for p in _leaves(v, prefix + (k,))]
    if isinstance(d, list):
        return [p for i, v in enumerate(d) for p in _leaves(v, prefix + (i,))]
    return [prefix]


def _mappings(d: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths of every mapping, the top level included."""
    out = []
    if isinstance(d, dict):
        out.append(prefix)
        for k, v in d.items():
            out += _mappings(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _mappings(v, prefix + (i,))
    return out


def _get(d: Any, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def _dotted(path: tuple) -> str:
    return ".".join(str(k) for k in path)


LEAVES = _leaves(VALID)
NUMBERS = [p for p in LEAVES if type(_get(VALID, p)) in (int, float)]  # bools are not numbers here
MAPPINGS = _mappings(VALID)
# keys whose absence the schema refuses (the others have defaults)
REQUIRED = [
    ("workload",),
    ("workload", "arrival"),
    ("workload", "arrival", "type"),
    ("workload", "arrival", "rate"),
    ("workload", "num_requests"),
    ("workload", "prompt_len"),
    ("workload", "prompt_len", "type"),
    ("workload", "prompt_len", "min"),
    ("workload", "prompt_len", "max"),
    ("workload", "output_len"),
    ("workload", "output_len", "value"),
    ("policy", "type"),
    ("variants", 0, "name"),
    ("variants", 1, "name"),
    ("variants", 1, "kv_cache", "type"),
]


def _wrong_value(value: Any, choice: int) -> Any:
    """A value of a type the key cannot take."""
    if isinstance(value, bool):
        return ["maybe", 2.5, [True]][choice]
    if isinstance(value, (int, float)):
        return ["lots", [value], {"n": value}][choice]
    return [[value], 2.5, None][choice]  # strings: a list, a number, null


@st.composite
def mutations(draw) -> tuple[dict, str, str]:
    """(mutated scenario, kind, dotted path of the offending key)."""
    d = copy.deepcopy(VALID)
    kind = draw(st.sampled_from(["unknown key", "wrong type", "negative", "missing"]))
    if kind == "unknown key":
        path = draw(st.sampled_from(MAPPINGS))
        name = draw(st.from_regex(r"zz_[a-z_]{1,10}", fullmatch=True))  # never a real key
        node = _get(d, path)
        node[name] = draw(st.sampled_from([1, "x", True, [1], {"a": 1}]))
        return d, kind, _dotted(path + (name,))
    if kind == "wrong type":
        path = draw(st.sampled_from(LEAVES))
        parent = _get(d, path[:-1])
        parent[path[-1]] = _wrong_value(parent[path[-1]], draw(st.integers(0, 2)))
        return d, kind, _dotted(path)
    if kind == "negative":
        path = draw(st.sampled_from(NUMBERS))
        parent = _get(d, path[:-1])
        parent[path[-1]] = -parent[path[-1]]
        return d, kind, _dotted(path)
    path = draw(st.sampled_from(REQUIRED))
    del _get(d, path[:-1])[path[-1]]
    return d, kind, _dotted(path)


def _names_the_key(err: str, dotted: str) -> bool:
    """The message names the offending key: its whole path, or (for a rule across keys, such as "poisson needs
    num_requests") its parent's path and its own name."""
    parent, _, leaf = dotted.rpartition(".")
    return f": {dotted}:" in err or f": {dotted} " in err or ((not parent or parent in err) and leaf in err)


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=mutations())
def test_malformed_scenarios_fail_cleanly(tmp_path: Path, case: tuple[dict, str, str]) -> None:
    scenario, kind, dotted = case
    out = tmp_path / "out"
    if out.exists():  # tmp_path is shared by the examples; a failure would have stopped at the first
        raise AssertionError("a run folder was written")
    result, out = invoke(tmp_path, scenario)
    err = assert_clean_error(result, out)
    assert _names_the_key(err, dotted), (kind, dotted, err)


def _every_malformation() -> list[tuple[dict, str, str]]:
    cases = []
    for path in LEAVES:
        for choice in range(3):
            d = copy.deepcopy(VALID)
            parent = _get(d, path[:-1])
            parent[path[-1]] = _wrong_value(parent[path[-1]], choice)
            cases.append((d, "wrong type", _dotted(path)))
    for path in NUMBERS:
        d = copy.deepcopy(VALID)
        parent = _get(d, path[:-1])
        parent[path[-1]] = -parent[path[-1]]
        cases.append((d, "negative", _dotted(path)))
    for path in REQUIRED:
        d = copy.deepcopy(VALID)
        del _get(d, path[:-1])[path[-1]]
        cases.append((d, "missing", _dotted(path)))
    for path in MAPPINGS:
        d = copy.deepcopy(VALID)
        _get(d, path)["zz_unknown"] = 1
        cases.append((d, "unknown key", _dotted(path + ("zz_unknown",))))
    return cases


def test_every_single_malformation_is_named() -> None:
    """The same four mutations, exhaustively, through the library (no CLI): fast, so every path is tried."""
    cases = _every_malformation()
    assert len(cases) > 100
    for scenario, kind, dotted in cases:
        with pytest.raises(ScenarioError) as info:
            prepare_scenario(parse_scenario(scenario, "s.yaml"), scenario, source="s.yaml")
        msg = str(info.value)
        assert len(msg.splitlines()) == 1, msg
        assert msg.startswith("s.yaml: "), msg
        assert _names_the_key("error: " + msg, dotted), (kind, dotted, msg)


def _commands(group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's argv path under a click group (`run`, `engine run`, ...)."""
    out = []
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer's own click, not necessarily the installed one)
            out += _commands(cmd, (*path, name))
        else:
            out.append((*path, name))
    return out


def test_every_command_with_a_progress_bar_takes_quiet(tmp_path: Path) -> None:
    """`servesim engine run ... -q` was refused (No such option: -q) though run, sweep, plan, calibrate and validate
    take it: a script silencing every command's bar failed on this one."""
    import typer.main

    group = typer.main.get_command(app)
    for path in [("run",), ("sweep",), ("tournament",), ("plan",), ("calibrate",), ("validate",), ("engine", "run")]:
        cmd: Any = group
        for name in path:
            cmd = cmd.commands[name]
        flags = {o for p in cmd.params for o in p.opts}
        assert {"--quiet", "-q"} <= flags, path
    pytest.importorskip("torch")
    one = {**VALID, "workload": {**VALID["workload"], "num_requests": 2}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(one))
    res = CliRunner().invoke(app, ["engine", "run", str(tmp_path / "s.yaml"), "--model", "tiny", "--time-scale", "0",
                                   "--weights", "random", "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "summary.json").is_file()


def test_help_shows_extras_and_no_type_after_flags() -> None:
    """Every command's --help: an extra named in the help text reads in full (Rich's markup once ate
    `[parquet]`, leaving `pip install 'servesim'`), and a flag shows no value type (`--quiet <bool>` read as if
    it took a value)."""
    import typer.main

    group = typer.main.get_command(app)
    paths = _commands(group)
    assert ("run",) in paths and ("engine", "run") in paths and ("sweep",) in paths
    runner = CliRunner()
    for path in [(), *paths]:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, (path, res.output)
        assert "'servesim'" not in res.output, (path, res.output)
        # an input path argument read 'scenario <Path>' since fd6ea98 (its parser made typer label it by its
        # annotation's class), where every other path reads '<path>'
        assert "<Path>" not in res.output, (path, res.output)
    run_help = " ".join(runner.invoke(app, ["run", "--help"]).output.split())  # help wraps lines
    assert "scenario <path> Scenario YAML file." in run_help
    assert "(needs pyarrow: pip install 'servesim[parquet]')" in run_help
    assert "-q, --quiet No progress bar." in run_help


def test_python_m_servesim_is_the_servesim_command(tmp_path: Path) -> None:
    """``python -m servesim`` (how a user without the venv's script on PATH runs it) was 'No module named
    servesim.__main__'; it is now the command itself, under its own name in the help and the error lines."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "servesim", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage: servesim [OPTIONS] COMMAND" in helped.stdout
    missing = run("run", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'nope.yaml'}: scenario file not found"


@pytest.mark.parametrize("command", [
    ["sweep", "scenarios/naive-vs-continuous.yaml", "-n", "5", "--sweep", "seed=1"],
    ["plan", "scenarios/plan-chat.yaml", "-n", "20", "--set", "plan.gpus=[l4]"],
    ["tournament", "examples/tournaments/priority-vs-fcfs.yaml"],
])
def test_address_without_the_ray_executor_is_refused(tmp_path: Path, monkeypatch, command) -> None:
    """``--address HOST:PORT`` names a Ray cluster, read only with ``--executor ray``; with the default local
    executor it was dropped without a word and the runs went to a process pool here (a sweep ran and exited 0)."""
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "o"), "-q", "--address", "10.0.0.1:6379"]
                             if command[0] != "plan" else [*command, "-q", "--address", "10.0.0.1:6379"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == ("error: --address 10.0.0.1:6379 names a Ray cluster, which only --executor ray "
                                  "uses; give --executor ray with it, or leave --address out to run here")
    assert not (tmp_path / "o").exists()


def test_a_count_of_one_takes_the_singular(tmp_path: Path) -> None:
    """`servesim run -n 1` described its workload as '1 requests', a closed loop of one user as '1 users', and a
    sweep of one run, a stalled run of one request or a verdict of one preemption said the same: the count's noun
    now follows it (sim/words.py)."""
    from sim.words import counted
    from sim.workload.arrivals import ClosedLoopArrival

    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / "naive-vs-continuous.yaml"), "-n", "1",
                                   "-o", str(tmp_path / "one")])
    assert res.exit_code == 0, res.output
    assert "poisson 6 req/s; 1 request; prompt" in res.output and "1 requests" not in res.output
    loop = ClosedLoopArrival.model_validate({"type": "closed_loop", "num_users": 1, "think_time": 0.5})
    assert loop.describe().startswith("closed loop, 1 user, think time")
    assert [counted(n, "request") for n in (0, 1, 2)] == ["0 requests", "1 request", "2 requests"]
    assert counted(12345, "request", fmt=",") == "12,345 requests"


@pytest.mark.parametrize("given, line", [
    (["--model", "llama-3.1-70b"], "No such option: --model; it is the scenario's deployment.model: give --set "
                                   "deployment.model=llama-3.1-70b"),
    (["--tp=2"], "No such option: --tp; it is the scenario's deployment.tensor_parallel_size: give --set "
                 "deployment.tensor_parallel_size=2"),
    (["--max-num-seqs", "8"], "No such option: --max-num-seqs; it is the scenario's policy.max_num_seqs: give "
                              "--set policy.max_num_seqs=8"),
])
def test_an_option_that_is_a_scenario_key_points_to_set(given: list[str], line: str) -> None:
    """`servesim run scenario.yaml --model X`, an option users try, was click's 'No such option: --model
    (Possible options: --help)': a guess at nothing. A command that reads a scenario now names the key and the --set
    that sets it (exit 2, as any usage error); an option that is no scenario key keeps click's message."""
    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    res = CliRunner().invoke(app, ["run", scenario, *given])
    assert res.exit_code == 2 and line in " ".join(res.output.split()), res.output
    other = CliRunner().invoke(app, ["run", scenario, "--verbose"])
    assert other.exit_code == 2 and "No such option: --verbose" in other.output and "--set" not in other.output
    # a longer spelling of the command's own option keeps click's pointer to it: --output was answered with the
    # scenario's plan.api_price.output, where the user meant --out
    out = CliRunner().invoke(app, ["run", scenario, "--output", "x"])
    assert out.exit_code == 2 and "No such option: --output (Possible options: --out)" in " ".join(out.output.split())
    assert "--set" not in out.output


@pytest.mark.parametrize("command", [["run"], ["check-policy"], ["engine", "run"], ["plan"]])
def test_variant_is_answered_as_the_scenarios_variants_not_a_nested_key(command: list[str]) -> None:
    """`servesim run s.yaml --variant mine` (validate, serve and observe take --variant) was told to give --set
    deployment.speculative.acceptance.variant=mine, a speculative-decoding knob the user never meant."""
    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    res = CliRunner().invoke(app, [*command, scenario, "--variant", "continuous"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "speculative" not in text and "--set" not in text, res.output
    what = "has no --variant" if command == ["plan"] else "runs every variant of the scenario"
    assert "No such option: --variant;" in text and f"{' '.join(command)} {what}" in text, res.output
    assert "validate" in text.partition("these take --variant:")[2], res.output
    # run as `python -m sim.cli` (a program name of three words): run read as "-m sim.cli run", said no --variant
    res = CliRunner().invoke(app, [*command, scenario, "--variant", "continuous"], prog_name="python -m sim.cli")
    assert f"python -m sim.cli {' '.join(command)} {what}" in " ".join(res.output.split()), res.output


@pytest.mark.parametrize(("command", "how"), [
    (["run"], "give the scenario a sweep section, --set 'sweep={policy.max_num_seqs: [8,16]}'"),
    (["check-policy"], "it runs one point: --set policy.max_num_seqs=8"),
    (["engine", "run"], "it runs one point: --set policy.max_num_seqs=8"),
])
def test_sweep_as_an_option_points_to_what_the_command_takes(command: list[str], how: str) -> None:
    """`servesim run s.yaml --sweep policy.max_num_seqs=8,16` (servesim sweep's option) was told 'give --set
    sweep=policy.max_num_seqs=8,16', which sets the section to that text and is refused ('expected a mapping');
    check-policy and engine run refuse a sweep section altogether."""
    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    for prog in (None, "python -m sim.cli"):  # the module's own program name: "-m sim.cli run" is still run
        res = CliRunner().invoke(app, [*command, scenario, "--sweep", "policy.max_num_seqs=8,16"], prog_name=prog)
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and "--set sweep=" not in text, res.output
        assert f"{' '.join(command)} has no --sweep (servesim sweep takes it): {how}" in text, res.output


def test_the_engines_time_scale_says_which_clock_it_is_on() -> None:
    # `engine run` and `validate` run the engine on its virtual clock, which skips idle gaps and counts only the
    # steps' measured time; --time-scale's help said "a * X wall seconds", so a user expected a wall-paced replay
    import typer.main

    root = typer.main.get_command(app)
    for path in (("engine", "run"), ("validate",)):
        cmd = root
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        [opt] = [p for p in cmd.params if p.name == "time_scale"]
        assert "wall" not in opt.help and "engine's clock" in opt.help and "skipped" in opt.help, path


@pytest.mark.parametrize(("given", "line"), [
    (["plan", "--gpu", "h100"], "No such option: --gpu; it is the scenario's plan.gpus: give --set plan.gpus=[h100]"),
    (["plan", "--tp", "2"], "give --set plan.tensor_parallel_sizes=[2]"),
    (["plan", "--max-num-seqs", "8"], "give --set plan.max_num_seqs=[8]"),
    (["observe", "--model", "m"], "No such option: --model; observe takes --served-model: give --served-model m"),
])
def test_each_commands_hint_names_the_key_it_uses(given: list[str], line: str) -> None:
    """plan searches plan.gpus (and replaces deployment.gpu with each candidate's): `servesim plan --gpu h100` was
    pointed at --set deployment.gpu=h100, which the search overrides; observe asks the server for --served-model."""
    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    res = CliRunner().invoke(app, [given[0], scenario, *given[1:]])
    assert res.exit_code == 2 and line in " ".join(res.output.split()), res.output
    # plan chooses the replica count itself: no --set to give
    plain = CliRunner().invoke(app, ["plan", scenario, "--replicas", "2"])
    assert plain.exit_code == 2 and "No such option: --replicas" in plain.output and "--set" not in plain.output


def test_a_gpu_option_that_names_no_gpu_is_refused_with_the_presets() -> None:
    """`servesim engine run s.yaml --gpu h100x` was told to give --set deployment.gpu=h100x, a second try bound to
    fail: the GPU is checked against the presets where the hint is made (exit 2, the presets named)."""
    from sim.hardware.gpu import GPU_PRESETS

    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    for given, place in ((["engine", "run", scenario, "--gpu", "h100x"], "deployment.gpu=NAME"),
                         (["plan", scenario, "--gpu", "h100,h100x"], "plan.gpus=[NAME]")):
        res = CliRunner().invoke(app, given)
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert (f"No such option: --gpu; it is the scenario's {place.partition('=')[0]}, and 'h100x' is no GPU preset: "
                f"give --set {place} with one of {', '.join(GPU_PRESETS)}") in text, res.output
    res = CliRunner().invoke(app, ["engine", "run", scenario, "--gpu", "H100"])  # an alias: the hint as it was
    assert res.exit_code == 2 and "give --set deployment.gpu=H100" in " ".join(res.output.split()), res.output
    # nvidia-smi's name, which the scenario's deployment.gpu answers with its preset (b6826fd): --gpu did not
    res = CliRunner().invoke(app, ["engine", "run", scenario, "--gpu", "NVIDIA H100 80GB HBM3"])
    assert res.exit_code == 2 and "the preset for 'NVIDIA H100 80GB HBM3' is 'h100-sxm'" in " ".join(
        res.output.split()), res.output


@pytest.mark.parametrize(("option", "line"), [
    ("--replicas", "it is the scenario's cluster.replicas: give --set cluster.replicas=2"),
    ("--xpyd", "give --set variants.0.disaggregation.xpyd=2 (0: a list's first item)"),
])
def test_the_hints_set_key_is_one_set_can_reach(option: str, line: str) -> None:
    """`servesim run --replicas 2` was told '--set variants.cluster.replicas=2': variants is a list (--set needs an
    index) and the top-level cluster section holds replicas; the schema was walked depth first, through variants."""
    scenario = str(ROOT / "scenarios" / "naive-vs-continuous.yaml")
    res = CliRunner().invoke(app, ["run", scenario, option, "2"])
    assert res.exit_code == 2 and line in " ".join(res.output.split()), res.output


def test_dtype_help_lists_every_dtype_the_engine_accepts() -> None:
    """`--dtype`'s help names what the check accepts: `engine run --dtype fp64` ran, but its help said only
    `fp32, bf16, fp16`. Help and check read one table (sim.hardware.dtypes.ENGINE_DTYPE_NAMES)."""
    torch_dtype = pytest.importorskip("realengine.model").torch_dtype
    from sim.hardware.dtypes import ENGINE_DTYPE_NAMES

    assert {str(torch_dtype(name)) for name in ENGINE_DTYPE_NAMES} == {
        "torch.float32", "torch.bfloat16", "torch.float16", "torch.float64"}
    for command in (["engine", "run"], ["calibrate"]):
        out = " ".join(CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).output.split())
        assert "--dtype <str> fp32, bf16, fp16, fp64 (default" in out, (command, out)


def test_validate_without_a_profile_names_the_shipped_ones() -> None:
    """docs/write-a-policy.md sent a user to `servesim validate` after `engine run`, and validate answered only
    'validate needs --profile (the engine run) ...', naming no profile to give; the profiles of the CPU models ship
    in calibration/profiles/."""
    root = Path(__file__).parent.parent
    p = servesim("validate", "scenarios/classes-priority.yaml", cwd=root)
    assert p.returncode == 2, p.stderr
    assert "calibration/profiles/tiny-cpu.json (--model tiny, measured on cpu)" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
