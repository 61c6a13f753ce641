"""The sampler's sort, what a top-p request costs an engine that filters it by sorting the whole vocabulary, and
the host work a penalized request costs vLLM V1 each step.

vLLM's PyTorch sampler (V0, and V1's ``apply_top_k_top_p`` in vllm/v1/sample/ops/topk_topp_sampler.py) sorts every
row's logits over the whole vocabulary (``logits.sort(dim=-1)``), then a softmax, a cumulative sum and a scatter
back, for any request with top-p below 1; a greedy request takes the argmax and a top-k-only one ``torch.topk``
(PR #15478), neither sorts. FlashInfer's sampling kernel does not sort (rejection sampling). Which one runs:
- V0 (0.5-0.6): FlashInfer only when ``VLLM_USE_FLASHINFER_SAMPLER=1``, so it sorts by default (vLLM's note in
  vllm/v1/sample/ops/topk_topp_sampler.py, 0.7-0.10: the variable is None by default, and "In V0, None means
  False, while in V1, None means True");
- V1 from PR #11394 (0.7, Dec 2024) to 0.11.0: FlashInfer whenever it is installed ("the sorting op can take ~20%
  performance overhead in high-throughput settings": ShareGPT 47.40 req/s greedy, 40.20 with top-p, 47.15 with
  top-p through FlashInfer);
- V1 0.11.1: off by default (PR #26859, Oct 2025, for correctness reports), opt-in by the variable, so it sorts.
  Later releases replace the sort from 8 rows up by a Triton kernel (PR #33538) and turn FlashInfer on again in
  0.21 (PR #40376, as PR #44405 states); the vllm-v1 preset follows 0.11.1.
The vllm-v1 and vllm-v0 presets sort unless ``deployment.engine.use_flashinfer_sampler`` is true; other engines'
samplers are not modelled (0). Only ``workload.sampling`` with top-p below 1 and a temperature above greedy pays it
(sim/workload/sampling.py); without it the requests sample as the benchmark clients send them, greedy.

Penalties (``repetition_penalty``, ``presence_penalty``, ``frequency_penalty`` off their neutral values) cost vLLM
V1 the host's rebuild of every row's output tokens each step (``PENALTY_HOST_TIME``); their GPU passes over the
logits (token counts, masks) are not modelled, nor V0's penalties.
Not modelled: the softmax and the random draw every sampled (non-greedy) request pays, with or without top-p (a
few passes over the logits, no sort). A speculative verify row sorts once here, as
sim/serving/spec_decode.py prices its LM head once, though vLLM V1's rejection sampler filters the target's
logits at each of its k + 1 positions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import CostModel
from sim.engines.base import EngineKey, engine_of

# Seconds per logit (row x vocabulary entry) of vLLM's PyTorch top-p filter: the median of the six measurements of
# that path published beside faster kernels (fp32 logits, every row filtered), 0.092-0.149 ns a logit:
# - vLLM PR #40376 (B200): top-p on every row, 1.005 ms at 64 rows x 131,072 (0.120 ns), 2.272 ms at 128 (0.135),
#   6.150 ms at 512 (0.092); 32,768 entries: 0.626 ms at 128 rows (0.149), 1.694 ms at 512 (0.101);
# - vLLM PR #32558 (the Triton filter's): 3.812 ms at 256 rows x 131,072, top-k on every row by the same sort (0.114).
# Linear in the vocabulary (a 4x larger one costs 3.6-4.3x) and near-linear in the rows from 64 up. No H100
# figure is published; a sort of this size runs far below the HBM bandwidth of either GPU (0.12 ns for the 24+
# bytes a logit moves per pass is ~0.2 TB/s), so the B200's figure is not scaled by bandwidth. Cross-check, not
# fitted: Llama-3.1-8B (128,256 entries) at 15 us a row makes a 256-row step of ~25 ms on an H100 about 15%
# longer, PR #11394's 47.40 -> 40.20 req/s (15%).
SAMPLER_SORT_TIME = 0.117e-9  # s per logit

# Host seconds per token of a step's rows vLLM V1 spends on a penalized batch's inputs (any row with a repetition,
# presence or frequency penalty): each step its sampler makes every row's output tokens, Python lists, into one
# padded int64 tensor on the CPU (vllm/v1/sample/ops/penalties.py ``_convert_to_tensors``: ``make_tensor_with_pad``,
# np.full, a copy per row, pinned memory, the copy to the GPU), a cost that grows with the output so far, every step
# (vLLM PR #47540, Jul 2026: "O(rows x max_output_len) per step"; the code's own note: "quite inefficient"). The one
# published measurement of it, PR #47540's (RTX 5090, Qwen3-4B with a 16-token draft, 4 rows, every penalty set):
# 6 ms a step at 4K tokens of history growing linearly to 47 ms at 28K, with the rejection sampler's copy of each
# history per draft position making 4 x 17 = 68 rows: (47 - 6) ms / (68 x 24K tokens) = 24.5 ns a row-token. The
# cost model counts each row's whole context (``kv_read_tokens``: the prompt too, which the output lists do not
# hold, an overcount by the prompt's share). Under async scheduling (vLLM 0.11 on) the work runs after the forward
# was launched, so the step waits for the larger of the two (sim/costs/analytic.py, ``penalty_host_time``).
PENALTY_HOST_TIME = 24.5e-9  # s per token of the step's rows' contexts

SAMPLER_KEYS = EngineKey(("use_flashinfer_sampler",), "use_flashinfer_sampler is vLLM's (VLLM_USE_FLASHINFER_SAMPLER); "
                         "engine {name}'s sampler is not modelled")


def vllm_sort_time(cfg: Any) -> float:
    """vLLM's ``sampler_sort_time`` under ``cfg`` (its ``deployment.engine``): 0 through FlashInfer's kernel."""
    return 0.0 if cfg is not None and cfg.use_flashinfer_sampler else SAMPLER_SORT_TIME


def with_sampling(cost: CostModel, engine: Any, sampling: Any) -> CostModel:
    """``cost`` with the engine's sort priced in each row of each step when ``sampling`` (``workload.sampling``)
    sorts the vocabulary; ``cost`` itself otherwise (greedy, no top-p, no engine, not the roofline)."""
    if engine is None or sampling is None or not isinstance(cost, AnalyticCostModel):
        return cost
    eng = engine_of(engine)
    t = eng.sampler_sort_time(engine) if sampling.sorts_vocabulary() else 0.0
    p = eng.penalty_host_time(engine) if sampling.penalizes() else 0.0
    if t <= 0 and p <= 0:
        return cost
    return replace(cost, sampler_sort_time=t or cost.sampler_sort_time, penalty_host_time=p or cost.penalty_host_time)


def unpriced_sampling_note(deployment: Any, sampling: Any) -> str | None:
    """What to tell a user whose ``workload.sampling`` asks for what the run does not price: a top-p sort on
    servesim's classic engine (no ``deployment.engine``), penalties on any engine but vllm-v1. A run whose TPOT does
    not move with them must say why."""
    if sampling is None:
        return None
    notes = []
    if sampling.sorts_vocabulary() and deployment.engine is None:
        notes.append(f"workload.sampling (top_p {sampling.top_p:g}) is not priced: without deployment.engine the "
                     "steps are those of greedy sampling; the vllm-v1 and vllm-v0 presets price vLLM's top-p sort "
                     "(sim/engines/sampling.py)")
    engine = deployment.engine
    if sampling.penalizes() and engine_of(engine).penalty_host_time(engine) <= 0:
        where = "without deployment.engine" if engine is None else f"on engine {engine_of(engine).name}"
        notes.append(f"workload.sampling's penalties ({sampling.describe_penalties()}) are not priced: {where} the "
                     "steps are those of unpenalized sampling; the vllm-v1 preset prices its sampler's penalty inputs "
                     "(sim/engines/sampling.py)")
    return "; ".join(notes) or None
