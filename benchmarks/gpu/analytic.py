"""The analytic (roofline) cost model's uncalibrated predictions, to set beside what the GPU run measured.

    python benchmarks/gpu/analytic.py --gpu h200 --workloads WORK/workloads.json --validations WORK/validate \
        --out OUT/predictions.json

Two parts, both from the GPU's and the model's specs alone (no profile, no measurement):

- ``decode``: the step time and tokens/s of the decode shapes ``benchmarks/gpu_realengine.py`` times (each model
  at each batch size, every row at the same context), in bf16;
- ``workloads``: each validation workload simulated with the analytic model of ``--gpu`` and the engine's model,
  with the KV block count the engine had (read from that workload's ``validation.json``), and per variant and
  metric the engine's measured value, the prediction and the relative error, as ``servesim validate`` reports
  them for the fitted model.

Runs on any machine (the simulator needs no GPU): the GPU script calls it last, and it can be rerun here on the
folders that run brought back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from calibration.validate import METRICS, relative_error  # noqa: E402
from sim.config.scenario import load_scenario, parse_scenario  # noqa: E402
from sim.costs.analytic import AnalyticCostModel  # noqa: E402
from sim.costs.costmodel import StepShape  # noqa: E402
from sim.hardware.gpu import resolve_gpu  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402
from sim.loop.run import run_scenario  # noqa: E402


def decode_shape(batch: int, context: int) -> StepShape:
    """One decode step: ``batch`` rows of one new token each over ``context`` cached tokens."""
    return StepShape(num_seqs=batch, num_tokens=batch, num_decode_seqs=batch, kv_read_tokens=batch * (context + 1),
                     attn_pairs=batch * (context + 1))


def predict_decode(gpu: str, models: list[str], batches: list[int], context: int) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu": gpu, "context": context, "weight_dtype": "bf16"}
    for name in models:
        cost = AnalyticCostModel(ModelSpec.from_name(name), resolve_gpu(gpu), weight_dtype="bf16", kv_dtype="auto")
        for b in batches:
            seconds = float(cost.step_time(decode_shape(b, context)))
            out[f"{name}/batch{b}"] = {"step_ms": seconds * 1e3, "tokens_per_s": b / seconds}
    return out


def predict_workload(scenario: Path, overrides: dict[str, Any], validation: dict[str, Any], *, gpu: str,
                     model: str) -> dict[str, Any]:
    """The workload simulated with the analytic model; compared with the engine's figures where it ran."""
    sets = {**overrides, "deployment.model": model, "deployment.gpu": gpu,
            "deployment.cost_model": {"type": "analytic"}}
    out: dict[str, Any] = {"overrides": sets, "variants": {}}
    for variant, v in validation["variants"].items():
        _sc, raw = load_scenario(scenario, sets)
        # that variant alone, with the engine's block count (a variant's own count, as preempt's, is the same)
        raw["variants"] = [x for x in raw["variants"] if x["name"] == variant]
        raw.setdefault("deployment", {})["num_gpu_blocks"] = int(v["num_gpu_blocks"])
        run = run_scenario(parse_scenario(raw, source=str(scenario)))
        summary = run.summaries[variant]
        real = {m: c["real"] for m, c in v["metrics"].items()}
        out["variants"][variant] = {"summary": summary, "vs_engine": compare_real(real, summary)}
    return out


def compare_real(real: dict[str, float | None], summary: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per metric of ``calibration.validate.METRICS``: the engine's value, the prediction, the relative error."""
    out: dict[str, dict[str, float | None]] = {}
    for m, path in METRICS.items():
        v: Any = summary
        for k in path:
            v = v[k]
        s = None if v is None else float(v)
        r = real.get(m)
        err = None if r is None or s is None else relative_error(r, s)
        out[m] = {"real": r, "analytic": s, "rel_error": err}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", help="GPU preset of the analytic model")
    ap.add_argument("--model", default="llama-3.2-1b", help="the model the engine ran in the validations")
    ap.add_argument("--decode-models", nargs="*", default=["llama-3.2-1b", "llama-3.1-8b"])
    ap.add_argument("--decode-batches", nargs="*", type=int, default=[1, 64])
    ap.add_argument("--decode-context", type=int, default=512)
    ap.add_argument("--workloads", type=Path, help="workloads.json written by run_all.py")
    ap.add_argument("--validations", type=Path, help="folder of the validations (one subfolder per workload)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    report: dict[str, Any] = {"decode": predict_decode(args.gpu, args.decode_models, args.decode_batches,
                                                       args.decode_context), "workloads": {}}
    if args.workloads is not None:
        spec = json.loads(args.workloads.read_text())
        for w in spec["workloads"]:
            path = None if args.validations is None else args.validations / w["name"] / "validation.json"
            if path is None or not path.exists():
                # nothing measured to set it beside (and the KV size would be vLLM's for the whole card)
                report["workloads"][w["name"]] = {"skipped": f"no engine validation at {path}"}
                continue
            validation = json.loads(path.read_text())
            report["workloads"][w["name"]] = predict_workload(Path(spec["scenario"]), w["overrides"], validation,
                                                              gpu=args.gpu, model=args.model)
            print(f"predicted {w['name']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
