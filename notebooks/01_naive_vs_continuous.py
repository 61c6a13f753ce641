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
# # Naive versus continuous batching
#
# This notebook shows three things, each with the simulator's own numbers:
#
# 1. **The same traffic under both policies.** A naive (static) server gathers a batch, runs it until its
#    longest request is done, and only then takes the next batch. A continuous server puts a waiting request
#    into a slot as soon as one frees up, at every step. We look at the batch's rows over time.
# 2. **Why the gain depends on the traffic.** If every request wants the same number of output tokens, a static
#    batch finishes all at once and there is little to win. The more the lengths differ, the longer a static
#    batch idles behind its longest member. We sweep the output-length distribution from all-equal to widely
#    mixed and measure the throughput ratio continuous / naive for each.
# 3. **How that compares with the published figures** quoted in the seed documents and in Anyscale's benchmark.
#
# Settings are small so the whole notebook runs in well under a minute on a laptop CPU; set
# `SERVESIM_NOTEBOOK_FAST=1` for the even smaller settings the test suite uses.

# %%
import servesim
from sim.output.report import fig_batch_slots, fig_memory_stack
from sim.studies.teaching import (
    fast_mode,
    fig_ratio_by_spread,
    find_scenario,
    length_spread,
    output_lengths,
    result_named,
    simulate,
    static_batching_estimate,
    throughput_ratio,
)

FAST = fast_mode()
print("fast settings" if FAST else "notebook settings")

# %% [markdown]
# ## 1. The same workload under both policies
#
# `scenarios/naive-vs-continuous.yaml` compares a static batcher (16 requests per batch, each reserving
# `max_model_len` tokens of contiguous KV) with a vLLM-style continuous batcher (up to 256 requests per step,
# paged KV, chunked prefill), both serving Llama-3.1-8B on one A100 80GB, on mixed chat lengths arriving at 6
# requests per second. We run it with fewer requests than the file asks for.

# %%
run = servesim.run(find_scenario("naive-vs-continuous"), num_requests=120 if FAST else 400)
print(run.table())

# %% [markdown]
# The chart below rebuilds the batch's rows from the request records (the simulator records when each request
# was first scheduled and when it finished, not which row it sat in; the rows are packed greedily, which uses
# as few rows as possible). Each coloured bar is one request. Grey hatching is a row the naive server still
# computes for a request that has already finished. Blank space is a slot doing nothing.
#
# **What to look at:** in the naive panel, the hatched areas: most of each batch's rows are padding, waiting for
# one long request. No new colour appears in a batch until it is over. In the continuous panel, a row that
# frees up gets a new colour at the next step, and the number of rows in use follows the traffic.

# %%
fig_batch_slots(run.results, max_requests=150 if FAST else 300).show()

# %% [markdown]
# Memory tells the same story from another side. The naive server reserves the maximum length for every request
# up front (orange: reserved and empty), while the continuous server's paged KV holds little more than the tokens
# it stores (blue). Here neither comes near the ceiling; notebook 2 is about the case where they do.

# %%
for variant in ("naive", "continuous"):
    fig_memory_stack(result_named(run, variant), max_points=300).show()

# %% [markdown]
# ## 2. The gain grows with the spread of output lengths
#
# To see the effect of length spread alone we hold everything else fixed:
#
# - every request arrives at time 0 (an offline batch job), so throughput measures capacity, not load;
# - every prompt is 512 tokens, so prompt padding plays no part;
# - the output lengths all have a mean of about 250 tokens; only their spread changes.
#
# Three servers run each workload:
#
# - **naive**: static batches of 16, contiguous KV;
# - **continuous, 16 slots**: continuous batching with the same 16 slots and the same contiguous KV, so the only
#   difference from naive is that a freed slot is refilled at once (continuous batching alone);
# - **continuous, up to 256**: the full vLLM-style server (paged KV, chunked prefill, up to 256 requests a step),
#   which can also run far bigger batches because its memory is not wasted on reservations.
#
# We measure spread as the coefficient of variation (standard deviation / mean) of the drawn lengths: 0 when all
# are equal, about 1 for an exponential distribution.

# %%
DISTRIBUTIONS = {
    "all 250": {"type": "fixed", "value": 250},
    "uniform 200-300": {"type": "uniform", "min": 200, "max": 300},
    "uniform 100-400": {"type": "uniform", "min": 100, "max": 400},
    "uniform 1-500": {"type": "uniform", "min": 1, "max": 500},
    "lognormal, std 250": {"type": "lognormal", "mean": 250, "std": 250, "min": 1, "max": 1024},
    "exponential": {"type": "exponential", "mean": 250, "min": 1, "max": 1024},
    "lognormal, std 500": {"type": "lognormal", "mean": 250, "std": 500, "min": 1, "max": 1024},
}
if FAST:
    DISTRIBUTIONS = {k: DISTRIBUTIONS[k] for k in ("all 250", "uniform 100-400", "exponential")}
SLOTS = 16


def spread_scenario(output_len: dict, num_requests: int) -> dict:
    return {
        "name": "spread",
        "seed": 0,
        "workload": {
            "arrival": {"type": "all_at_once"},
            "num_requests": num_requests,
            "prompt_len": {"type": "fixed", "value": 512},
            "output_len": output_len,
        },
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096},
        "variants": [
            {"name": "naive", "policy": {"type": "static", "batch_size": SLOTS, "max_wait": 0.0},
             "kv_cache": {"type": "contiguous"}},
            {"name": "continuous-16", "policy": {"type": "continuous", "max_num_seqs": SLOTS},
             "kv_cache": {"type": "contiguous"}},
            {"name": "continuous-256", "policy": {"type": "continuous", "max_num_seqs": 256,
                                                  "enable_chunked_prefill": True, "max_num_batched_tokens": 4096},
             "kv_cache": {"type": "paged"}},
        ],
    }


rows = []
for label, dist in DISTRIBUTIONS.items():
    sweep_run = simulate(spread_scenario(dist, 96 if FAST else 320))
    lengths = output_lengths(sweep_run.results[0])
    rows.append({
        "distribution": label,
        "mean": lengths.mean(),
        "spread": length_spread(lengths),
        "16 slots": throughput_ratio(sweep_run, "continuous-16", "naive"),
        "up to 256": throughput_ratio(sweep_run, "continuous-256", "naive"),
        "estimate": static_batching_estimate(lengths, SLOTS),
        "naive tok/s": sweep_run.summaries["naive"]["output_throughput"],
    })

print(f"{'distribution':<20}{'mean':>7}{'spread':>8}{'16 slots':>10}{'up to 256':>11}{'estimate':>10}"
      f"{'naive tok/s':>13}")
for r in rows:
    print(f"{r['distribution']:<20}{r['mean']:>7.0f}{r['spread']:>8.2f}{r['16 slots']:>9.2f}x"
          f"{r['up to 256']:>10.2f}x{r['estimate']:>9.2f}x{r['naive tok/s']:>13.0f}")

# %%
fig_ratio_by_spread(
    [r["spread"] for r in rows],
    {
        "continuous, 16 slots (refilling alone)": [r["16 slots"] for r in rows],
        "continuous, up to 256 (paged KV)": [r["up to 256"] for r in rows],
        "estimate from lengths alone (16 slots)": [r["estimate"] for r in rows],
    },
    labels=[r["distribution"] for r in rows],
    bands={"seed: 4-8x on mixed chat": (4.0, 8.0)},
).show()

# %% [markdown]
# **What to look at.**
#
# - *Equal lengths:* with the same 16 slots, continuous batching gains nothing (ratio 1.0): a static batch whose
#   requests all finish together wastes no row. This is the caveat the seed document gives, that traffic with
#   uniform output lengths leaves little idle time to reclaim.
# - *Growing spread:* the same-slot ratio climbs steadily with the spread, to between 2.5x and 3x for exponential
#   and wider lengths. The only thing that changed is how long a static batch waits for its longest member.
# - *The estimate* (dotted) counts row-steps from the lengths alone (each static batch costs 16 rows times its
#   longest request). It is an upper bound: it ignores prefill time, which both servers pay, so the measured
#   ratio sits below it while following its shape.
# - *The full server* gains more at every spread, because paged KV wastes no memory on reservations and lets it
#   run batches of a hundred and more: even with equal lengths it is about 3x faster than naive, and on mixed
#   lengths it lands in the 4-8x band that the seed document quotes for mixed chat traffic.

# %% [markdown]
# ## 3. Against the published figures
#
# The seed documents put the gain of continuous batching and paged KV together at roughly 3-5x more traffic
# than a naive inference loop on the same hardware, and 4-8x on chat traffic whose output lengths vary a lot.
# Anyscale's benchmark (OPT-13B on one A100 40GB, every prompt 512 tokens, output lengths drawn from an
# exponential distribution and held between 32 and 1536 tokens) reported about 8x over naive static batching
# for continuous batching alone, and up to 23x once paged memory was added.
#
# We rebuild that setup: same model, same GPU, same prompt length, outputs exponential and clipped to the same
# range (we pick a mean of 256 tokens). The naive baseline gets the best of three batch sizes, as a benchmark
# tuning its baseline would. "Continuous alone" refills slots but keeps contiguous reservations of
# `max_model_len`; "with paged KV" also allocates memory a block at a time.

# %%
anyscale = {
    "name": "anyscale-like",
    "seed": 0,
    "workload": {
        "arrival": {"type": "all_at_once"},
        "num_requests": 96 if FAST else 300,
        "prompt_len": {"type": "fixed", "value": 512},
        "output_len": {"type": "exponential", "mean": 256, "min": 32, "max": 1536},
    },
    "deployment": {"model": "opt-13b", "gpu": "a100-40gb", "max_model_len": 2048},
    "variants": [
        *({"name": f"naive-{b}", "policy": {"type": "static", "batch_size": b, "max_wait": 0.0},
           "kv_cache": {"type": "contiguous"}} for b in (4, 8, 16)),
        {"name": "continuous alone", "policy": {"type": "continuous", "max_num_seqs": 256},
         "kv_cache": {"type": "contiguous"}},
        {"name": "with paged KV", "policy": {"type": "continuous", "max_num_seqs": 256},
         "kv_cache": {"type": "paged"}},
    ],
}
any_run = simulate(anyscale)
best_naive = max((n for n in any_run.summaries if n.startswith("naive")),
                 key=lambda n: any_run.summaries[n]["output_throughput"])
print(f"{'variant':<18}{'tok/s':>8}{'vs ' + best_naive:>16}{'mean batch':>12}{'KV peak':>9}")
for name, s in any_run.summaries.items():
    print(f"{name:<18}{s['output_throughput']:>8.0f}{throughput_ratio(any_run, name, best_naive):>15.2f}x"
          f"{s['mean_batch_size']:>12.1f}{s['kv_usage']['max']:>9.0%}")
alone = throughput_ratio(any_run, "continuous alone", best_naive)
paged = throughput_ratio(any_run, "with paged KV", best_naive)
print(f"\ncontinuous alone: {alone:.1f}x (Anyscale: about 8x); with paged KV: {paged:.1f}x (Anyscale: up to 23x)")

# %% [markdown]
# **What to look at, and why the factors differ.** The simulator reproduces the *order* of the published result
# (refilling slots helps, and paged memory roughly doubles the gain again) but with smaller factors, about 2.5x
# and 5x. The reasons are worth knowing:
#
# - **Memory is the ceiling here.** OPT-13B's weights take about 24 GiB of the 40 GiB card, and each token's KV
#   cache takes 800 KiB (40 layers, no grouped-query attention). When every request reserves 2048 tokens up
#   front, only five or six fit at once, whatever the batch size setting. Look at the mean batch column (real
#   requests per step): continuous batching alone keeps those few slots busy, while the naive batches average
#   about two real requests, the rest of their rows being padding. Paged KV stores only the tokens that exist,
#   so two to three times as many requests run together; that, not refilling, is where the second doubling
#   comes from.
# - **The baseline is a good static batcher.** The simulated naive server uses the same step-time model as the
#   continuous one; it only batches statically. Anyscale's baseline was a plain static-batching loop from a
#   general-purpose library, with its own overheads, and a published ratio is always relative to its baseline.
# - **The output-length mean is ours.** With exponential lengths the gain of refilling grows with the spread,
#   and the clipping range alone does not pin the distribution down.
#
# The seed document's 3-5x overall and 4-8x on mixed chat sit between these extremes, and section 2 lands in
# that band for the full server on mixed lengths.
