"""Pre-flight limits and KV bookkeeping memory: each case runs ``servesim run`` in a child process and reports its
exit status, CPU time (``resource.getrusage`` of the child: user + system) and peak resident memory.

    python benchmarks/bench_limits.py

Targets (issue 15): every oversized scenario exits 2 before starting, in well under a second of CPU; a tiny model
on an H100 with ``block_size: 1`` (tens of millions of one-token KV blocks) and 200 requests peaks below 300 MB.
Not part of the test suite (timings are not tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """\
name: bench-limits
seed: 0
workload:
  arrival: {type: poisson, rate: 20.0}
  num_requests: 200
  prompt_len: {type: lognormal, mean: 400, std: 300, min: 16, max: 1024}
  output_len: {type: lognormal, mean: 250, std: 350, min: 1, max: 1024}
deployment: {model: MODEL, gpu: h100-sxm, max_model_len: 2048, block_size: 16}
policy: {type: continuous, max_num_seqs: 256, enable_chunked_prefill: true, max_num_batched_tokens: 2048}
"""
SWEEP = "sweep:\n" + "".join(
    f"  {k}: [{', '.join(str(v) for v in vals)}]\n"
    for k, vals in [
        ("workload.arrival.rate", range(1, 11)), ("workload.num_requests", range(100, 110)),
        ("policy.max_num_seqs", range(1, 11)), ("policy.max_num_batched_tokens", range(1000, 1010)),
        ("deployment.block_size", range(1, 11)), ("deployment.max_model_len", range(1100, 1110)),
        ("deployment.num_gpu_blocks", range(2000, 2010)), ("workload.prompt_len.mean", range(100, 110)),
        ("workload.output_len.mean", range(100, 110)), ("workload.prompt_len.std", range(10, 20)),
        ("workload.output_len.std", range(10, 20)), ("admission.max_queue_delay", range(1, 11)),
    ]
)

CASES = [
    ("num_requests 1e8", "llama-3.1-8b", ["--set", "workload.num_requests=100000000"], ""),
    ("num_gpu_blocks 1e8", "llama-3.1-8b", ["--set", "deployment.num_gpu_blocks=100000000"], ""),
    ("1e6 replicas", "llama-3.1-8b", ["--set", "cluster.replicas=1000000"], ""),
    ("10^12-point sweep", "llama-3.1-8b", [], SWEEP),
    ("block_size 1, llama-57m, 200 requests", "llama-57m", ["--set", "deployment.block_size=1"], ""),
    ("block_size 16, llama-57m, 200 requests", "llama-57m", [], ""),
    ("block_size 1, tiny, 200 requests", "tiny", ["--set", "deployment.block_size=1"], ""),
    ("block_size 1, tiny, prefix caching", "tiny", ["--set", "deployment.block_size=1", "--set",
                                                   "kv_cache={type: paged, enable_prefix_caching: true}"], ""),
]
REPEAT = ("repeat_to 1e12", ["--set", "workload.arrival.repeat_to=1000000000000"])


def child(args: list[str]) -> tuple[int, float, float, str]:
    """Run the CLI in a child; returns (exit status, CPU seconds, peak RSS MB, last line of stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "sim.cli.main", "run", "-q", *args], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage: CPU time and peak RSS
    p.returncode = os.waitstatus_to_exitcode(status)
    last = (err.strip().splitlines() or [""])[-1]
    return p.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, last


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, extra, tail in CASES:
            path = Path(tmp) / "s.yaml"
            path.write_text(SCENARIO.replace("MODEL", model) + tail)
            rc, cpu, rss, last = child([str(path), "-o", str(Path(tmp) / "out"), *extra])
            print(f"{label:42s} exit {rc}  cpu {cpu:6.2f} s  peak RSS {rss:7.1f} MB  {last[:110]}")
        rc, cpu, rss, last = child([str(ROOT / "scenarios/azure-conv.yaml"), "-o", str(Path(tmp) / "out"), *REPEAT[1]])
        print(f"{REPEAT[0]:42s} exit {rc}  cpu {cpu:6.2f} s  peak RSS {rss:7.1f} MB  {last[:110]}")


if __name__ == "__main__":
    main()
