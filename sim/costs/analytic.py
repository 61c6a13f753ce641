"""The analytic (roofline) cost model: a step's time from first principles, FLOPs and bytes moved against the GPU's
peak rates, with the defaults of its efficiencies and overheads and their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import numpy as np

from sim.costs.costmodel import CostModel, StepShape, is_array
from sim.hardware.dtypes import DTYPE_BITS, activation_dtype, canonical_dtype, kv_dtype_bytes, resolve_kv_dtype
from sim.hardware.gpu import GPUSpec, resolve_gpu
from sim.hardware.mla import mla_attn_flops_per_pair
from sim.hardware.models import ModelSpec, check_tensor_parallel, resolve_model
from sim.hardware.moe import expected_experts

# Defaults of AnalyticCostModel, with their reasons.
# Large bf16 GEMMs reach 60-70% of the dense datasheet peak on Hopper and Ampere; a whole prefill, with its
# smaller projections and elementwise kernels, sits near the low end.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
# The figures above are of NVIDIA's Hopper and Ampere. S. Bekman's "Maximum Achievable Matmul FLOPS" table
# (github.com/stas00/ml-engineering, compute/accelerator/README.md, mamf-finder.py: the best bf16 GEMM shape of a
# brute-force search) puts every NVIDIA GPU it measured at 72.9-86.9% of the dense peak (H100 SXM 794.5 of 989 TFLOP/s,
# 80.3%) and AMD's CDNA3 far below: MI300X 668.4 of 1,300 (51.4%), MI325X 60.4%. On those GPUs a bf16/fp16 matmul
# reaches that share over the H100's of what it reaches there (the table has no CDNA3 fp8 figure: fp8 matmuls keep
# the default); attention kernels are not GEMMs and keep theirs.
CDNA3_MATMUL_SHARE = {"mi300x": 51.4 / 80.3, "mi325x": 60.4 / 80.3}
# Decode GEMVs and paged-attention reads stream at 75-85% of the datasheet HBM bandwidth.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
# Fixed time per step outside the GPU's arithmetic: scheduling, input preparation, kernel launch (mostly hidden
# by CUDA graphs), sampling and output processing. An optimized engine (vLLM v1, CUDA graphs) spends about 1-2 ms;
# with it an 8B bf16 batch-1 decode on an H100 comes out near 7.5 ms, as measured in practice.
DEFAULT_STEP_OVERHEAD = 1.5e-3  # s per step
# CPU work that grows with the batch: per-row input preparation, sampling bookkeeping, detokenization.
DEFAULT_PER_REQUEST_OVERHEAD = 1.0e-5  # s per row per step
# Weight-only quantized GEMMs (int8/int4, fp8 without fp8 tensor cores) dequantize inside the kernel (Marlin and
# the like): near bf16 speed once compute-bound, a little slower.
DEFAULT_DEQUANT_OVERHEAD = 0.1  # fraction added to the compute time of weight-only quantized matmuls
# PyTorch's weight-only kernels stream their weights slower than a bf16 GEMV does. torchao's quantization README
# (pytorch/ao at 03d01ad, one A100, batch 1, tok/s x model size): Llama-2-7B bf16 1418.93 GB/s, int8 weight-only
# 1131.18, int4 weight-only (tinygemm's _weight_int4pack_mm, group 64) 751.42; Llama-3-8B 1435.54, 1150.80, 763.33.
# The shares of bf16's rate, the mean of the two models: what ``weight_only_bandwidth`` is for gpt-fast's and
# torchao's int8 (dequantize-and-matmul under torch.compile) and int4 (the same tinygemm op) weights
TORCH_WEIGHT_ONLY_BANDWIDTH = {"int8": (1131.18 / 1418.93 + 1150.80 / 1435.54) / 2,
                               "int4": (751.42 / 1418.93 + 763.33 / 1435.54) / 2}
# One all-reduce's fixed cost (NCCL or vLLM's custom all-reduce on NVLink: 5-20 us).
DEFAULT_ALLREDUCE_LATENCY = 1.0e-5  # s per all-reduce


def _attn_flops_per_pair(m: ModelSpec, heads: int) -> float:
    """Attention FLOPs per causal query-key pair of one GPU's ``heads`` heads, all layers (an exact integer as a
    float, so the product with the time per FLOP rounds as it always did). MLA: sim/hardware/mla.py."""
    if m.kv_lora_rank:
        return float(mla_attn_flops_per_pair(m, heads))
    return 4.0 * m.num_layers * heads * m.head_dim




@dataclass(frozen=True, slots=True)
class AnalyticCostModel(CostModel):
    """Step time from first principles: FLOPs and bytes moved against the GPU's peak rates.

    A step's time is a sum of per-part rooflines, each part bound by whichever of compute or memory it waits on:

        time = step_overhead + per_request_overhead * num_seqs
             + max(linear FLOPs / compute rate,    (linear weights + activations) / bandwidth)
             + max(attention FLOPs / compute rate, KV bytes read and written / bandwidth)
             + tensor-parallel all-reduces + swap copies over PCIe

    With ``penalty_host_time`` (vLLM V1's penalties, sim/engines/sampling.py) the GPU parts run under the host's
    rebuild of the rows' tokens: ``time = overheads + max(GPU parts, kv_read_tokens * penalty_host_time)``.

    Summing the parts, rather than taking one global max, reflects that the linear layers and attention are
    separate kernels: a long-context decode waits on KV reads in attention even when its linear layers are
    memory-bound on the weights, and vice versa in a large prefill.

    - Linear layers (per GPU shard): ``2 * body_matmul_params`` FLOPs per token, plus the LM head's
      ``2 * vocab * hidden`` FLOPs per *row* (vLLM computes logits only at the positions that sample). Bytes: every
      weight once per step, plus each matmul's input and output activations per token (fp32 logits per row).
    - Attention: ``4 * layers * heads * head_dim`` FLOPs per causal query-key pair (``attn_pairs``), in bf16 (fp16
      for fp16 models) whatever the weight format; bytes: ``(kv_read_tokens + num_tokens) * kv_bytes_per_token``
      (the context read, the new tokens' KV written).
    - Tensor parallelism (``tp > 1``): weights, heads and KV heads split over the GPUs (KV heads replicated when
      ``tp`` exceeds them); two all-reduces per layer of ``num_tokens * hidden`` activations, ring cost
      ``allreduce_latency + 2 (tp-1)/tp * bytes / link``, the link being NVLink (times ``bandwidth_efficiency``)
      or, without NVLink, PCIe.
    - Swaps: ``swap_blocks * block_size * kv_bytes_per_token`` (per GPU) over PCIe, serial with the step (vLLM
      issues the copies before the forward).

    Compute dtype of the linear layers: fp8 weights on a GPU with fp8 tensor cores compute at the fp8 peak
    (W8A8, as vLLM does on Hopper and Ada). fp8 weights on a GPU without fp8 (A100) *fall back* to weight-only
    fp8 (vLLM's Marlin path): one byte per weight, bf16 compute plus ``dequant_overhead``; int8 and int4 are
    weight-only likewise. ``compute_dtype`` and ``weight_only`` tell which case applies.

    Every ``StepShape`` field may be a numpy array (many steps at once): the same expression is evaluated, with
    ``np.maximum`` for arrays and the built-in ``max`` for scalars (both the IEEE maximum), so the two forms are
    bit-identical. A scalar shape gives a Python float.
    """

    model: ModelSpec  # anything sim.hardware.models.resolve_model accepts (a preset name, a config) is resolved
    gpu: GPUSpec  # anything sim.hardware.gpu.resolve_gpu accepts (a preset name, a mapping of fields) is resolved
    weight_dtype: str = "bf16"
    kv_dtype: str = "auto"  # "auto": the model's activation dtype
    tensor_parallel_size: int = 1
    block_size: int = 16  # tokens per KV block, for swap traffic
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY  # fraction of the dense peak FLOP/s matmuls achieve
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY  # fraction of HBM (and NVLink) bandwidth achieved
    attention_efficiency: float | None = None  # fraction of peak attention kernels achieve; None: compute_eff.
    step_overhead: float = DEFAULT_STEP_OVERHEAD  # s per step
    per_request_overhead: float = DEFAULT_PER_REQUEST_OVERHEAD  # s per row per step
    dequant_overhead: float = DEFAULT_DEQUANT_OVERHEAD  # fraction added to weight-only quantized matmul time
    # share of bandwidth_efficiency at which a weight-only quantized model's weights stream through its dequantizing
    # kernels (1: as fast as unquantized weights; TORCH_WEIGHT_ONLY_BANDWIDTH: PyTorch's). Dense weights: MoE
    # experts, read by other kernels, keep the full rate
    weight_only_bandwidth: float = 1.0
    allreduce_latency: float = DEFAULT_ALLREDUCE_LATENCY  # s per all-reduce (tp > 1 only)
    # host (CPU) seconds per second of GPU work that the GPU waits for (sim/engines/costs.py: vLLM 0.5 and 0.6);
    # 0: the host work overlaps the GPU, as in an engine without a synchronous CPU loop. A step of prompts alone
    # waits for its rows' decode step's host time instead (``_prefill_host``), and so does a step mixing prompt
    # tokens and decode rows where that host time is capped (``host_time_cap``: V0 on one GPU)
    host_time_ratio: float = 0.0
    # a step without prompt tokens waits for at most this many host seconds, plus ``host_time_cap_per_row`` a row,
    # where its ``host_time_ratio`` share would be more: the ratio comes from runs of large batches, and V0's host
    # work is per step and per row, not per second of GPU time (sim/engines/vllm_v0.py). Both 0: no cap
    host_time_cap: float = 0.0
    host_time_cap_per_row: float = 0.0
    # SM clock as a share of its full rate: below 1 when a power cap (deployment.power_limit_w) runs the clocks
    # down (sim/costs/energy.py). It divides the compute side of each roofline part; HBM bandwidth keeps its clock
    compute_clock: float = 1.0
    # share of a step's decode compute (one token per row, up to the weight reads' time) that runs under the weight
    # reads: 1, the roofline's max(); 0, added to it, as an engine whose decode GEMMs do not overlap their loads and
    # their arithmetic (sim/engines/vllm_v1.py). A prompt's further tokens keep the max: GEMMs of many rows overlap
    linear_overlap: float = 1.0
    # seconds per logit (sampled row x vocabulary entry) the sampler spends filtering top-p/top-k by sorting the
    # whole vocabulary on the GPU (sim/engines/sampling.py): 0 where the rows sample greedily, without top-p/top-k,
    # or through a kernel that does not sort. Memory-bound GPU work, paid by every row of every step, a CUDA-graph
    # step's padding rows too (vLLM samples only the real ones: at most 7 or 15 rows, about 1% of such a step)
    sampler_sort_time: float = 0.0
    # host seconds per token of the step's rows' contexts (``kv_read_tokens``) that the engine spends building its
    # sampler's penalty inputs each step (sim/engines/sampling.py, ``PENALTY_HOST_TIME``): CPU work the GPU's
    # forward of the same step runs under, so the step waits for the larger of the two. 0: no penalties
    penalty_host_time: float = 0.0
    # a step with prompts runs them in a forward of their own before the step's decode forward: each prompt's
    # tokens less its last (TurboMind's ContextDecode, no logits), its last token then decoded with every row, so
    # its first token costs both (sim/engines/lmdeploy.py, version 0.1). False: one forward of every token
    context_decode_pass: bool = False
    # the per-row overhead (``per_request_overhead`` x rows) is GPU work the roofline does not itemize, which the
    # power model counts HBM-busy (``busy_times``), not host time the GPU waits through at static power: an engine
    # whose host work runs beside the GPU's (vLLM V1, sim/engines/vllm_v1.py). False: the GPU waits through it
    per_request_busy: bool = False

    # Derived in __post_init__.
    compute_dtype: str = field(init=False)  # dtype of the linear layers' arithmetic
    weight_only: bool = field(init=False)  # quantized weights dequantized to compute_dtype inside the GEMM
    _k: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _flops: tuple[int, int, int] = field(init=False, repr=False, compare=False)
    _peak: float = field(init=False, repr=False, compare=False)
    _moe: tuple[float, int, int] | None = field(init=False, repr=False, compare=False)
    _serial: float = field(init=False, repr=False, compare=False)  # 1 - linear_overlap
    _sort_row: float = field(init=False, repr=False, compare=False)  # sampler_sort_time x vocabulary, s per row
    _head: tuple[float, float, float] = field(init=False, repr=False, compare=False)  # lm_head_time's terms
    _decode_cache: dict[int, tuple[float, float, int | float]] = field(init=False, repr=False, compare=False)
    _cap: tuple[float, float] | None = field(init=False, repr=False, compare=False)  # the two caps, or None: none

    def __post_init__(self) -> None:
        m, g = resolve_model(self.model), resolve_gpu(self.gpu)
        wd = canonical_dtype(self.weight_dtype)
        kd = resolve_kv_dtype(self.kv_dtype, wd)
        tp = check_tensor_parallel(m, self.tensor_parallel_size)
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {v}")
        attn_eff = self.compute_efficiency if self.attention_efficiency is None else self.attention_efficiency
        if not 0.0 < attn_eff <= 1.0:
            raise ValueError(f"attention_efficiency must be in (0, 1], got {attn_eff}")
        for name in ("step_overhead", "per_request_overhead", "dequant_overhead", "allreduce_latency",
                     "host_time_ratio", "sampler_sort_time", "host_time_cap", "host_time_cap_per_row",
                     "penalty_host_time"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.compute_clock <= 1.0:
            raise ValueError(f"compute_clock must be in (0, 1], got {self.compute_clock}")
        if not 0.0 < self.weight_only_bandwidth <= 1.0:
            raise ValueError(f"weight_only_bandwidth must be in (0, 1], got {self.weight_only_bandwidth}")
        if not 0.0 <= self.linear_overlap <= 1.0:
            raise ValueError(f"linear_overlap must be in [0, 1], got {self.linear_overlap}")

        act = activation_dtype(wd)
        if wd in ("fp32", "bf16", "fp16"):
            cd, weight_only = wd, False
        elif wd == "fp8" and g.peak("fp8") > 0:
            cd, weight_only = "fp8", False
        else:  # int8 / int4 weight-only, or fp8 on a GPU without fp8 tensor cores
            cd, weight_only = act, True
        peak_lin = g.peak(cd)
        peak_attn = g.peak(act)
        if peak_lin <= 0 or peak_attn <= 0:
            raise ValueError(f"GPU {g.name} has no {cd if peak_lin <= 0 else act} peak FLOP/s in its spec")

        s = m.shard(tp)
        act_b = DTYPE_BITS[act] / 8
        bw = g.mem_bandwidth * self.bandwidth_efficiency
        share = CDNA3_MATMUL_SHARE.get(g.name, 1.0)  # bf16/fp16 matmuls on a GPU below the default's basis
        t_flop_lin = (1.0 + (self.dequant_overhead if weight_only else 0.0)) / (
            peak_lin * self.compute_efficiency * (share if cd in ("bf16", "fp16") else 1.0))
        t_flop_attn = 1.0 / (peak_attn * attn_eff)
        if self.compute_clock != 1.0:  # a capped GPU's slower SM clock (uncapped: the times as they always were)
            t_flop_lin /= self.compute_clock
            t_flop_attn /= self.compute_clock
        h, hd = m.hidden_size, m.head_dim
        n_up = 2 if m.mlp == "gated" else 1
        # inputs + outputs of each matmul of one layer, per token (elementwise kernels assumed fused)
        per_expert = max(1, s.experts_per_tok)  # MoE: a token's activations pass through its k experts
        layer_act = (h + (s.num_attention_heads + 2 * s.num_key_value_heads) * hd  # qkv
                     + s.num_attention_heads * hd + h  # o
                     + (h + n_up * s.intermediate_size  # up (and gate)
                        + s.intermediate_size + h) * per_expert)  # down
        act_bytes_token = m.num_layers * layer_act * act_b
        act_bytes_row = m.word_embed_proj_dim * act_b + s.vocab_size * 4  # LM head input, fp32 logits
        kv_token = m.kv_elements_per_token(tp) * kv_dtype_bytes(kd)
        if tp > 1:
            link = g.nvlink_bandwidth * self.bandwidth_efficiency if g.nvlink_bandwidth > 0 else g.pcie_bandwidth
            n_ar = 2 * m.num_layers
            ar_const = n_ar * self.allreduce_latency
            ar_token = n_ar * (2.0 * (tp - 1) / tp) * h * act_b / link
        else:
            ar_const = ar_token = 0.0
        lin_token = 2.0 * s.active_body_params * t_flop_lin
        if s.unquantized_params and wd not in ("fp32", "bf16", "fp16"):
            # a quantized checkpoint's unconverted matmuls (sim/hardware/quant.py) compute in the activation dtype
            t_flop_act = 1.0 / (peak_attn * self.compute_efficiency * share * self.compute_clock)
            lin_token = 2.0 * ((s.active_body_params - s.unquantized_params) * t_flop_lin
                               + s.unquantized_params * t_flop_act)
        sort_row = self.sampler_sort_time * m.vocab_size  # the sampler's sort sees the whole vocabulary on each GPU
        k: tuple[float, ...] = (
            self.step_overhead,  # 0: s per step
            self.per_request_overhead + sort_row,  # 1: s per row (+ 0.0 without a sort: the same float)
            lin_token,  # 2: linear compute, s per token (MoE: its k experts)
            2.0 * s.lm_head_params * t_flop_lin,  # 3: LM head compute, s per row
            s.weight_bytes_read_per_step(wd) / (bw * self.weight_only_bandwidth if weight_only else bw),  # 4: weights
            act_bytes_token / bw,  # 5: activations, s per token
            act_bytes_row / bw,  # 6: LM head activations, s per row
            _attn_flops_per_pair(m, s.num_attention_heads) * t_flop_attn,  # 7: attention, s per pair
            kv_token / bw,  # 8: KV read or written, s per token
            ar_const,  # 9: all-reduce latency, s per step
            ar_token,  # 10: all-reduce transfer, s per token
            self.block_size * kv_token / g.pcie_bandwidth,  # 11: swap, s per block
        )
        if self.host_time_ratio > 0:  # every GPU part stretched by the host time it waits for; overheads as they are
            stretch = 1.0 + self.host_time_ratio
            k = k[:2] + tuple(x * stretch for x in k[2:])
        object.__setattr__(self, "model", m)
        object.__setattr__(self, "gpu", g)
        object.__setattr__(self, "weight_dtype", wd)
        object.__setattr__(self, "kv_dtype", kd)
        object.__setattr__(self, "compute_dtype", cd)
        object.__setattr__(self, "weight_only", weight_only)
        object.__setattr__(self, "_k", k)
        body, head = m.shard(1).active_body_params, m.shard(1).lm_head_params
        # MoE: seconds to read one expert of every layer, experts per layer, experts per token (sim/hardware/moe.py)
        moe = (s.expert_bytes(wd) / bw * (1.0 + self.host_time_ratio), s.num_experts, s.experts_per_tok) \
            if s.num_experts else None
        object.__setattr__(self, "_moe", moe)
        object.__setattr__(self, "_serial", 1.0 - self.linear_overlap)
        object.__setattr__(self, "_sort_row", sort_row)
        # the LM head's own weights (read in the activation dtype, as weight_bytes_read_per_step counts them), its
        # FLOPs and its input and logits per row (k[3], k[6], stretched with the rest): lm_head_time
        head_w = s.lm_head_params * act_b / bw * (1.0 + self.host_time_ratio)
        object.__setattr__(self, "_head", (head_w, k[3], k[6]))
        capped = self.host_time_ratio > 0 and (self.host_time_cap > 0 or self.host_time_cap_per_row > 0)
        object.__setattr__(self, "_cap", (self.host_time_cap, self.host_time_cap_per_row) if capped else None)
        object.__setattr__(self, "_decode_cache", {})  # _decode_terms's, per row count
        object.__setattr__(self, "_flops", (2 * body, 2 * head, m.attn_flops_per_pair))
        object.__setattr__(self, "_peak", peak_lin * tp)

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of the linear layers' compute dtype, summed over the tensor-parallel GPUs."""
        return self._peak

    def lm_head_time(self, rows: Any) -> Any:
        """Seconds of a step's LM head for ``rows`` sampled rows, the sampler's sort included: its weights read once
        or its FLOPs, whichever binds, plus its input and logits per row. Part of ``step_time``; a pipeline's last
        stage computes it alone (sim/serving/pipeline.py)."""
        w, flop, act = self._head
        mx = np.maximum if isinstance(rows, np.ndarray) else max
        return mx(rows * flop, w + rows * act) + rows * self._sort_row

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token on one GPU."""
        return self.model.kv_elements_per_token(self.tensor_parallel_size) * kv_dtype_bytes(self.kv_dtype)

    def _time(self, n_seqs: Any, n_tok: Any, kv_read: Any, pairs: Any, swap: Any,
              mx: Callable[[Any, Any], Any]) -> Any:
        # The one place the step time's arithmetic is written: scalars (mx=max) and arrays (mx=np.maximum) go
        # through the same operations in the same order, so both forms round identically.
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        lin_c, lin_m = n_tok * k2 + n_seqs * k3, k4 + n_tok * k5 + n_seqs * k6
        lin = mx(lin_c, lin_m)  # linear layers: compute | memory
        if self._serial:  # one token per row's compute (a decode's GEMM rows) not under the weight reads
            lin = lin + self._serial * (np.minimum if mx is np.maximum else min)(n_seqs * k2 + n_seqs * k3, lin_m)
        if self.penalty_host_time:  # the forward runs under the host's penalty inputs (``penalty_host_time``)
            return k0 + n_seqs * k1 + mx(lin + mx(pairs * k7, (kv_read + n_tok) * k8) + (k9 + n_tok * k10)
                                         + swap * k11, kv_read * self.penalty_host_time)
        return (k0 + n_seqs * k1  # fixed and per-row overhead
                + lin
                + mx(pairs * k7, (kv_read + n_tok) * k8)  # attention: compute | KV traffic
                + (k9 + n_tok * k10)  # tensor-parallel all-reduces
                + swap * k11)  # swap copies over PCIe

    def _time_moe(self, n_seqs: Any, n_tok: Any, kv_read: Any, pairs: Any, swap: Any) -> Any:
        # _time with the experts a step reads (sim.hardware.moe.expected_experts) on the memory side of the linear
        # layers;
        # numpy for scalars and arrays alike, so both round identically
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        per_expert, num_experts, top_k = self._moe  # type: ignore[misc]
        experts = expected_experts(num_experts, top_k, n_tok) * per_expert
        lin_c, lin_m = n_tok * k2 + n_seqs * k3, k4 + experts + n_tok * k5 + n_seqs * k6
        lin = np.maximum(lin_c, lin_m)
        if self._serial:
            lin = lin + self._serial * np.minimum(n_seqs * k2 + n_seqs * k3, lin_m)
        if self.penalty_host_time:
            return k0 + n_seqs * k1 + np.maximum(lin + np.maximum(pairs * k7, (kv_read + n_tok) * k8)
                                                 + (k9 + n_tok * k10) + swap * k11, kv_read * self.penalty_host_time)
        return (k0 + n_seqs * k1
                + lin
                + np.maximum(pairs * k7, (kv_read + n_tok) * k8)
                + (k9 + n_tok * k10)
                + swap * k11)

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
        t = self._gpu_times(shape)[2]
        h = shape.host_load_time
        return t + h if h else t

    def _gpu_times(self, shape: StepShape) -> tuple[Any, Any, Any]:
        """The step's time as one forward, after ``context_decode_pass``'s second forward, and after a step of
        prompts alone is given its decode step's host time (``host_time_ratio``): ``breakdown`` shows each change."""
        a, b, c, d, e = shape.num_seqs, shape.num_tokens, shape.kv_read_tokens, shape.attn_pairs, shape.swap_blocks
        nd = np.ndarray
        array = a.__class__ is nd or b.__class__ is nd or c.__class__ is nd or d.__class__ is nd or e.__class__ is nd
        if self._moe is not None:
            t = self._time_moe(a, b, c, d, e)
            t = t if array else float(t)
        elif array:
            t = self._time(a, b, c, d, e, np.maximum)
        else:
            t = float(self._time(a, b, c, d, e, max))
        one = t
        if self.context_decode_pass:
            t = self._two_passes(a, b, c, d, e, t, array)
        two = t
        if self.host_time_ratio > 0:
            # a row verifying drafts (sim/serving/spec_decode.py) computes k + 1 tokens and is left out of
            # num_decode_seqs, but it is a decode row: a step of them alone is not a step of prompts
            dec = shape.num_decode_seqs + shape.num_spec_seqs
            # with decode rows too (chunked prefill's mixed steps) where that host time is capped (V0 on one GPU)
            mixed = self._cap is not None
            if array:
                t = np.where(((np.asarray(dec) == 0) | mixed) & (np.asarray(b) > np.asarray(a)),
                             self._prefill_host(a, c, e, t, True), t)
            elif (dec == 0 or mixed) and b > a:
                t = float(self._prefill_host(a, c, e, t, False))
            if self._cap is not None:  # a step without prompt tokens: its host time capped
                if array:
                    t = np.where(np.asarray(b) <= np.asarray(a), self._capped(t, a, np.minimum), t)
                elif b <= a:
                    t = float(self._capped(t, a, min))
        return one, two, t

    def _capped(self, t: Any, n: Any, mn: Callable[[Any, Any], Any]) -> Any:
        """A step of ``n`` rows stretched as a whole (``t = overheads + (1 + r) x GPU time``) whose host time is at
        most ``host_time_cap`` (``_cap``): the overheads, the GPU time, and the smaller of the two host times. The
        one place this is written, for ``_gpu_times`` and the decode loop alike (``mn``: min or np.minimum)."""
        cap = self._cap
        assert cap is not None
        o = self._k[0] + n * self._k[1]
        return mn(t, o + (t - o) / (1.0 + self.host_time_ratio) + (cap[0] + n * cap[1]))

    def _two_passes(self, a: Any, b: Any, c: Any, d: Any, e: Any, t: Any, array: bool) -> Any:
        """A step with prompt tokens (``b > a``) under ``context_decode_pass``: the decode forward of every row
        (one token each; the step's attention, reads and swaps) plus the prompts' forward of their other ``b - a``
        tokens (its linear layers, KV writes and all-reduces; the step's fixed overhead counted once)."""
        mx = np.maximum if array else max
        if self._moe is not None:
            two = self._time_moe(a, a, c, d, e) + self._time_moe(0, b - a, 0, 0, 0) - self._k[0]
        else:
            two = self._time(a, a, c, d, e, mx) + self._time(0, b - a, 0, 0, 0, mx) - self._k[0]
        if array:
            return np.where(np.asarray(b) > np.asarray(a), two, t)
        return float(two) if b > a else t

    def _prefill_host(self, a: Any, c: Any, e: Any, t: Any, array: bool) -> Any:
        """A step of prompts alone (no decode row) under ``host_time_ratio``: its GPU time unstretched, plus the host
        time of the decode step of the same rows (``a`` rows attending the same ``c`` tokens, ``e`` swapped blocks).
        ``t`` is the step stretched as a whole, ``overheads + (1 + r) x GPU time``, so its GPU time is recovered by
        taking the overheads out and dividing. V0's host work is per step and per sequence (scheduling, input
        preparation, sampling, output processing), and the profiles the ratio comes from timed it on decode steps
        (sim/engines/costs.py): a prompt's thousand tokens of compute add none of it."""
        o = self._k[0] + a * self._k[1]
        r = self.host_time_ratio
        if self._moe is not None:
            td = self._time_moe(a, a, c, c, e)
        else:
            td = self._time(a, a, c, c, e, np.maximum if array else max)
        host = r * ((td - o) / (1.0 + r))
        if self._cap is not None:  # that decode step's host time, capped as the decode step's is
            host = (np.minimum if array else min)(host, self._cap[0] + a * self._cap[1])
        return o + (t - o) / (1.0 + r) + host

    def decode_steps(self, rows: Sequence[int], reads: Sequence[int],
                     longest: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """Times and FLOPs of unpadded one-token-per-row steps (``rows[i]`` rows attending ``reads[i]`` tokens):
        ``step_time``/``step_flops`` of those shapes, written out for the simulator's decode loop. The expression
        and its order are ``_time``'s, so the results are bit-identical. (``longest``, each step's longest decode
        context, does not enter the roofline: a GPU's paged decode kernel reads each row's own context.)"""
        if self._moe is not None:  # the experts read grow with the rows: priced through step_time
            return CostModel.decode_steps(self, rows, reads, longest)
        if rows and rows.count(rows[0]) == len(rows):  # one row count: a stretch without departures
            return self._decode_run(rows[0], reads)
        # runs of equal row counts (members leave between them), each priced as one
        times: list[float] = []
        flops: list[float] = []
        i = 0
        for n, run in groupby(rows):
            j = i + len(list(run))
            t, f = self._decode_run(n, reads[i:j])
            times += t
            flops += f
            i = j
        return times, flops

    def _decode_run(self, n: int, reads: Sequence[int]) -> tuple[list[float], list[float]]:
        """``decode_steps`` of steps that all have ``n`` rows: the terms of ``n`` as locals, no lookup per step.
        ``+ 0 * k11`` (no swap) adds +0.0, which changes no float, so it is left out."""
        k7, k8 = self._k[7], self._k[8]
        f_pair = self._flops[2]
        head, tail, f_rows = self._decode_terms(n)
        pen = self.penalty_host_time
        if pen:  # ``_time``'s form with the host's penalty inputs: the overheads, then the larger of the two
            o, lin = self._k[0] + n * self._k[1], self._linear(n)
            times = [o + max(lin + max(c * k7, (c + n) * k8) + tail, c * pen) for c in reads]
        elif k8 >= k7:
            # the attention term max(c * k7, (c + n) * k8) is the memory one for every c, n >= 0 (a decode's
            # query-key pairs are its KV reads): max() would return exactly that product, so it is skipped
            times = [head + (c + n) * k8 + tail for c in reads]
        else:
            times = [head + max(c * k7, (c + n) * k8) + tail for c in reads]
        if self._cap is not None:
            times = [self._capped(t, n, min) for t in times]
        if reads.__class__ is range and f_rows.__class__ is int and f_pair.__class__ is int and f_pair > 0:
            # integers in arithmetic progression stay one: the exact sums f_rows + c * f_pair for every c, as a
            # range, each made a float as float() makes it
            r = reads
            return times, list(map(float, range(f_rows + r.start * f_pair, f_rows + r.stop * f_pair,
                                                r.step * f_pair)))
        return times, [float(f_rows + c * f_pair) for c in reads]

    def _decode_terms(self, n: int) -> tuple[float, float, int | float]:
        """The parts of an unpadded decode step of ``n`` rows that depend on ``n`` alone, in ``_time``'s order
        (fixed and per-row overhead + linear layers; the all-reduces) and its FLOPs without attention: kept per
        ``n``, as the decode loop asks for the same few counts again and again."""
        got = self._decode_cache.get(n)
        if got is None:
            k = self._k
            f_tok, f_row, _ = self._flops
            got = (k[0] + n * k[1] + self._linear(n), k[9] + n * k[10], (n - 0) * f_tok + n * f_row)
            self._decode_cache[n] = got
        return got

    def decode_step_time(self, n: int, c: int) -> float:
        """One unpadded decode step's time (``decode_steps`` for a single step, without the lists)."""
        if self._moe is not None or self.penalty_host_time:
            return float(self.step_time(StepShape(n, n, n, c, c)))  # (the penalty: _decode_run's form)
        k = self._k
        head, tail, _ = self._decode_terms(n)
        t = head + max(c * k[7], (c + n) * k[8]) + tail
        return t if self._cap is None else self._capped(t, n, min)

    def _linear(self, n: int) -> float:
        """The linear layers' time of a decode step of ``n`` rows (``_time``'s term, the same floats)."""
        k = self._k
        lin_c, lin_m = n * k[2] + n * k[3], k[4] + n * k[5] + n * k[6]
        lin = max(lin_c, lin_m)
        return lin + self._serial * min(lin_c, lin_m) if self._serial else lin

    def breakdown(self, shape: StepShape) -> dict[str, Any]:
        """The step time's parts in seconds (they sum to ``step_time`` up to rounding) and, for the two roofline
        parts, whether compute (True) or memory traffic (False) bounds them. For teaching and debugging.
        ``decode_pass``: what ``context_decode_pass``'s second forward adds to a step with prompt tokens (LMDeploy
        0.1); ``prompt_host``: what a step of prompts alone (or, capped, mixed with decodes) changes under
        ``host_time_ratio`` (vLLM V0), its GPU parts unstretched plus its decode step's host time, and what
        ``host_time_cap`` takes off a step without prompt tokens, negative as it is less than the stretch above it;
        ``host_load``: the shape's ``host_load_time``. Each is 0 where it does not apply."""
        a, b, c, d, e = shape.num_seqs, shape.num_tokens, shape.kv_read_tokens, shape.attn_pairs, shape.swap_blocks
        one, two, hosted = self._gpu_times(shape)
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        lin_c, lin_m = b * k2 + a * k3, k4 + b * k5 + a * k6
        if self._moe is not None:
            lin_m = lin_m + expected_experts(self._moe[1], self._moe[2], b) * self._moe[0]
        att_c, att_m = d * k7, (c + b) * k8
        return {
            "overhead": k0 + a * k1,
            "linear": np.maximum(lin_c, lin_m) + self._serial * np.minimum(a * k2 + a * k3, lin_m),
            "attention": np.maximum(att_c, att_m),
            "allreduce": k9 + b * k10,
            "swap": e * k11,
            "decode_pass": two - one,
            "prompt_host": hosted - two,
            "host_load": shape.host_load_time,
            "linear_compute_bound": np.greater_equal(lin_c, lin_m),
            "attention_compute_bound": np.greater_equal(att_c, att_m),
        }

    def busy_times(self, shape: StepShape) -> tuple[np.ndarray, np.ndarray]:
        """Seconds one GPU's arithmetic units and its memory are busy in each step of ``shape`` (array fields):
        the compute and the memory side of the two roofline parts, summed (the step time takes the larger of each
        pair; the power model, sim/costs/energy.py, needs both). Overheads, all-reduces and swaps busy neither, nor does
        the host time the GPU parts are stretched by (``host_time_ratio``): the GPU waits then, at static power. With
        ``per_request_busy`` the per-row overhead keeps HBM busy (GPU work the roofline does not itemize)."""
        a, b, c, d = (np.asarray(x, dtype=np.float64) for x in (shape.num_seqs, shape.num_tokens,
                                                                shape.kv_read_tokens, shape.attn_pairs))
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        memory = k4 + b * k5 + a * k6 + (c + b) * k8
        stretch = 1.0 + self.host_time_ratio
        if self._sort_row:  # the sampler's sort streams the logits through HBM; priced in k1, not stretched, so
            memory = memory + a * self._sort_row * stretch  # its whole time stays after the division below
        if self._moe is not None:
            memory = memory + expected_experts(self._moe[1], self._moe[2], b) * self._moe[0]
        if self.per_request_busy:  # not stretched (an overhead), so its whole time stays after the division below
            memory = memory + a * self.per_request_overhead * stretch
        return (b * k2 + a * k3 + d * k7) / stretch, memory / stretch

    @property
    def flops_per_unit(self) -> tuple[int, int, int]:
        """Model FLOPs per non-padding token, per row (LM head) and per query-key pair, all GPUs (``step_flops``'s
        terms): the power model recovers a step's query-key pairs from its recorded FLOPs with them."""
        return self._flops

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        """Useful FLOPs of the step over all GPUs: linear layers for the non-padding tokens, the LM head for every
        row, and attention for ``attn_pairs``. Tensor-parallel replication of KV projections is not counted."""
        f_tok, f_row, f_pair = self._flops
        a, b, p, d = shape.num_seqs, shape.num_tokens, shape.num_padding_tokens, shape.attn_pairs
        r = (b - p) * f_tok + a * f_row + d * f_pair
        return r if is_array(a, b, p, d) else float(r)

