"""Issue 36's engine registry: each serving engine is one module, and an engine servesim has never seen is one
new module of another package, added through the ``servesim.plugins`` entry point group (sim/plugins.py).

The plugin test writes the package's ``.dist-info`` folder itself, as ``pip install`` would, so
importlib.metadata finds it on the path, and runs the scenario in a separate process so that the registration
leaves this test process as it was.
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from sim.engines.registry import EngineConfig, engines

ROOT = Path(__file__).resolve().parents[1]

DUMMY_ENGINE = '''
    from sim.engines.base import Engine
    from sim.engines.registry import register_engine


    class Dummy(Engine):
        """Chunks of 48 tokens, at most 3 sequences a step: defaults no shipped engine has."""

        name = "dummy"

        def chunked_prefill(self, max_model_len):
            return True

        def token_budget(self, cfg, gpu, chunked, max_model_len):
            return 48 if chunked else max_model_len

        def max_num_seqs(self, cfg, gpu, max_model_len, kv_tokens):
            return 3


    register_engine(Dummy())
'''

SCENARIO = """
name: plugin-engine
seed: 5
workload:
  arrival: {type: poisson, rate: 200.0}   # a burst: more requests wait than the engine runs at once
  num_requests: 24
  prompt_len: {type: uniform, min: 64, max: 256}
  output_len: {type: uniform, min: 4, max: 16}
deployment: {model: llama-3.1-8b, gpu: a100-80gb, max_model_len: 1024, engine: dummy}
policy: {type: continuous}
"""


def _package(tmp: Path) -> Path:
    pkg = tmp / "site"
    pkg.mkdir()
    (pkg / "dummy_engine.py").write_text(textwrap.dedent(DUMMY_ENGINE).lstrip())
    info = pkg / "dummy_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[servesim.plugins]\ndummy_engine = dummy_engine\n")
    return pkg


def _run(tmp: Path, env_path: list[Path], scenario: str) -> subprocess.CompletedProcess[str]:
    (tmp / "scenario.yaml").write_text(scenario)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in [*env_path, ROOT]))
    return subprocess.run([sys.executable, "-m", "sim.cli", "run", str(tmp / "scenario.yaml"), "-q", "--steps",
                           "full", "--out", str(tmp / "out")], capture_output=True, text=True, env=env, cwd=tmp,
                          timeout=300)


def test_a_plugin_engine_is_one_new_module_and_its_scheduler_defaults_apply(tmp_path: Path) -> None:
    res = _run(tmp_path, [_package(tmp_path)], SCENARIO)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["scenario"]["deployment"]["engine"]["name"] == "dummy"
    assert summary["variants"]["plugin-engine"]["limits"]["slot_cap"] == 3  # the engine's max_num_seqs
    with (tmp_path / "out" / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    rows = [int(s["batch_size"]) for s in steps]
    tokens = [int(s["prefill_tokens"]) + int(s["decode_tokens"]) for s in steps]
    # the burst queues 24 requests: the engine runs 3 at a time and computes 48 tokens a step at most, chunking
    # prompts of 64-256 tokens (classic, without deployment.engine, would run them whole, 256 at a time)
    assert max(rows) == 3 and max(tokens) == 48, (max(rows), max(tokens))
    with (tmp_path / "out" / "requests.csv").open() as f:
        assert sum(r["outcome"] == "completed" for r in csv.DictReader(f)) == 24


def test_an_engine_no_module_registers_is_refused_with_the_names(tmp_path: Path) -> None:
    res = _run(tmp_path, [], SCENARIO)  # no plugin on the path
    assert res.returncode == 2, res.stdout + res.stderr
    assert "deployment.engine.name: must be 'vllm-v1', 'vllm-v0', 'tensorrt-llm', 'sglang', 'lmdeploy', " \
           "'tgi' or 'classic' (got 'dummy')" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("typed, name", [("vllm", "vllm-v1"), ("vLLM", "vllm-v1"), ("trtllm", "tensorrt-llm"),
                                         ("trt-llm", "tensorrt-llm"), ("tensorrt_llm", "tensorrt-llm"),
                                         ("vllm_v0", "vllm-v0"), ("text-generation-inference", "tgi")])
def test_the_names_users_type_run_the_engine_they_mean(typed: str, name: str) -> None:
    # Before: `engine: vllm` and `engine: trtllm` were refused ("must be 'vllm-v1', 'vllm-v0', ..."), the words
    # users type for them (vllm serve, trtllm-serve); the resolved configuration records the engine's own name
    assert EngineConfig.model_validate({"name": typed}).name == name


def test_the_schema_lists_the_registered_engines() -> None:
    schema = EngineConfig.model_json_schema()
    assert list(engines()) == ["vllm-v1", "vllm-v0", "tensorrt-llm", "sglang", "lmdeploy", "tgi", "classic"]
    assert schema["properties"]["name"]["enum"] == [*engines(), "vllm", "trtllm", "trt-llm", "tensorrtllm",
                                                    "text-generation-inference"]


def test_what_editors_check_against_takes_the_engine_names_servesim_runs() -> None:
    # Before: `servesim schema` listed the engines' own names alone, and no bare name: an editor flagged
    # `engine: {name: vllm}` (runs since 145bf7b) and `engine: sglang` (the short form docs/engines-and-hardware.md
    # uses), both of which servesim runs
    jsonschema = pytest.importorskip("jsonschema")
    from sim.config.scenario import parse_scenario
    from sim.config.schema import json_schema

    validator = jsonschema.Draft202012Validator(json_schema())
    base = yaml.safe_load((ROOT / "scenarios" / "naive-vs-continuous.yaml").read_text())
    for engine in ("sglang", "vllm", {"name": "vllm"}, {"name": "trt-llm", "kv_cache_free_gpu_mem_fraction": 0.9}):
        for where in ("deployment", "variant"):
            raw = copy.deepcopy(base)
            (raw["deployment"] if where == "deployment" else raw["variants"][0].setdefault("deployment", {}))[
                "engine"] = engine
            parse_scenario(raw)  # servesim runs it...
            assert validator.is_valid(raw), (engine, where)  # ...and the schema takes it
    base["deployment"]["engine"] = "vllm-v9"
    assert not validator.is_valid(base)


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_each_engine_name_is_a_string_in_its_own_module_only() -> None:
    """No module tells engines apart by name but the engine's own: the name, as a string of the code (a
    docstring or a description saying more than the name is prose), occurs in one module under sim/,
    realengine/ and calibration/."""
    sources = {p.relative_to(ROOT).as_posix(): _string_constants(p)
               for pkg in ("sim", "realengine", "calibration") for p in sorted((ROOT / pkg).rglob("*.py"))}
    for name, engine in engines().items():
        own = f"{type(engine).__module__.replace('.', '/')}.py"
        holders = sorted(path for path, strings in sources.items() if name in strings)
        assert holders == [own], (name, holders)


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v0", "tensorrt-llm", "sglang", "lmdeploy", "tgi", "classic"])
def test_each_shipped_engine_is_its_own_module(name: str) -> None:
    engine = engines()[name]
    assert type(engine).__module__ == "sim.engines." + name.replace("-", "_")


def test_a_plugin_engines_name_and_aliases_are_matched_as_the_shipped_ones(monkeypatch) -> None:
    # "any case, _ for -" (docs/engines-and-hardware.md) held only for names written lower-case with "-": a plugin's
    # engine named "my_engine" with alias "MyEng" was refused as "MY_ENGINE" and "myeng", which its own name's
    # spelling runs
    from sim.engines import base

    class Mine(base.Engine):
        name = "my_engine"
        aliases = ("MyEng",)

    monkeypatch.setitem(base._ENGINES, "my_engine", Mine())
    assert [base.engine_named(t) for t in ("my_engine", "MY_ENGINE", "my-engine", "myeng", "MYENG", "mine")] == [
        "my_engine", "my_engine", "my_engine", "my_engine", "my_engine", None]
