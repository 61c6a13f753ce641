"""Memory of a large, cheap sweep: ``servesim sweep`` over N points of a 4-request scenario (llama-3.2-1b on L4,
one variant) in a child process, its resident memory sampled every second: the driver's and the whole tree's
(driver + process-pool workers), at the peak and along the run, and the wall time.

    python benchmarks/bench_sweep_memory.py [--runs 10000] [--workers 1] [--tree DIR]

``--tree`` runs the command from another checkout (a worktree of an older commit, to compare). A sweep that keeps
its rows grows all along; one that streams them stays flat while the runs go. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def scenario(runs: int) -> dict:
    return {"name": f"sweep-memory-{runs}", "seed": 0,
            "workload": {"arrival": {"type": "poisson", "rate": 5.0}, "num_requests": 4,
                         "prompt_len": {"type": "fixed", "value": 32}, "output_len": {"type": "fixed", "value": 4}},
            "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
            "sweep": {"workload.arrival.rate": [round(1 + i * 0.001, 3) for i in range(runs)]}}


def _children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids]


def _tree(pid: int) -> list[int]:
    out = [pid]
    for c in _children(pid):
        out += _tree(c)
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tree", type=Path, default=ROOT, help="checkout whose code runs the sweep")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(scenario(args.runs), sort_keys=False))
        cmd = [sys.executable, "-m", "sim.cli.main", "sweep", str(path), "--out", str(Path(tmp) / "out"),
               "-j", str(args.workers), "-q"]
        env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=args.tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples = []  # (seconds, driver MB, tree MB)
        while child.poll() is None:
            time.sleep(1.0)
            samples.append((time.perf_counter() - t0, _rss_mb(child.pid), sum(map(_rss_mb, _tree(child.pid)))))
        wall = time.perf_counter() - t0
        err = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0 or not samples:
        sys.exit(f"the sweep exited {child.returncode}: {err[-2000:]}")
    print(f"{args.runs:,} runs, -j {args.workers}, code from {args.tree}: {wall:.0f} s wall")
    print(f"peak RSS: driver {max(s[1] for s in samples):.0f} MB, driver + workers {max(s[2] for s in samples):.0f} MB")
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        t, d, tr = samples[int(q * (len(samples) - 1))]
        print(f"  at {t:4.0f} s ({q:.0%} of the run): driver {d:.0f} MB, driver + workers {tr:.0f} MB")


if __name__ == "__main__":
    main()
