"""Issue 36's registries: an engine, a GPU, a metric, a scheduling policy and a router, each added as one new
module of a package servesim has never seen, and a scenario that uses all of them, with nothing in servesim edited.

The engine, the GPU and the metric come in through the ``servesim.plugins`` entry point group (sim/plugins.py): the test
writes the package's ``.dist-info`` folder itself, as ``pip install`` would, so importlib.metadata finds it on the
path. The policy and the router are named by class in the scenario. The run is a separate process, so that the
registrations leave this test process as it was.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULES = {
    "dummy_engine.py": '''
        from sim.engines.base import Engine
        from sim.engines.registry import register_engine


        class TinySteps(Engine):
            """Chunked prefill with 64 tokens a step and at most options.max_seqs sequences (3): small enough to see."""

            name = "tiny-steps"

            def chunked_prefill(self, max_model_len):
                return True

            def token_budget(self, cfg, gpu, chunked, max_model_len):
                return 64 if chunked else max_model_len

            def max_num_seqs(self, cfg, gpu, max_model_len, kv_tokens):
                return (cfg.options or {}).get("max_seqs", 3)

            def check_options(self, options):  # its own key in deployment.engine.options
                for key, value in options.items():
                    if key != "max_seqs" or not isinstance(value, int) or value < 1:
                        raise ValueError(f"tiny-steps takes options.max_seqs, a whole number >= 1; got {key}={value!r}")


        register_engine(TinySteps())
    ''',
    "dummy_gpu.py": '''
        from sim.hardware.gpu import register_gpu

        # half an A100-80GB's rates, an architecture no shipped GPU has
        register_gpu({"name": "dummy-gpu", "architecture": "dummyarch", "memory_bytes": 40 * 2**30,
                      "mem_bandwidth": 1.0e12, "peak_flops": {"bf16": 156e12}, "pcie_bandwidth": 25e9})
    ''',
    "dummy_metric.py": '''
        from sim.metrics.registry import Metric, register_metric


        def _output_per_request(result):
            done = [r for r in result.requests if r.completed]
            return sum(r.output_tokens for r in done) / len(done) if done else float("nan")


        register_metric(Metric("output_tokens_per_request", "output tok / request", "s", "tokens",
                               "output tokens of completed requests / completed requests",
                               compute=_output_per_request))
    ''',
    "dummy_policy.py": '''
        import servesim


        class LongestPromptFirst(servesim.QueuePolicy):
            """Waiting requests by longest prompt first: the opposite of shortest-job-first."""

            def rank(self, req):
                return (-req.prompt_len, req.arrival)
    ''',
    "dummy_router.py": '''
        import servesim


        class LastReplica(servesim.Router):
            """Every request to the highest-numbered replica."""

            def route(self, request, replicas):
                return replicas[-1].index
    ''',
}

ENTRY_POINTS = "[servesim.plugins]\ndummy_engine = dummy_engine\ndummy_gpu = dummy_gpu\ndummy_metric = dummy_metric\n"

SCENARIO = """
name: extensions
seed: 3
workload:
  arrival: {type: poisson, rate: 400.0}   # a burst: requests wait, so the order of service shows
  num_requests: 60
  prompt_len: {type: uniform, min: 32, max: 512}
  output_len: {type: uniform, min: 8, max: 64}
deployment:
  model: llama-3.1-8b
  gpu: dummy-gpu
  max_model_len: 2048
  engine: {name: tiny-steps, options: {max_seqs: 2}}
policy: {type: custom, cls: "dummy_policy:LongestPromptFirst"}
cluster: {replicas: 2, router: {type: custom, cls: "dummy_router:LastReplica"}}
variants:
  - name: longest-first
  - name: fcfs
    policy: {type: continuous}
"""


def _out_of_order(rows: list[dict[str, str]]) -> tuple[int, int]:
    """(pairs served against longest-prompt-first, pairs where the order was a choice): a before b while b was
    already waiting, and a's prompt shorter than b's."""
    against = choices = 0
    for a in rows:
        for b in rows:
            fa, fb = float(a["first_scheduled_s"]), float(b["first_scheduled_s"])
            if fa < fb and float(b["arrival_s"]) < fa:
                choices += 1
                against += int(a["prompt_tokens"]) < int(b["prompt_tokens"])
    return against, choices


def _package(tmp: Path) -> Path:
    pkg = tmp / "site"
    pkg.mkdir()
    for name, src in MODULES.items():
        (pkg / name).write_text(textwrap.dedent(src).lstrip())
    info = pkg / "dummy_extensions-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-extensions\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return pkg


def _run(tmp: Path, pkg: Path, scenario: str) -> subprocess.CompletedProcess[str]:
    (tmp / "scenario.yaml").write_text(scenario)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "sim.cli", "run", str(tmp / "scenario.yaml"), "--out",
                           str(tmp / "out")], capture_output=True, text=True, env=env, cwd=tmp, timeout=300)


@pytest.mark.slow
def test_an_engine_gpu_metric_policy_and_router_each_one_new_module(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    res = _run(tmp_path, pkg, SCENARIO)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    variant = summary["variants"]["longest-first"]
    with (tmp_path / "out" / "requests.csv").open() as f:
        every = list(csv.DictReader(f))
    rows = [r for r in every if r["variant"] == "longest-first"]
    done = [r for r in rows if r["outcome"] == "completed"]
    # the metric: in summary.json under its key, equal to the same figure from requests.csv, and in the table
    want = sum(int(r["output_tokens"]) for r in done) / len(done)
    assert variant["output_tokens_per_request"] == pytest.approx(want, rel=1e-12)
    assert "output tok / request" in res.stdout
    # the router: every request of both variants went to the last of the two replicas
    assert {r["replica"] for r in every} == {"1"}
    # the policy: never a shorter prompt served before a longer one that was already waiting (FCFS does so often)
    against, choices = _out_of_order(rows)
    assert against == 0 and choices > 100, (against, choices)
    fcfs_against, _ = _out_of_order([r for r in every if r["variant"] == "fcfs"])
    assert fcfs_against > 20, fcfs_against
    # the GPU: the run was priced on it (its name recorded with the deployment)
    assert "dummy-gpu" in json.dumps(summary)
    assert len(done) == 60
    # the engine: its defaults fill the built-in policy's unset keys, and every step of that variant keeps them
    fcfs = summary["variants"]["fcfs"]
    assert "tiny-steps" in json.dumps(summary["scenario"])
    with (tmp_path / "out" / "steps.csv").open() as f:
        steps = [s for s in csv.DictReader(f) if s["variant"] == "fcfs"]
    assert steps and fcfs["num_completed"] == 60
    assert max(int(s["prefill_tokens"]) + int(s["decode_tokens"]) for s in steps) == 64  # the budget, reached
    assert max(int(s["batch_size"]) for s in steps) == 2  # max_num_seqs from the engine's own option, reached


def test_a_plugin_that_fails_to_load_is_one_clear_error(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    (pkg / "dummy_gpu.py").write_text("raise RuntimeError('no such card')\n")
    res = _run(tmp_path, pkg, SCENARIO)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "servesim plugin 'dummy_gpu'" in res.stderr + res.stdout and "no such card" in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


def test_an_engines_own_options_are_checked_by_it_and_refused_by_the_shipped_ones(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    bad = _run(tmp_path, pkg, SCENARIO.replace("max_seqs: 2", "max_seq: 2"))
    assert bad.returncode == 2 and "tiny-steps takes options.max_seqs" in bad.stdout + bad.stderr, bad.stderr
    shipped = _run(tmp_path, pkg, SCENARIO.replace("name: tiny-steps", "name: vllm-v1"))
    assert shipped.returncode == 2, shipped.stderr
    assert "engine vllm-v1 takes no options (got max_seqs)" in shipped.stdout + shipped.stderr
    assert "Traceback" not in bad.stderr + shipped.stderr
