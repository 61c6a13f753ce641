"""Published energy per output token against the simulator's power model (sim/costs/energy.py), and its shape.

The rows (``benchmarks/data/energy-published.csv``) are figures others measured and published, each with its
source's address: so far the ML.ENERGY longitudinal post's Llama-3.1-8B on one H100 at batch 64, 0.12 J per output
token with vLLM 0.11.1 (leaderboard v3.0) and 0.20 J with vLLM 0.5.4 (v2.0). Each row runs on its engine's preset
(vLLM 0.11 -> the default engine, vLLM 0.5 -> ``vllm-v0`` 0.5, whose host loop stalls the GPU) as a closed loop of
``batch_size`` users with ``max_num_seqs`` = the batch, as the leaderboard sets its batch size. The posts state
no lengths for these rows: the workload is the v3.0 post's mean text-conversation output, 717 tokens, after a
200-token prompt (an assumption). Nothing is fitted to a row.

Then the shape the issue asks for, on the same workload: J/token against batch size (1 to 256) and output length
(128 to 4096 tokens at batch 32), and B200 against H100 at batch 64.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_energy.py [--requests-per-user N]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path
from typing import Any

import servesim

DATA = Path(__file__).resolve().parent / "data" / "energy-published.csv"
PROMPT_TOKENS = 200  # assumed: the posts state no prompt lengths
OUTPUT_TOKENS = 717  # the ML.ENERGY v3.0 post's mean text-conversation output


def engine_of(row: dict[str, str]) -> dict[str, Any] | None:
    """The row's deployment.engine: vLLM 0.5 and 0.6 are vllm-v0's presets; a v1 release the default engine."""
    version = row["engine_version"][:3]
    if row["engine"] == "vllm" and version in ("0.5", "0.6"):
        return {"name": "vllm-v0", "version": version}
    return None


def scenario(model: str, gpu: str, batch: int, *, engine: dict | None = None, prompt: int = PROMPT_TOKENS,
             output: int = OUTPUT_TOKENS, per_user: int = 4, tp: int = 1) -> dict[str, Any]:
    dep: dict[str, Any] = {"model": model, "gpu": gpu, "tensor_parallel_size": tp}
    if engine is not None:
        dep["engine"] = engine
    return {"name": "energy", "seed": 0,
            "workload": {"arrival": {"type": "closed_loop", "num_users": batch}, "num_requests": per_user * batch,
                         "prompt_len": {"type": "fixed", "value": prompt},
                         "output_len": {"type": "fixed", "value": output}},
            "deployment": dep, "policy": {"type": "continuous", "max_num_seqs": batch}}


def j_per_token(sc: dict[str, Any]) -> tuple[float, float]:
    res = servesim.run(sc)
    e = res.summary[res.variants[0]]["energy"]
    return e["j_per_output_token"], e["mean_power_w"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests-per-user", type=int, default=4)
    args = ap.parse_args()
    n = args.requests_per_user
    errors = []
    print(f"{'source':40s} {'engine':>14s} {'batch':>5s} {'published':>9s} {'simulated':>9s} {'W':>5s} {'error':>7s}")
    with open(DATA, newline="") as f:
        for row in csv.DictReader(f):
            sim, watts = j_per_token(scenario(row["model"], row["gpu"], int(row["batch_size"]),
                                              engine=engine_of(row), per_user=n, tp=int(row["num_gpus"])))
            pub = float(row["j_per_output_token"])
            errors.append(sim / pub - 1)
            print(f"{row['source']:40s} {row['engine'] + ' ' + row['engine_version']:>14s} {row['batch_size']:>5s} "
                  f"{pub:9.3f} {sim:9.4f} {watts:5.0f} {100 * errors[-1]:+6.1f}%")
    print(f"median |error| over {len(errors)} rows: {100 * statistics.median(abs(e) for e in errors):.1f}%")
    print("\nshape, llama-3.1-8b on h100-sxm (J/output token):")
    for b in (1, 8, 64, 256):
        jt = j_per_token(scenario("llama-3.1-8b", "h100-sxm", b, per_user=n))[0]
        print(f"  batch {b:3d}, {OUTPUT_TOKENS} out: {jt:.4f}")
    for out in (128, 1024, 4096):
        jt = j_per_token(scenario("llama-3.1-8b", "h100-sxm", 32, prompt=16, output=out, per_user=n))[0]
        print(f"  batch  32, {out:4d} out (16 in): {jt:.4f}")
    for gpu in ("h100-sxm", "b200"):
        print(f"  {gpu}, batch 64: {j_per_token(scenario('llama-3.1-8b', gpu, 64, per_user=n))[0]:.4f}")


if __name__ == "__main__":
    main()
