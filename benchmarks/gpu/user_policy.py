"""A user's policy from a file on the real engine, against FCFS on the same requests, with the parity check.

    python benchmarks/gpu/user_policy.py --device cuda --model llama-3.2-1b --out user_policy.json
    python benchmarks/gpu/user_policy.py --device cpu --model tiny --requests 24 --out user_policy.json  # dry run

Runs every variant of ``benchmarks/gpu/user-policy.yaml`` (FCFS, and ``examples/policies/shortest_prompt_first.py``
named by its path as a user names it) on the engine under its virtual clock (on CUDA a step lasts its synchronised
wall time; on a CPU, the serving thread's CPU time), then the simulator fed each run's measured step durations
(``sim.loop.replay``). Writes, per variant: the run's summary (as summary.json has it, per class too), the engine's
wall seconds, the policy's class, and the parity check: the differences between the engine's schedule and the
replay's (none when the simulator reproduced it step by step). Section ``policy`` of ``run_all.py``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "benchmarks" / "gpu" / "user-policy.yaml"


def _relative(spec: str) -> str:
    """A path, or ``path.py:Class``, with a path under the repository written relative to it: the records name no
    machine's folders."""
    path, sep, name = spec.rpartition(":") if spec.rpartition(":")[0].endswith(".py") else (spec, "", "")
    p = Path(path).resolve()
    return (str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path) + sep + name


def run(scenario: Path, device: str, model: str, num_requests: int | None) -> dict[str, Any]:
    import torch

    from realengine.engine import engine_config, run_engine
    from sim.config.scenario import load_scenario, slos_of, variant_configs
    from sim.loop.replay import compare, replay
    from sim.loop.run import generate_workload
    from sim.metrics.summary import summarize

    overrides = {} if num_requests is None else {"workload.num_requests": num_requests}
    sc, _ = load_scenario(scenario, overrides)
    out: dict[str, Any] = {"scenario": _relative(str(scenario)), "device": device, "model": model,
                           "torch": torch.__version__, "python": platform.python_version(),
                           "num_requests": sc.workload.num_requests, "variants": {}}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    wl = generate_workload(sc)
    for cfg in variant_configs(sc):
        t = time.perf_counter()
        result, requests, core = run_engine(cfg, wl, device=device, model_spec=model, record_plans=True,
                                            seed=sc.seed)
        seconds = time.perf_counter() - t
        user = type(getattr(core.policy, "user", core.policy))  # the public-API policy inside its adapter
        policy = cfg.policy.model_dump(mode="json", exclude_none=True)
        if "cls" in policy:  # resolved against the scenario's folder: recorded relative to the repository
            policy["cls"] = _relative(policy["cls"])
        differences = compare(core, requests, *replay(engine_config(cfg, model_spec=model,
                                                                    num_gpu_blocks=core.kv.num_blocks,
                                                                    device=device), result, requests))
        out["variants"][cfg.name] = {
            "policy": policy,
            "policy_class": f"{_relative(inspect.getfile(user))}:{user.__qualname__}",
            "engine_seconds": round(seconds, 3),
            "num_gpu_blocks": int(core.kv.num_blocks),
            "parity": {"reproduced": not differences, "num_steps": len(result.steps["duration"]),
                       "differences": differences[:20]},
            "summary": summarize(result, slos_of(sc)),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="llama-3.2-1b", help="the engine's model (random weights)")
    ap.add_argument("--requests", type=int, default=None, help="replaces workload.num_requests (120)")
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = ap.parse_args()
    report = run(args.scenario, args.device, args.model, args.requests)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    for name, v in report["variants"].items():
        s = v["summary"]
        print(f"{name}: {v['policy_class']}, {s['num_completed']}/{s['num_requests']} completed, "
              f"{s['num_preemptions']} preemptions, TTFT mean {1e3 * s['ttft']['mean']:.1f} ms, "
              f"p99 {1e3 * s['ttft']['p99']:.1f} ms, output {s['output_throughput']:.0f} tok/s; parity over "
              f"{v['parity']['num_steps']} steps: {'reproduced' if v['parity']['reproduced'] else 'DIFFERS'}")
    return 0 if all(v["parity"]["reproduced"] for v in report["variants"].values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
