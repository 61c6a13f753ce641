"""The real engine's GPU checks, in one run of a few minutes, written to calibration/gpu/<card>.json.

    python benchmarks/gpu_realengine.py --out calibration/gpu            # on a CUDA machine (under 8 minutes)
    python benchmarks/gpu_realengine.py --device cpu --quick --out DIR   # smoke run of every section on a CPU

A ``--quick`` run is a smoke test, not a record: without ``--out`` it writes to a new temporary folder (and says
where), so it leaves nothing in the checkout; a full run writes to ``calibration/gpu`` unless ``--out`` says otherwise.

Sections (each one timed and guarded: a failure is recorded and the next section runs):

1. ``kernel``: the Triton paged decode kernel against the gather + SDPA reference, float32 / bfloat16 / float16.
2. ``device``: copy bandwidth (device to device, bytes read + written) and dense matmul rate per dtype.
3. ``paging``: decode attention of Llama-3.1-8B's heads at batch 64: Triton paged vs contiguous SDPA vs the
   gather reference. Target on an H200: paged within 10% of contiguous.
4. ``decode``: a decode step of the 1B and 8B shapes at batch 1 and 64, eager and as a CUDA graph: tokens/s and
   achieved bandwidth (weights + KV read per step / step time) as a share of the measured copy bandwidth.
   Target on an H200: batch-1 decode of the 1B shape at 60% or more.
5. ``batching``: static versus continuous batching on one mixed workload through the engine (run_engine).
6. ``quant``: decode of the 1B shape at batch 1 and 64 with int8, fp8 and int4 weights (realengine/quant.py;
   fp8 products through torch._scaled_mm where the card has them) against bfloat16: tokens/s and the speed-up
   (the seed documents quote 1.4-1.7x for fp8 on Hopper).

The GPU machine has torch and triton but not simpy, pydantic or PyYAML, which section 5 needs (the serving core
reads scenarios): carry them as wheels (see the device tool's notes) or that section records the ImportError.
"""

# ruff: noqa: B023 - the timed lambdas run at once, inside the loop that binds their variables
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from realengine.attention import build_metadata, paged_decode_attention_ref
from realengine.kv_cache import KVCache, kv_bytes_per_block
from realengine.model import LlamaModel
from sim.hardware.models import ModelSpec


class Timer:
    """Median milliseconds of ``fn()`` over ``iters`` runs after ``warmup``: CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn, *, warmup: int = 3, iters: int = 10) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)


def _dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


# ---- 1. kernel correctness --------------------------------------------------------------------------------------
def check_kernel(dev: torch.device, quick: bool) -> dict:
    if dev.type != "cuda":
        return {"skipped": "the Triton kernel runs on CUDA (the CPU suite checks it in Triton's interpreter)"}
    from realengine.triton_decode import paged_decode_attention

    g = torch.Generator(device="cpu").manual_seed(0)
    out = {}
    for name in ("fp32", "bf16", "fp16"):
        worst = 0.0
        for b, h, hkv, d, bs, lens in [(3, 32, 8, 128, 16, [1, 700, 4097]), (1, 16, 16, 64, 32, [9000]),
                                       (64, 32, 8, 128, 16, [2048] * 64)]:
            nb = sum(-(-n // bs) for n in lens) + 3
            k = torch.randn(nb, bs, hkv, d, generator=g, dtype=torch.float64)
            v = torch.randn(nb, bs, hkv, d, generator=g, dtype=torch.float64)
            q = torch.randn(b, h, d, generator=g, dtype=torch.float64)
            width = -(-max(lens) // bs)
            bt = torch.stack([torch.randperm(nb, generator=g)[:width] for _ in range(b)])
            sl = torch.tensor(lens)
            dt = _dtype(name)
            k_, v_, q_ = (x.to(dt).to(dev) for x in (k, v, q))
            ref = paged_decode_attention_ref(q_.double(), k_.double(), v_.double(), bt.to(dev), sl.to(dev),
                                             max(lens), d**-0.5)
            got = paged_decode_attention(q_, k_, v_, bt.to(dev, torch.int32), sl.to(dev, torch.int32), max(lens),
                                         d**-0.5)
            worst = max(worst, float((got.double() - ref).abs().max() / ref.abs().max()))
        out[name] = {"max_rel_err": worst, "ok": worst < {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-3}[name]}
    return out


# ---- 2. copy bandwidth and matmul rate --------------------------------------------------------------------------
def measure_device(dev: torch.device, quick: bool) -> dict:
    timer = Timer(dev)
    size = (64 if quick else 4096) * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=dev)
    src.random_(0, 255)  # never measure on zeros: some paths compress them
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), iters=20)
    out: dict[str, Any] = {"copy_bytes": size, "copy_ms": ms, "copy_bandwidth_GBps": 2 * size / ms / 1e6}
    n = 512 if quick else 8192
    for name in (("fp32",) if dev.type != "cuda" else ("bf16", "fp16", "fp32")):
        a = torch.randn(n, n, device=dev, dtype=_dtype(name))
        b = torch.randn(n, n, device=dev, dtype=_dtype(name))
        ms = timer(lambda: a @ b, iters=10)
        out[f"matmul_{name}_TFLOPs"] = 2 * n**3 / ms / 1e9
    return out


# ---- 3. the cost of paging ---------------------------------------------------------------------------------------
def measure_paging(dev: torch.device, quick: bool) -> dict:
    timer = Timer(dev)
    spec = ModelSpec.from_name("tiny" if quick else "llama-3.1-8b")
    h, hkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    b, ctx, bs = (4, 128, 16) if quick else (64, 2048, 16)
    dt = torch.float32 if dev.type != "cuda" else torch.bfloat16
    nb = b * ctx // bs
    g = torch.Generator(device="cpu").manual_seed(1)
    k_pages = torch.randn(nb, bs, hkv, d, generator=g).to(dev, dt)
    v_pages = torch.randn(nb, bs, hkv, d, generator=g).to(dev, dt)
    table = torch.randperm(nb, generator=g).view(b, ctx // bs).to(dev)
    # the same values laid out contiguously per sequence: [B, H_kv, L, D]
    k_cont = k_pages[table].flatten(1, 2).transpose(1, 2).contiguous()
    v_cont = v_pages[table].flatten(1, 2).transpose(1, 2).contiguous()
    q = torch.randn(b, h, d, generator=g).to(dev, dt)
    lens = torch.full((b,), ctx, device=dev)
    scale = d**-0.5
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def contiguous():
        return sdpa(q[:, :, None, :], k_cont, v_cont, scale=scale, enable_gqa=True)

    out: dict[str, Any] = {"batch": b, "context": ctx, "heads": h, "kv_heads": hkv, "head_dim": d, "dtype": str(dt),
           "contiguous_sdpa_ms": timer(contiguous, iters=20),
           "paged_gather_ref_ms": timer(lambda: paged_decode_attention_ref(q, k_pages, v_pages, table, lens, ctx,
                                                                            scale), iters=20)}
    kv_bytes = 2 * b * ctx * hkv * d * k_pages.element_size()
    out["contiguous_bandwidth_GBps"] = kv_bytes / out["contiguous_sdpa_ms"] / 1e6
    if dev.type == "cuda":
        from realengine.triton_decode import paged_decode_attention

        out["paged_triton_ms"] = timer(lambda: paged_decode_attention(q, k_pages, v_pages, table.int(),
                                                                      lens.int(), ctx, scale), iters=20)
        out["paged_over_contiguous"] = out["paged_triton_ms"] / out["contiguous_sdpa_ms"]
        out["target_within_10pct"] = out["paged_over_contiguous"] <= 1.10
        out["paged_bandwidth_GBps"] = kv_bytes / out["paged_triton_ms"] / 1e6
    return out


# ---- 4. decode throughput ----------------------------------------------------------------------------------------
def _decode_model(spec: ModelSpec, dev: torch.device, dt: torch.dtype, batches: list[int], ctx: int, bs: int,
                  timer: Timer, bandwidth_GBps: float | None) -> dict[str, Any]:
    """``measure_decode``'s rows for one model: eager and CUDA-graph decode steps at each batch size."""
    from realengine.cuda_graph import DecodeGraph

    out: dict[str, Any] = {}
    model = LlamaModel(spec, dtype=dt, device=dev, seed=0)
    for b in batches:
        width = math.ceil((ctx + 1) / bs)
        kv = KVCache(spec, block_size=bs, dtype=dt, device=dev, num_blocks=b * width + 1)
        for t in kv.k + kv.v:
            t.normal_()
        tables = torch.arange(1, b * width + 1, device=dev).view(b, width)  # block 0: the graph's scratch
        ctxs = torch.full((b,), ctx, device=dev)
        ids = torch.randint(0, spec.vocab_size, (b,), device=dev)
        meta = build_metadata([ctx] * b, [1] * b, device=dev, block_size=bs, block_tables=tables.tolist())
        eager_ms = timer(lambda: model(ids, meta.positions, meta, kv).argmax(-1), iters=10)
        row: dict[str, Any] = {"eager_ms": eager_ms}
        try:
            graph = DecodeGraph(model, kv, b, width)
            row["graph"] = graph.graph is not None
            row["graph_ms"] = timer(lambda: graph.step(ids, ctxs, tables), iters=20)
        except Exception as e:  # noqa: BLE001 - record and go on with the eager figure
            row["graph_error"] = f"{type(e).__name__}: {e}"
        best = min(row.get("graph_ms", math.inf), eager_ms)
        step_bytes = model.weight_bytes() + b * ctx * kv_bytes_per_block(spec, dt, 1)
        row.update(tokens_per_s=b / best * 1e3, bytes_per_step=step_bytes,
                   achieved_GBps=step_bytes / best / 1e6)
        if bandwidth_GBps:
            row["share_of_copy_bandwidth"] = row["achieved_GBps"] / bandwidth_GBps
        out[f"{spec.name}/batch{b}"] = row
    return out


def measure_decode(dev: torch.device, quick: bool, bandwidth_GBps: float | None) -> dict:
    from realengine import attention

    if dev.type == "cuda":
        from realengine import triton_decode

        triton_decode.register()
    timer = Timer(dev)
    out: dict[str, Any] = {}
    models = ["tiny"] if quick else ["llama-3.2-1b", "llama-3.1-8b"]
    batches = [1, 4] if quick else [1, 64]
    ctx, bs = (32, 16) if quick else (512, 16)
    dt = torch.float32 if dev.type != "cuda" else torch.bfloat16
    for name in models:
        # one function call per model: its tensors are freed when it returns, before the next (8B) model
        out.update(_decode_model(ModelSpec.from_name(name), dev, dt, batches, ctx, bs, timer, bandwidth_GBps))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    attention.register_cuda_decode_kernel(None)
    one = out.get("llama-3.2-1b/batch1", {})
    if "share_of_copy_bandwidth" in one:
        out["target_1b_batch1_60pct"] = one["share_of_copy_bandwidth"] >= 0.60
    return out


# ---- 6. quantized weights: decode speed against the unquantized model ------------------------------------------
def measure_quant(dev: torch.device, quick: bool) -> dict:
    from realengine.quant import quantize_model

    timer = Timer(dev)
    spec = ModelSpec.from_name("tiny" if quick else "llama-3.2-1b")
    dt = torch.float32 if dev.type != "cuda" else torch.bfloat16
    base = LlamaModel(spec, dtype=dt, device=dev, seed=0)
    ctx, bs = (32, 16) if quick else (512, 16)
    out: dict = {"model": spec.name, "baseline_dtype": str(dt).replace("torch.", ""), "context": ctx}
    for b in ([1, 4] if quick else [1, 64]):
        width = math.ceil((ctx + 1) / bs)
        kv = KVCache(spec, block_size=bs, dtype=dt, device=dev, num_blocks=b * width)
        for t in kv.k + kv.v:
            t.normal_()
        tables = torch.arange(b * width, device=dev).view(b, width).tolist()
        ids = torch.randint(0, spec.vocab_size, (b,), device=dev)
        meta = build_metadata([ctx] * b, [1] * b, device=dev, block_size=bs, block_tables=tables)
        row: dict[str, dict[str, Any]] = {}
        for fmt in ("base", "int8", "fp8", "int4"):
            try:
                model = base if fmt == "base" else quantize_model(base, fmt)
                ms = timer(lambda: model(ids, meta.positions, meta, kv).argmax(-1), iters=10)
                row[fmt] = {"step_ms": ms, "tokens_per_s": b / ms * 1e3}
            except Exception as e:  # noqa: BLE001 - a format the card cannot run: record it, go on
                row[fmt] = {"error": f"{type(e).__name__}: {e}"}
        for fmt in ("int8", "fp8", "int4"):
            if "step_ms" in row[fmt]:
                row[fmt]["speedup_vs_base"] = row["base"]["step_ms"] / row[fmt]["step_ms"]
        out[f"batch{b}"] = row
    return out


# ---- 5. static versus continuous batching on the engine ----------------------------------------------------------
def measure_batching(dev: torch.device, quick: bool) -> dict:
    from realengine.engine import run_engine
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.run import generate_workload

    raw = {
        "name": "gpu-static-vs-continuous",
        "seed": 7,
        "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 12 if quick else 128,
                     "prompt_len": {"type": "uniform", "low": 8, "high": 24 if quick else 512},
                     "output_len": {"type": "uniform", "low": 2, "high": 24 if quick else 512}},
        "deployment": {"model": "tiny" if quick else "llama-3.2-1b", "max_model_len": 64 if quick else 1024},
        "variants": [
            {"name": "static", "policy": {"type": "static", "batch_size": 4 if quick else 32}},
            {"name": "continuous", "policy": {"type": "continuous", "max_num_seqs": 4 if quick else 32,
                                              "max_num_batched_tokens": 128 if quick else 2048}},
        ],
    }
    sc = parse_scenario(raw)
    wl = generate_workload(sc)
    out: dict[str, Any] = {}
    for cfg in variant_configs(sc):
        t = time.perf_counter()
        result, requests, _ = run_engine(cfg, wl, device=dev.type, model_spec="tiny" if quick else None,
                                         num_gpu_blocks=256 if dev.type != "cuda" else None)
        wall = time.perf_counter() - t
        tokens = sum(r.num_output_tokens for r in requests)
        out[cfg.name] = {"output_tokens": tokens, "duration_s": result.duration,
                         "output_tokens_per_s": tokens / result.duration, "wall_s": wall,
                         "steps": len(result.steps["duration"])}
    out["continuous_over_static"] = out["continuous"]["output_tokens_per_s"] / out["static"]["output_tokens_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run of every section")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for <card>.json (default calibration/gpu; a new temporary folder with --quick)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these sections")
    ap.add_argument("--copy-bandwidth-GBps", type=float, default=None,
                    help="the device section's copy bandwidth, for decode's share when device is not run with it "
                         "(benchmarks/gpu/run_all.py runs each section in its own process)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_realengine: --device cuda but torch sees no CUDA device (use --device cpu --quick)")
    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    card = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu-{platform.machine()}"
    report: dict = {
        "card": card, "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "quick": args.quick, "sections": {},
    }
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    sections = [("kernel", lambda: check_kernel(dev, args.quick)),
                ("device", lambda: measure_device(dev, args.quick)),
                ("paging", lambda: measure_paging(dev, args.quick)),
                ("decode", lambda: measure_decode(dev, args.quick, report["sections"].get("device", {})
                                                  .get("copy_bandwidth_GBps", args.copy_bandwidth_GBps))),
                ("batching", lambda: measure_batching(dev, args.quick)),
                ("quant", lambda: measure_quant(dev, args.quick))]
    if args.out is None:  # a smoke run is not a record: keep it out of the checkout
        args.out = Path(tempfile.mkdtemp(prefix="gpu_realengine-")) if args.quick else Path("calibration/gpu")
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in card.lower()).strip("-")
    path = args.out / f"{slug}{'-quick' if args.quick else ''}.json"
    for name, fn in sections:
        if args.only and name not in args.only:
            continue
        t = time.perf_counter()
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others' figures
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=4)}
        res["seconds"] = round(time.perf_counter() - t, 2)
        report["sections"][name] = res
        print(f"{name}: {json.dumps(res, default=str)[:600]}", flush=True)
        # rewritten after every section: a run killed in a later one keeps what the earlier ones measured
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp.replace(path)  # written whole or not at all
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
