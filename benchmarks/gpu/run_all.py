"""Everything issue 20 measures on a GPU, in one command that fits one device call (under 10 minutes).

    python3 benchmarks/gpu/run_all.py --out "$OUT"                        # on the GPU machine (.whl carried)
    python benchmarks/gpu/run_all.py --device cpu --quick --out DIR       # the dry run on a CPU

Sections, in order, each in its own process under its own time limit (and all under ``--budget`` seconds), so
that a hang or a crash costs that section only:

1. ``install``: the wheels of ``benchmarks/gpu/fetch_wheels.sh`` (``--wheels``, default ``.whl``) installed
   offline into ``--site`` (``pip install --no-index --no-deps --target``), which then leads every later
   section's PYTHONPATH. Skipped when the folder has no wheels. On an interpreter other than the wheels' 3.12
   (the dry run here) they are installed for 3.12 all the same, to check the set, but not put on the path.
2. ``kernel``, ``device``, ``paging``, ``decode``, ``batching``, ``quant``: ``benchmarks/gpu_realengine.py``'s
   sections (decode is given the device section's copy bandwidth).
3. ``calibrate``: ``servesim calibrate`` of the llama-3.2-1b shape (``--quick``: the tiny model, one repeat).
4. ``policy``: ``benchmarks/gpu/user_policy.py``: a user's policy from a file
   (``examples/policies/shortest_prompt_first.py``) against FCFS on the engine running the model above, each
   replayed by the simulator fed its measured step durations (``sim.loop.replay``: the schedule reproduced or not).
5. ``validate``: ``servesim validate`` of ``calibration/scenarios/validate-tiny.yaml`` on ``--workloads`` random
   workloads (seed, arrival rate and burstiness, prompt and output lengths drawn from a seeded generator and set
   with ``--set``), each in its own process, with the profile just fitted and the engine running the model above.
6. ``predict``: ``benchmarks/gpu/analytic.py``, the analytic model's uncalibrated predictions of ``--gpu`` for the
   decode shapes and the same workloads.

What comes back (at most 8 files, as the device tool returns them; rewritten after every section, so a run
stopped at any point returns what was done): ``summary.json`` (each section's status, seconds, command),
``log.txt`` (every section's output), ``gpu_realengine.json`` (the sections of 2 merged: commit it as
``calibration/gpu/h200.json``), ``profile.json``, ``user_policy.json`` (the policy section's figures and parity),
``validation.json`` (every workload's validation), ``predictions.json`` and ``artifacts.tar.gz`` (the run
folders' summaries, CSVs and validation files, without the HTML reports). Uses the standard library only: it runs
before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GPU_SECTIONS = ("kernel", "device", "paging", "decode", "batching", "quant")
SECTIONS = ("install", *GPU_SECTIONS, "calibrate", "policy", "validate", "predict")
SCENARIO = ROOT / "calibration" / "scenarios" / "validate-tiny.yaml"
# upper bounds in seconds on the H200, each well above what the section should take: a limit guards against a
# hang; the budget, not these, is what keeps the whole run inside one call
LIMITS = {"install": 90, "kernel": 60, "device": 30, "paging": 45, "decode": 90, "batching": 90, "quant": 60,
          "calibrate": 150, "policy": 90, "validate": 240, "predict": 90}
VALIDATE_ONE = 45  # seconds for one workload's validation
SERVESIM = ("-c", "from sim.cli.main import app; app()")  # the CLI without an installed `servesim` script


@dataclass(slots=True)
class Runner:
    """Runs the sections' commands, each with a time limit, keeping ``summary.json`` and ``log.txt`` current."""

    out: Path  # what comes back
    work: Path  # every section's own files
    deadline: float  # time.monotonic() by which the last section must have ended
    env: dict[str, str]
    summary: dict[str, Any] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, text: str) -> None:
        with open(self.out / "log.txt", "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        print(text, flush=True)

    def save(self) -> None:
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=2, default=str) + "\n")
        tmp.replace(self.out / "summary.json")

    def run(self, section: str, cmd: list[str], limit: float) -> dict[str, Any]:
        """Run ``cmd`` (output appended to log.txt) for at most ``limit`` seconds and what the budget leaves."""
        allowed = min(limit, self.left() - 5)
        rec: dict[str, Any] = {"cmd": cmd, "limit_s": round(allowed, 1)}
        if allowed < 5:
            rec.update(status="skipped", reason="the run's budget is spent")
            self.log(f"== {section}: skipped, the budget is spent")
            return rec
        self.log(f"== {section}: {' '.join(cmd)}  (limit {allowed:.0f} s)")
        t = time.monotonic()
        with open(self.out / "log.txt", "a") as logf:
            # its own process group, so that a timeout also ends whatever the command started
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=allowed)
                rec.update(status="ok" if rc == 0 else "failed", returncode=rc)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rec.update(status="timed_out")
        rec["seconds"] = round(time.monotonic() - t, 2)
        self.log(f"== {section}: {rec['status']} after {rec['seconds']} s")
        return rec

    def record(self, section: str, rec: dict[str, Any]) -> None:
        self.summary["sections"][section] = rec
        self.save()


def random_workloads(n: int, seed: int, num_requests: int) -> list[dict[str, Any]]:
    """``n`` workloads of the validation scenario's shape (gamma arrivals, lognormal prompts, exponential outputs)
    with their parameters drawn from ``random.Random(seed)``: varied load, burstiness and lengths."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt_mean = round(rng.uniform(24, 160))
        w = {
            "workload.num_requests": num_requests,
            "seed": 1000 + i,
            "workload.arrival.rate": round(rng.uniform(20.0, 100.0), 1),  # requests/s on the wall clock
            "workload.arrival.cv": round(rng.uniform(0.5, 2.0), 2),
            "workload.prompt_len.mean": prompt_mean,
            "workload.prompt_len.std": round(prompt_mean * rng.uniform(0.3, 1.0)),
            "workload.output_len.mean": round(rng.uniform(12, 48)),
            # a KV cache far above these workloads' peak (32 rows of at most 396 tokens: 800 blocks), the same on
            # every machine: the engine's own sizing would allocate (and the simulator track) the whole card's
            # memory for nothing (preempt keeps its own 24 blocks); and 1 GiB of pinned swap space, not 4
            "deployment.num_gpu_blocks": 4096,
            "deployment.swap_space": 1.0,
        }
        out.append({"name": f"w{i:02d}", "overrides": w})
    return out


def set_args(overrides: dict[str, Any]) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def merge_gpu_reports(folder: Path) -> dict[str, Any]:
    """One report from the per-section ones (each process wrote its own into a subfolder)."""
    merged: dict[str, Any] = {"sections": {}}
    for name in GPU_SECTIONS:
        for path in sorted((folder / name).glob("*.json")):
            rep = json.loads(path.read_text())
            merged.update({k: v for k, v in rep.items() if k != "sections"})
            merged["sections"].update(rep.get("sections", {}))
    return merged


def merge_validations(folder: Path, workloads: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in workloads:
        path = folder / w["name"] / "validation.json"
        if path.exists():
            out[w["name"]] = {"overrides": w["overrides"], "validation": json.loads(path.read_text())}
    return out


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def pack(work: Path, dest: Path) -> None:
    """The work folder's small files (JSON, CSV, logs), without the HTML reports (megabytes of plotly each)."""
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(work.rglob("*")):
            if p.is_file() and p.suffix in (".json", ".csv", ".txt", ".log"):
                tar.add(p, arcname=str(p.relative_to(work)))
    tmp.replace(dest)


def collect(r: Runner, workloads: list[dict[str, Any]]) -> None:
    """Refresh the files that come back from what the sections have written so far."""
    gpu = merge_gpu_reports(r.work / "gpu")
    if gpu["sections"]:
        write_json(r.out / "gpu_realengine.json", gpu)
    profile = r.work / "profile.json"
    if profile.exists():
        write_json(r.out / "profile.json", json.loads(profile.read_text()))
    vals = merge_validations(r.work / "validate", workloads)
    if vals:
        write_json(r.out / "validation.json", vals)
    for name in ("user_policy.json", "predictions.json"):
        if (r.work / name).exists():
            write_json(r.out / name, json.loads((r.work / name).read_text()))
    pack(r.work, r.out / "artifacts.tar.gz")


def install(r: Runner, wheels: Path, site: Path) -> dict[str, Any]:
    found = sorted(wheels.glob("*.whl"))
    if not found:
        return {"status": "skipped", "reason": f"no wheels in {wheels}: the interpreter's own packages are used"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site)]
    same = sys.version_info[:2] == (3, 12)
    if not same:  # check the set for the GPU machine's python, which this interpreter cannot import
        cmd += ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]
    rec = r.run("install", [*cmd, *map(str, found)], LIMITS["install"])
    rec["wheels"] = [w.name for w in found]
    if rec.get("status") == "ok" and same:
        r.env["PYTHONPATH"] = os.pathsep.join([str(site), r.env["PYTHONPATH"]])
        rec["on_path"] = str(site)
    elif rec.get("status") == "ok":
        rec["on_path"] = None
        rec["note"] = f"installed for 3.12 to check the set; python {sys.version.split()[0]} uses its own packages"
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny shapes and the tiny model: the CPU dry run")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/gpu")))
    ap.add_argument("--work", type=Path, default=None, help="the sections' own files (default: a temporary folder)")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    ap.add_argument("--site", type=Path, default=Path("/tmp/site"))
    ap.add_argument("--budget", type=float, default=510.0, help="seconds for the whole run")
    ap.add_argument("--only", nargs="*", choices=SECTIONS, default=None, help="run only these sections")
    ap.add_argument("--model", default=None, help="the engine's model (default: llama-3.2-1b; --quick: tiny)")
    ap.add_argument("--gpu", default="h200", help="GPU preset: calibrate's peak FLOP/s and the analytic model")
    ap.add_argument("--workloads", type=int, default=10)
    ap.add_argument("--requests", type=int, default=None, help="per workload (default 120; --quick: 20)")
    ap.add_argument("--calibrate-repeats", type=int, default=None, help="(default 3; --quick: 1)")
    ap.add_argument("--seed", type=int, default=20, help="of the workloads' parameters")
    args = ap.parse_args()

    model = args.model or ("tiny" if args.quick else "llama-3.2-1b")
    requests = args.requests or (20 if args.quick else 120)
    repeats = args.calibrate_repeats or (1 if args.quick else 3)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="servesim-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    r = Runner(args.out, work, time.monotonic() + args.budget, env)
    r.summary = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "device": args.device,
                 "quick": args.quick, "model": model, "gpu": args.gpu, "budget_s": args.budget,
                 "python": sys.version.split()[0], "work": str(work), "sections": {}}
    previous = args.out / "summary.json"
    if args.only and previous.exists():  # a rerun of some sections keeps the record of the others
        r.summary["sections"] = json.loads(previous.read_text()).get("sections", {})
        r.summary["rerun"] = args.only
    workloads = random_workloads(args.workloads, args.seed, requests)
    write_json(work / "workloads.json", {"scenario": str(SCENARIO), "workloads": workloads})
    wanted = set(args.only or SECTIONS)
    threads = ["--threads", "1"] if args.device == "cpu" else []  # as the CPU calibration is measured
    t0 = time.monotonic()

    if "install" in wanted:
        r.record("install", install(r, args.wheels, args.site))
    py = [sys.executable]
    bandwidth: float | None = None
    for name in GPU_SECTIONS:
        if name not in wanted:
            continue
        cmd = [*py, "benchmarks/gpu_realengine.py", "--device", args.device, "--out", str(work / "gpu" / name),
               "--only", name]
        if args.quick:
            cmd.append("--quick")
        if name == "decode" and bandwidth:
            cmd += ["--copy-bandwidth-GBps", f"{bandwidth:.3f}"]
        rec = r.run(name, cmd, LIMITS[name])
        res = merge_gpu_reports(work / "gpu")["sections"].get(name)
        if isinstance(res, dict) and "error" in res:
            rec["status"], rec["error"] = "error", res["error"]
        if name == "device" and isinstance(res, dict):
            bandwidth = res.get("copy_bandwidth_GBps")
        r.record(name, rec)
        collect(r, workloads)

    profile = work / "profile.json"
    if "calibrate" in wanted:
        cmd = [*py, *SERVESIM, "calibrate", "--device", args.device, "--model", model, "--repeats", str(repeats),
               "--out", str(profile), "-q", *threads]
        if args.device == "cuda":
            cmd += ["--gpu", args.gpu]  # the card's peak FLOP/s, for the profile's MFU
        r.record("calibrate", r.run("calibrate", cmd, LIMITS["calibrate"]))
        collect(r, workloads)

    if "policy" in wanted:  # before validate, whose workloads take whatever time the budget has left
        cmd = [*py, "benchmarks/gpu/user_policy.py", "--device", args.device, "--model", model, "--requests",
               str(requests), "--out", str(work / "user_policy.json")]
        r.record("policy", r.run("policy", cmd, LIMITS["policy"]))
        collect(r, workloads)

    if "validate" in wanted:
        if not profile.exists():
            r.record("validate", {"status": "skipped", "reason": f"no profile at {profile} (calibrate failed?)"})
        else:
            end = time.monotonic() + LIMITS["validate"]
            done: dict[str, Any] = {}
            for w in workloads:
                cmd = [*py, *SERVESIM, "validate", str(SCENARIO), "--profile", str(profile), "--device",
                       args.device, "--model", model, "--out", str(work / "validate" / w["name"]), "-q",
                       *set_args(w["overrides"])]
                done[w["name"]] = r.run(f"validate {w['name']}", cmd, min(VALIDATE_ONE, end - time.monotonic()))
                r.record("validate", {"status": "running", "workloads": done})
                collect(r, workloads)
            ok = sum(1 for rec in done.values() if rec.get("status") == "ok")
            r.record("validate", {"status": "ok" if ok == len(workloads) else "partial", "completed": ok,
                                  "workloads": done})

    if "predict" in wanted:
        cmd = [*py, "benchmarks/gpu/analytic.py", "--gpu", args.gpu, "--model", model, "--workloads",
               str(work / "workloads.json"), "--validations", str(work / "validate"), "--out",
               str(work / "predictions.json")]
        if args.quick:
            cmd += ["--decode-models", "tiny", "--decode-batches", "1", "4", "--decode-context", "32"]
        r.record("predict", r.run("predict", cmd, LIMITS["predict"]))
    collect(r, workloads)
    r.summary["seconds"] = round(time.monotonic() - t0, 1)
    r.save()
    bad = [n for n, rec in r.summary["sections"].items() if rec.get("status") not in ("ok", "skipped")]
    r.log(f"== done in {r.summary['seconds']} s; not ok: {', '.join(bad) or 'none'}; results in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
