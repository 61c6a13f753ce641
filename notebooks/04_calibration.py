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
# # Calibration: from measured steps to a simulator you can trust
#
# The simulator prices every step with a cost model. Calibration replaces guessed hardware numbers with
# measurements: run the real engine (`realengine/`) over a grid of step shapes, fit a small linear model with
# non-negative coefficients, then replay a workload the grid never saw on both the engine and the simulator and
# compare, metric by metric. This notebook walks through the three stages on the tiny model and the CPU:
#
# 1. **the measurements and the fit**: measured step times against the fitted model, per shape class, and the
#    error on steps held out of the fit;
# 2. **what dominates a step**: fixed overhead, linear layers, attention; where the model is overhead-bound,
#    where attention (memory traffic) takes over, and how that compares with the roofline of a real GPU;
# 3. **real against simulated**: latency distributions of the engine and of the calibrated simulator.
#
# It reads the shipped profile (`calibration/profiles/tiny-cpu.json`, made by `servesim calibrate`), so the
# first two parts need no torch; the third runs the engine (torch) on a small workload.

# %%
import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from calibration.fit import FIT_TERMS, format_errors, heldout_errors, predict, samples_from_profile
from sim.output.report import TEMPLATE, color
from sim.studies.teaching import fast_mode

FAST = fast_mode()
ROOT = Path.cwd() if (Path.cwd() / "calibration").is_dir() else Path.cwd().parent
profile = json.loads((ROOT / "calibration" / "profiles" / "tiny-cpu.json").read_text())
samples = samples_from_profile(profile)
print(f"{profile['model']} on {profile['provenance']['device']}, {profile['provenance']['date']}, "
      f"torch {profile['provenance']['torch']}: {len(samples)} measured step shapes")

# %% [markdown]
# ## 1. The fitted model against the measurements
#
# Each point is one step of a calibration script, its time the median over the repeats. The model is
#
# `time = step + token·new_tokens + decode_seq·decode_rows + prefill_seq·prompt_rows + attn_pair·pairs + kv_read_token·KV_tokens_read`
#
# fitted by non-negative least squares on relative error. Points on the diagonal are predicted exactly.

# %%
coef = {k: profile["coefficients"][k] for k in FIT_TERMS}
for k, v in coef.items():
    print(f"{k:<14} {v:.4g} s")
measured = np.array([s.duration for s in samples])
predicted = predict(coef, samples)
fig = go.Figure()
for i, cls in enumerate(("decode", "prefill", "mixed", "padded")):
    idx = [j for j, s in enumerate(samples) if s.step_class == cls]
    fig.add_trace(go.Scatter(x=measured[idx] * 1e3, y=predicted[idx] * 1e3, mode="markers", name=cls,
                             marker=dict(color=color(i), size=5, opacity=0.7)))
top = float(measured.max() * 1e3)
fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="exact", line=dict(color="#999", dash="dot")))
fig.update_layout(template=TEMPLATE, title="Fitted against measured step time", xaxis_title="measured (ms)",
                  yaxis_title="predicted (ms)", xaxis_type="log", yaxis_type="log", height=420)
fig

# %% [markdown]
# The honest number is the error on steps the fit did not see: every script is left out in turn, the model is
# fitted on the rest and predicts the steps of the script left out.

# %%
errors, _ = heldout_errors(samples)
print(format_errors(errors))

# %% [markdown]
# ## 2. What a step costs, part by part
#
# Split the predicted time of decode steps into the model's terms. On this CPU, with a model of 2 layers and
# 64 hidden units, the fixed per-step cost (Python scheduling, input preparation, launching a few dozen small
# operators, sampling) dominates: a decode step is **overhead-bound**, as small-batch decoding on a GPU is
# launch- and bandwidth-bound. Attention's share grows with the context each row reads; prompt rows add their
# own attention call and their quadratic query-key pairs.

# %%
decode = [s for s in samples if s.step_class == "decode" and s.index == 5]
decode.sort(key=lambda s: (s.num_seqs, s.kv_read_tokens))
labels = [f"B={s.num_seqs}, ctx≈{s.kv_read_tokens // s.num_seqs}" for s in decode]
parts = {
    "fixed per step": np.full(len(decode), coef["step"]),
    "linear layers (per token)": np.array([coef["token"] * s.num_tokens for s in decode]),
    "per row": np.array([coef["decode_seq"] * s.num_decode_seqs for s in decode]),
    "attention (pairs + KV read)": np.array([coef["attn_pair"] * s.attn_pairs
                                             + coef["kv_read_token"] * s.kv_read_tokens for s in decode]),
}
fig = go.Figure()
for i, (name, v) in enumerate(parts.items()):
    fig.add_trace(go.Bar(x=labels, y=v * 1e3, name=name, marker_color=color(i)))
fig.add_trace(go.Scatter(x=labels, y=[s.duration * 1e3 for s in decode], mode="markers", name="measured",
                         marker=dict(color="black", symbol="diamond")))
fig.update_layout(template=TEMPLATE, barmode="stack", title="Decode step time by part", yaxis_title="ms",
                  height=420)
fig

# %% [markdown]
# The same question on a GPU has a textbook answer: the analytic (roofline) cost model says for each step
# whether its linear layers and its attention are limited by compute or by memory traffic. For Llama-3.1-8B on
# an H100, decoding stays memory-bound until the batch is a few hundred rows, while a prefill chunk of a few
# hundred tokens is already compute-bound. A profile measured on a GPU (`servesim calibrate --device cuda`)
# lets you check where the real kernels leave the roofline.

# %%
from sim.costs.analytic import AnalyticCostModel  # noqa: E402
from sim.costs.costmodel import StepShape  # noqa: E402
from sim.hardware.gpu import GPUSpec  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402

roof = AnalyticCostModel(ModelSpec.from_name("llama-3.1-8b"), GPUSpec.from_name("h100-sxm"))
for b in (1, 16, 64, 256, 512):
    sh = StepShape(b, b, b, b * 2048, b * 2048)
    bd = roof.breakdown(sh)
    print(f"decode B={b:<4} ctx 2048: {roof.step_time(sh) * 1e3:6.2f} ms, linear "
          f"{'compute' if bd['linear_compute_bound'] else 'memory'}-bound, attention "
          f"{'compute' if bd['attention_compute_bound'] else 'memory'}-bound")
for q in (64, 512, 2048):
    sh = StepShape(1, q, 0, q, q * (q + 1) // 2)
    bd = roof.breakdown(sh)
    print(f"prefill q={q:<5}: {roof.step_time(sh) * 1e3:6.2f} ms, linear "
          f"{'compute' if bd['linear_compute_bound'] else 'memory'}-bound")

# %% [markdown]
# ## 3. Real against simulated
#
# Replay a small bursty workload (gamma arrivals, lognormal prompts, exponential outputs) on the engine, then
# in the simulator with the profile and the engine's own KV block count, and overlay the latency
# distributions. `servesim validate` does the same for every variant of a scenario and writes the table and
# the page; here one variant, small. On a shared machine the engine is at the mercy of other processes: the
# validation also times the profile's reference step around the run, and prints how much slower the machine
# was than at calibration.

# %%
import torch  # noqa: E402

from calibration.validate import fig_kv_over_time, fig_real_vs_sim_cdfs, validate  # noqa: E402

torch.set_num_threads(int(profile["provenance"].get("torch_threads", 1)))
val = validate(ROOT / "calibration" / "scenarios" / "validate-tiny.yaml",
               ROOT / "calibration" / "profiles" / "tiny-cpu.json",
               overrides={"workload.num_requests": 60 if FAST else 300,
                          "variants": [{"name": "continuous", "policy": {"type": "continuous", "max_num_seqs": 32}}]})
print(val.table())

# %%
fig_real_vs_sim_cdfs(val.variants[0])

# %%
fig_kv_over_time(val.variants[0])

# %% [markdown]
# What to take away: a handful of physically meaningful terms, fitted to a few hundred measured steps, carries
# the simulator to within a few percent of the engine on the median on a quiet machine; the tails are where
# noise (the OS, other processes, the garbage collector) lives, and no cost model of the step can predict it.
