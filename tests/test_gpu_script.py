"""The GPU script's every section, run with tiny shapes on the CPU: no GPU here or in CI, so this is what keeps
the script runnable for the day one is lent."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def test_quick_cpu_run_fills_every_section(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_realengine.py"), "--device", "cpu",
                           "--quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    s = report["sections"]
    assert set(s) == {"kernel", "device", "paging", "decode", "batching", "quant"}
    assert not [name for name, res in s.items() if "error" in res], s
    assert s["device"]["copy_bandwidth_GBps"] > 0 and s["device"]["matmul_fp32_TFLOPs"] > 0
    assert s["paging"]["contiguous_sdpa_ms"] > 0 and s["paging"]["paged_gather_ref_ms"] > 0
    for row in (s["decode"]["tiny/batch1"], s["decode"]["tiny/batch4"]):
        assert row["tokens_per_s"] > 0 and 0 < row["share_of_copy_bandwidth"]
    for batch in ("batch1", "batch4"):
        q = s["quant"][batch]
        assert q["base"]["tokens_per_s"] > 0
        assert all(q[f]["speedup_vs_base"] > 0 for f in ("int8", "fp8", "int4"))
    b = s["batching"]
    assert b["static"]["output_tokens"] == b["continuous"]["output_tokens"] > 0


def test_quick_run_without_out_leaves_the_checkout_alone(tmp_path: Path) -> None:
    # run from a scratch "checkout": a smoke run used to leave an untracked calibration/gpu/ folder behind
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_realengine.py"), "--device", "cpu",
                           "--quick", "--only", "kernel"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
    written = Path(proc.stdout.split("wrote ")[-1].strip())
    assert json.loads(written.read_text())["sections"]["kernel"]["seconds"] >= 0
    shutil.rmtree(written.parent)


def test_run_all_dry_run_of_the_policy_section(tmp_path: Path) -> None:
    """run_all.py's ``policy`` section on the CPU (no GPU here): a user's policy from a file and FCFS on the engine,
    each reproduced by the simulator fed its measured steps, recorded in user_policy.json without machine paths."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "run_all.py"), "--device", "cpu",
                           "--quick", "--only", "policy", "--wheels", str(tmp_path / "no-wheels"), "--out", str(out),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sections"]["policy"]["status"] == "ok"
    text = (out / "user_policy.json").read_text()
    assert str(ROOT) not in text and str(tmp_path) not in text
    report = json.loads(text)
    assert report["model"] == "tiny" and report["num_requests"] == 20
    v = report["variants"]
    mine = "examples/policies/shortest_prompt_first.py:ShortestPromptFirst"  # named by file, as a user names it
    assert v["shortest-prompt-first"]["policy_class"] == v["shortest-prompt-first"]["policy"]["cls"] == mine
    assert v["fcfs"]["policy_class"] == "sim/policies/queue.py:FCFSPolicy"
    for name, run in v.items():
        assert run["parity"] == {"reproduced": True, "num_steps": run["summary"]["num_steps"], "differences": []}, name
        # the figures; which requests wait or are preempted follows the measured step times, so only parity and
        # completion are exact here (the tiny model's steps on a shared CPU: 0-4 preemptions seen in a run)
        s = run["summary"]
        assert s["num_completed"] == 20 and s["ttft"]["p99"] > 0 and s["output_throughput"] > 0, name
