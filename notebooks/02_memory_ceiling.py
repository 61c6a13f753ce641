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
# # The memory ceiling
#
# A GPU serving a language model holds two things in memory: the model's weights, and one KV cache per request
# in flight. The weights are fixed; the KV caches grow with every token. When they fill what the weights leave,
# no further request can start, however idle the math units are. This notebook shows, with the simulator's own
# sizing code:
#
# 1. **How many bytes one token of KV takes**, computed from a model's config, with the arithmetic written out for
#    Llama-3.1-8B.
# 2. **How many sessions fit on one GPU** at several context lengths, for a few GPUs.
# 3. **How much of the KV memory holds tokens** when every request reserves its maximum length up front
#    (contiguous), against allocating it a block at a time (paged), measured from a simulation.
# 4. **What 8-bit weights or an 8-bit KV cache change**, in capacity and in a simulated run.
#
# Set `SERVESIM_NOTEBOOK_FAST=1` for the smaller runs the test suite uses.

# %%
import copy

import plotly.graph_objects as go
import yaml

from sim.hardware.dtypes import GiB
from sim.hardware.kv_budget import kv_budget, max_concurrent_sequences
from sim.hardware.models import ModelSpec
from sim.output.report import TEMPLATE, color, fig_memory_stack
from sim.output.run_folder import format_table
from sim.studies.teaching import fast_mode, fig_metric_panels, find_scenario, result_named, run_shipped, simulate

FAST = fast_mode()
KiB = 1024
print("fast settings" if FAST else "notebook settings")

# %% [markdown]
# ## 1. KV bytes per token, from the config
#
# Every layer stores one key vector and one value vector per KV head for every token it has seen. So a token
# costs
#
#     2 (key and value) x layers x KV heads x head size x bytes per element
#
# The fields come straight from a Hugging Face `config.json`: `num_hidden_layers`, `num_key_value_heads`, and
# `head_dim` (or `hidden_size / num_attention_heads`). Below is Llama-3.1-8B's config, as the simulator's preset
# writes it.

# %%
llama8b = ModelSpec.from_name("llama-3.1-8b")
config = llama8b.to_hf_config()
print({k: config[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                              "hidden_size")})

spec = ModelSpec.from_hf_config(config, name="from config.json")
layers, kv_heads, head_dim, elem = spec.num_layers, spec.num_key_value_heads, spec.head_dim, 2  # bf16: 2 bytes
by_hand = 2 * layers * kv_heads * head_dim * elem
print(f"2 x {layers} layers x {kv_heads} KV heads x {head_dim} x {elem} bytes = {by_hand:,} bytes "
      f"= {by_hand // KiB} KiB per token")
assert by_hand == spec.kv_bytes_per_token("bf16") == 128 * KiB
print(f"a 4,096-token conversation: {4096 * by_hand / GiB:.2f} GiB;  "
      f"a 128k-token one: {131072 * by_hand / GiB:.0f} GiB")

# %% [markdown]
# Grouped-query attention is what keeps this small: Llama-3.1-8B has 32 query heads but only 8 KV heads. A model
# without it, such as OPT-13B, stores a key and a value for every attention head.

# %%
print(f"{'model':<14}{'layers':>8}{'KV heads':>10}{'head dim':>10}{'KV / token (bf16)':>20}")
for name in ("llama-3.2-1b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "opt-13b", "llama-3.1-70b"):
    m = ModelSpec.from_name(name)
    print(f"{name:<14}{m.num_layers:>8}{m.num_key_value_heads:>10}{m.head_dim:>10}"
          f"{m.kv_bytes_per_token('bf16') / KiB:>16.0f} KiB")

# %% [markdown]
# ## 2. Sessions per GPU
#
# The simulator sizes the KV cache as vLLM does: take `gpu_memory_utilization` (90%) of the GPU's memory, subtract
# the weights and the activation reserve, and cut what is left into 16-token blocks
# (`sim.hardware.kv_budget.kv_budget`). `max_concurrent_sequences` then counts how many sequences of a given context
# length (prompt plus output) fit at once, in whole blocks.

# %%
GPUS = ("l4", "a100-40gb", "a100-80gb", "h100-sxm", "h200")
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 131072)
budgets = {g: kv_budget("llama-3.1-8b", g) for g in GPUS}
print(f"{'GPU':<11}{'memory':>9}{'weights':>9}{'reserve':>9}{'KV':>9}{'KV tokens':>11}  sessions at "
      + " ".join(f"{c // 1024}k".rjust(5) for c in CONTEXTS))
for g, b in budgets.items():
    sessions = [max_concurrent_sequences(b, c) for c in CONTEXTS]
    print(f"{g:<11}{b.total_memory / GiB:>8.1f}G{b.weight_bytes / GiB:>8.1f}G{b.activation_reserve / GiB:>8.1f}G"
          f"{b.kv_memory / GiB:>8.1f}G{b.capacity_tokens:>11,}  {'':12}" + " ".join(f"{s:>5}" for s in sessions))

fig = go.Figure()
for i, (g, b) in enumerate(budgets.items()):
    fig.add_trace(go.Scatter(x=CONTEXTS, y=[max(max_concurrent_sequences(b, c), 0.5) for c in CONTEXTS],
                             name=g, mode="lines+markers", line=dict(color=color(i))))
fig.update_layout(template=TEMPLATE, height=420, title="Llama-3.1-8B (bf16): sessions that fit in the KV cache",
                  xaxis=dict(type="log", title="context length per session (tokens)", tickvals=CONTEXTS,
                             ticktext=[f"{c // 1024}k" for c in CONTEXTS]),
                  yaxis=dict(type="log", title="concurrent sessions"))
fig.show()

# %% [markdown]
# **What to look at.** The L4 (24 GB) spends most of its memory on the 15 GiB of weights: about 3 GiB of KV is
# left, a dozen 2k-token chats, and not one session at 32k tokens, let alone 128k. Every doubling of the context
# halves the sessions, on every GPU: a line with slope -1 on this log-log plot. The H200's extra memory goes
# almost entirely to KV, because the weights take the same 15 GiB everywhere. This is the ceiling: the number of
# sessions is set by memory, not by how fast the GPU computes.

# %% [markdown]
# ## 3. Reserved versus paged: how much of the KV memory holds tokens
#
# A server that allocates one contiguous region per request must reserve the request's maximum length when it
# starts, because it does not know how long the answer will be. The vLLM paper measured that such servers use only
# 20-40% of their KV memory for tokens: 60-80% is reserved but empty, or lost to fragmentation. Paged allocation
# hands out 16-token blocks as tokens arrive, so only each request's last block is partly empty: the paper put the
# waste under 4%.
#
# `scenarios/lesson-paged-memory.yaml` runs chat traffic on Llama-3.1-8B on an A100 40GB with the same continuous
# scheduler and the two allocators. The summary key `kv_token_utilization` is the share of allocated token slots
# that hold a token, averaged over the time the GPU computed.

# %%
paged_run = run_shipped("lesson-paged-memory", {"workload.num_requests": 150 if FAST else 600})
print(format_table(paged_run.summaries))
for name in ("contiguous", "paged"):
    s = paged_run.summaries[name]
    print(f"{name:<11} tokens in {s['kv_token_utilization']:6.1%} of allocated KV -> waste "
          f"{1 - s['kv_token_utilization']:6.1%};  KV usage mean {s['kv_usage']['mean']:.0%}, "
          f"peak {s['kv_usage']['max']:.0%}; TTFT p99 {s['ttft']['p99']:.2f} s")

# %%
names = ["contiguous", "paged"]
waste = [1 - paged_run.summaries[n]["kv_token_utilization"] for n in names]
fig = go.Figure(go.Bar(x=names, y=waste, marker_color=[color(1), color(0)], text=[f"{w:.0%}" for w in waste],
                       textposition="outside", name="simulated waste"))
fig.add_hrect(y0=0.6, y1=0.8, fillcolor=color(1), opacity=0.12, line_width=0,
              annotation_text="vLLM paper: 60-80% waste (contiguous)", annotation_position="top left")
fig.add_hrect(y0=0.0, y1=0.04, fillcolor=color(0), opacity=0.2, line_width=0,
              annotation_text="paper: under 4% (paged)", annotation_position="top right")
fig.update_layout(template=TEMPLATE, height=400, yaxis=dict(range=[0, 1], tickformat=".0%",
                  title="allocated KV holding no token"), title="KV memory wasted, measured in the simulation")
fig.show()

# %% [markdown]
# The memory stacks below show the same run over time: weights at the bottom (grey), then KV holding tokens
# (dark blue), the empty tails of partly filled blocks (light blue), blocks reserved but still empty (orange) and
# free blocks, up to the capacity line.
#
# **What to look at.** The contiguous server's stack is mostly orange and climbs towards the capacity line (at
# the notebook's full settings it reaches it, and requests then wait for memory: see the TTFT tail); the paged
# server holds the same requests, serving the same tokens, in a thin blue band with most of the cache free.

# %%
for name in names:
    fig_memory_stack(result_named(paged_run, name), max_points=300).show()

# %% [markdown]
# ## 4. Eight-bit weights or KV
#
# Two knobs move the ceiling without new hardware:
#
# - **8-bit weights** (fp8 or int8) halve the weights, and everything they free goes to KV;
# - **an 8-bit KV cache** (fp8) halves the bytes per token, so the same KV memory holds twice the tokens.
#
# Both cost some accuracy, which has to be checked on the task (the seed document's advice: run your own quality
# evaluation before switching). First the arithmetic, on an L4 (where weights dominate) and an H100.

# %%
COMBOS = [("bf16", "auto"), ("bf16", "fp8"), ("fp8", "auto"), ("int8", "fp8"), ("fp8", "fp8")]
print(f"{'GPU':<10}{'weights':>8}{'KV':>6}{'weights GiB':>13}{'KV GiB':>8}{'KV/token':>10}{'KV tokens':>11}"
      f"{'4k sessions':>13}")
for g in ("l4", "h100-sxm"):
    base = None
    for wd, kd in COMBOS:
        b = kv_budget("llama-3.1-8b", g, weight_dtype=wd, kv_dtype=kd)
        base = base or b.capacity_tokens
        print(f"{g:<10}{wd:>8}{b.kv_dtype:>6}{b.weight_bytes / GiB:>13.1f}{b.kv_memory / GiB:>8.1f}"
              f"{b.bytes_per_token / KiB:>7.0f}KiB{b.capacity_tokens:>11,}{max_concurrent_sequences(b, 4096):>13}"
              f"   ({b.capacity_tokens / base:.1f}x)")

# %% [markdown]
# **What to look at.** On the L4, 8-bit weights free 6.5 GiB, which triples the KV memory, and an fp8 KV cache
# doubles what that memory holds: together about 6x the sessions on the same card. On the H100, where the
# weights are a small share, the KV dtype matters more than the weight dtype.
#
# Now the same levers in a simulation: `scenarios/lesson-memory-bound.yaml` serves long chats with Llama-3.1-70B
# on two H100s, where bf16 weights leave only ~4.4 GiB per GPU for KV. We run four variants on the same requests.

# %%
raw = yaml.safe_load(find_scenario("lesson-memory-bound").read_text())
raw["workload"]["num_requests"] = 80 if FAST else 300
raw["variants"] = [
    {"name": "bf16 weights, bf16 KV"},
    {"name": "bf16 weights, fp8 KV", "deployment": {"kv_dtype": "fp8"}},
    {"name": "fp8 weights, bf16 KV", "deployment": {"weight_dtype": "fp8"}},
    {"name": "fp8 weights, fp8 KV", "deployment": {"weight_dtype": "fp8", "kv_dtype": "fp8"}},
]
quant_run = simulate(copy.deepcopy(raw))
print(f"{'variant':<24}{'tok/s':>7}{'batch':>7}{'KV mean':>9}{'MFU':>6}{'preempt':>9}{'rejected':>10}")
for name, s in quant_run.summaries.items():
    print(f"{name:<24}{s['output_throughput']:>7.0f}{s['mean_batch_size']:>7.1f}{s['kv_usage']['mean']:>9.0%}"
          f"{s['mfu']:>6.0%}{s['num_preemptions']:>9}{s['num_rejected']:>10}")

# two panels, one per unit: on twin axes of one panel the rejection bars covered the throughput bars
fig_metric_panels(quant_run.summaries, [("output_throughput", "output tokens / s"),
                                        ("num_rejected", "requests rejected")],
                  title="Llama-3.1-70B on 2 x H100: what 8 bits buy").show()

# %% [markdown]
# **What to look at.** With everything in bf16 the cache is nearly full, requests are preempted (and, once the
# queue outgrows the 20 s admission limit at the notebook's full settings, rejected), and MFU is low: the GPUs
# are not short of compute, they are short of room. An fp8 KV cache alone doubles the room, which at this load
# is enough to end the preemptions and rejections. fp8 weights free some 32 GiB per GPU, far more than the whole
# bf16 KV cache, and leave it mostly empty. Which one to use is then a question of accuracy, not of capacity.
