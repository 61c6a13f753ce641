"""Cost models: how long one step of a batch takes on a device.

A cost model sees a step through ``StepShape``, a handful of integer aggregates of the batch. Every field may
also be a numpy array, one entry per step: the simulator's decode fast-forward asks for many successive steps at
once, and the same arithmetic then gives bit-identical times to asking one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.hardware.dtypes import DTYPE_BITS, activation_dtype, canonical_dtype, kv_dtype_bytes, resolve_kv_dtype
from sim.hardware.gpu import GPUSpec, resolve_gpu
from sim.hardware.mla import mla_attn_flops_per_pair
from sim.hardware.models import ModelSpec, check_tensor_parallel, is_model_preset, read_json_file, resolve_model
from sim.hardware.moe import expected_experts


@dataclass(slots=True)
class StepShape:
    """What a step's duration depends on. Padding rows and tokens (static batching) are included: the GPU
    computes them even though nobody receives their output."""

    num_seqs: int | np.ndarray  # rows in the batch, padding rows included
    num_tokens: int | np.ndarray  # new tokens computed (prefill + decode + padding): drives the linear layers
    num_decode_seqs: int | np.ndarray  # rows computing exactly one token
    kv_read_tokens: int | np.ndarray  # sum over rows of tokens attended (cached context + new): KV bytes read
    attn_pairs: int | np.ndarray  # sum over rows of q*c + q*(q+1)/2 (causal query-key pairs): attention FLOPs
    num_padding_tokens: int | np.ndarray = 0  # of num_tokens, how many are padding (wasted work)
    swap_blocks: int | np.ndarray = 0  # KV blocks copied between GPU and CPU memory this step (out + in)
    # seconds the executor idled just before this step (0: it starts where the previous step ended). A real
    # engine pays a wake-up after idling (the OS's timer slack, a CPU or GPU leaving its power-saving state,
    # cold caches) that grows with the idle time; a fitted profile measures it
    idle_before: float | np.ndarray = 0.0
    # tokens attended by the longest decode row (its context + 1; 0: unknown). An engine whose decode attention
    # gathers every row padded to the longest context pays rows x this, not the sum of the contexts
    max_decode_len: int | np.ndarray = 0
    # speculative decoding (sim.serving.spec_decode): rows verifying draft tokens (each computes 1 + its drafts, counted
    # in num_tokens), the draft tokens of the step, and those rows' cached context. The target's cost model
    # prices the step as it is; sim.serving.spec_decode.SpecDecodeCost adds the proposer's time from these
    num_spec_seqs: int = 0
    num_draft_tokens: int = 0
    spec_context_tokens: int = 0
    # seconds of prefix blocks loaded back from the host-memory tier before the step (sim.serving.host_kv_tier): the
    # tier prices its own link, so every cost model adds it as it is
    host_load_time: float = 0.0


class CostModel(Protocol):
    """Predicts step times. Implementations: ``AnalyticCostModel`` (roofline from specs) and
    ``FittedCostModel`` (coefficients fitted to a real engine by calibration).

    ``step_time``, ``step_flops`` and ``peak_flops`` are required. ``decode_steps`` and ``decode_step_time`` are
    the simulator's decode fast path (``sim.serving.fast_path``); their defaults here price through ``step_time``, and
    a model overrides them only to be faster, never to give other numbers (the tests check bit-identity). A class
    that subclasses ``CostModel`` inherits the defaults; one that only has the required members gets them through
    ``optional_member``."""

    __slots__ = ()  # keeps the slots of the dataclasses that subclass it

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
        ...

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        """Useful floating-point operations of the step (padding excluded), for model FLOPs utilisation."""
        ...

    @property
    def peak_flops(self) -> float:
        """The device's peak dense FLOP/s for the model's compute dtype, summed over its shards."""
        ...

    def decode_steps(self, rows: list[int], reads: list[int],
                     longest: list[int] | None = None) -> tuple[list[float], list[float]]:
        """Times and FLOPs of unpadded one-token-per-row steps: ``rows[i]`` rows attending ``reads[i]`` tokens,
        the longest of them ``longest[i]`` (``StepShape.max_decode_len``; 0 when not given)."""
        ms = longest if longest is not None else [0] * len(rows)
        shapes = [StepShape(n, n, n, c, c, max_decode_len=m) for n, c, m in zip(rows, reads, ms, strict=True)]
        return [float(self.step_time(s)) for s in shapes], [float(self.step_flops(s)) for s in shapes]

    def decode_step_time(self, n: int, c: int) -> float:
        """One unpadded decode step's time: ``n`` rows attending ``c`` tokens."""
        return float(self.step_time(StepShape(n, n, n, c, c)))


def optional_member(cost: object, name: str) -> Any:
    """``cost``'s member ``name``, one of ``CostModel``'s members with a default; that default, bound to ``cost``,
    when ``cost`` implements the protocol without subclassing it and lacks the member (a test's few-line model)."""
    member = getattr(cost, name, None)
    return member if member is not None else getattr(CostModel, name).__get__(cost)


# ---------------------------------------------------------------------------------------------------------------
# Analytic (roofline) cost model

# Defaults of AnalyticCostModel, with their reasons.
# Large bf16 GEMMs reach 60-70% of the dense datasheet peak on Hopper and Ampere; a whole prefill, with its
# smaller projections and elementwise kernels, sits near the low end.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
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
# One all-reduce's fixed cost (NCCL or vLLM's custom all-reduce on NVLink: 5-20 us).
DEFAULT_ALLREDUCE_LATENCY = 1.0e-5  # s per all-reduce


def _attn_flops_per_pair(m: ModelSpec, heads: int) -> float:
    """Attention FLOPs per causal query-key pair of one GPU's ``heads`` heads, all layers (an exact integer as a
    float, so the product with the time per FLOP rounds as it always did). MLA: sim/hardware/mla.py."""
    if m.kv_lora_rank:
        return float(mla_attn_flops_per_pair(m, heads))
    return 4.0 * m.num_layers * heads * m.head_dim


def _is_array(*xs: Any) -> bool:
    for x in xs:
        if x.__class__ is np.ndarray:
            return True
    return False


@dataclass(frozen=True, slots=True)
class AnalyticCostModel(CostModel):
    """Step time from first principles: FLOPs and bytes moved against the GPU's peak rates.

    A step's time is a sum of per-part rooflines, each part bound by whichever of compute or memory it waits on:

        time = step_overhead + per_request_overhead * num_seqs
             + max(linear FLOPs / compute rate,    (linear weights + activations) / bandwidth)
             + max(attention FLOPs / compute rate, KV bytes read and written / bandwidth)
             + tensor-parallel all-reduces + swap copies over PCIe

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
    allreduce_latency: float = DEFAULT_ALLREDUCE_LATENCY  # s per all-reduce (tp > 1 only)
    # host (CPU) seconds per second of GPU work that the GPU waits for (sim/engines/costs.py: vLLM 0.5 and 0.6);
    # 0: the host work overlaps the GPU, as in an engine without a synchronous CPU loop
    host_time_ratio: float = 0.0
    # SM clock as a share of its full rate: below 1 when a power cap (deployment.power_limit_w) runs the clocks
    # down (sim/costs/energy.py). It divides the compute side of each roofline part; HBM bandwidth keeps its clock
    compute_clock: float = 1.0

    # Derived in __post_init__.
    compute_dtype: str = field(init=False)  # dtype of the linear layers' arithmetic
    weight_only: bool = field(init=False)  # quantized weights dequantized to compute_dtype inside the GEMM
    _k: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _flops: tuple[int, int, int] = field(init=False, repr=False, compare=False)
    _peak: float = field(init=False, repr=False, compare=False)
    _moe: tuple[float, int, int] | None = field(init=False, repr=False, compare=False)

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
                     "host_time_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.compute_clock <= 1.0:
            raise ValueError(f"compute_clock must be in (0, 1], got {self.compute_clock}")

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
        t_flop_lin = (1.0 + (self.dequant_overhead if weight_only else 0.0)) / (peak_lin * self.compute_efficiency)
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
        k: tuple[float, ...] = (
            self.step_overhead,  # 0: s per step
            self.per_request_overhead,  # 1: s per row
            2.0 * s.active_body_params * t_flop_lin,  # 2: linear compute, s per token (MoE: its k experts)
            2.0 * s.lm_head_params * t_flop_lin,  # 3: LM head compute, s per row
            s.weight_bytes_read_per_step(wd) / bw,  # 4: weights, s per step
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
        object.__setattr__(self, "_flops", (2 * body, 2 * head, m.attn_flops_per_pair))
        object.__setattr__(self, "_peak", peak_lin * tp)

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of the linear layers' compute dtype, summed over the tensor-parallel GPUs."""
        return self._peak

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token on one GPU."""
        return self.model.kv_elements_per_token(self.tensor_parallel_size) * kv_dtype_bytes(self.kv_dtype)

    def _time(self, n_seqs: Any, n_tok: Any, kv_read: Any, pairs: Any, swap: Any,
              mx: Callable[[Any, Any], Any]) -> Any:
        # The one place the step time's arithmetic is written: scalars (mx=max) and arrays (mx=np.maximum) go
        # through the same operations in the same order, so both forms round identically.
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        return (k0 + n_seqs * k1  # fixed and per-row overhead
                + mx(n_tok * k2 + n_seqs * k3, k4 + n_tok * k5 + n_seqs * k6)  # linear layers: compute | memory
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
        return (k0 + n_seqs * k1
                + np.maximum(n_tok * k2 + n_seqs * k3, k4 + experts + n_tok * k5 + n_seqs * k6)
                + np.maximum(pairs * k7, (kv_read + n_tok) * k8)
                + (k9 + n_tok * k10)
                + swap * k11)

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
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
        h = shape.host_load_time
        return t + h if h else t

    def decode_steps(self, rows: list[int], reads: list[int],
                     longest: list[int] | None = None) -> tuple[list[float], list[float]]:
        """Times and FLOPs of unpadded one-token-per-row steps (``rows[i]`` rows attending ``reads[i]`` tokens):
        ``step_time``/``step_flops`` of those shapes, written out for the simulator's decode loop. The expression
        and its order are ``_time``'s, so the results are bit-identical. (``longest``, each step's longest decode
        context, does not enter the roofline: a GPU's paged decode kernel reads each row's own context.)"""
        if self._moe is not None:  # the experts read grow with the rows: priced through step_time
            return CostModel.decode_steps(self, rows, reads, longest)
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        f_tok, f_row, f_pair = self._flops
        # The parts that depend on the row count alone, once per count (a stretch has few), summed in _time's order.
        # ``+ 0 * k11`` (no swap) adds +0.0, which changes no float, so it is left out.
        counts = set(rows)
        head = {n: k0 + n * k1 + max(n * k2 + n * k3, k4 + n * k5 + n * k6) for n in counts}
        tail = {n: k9 + n * k10 for n in counts}
        f_rows = {n: (n - 0) * f_tok + n * f_row for n in counts}
        if k8 >= k7:
            # the attention term max(c * k7, (c + n) * k8) is the memory one for every c, n >= 0 (a decode's
            # query-key pairs are its KV reads): max() would return exactly that product, so it is skipped
            times = [head[n] + (c + n) * k8 + tail[n] for n, c in zip(rows, reads, strict=True)]
        else:
            times = [head[n] + max(c * k7, (c + n) * k8) + tail[n] for n, c in zip(rows, reads, strict=True)]
        flops = [float(f_rows[n] + c * f_pair) for n, c in zip(rows, reads, strict=True)]
        return times, flops

    def decode_step_time(self, n: int, c: int) -> float:
        """One unpadded decode step's time (``decode_steps`` for a single step, without the lists)."""
        if self._moe is not None:
            return float(self.step_time(StepShape(n, n, n, c, c)))
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        return (k0 + n * k1 + max(n * k2 + n * k3, k4 + n * k5 + n * k6) + max(c * k7, (c + n) * k8)
                + (k9 + n * k10))

    def breakdown(self, shape: StepShape) -> dict[str, Any]:
        """The step time's parts in seconds (they sum to ``step_time`` up to rounding) and, for the two roofline
        parts, whether compute (True) or memory traffic (False) bounds them. For teaching and debugging."""
        a, b, c, d, e = shape.num_seqs, shape.num_tokens, shape.kv_read_tokens, shape.attn_pairs, shape.swap_blocks
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        lin_c, lin_m = b * k2 + a * k3, k4 + b * k5 + a * k6
        if self._moe is not None:
            lin_m = lin_m + expected_experts(self._moe[1], self._moe[2], b) * self._moe[0]
        att_c, att_m = d * k7, (c + b) * k8
        return {
            "overhead": k0 + a * k1,
            "linear": np.maximum(lin_c, lin_m),
            "attention": np.maximum(att_c, att_m),
            "allreduce": k9 + b * k10,
            "swap": e * k11,
            "linear_compute_bound": np.greater_equal(lin_c, lin_m),
            "attention_compute_bound": np.greater_equal(att_c, att_m),
        }

    def busy_times(self, shape: StepShape) -> tuple[np.ndarray, np.ndarray]:
        """Seconds one GPU's arithmetic units and its memory are busy in each step of ``shape`` (array fields):
        the compute and the memory side of the two roofline parts, summed (the step time takes the larger of each
        pair; the power model, sim/costs/energy.py, needs both). Overheads, all-reduces and swaps busy neither, nor does
        the host time the GPU parts are stretched by (``host_time_ratio``): the GPU waits then, at static power."""
        a, b, c, d = (np.asarray(x, dtype=np.float64) for x in (shape.num_seqs, shape.num_tokens,
                                                                shape.kv_read_tokens, shape.attn_pairs))
        k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11 = self._k
        memory = k4 + b * k5 + a * k6 + (c + b) * k8
        if self._moe is not None:
            memory = memory + expected_experts(self._moe[1], self._moe[2], b) * self._moe[0]
        stretch = 1.0 + self.host_time_ratio
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
        return r if _is_array(a, b, p, d) else float(r)


# ---------------------------------------------------------------------------------------------------------------
# Fitted cost model

PROFILE_SCHEMA_VERSION = 2
SUPPORTED_PROFILE_VERSIONS = (1, 2)  # version 2 added the optional calibration record (samples, fit, overheads)
COEFFICIENT_NAMES = ("step", "token", "decode_seq", "seq", "attn_pair", "kv_read_token", "swap_block", "prefill_seq",
                     "decode_pad_token")


class ProfileCoefficients(BaseModel):
    """Seconds per unit of each ``StepShape`` aggregate; all >= 0, absent ones are 0."""

    model_config = ConfigDict(extra="forbid")
    step: float = Field(0.0, ge=0, description="s per step (fixed overhead)")
    token: float = Field(0.0, ge=0, description="s per new token computed (num_tokens)")
    decode_seq: float = Field(0.0, ge=0, description="s per decode row (num_decode_seqs)")
    seq: float = Field(0.0, ge=0, description="s per row (num_seqs)")
    attn_pair: float = Field(0.0, ge=0, description="s per causal query-key pair (attn_pairs)")
    kv_read_token: float = Field(0.0, ge=0, description="s per token of KV read (kv_read_tokens)")
    swap_block: float = Field(0.0, ge=0, description="s per KV block swapped (swap_blocks)")
    prefill_seq: float = Field(0.0, ge=0, description="s per row that is not a decode (num_seqs - num_decode_seqs): "
                               "engines run each prompt chunk's attention on its own (schema version 2)")
    decode_pad_token: float = Field(0.0, ge=0, description="s per token of the padded decode batch (decode rows x "
                                    "max_decode_len): the decode attention's gather of every row padded to the "
                                    "longest context")


class ProfileFlops(BaseModel):
    """Model FLOPs per unit, for ``step_flops`` (model FLOPs utilisation)."""

    model_config = ConfigDict(extra="forbid")
    token: float = Field(0.0, ge=0, description="FLOPs per non-padding token (2 x body matmul params)")
    seq: float = Field(0.0, ge=0, description="FLOPs per row (2 x LM head params)")
    attn_pair: float = Field(0.0, ge=0, description="FLOPs per query-key pair (4 x layers x heads x head_dim)")


class CalibrationProfile(BaseModel):
    """The file ``FittedCostModel.from_profile`` reads (JSON)::

        {
          "schema_version": 1,
          "model": "llama-3.1-8b",            # preset name, or a Hugging Face config dict, or any label
          "device": "NVIDIA H200",            # free text
          "coefficients": {"step": 1.4e-3, "token": 2.0e-5, "decode_seq": 0.0, "seq": 8e-6,
                           "attn_pair": 1.1e-11, "kv_read_token": 4.0e-8, "swap_block": 6e-5},
          "peak_flops": 9.894e14,             # optional: FLOP/s of the device (all shards); 0 -> MFU is NaN
          "flops": {"token": ..., "seq": ..., "attn_pair": ...},   # optional; default from "model" when it is
                                                                   # a preset name or a config dict, else 0
          "provenance": {"date": "...", "torch": "...", "engine_commit": "...", "grid": "...", "rmse": ...},
          # version 2, all optional (written by `servesim calibrate`; step_time does not read them):
          "num_gpu_blocks": 2048,             # KV blocks the engine got for this model on this device
          "overheads": {"step": ..., "token": ..., "seq": ...},   # host-side share (scheduling, input, sampling)
          "fit": {"heldout": {"decode": {"n": ..., "median_abs": ...}, ...}, ...},   # fit quality per class
          "samples": [{"script": ..., "kind": ..., "num_seqs": ..., "duration": ...}, ...]   # the measurements
        }

    Coefficient units are seconds per unit (see ``ProfileCoefficients``); unknown keys are refused so that a
    misspelt coefficient cannot silently count as zero. Version 1 files (without the calibration record) load.
    """

    model_config = ConfigDict(extra="forbid")
    schema_version: int = PROFILE_SCHEMA_VERSION
    model: str | dict[str, Any] = ""
    device: str = ""
    coefficients: ProfileCoefficients
    peak_flops: float = Field(0.0, ge=0)
    flops: ProfileFlops | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)
    num_gpu_blocks: int | None = Field(None, ge=1, description="KV blocks the engine got (calibration record)")
    overheads: dict[str, float] = Field(default_factory=dict, description="host-side s per step, token, row")
    fit: dict[str, Any] = Field(default_factory=dict, description="fit method and held-out errors per class")
    samples: list[dict[str, Any]] = Field(default_factory=list, description="the measured steps")
    wake_curve: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[idle seconds, extra seconds] pairs, idle increasing from 0: how much longer a step takes "
        "after the engine idled that long (interpolated, flat past the last point); empty: no wake-up cost")

    token_curve: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[new tokens, extra seconds] pairs, tokens increasing from 1, the first extra 0: the linear "
        "layers' cost as a function of the step's new tokens beyond the linear `token` term (a CPU BLAS or a GPU "
        "kernel picks its tiling by the row count, so the cost climbs in stairs); interpolated, flat past the last "
        "point; empty: none")

    @field_validator("token_curve")
    @classmethod
    def _token_curve_ok(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if v:
            x = [p[0] for p in v]
            increasing = all(b > a for a, b in zip(x, x[1:], strict=False))
            if tuple(v[0]) != (1, 0) or not increasing or any(not p[1] >= 0 for p in v):
                raise ValueError("token_curve must start at [1, 0] with tokens increasing and extra times >= 0")
        return v

    @field_validator("wake_curve")
    @classmethod
    def _wake_curve_ok(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if v:
            idle = [p[0] for p in v]
            increasing = all(a < b for a, b in zip(idle, idle[1:], strict=False))
            if tuple(v[0]) != (0, 0) or not increasing or any(p[1] < 0 for p in v):
                raise ValueError("wake_curve must start at [0, 0] with idle increasing and extra times >= 0")
        return v


@dataclass(frozen=True, slots=True)
class FittedCostModel(CostModel):
    """Step time as a non-negative linear combination of the ``StepShape`` aggregates, with coefficients fitted
    to a real engine by calibration::

        time = step + token * num_tokens + decode_seq * num_decode_seqs + seq * num_seqs
             + attn_pair * attn_pairs + kv_read_token * kv_read_tokens + swap_block * swap_blocks
             + prefill_seq * (num_seqs - num_decode_seqs)
             (+ the wake-up curve at idle_before, when the profile has one)

    Scalar and array shapes give bit-identical results (the same expression). Load one with ``from_profile``;
    the file format is ``CalibrationProfile``.
    """

    step: float = 0.0  # s per step
    token: float = 0.0  # s per new token
    decode_seq: float = 0.0  # s per decode row
    seq: float = 0.0  # s per row
    attn_pair: float = 0.0  # s per causal query-key pair
    kv_read_token: float = 0.0  # s per token of KV read
    swap_block: float = 0.0  # s per KV block swapped
    prefill_seq: float = 0.0  # s per row that is not a decode (its own attention call)
    decode_pad_token: float = 0.0  # s per token of the padded decode batch (decode rows x longest decode context)
    peak_flops: float = 0.0  # FLOP/s of the device over all shards; 0: unknown (MFU reported as NaN)
    flops_per_token: float = 0.0  # model FLOPs per non-padding token
    flops_per_seq: float = 0.0  # model FLOPs per row (LM head)
    flops_per_attn_pair: float = 0.0  # model FLOPs per query-key pair
    model: str = ""
    device: str = ""
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    wake_idle: tuple[float, ...] = ()  # the wake-up curve: idle seconds (from 0, increasing) ...
    wake_extra: tuple[float, ...] = ()  # ... and the seconds a step then takes longer
    token_knots: tuple[float, ...] = ()  # the token curve: new tokens (from 1, increasing) ...
    token_extra: tuple[float, ...] = ()  # ... and the linear layers' seconds beyond the ``token`` term

    def __post_init__(self) -> None:
        for name in COEFFICIENT_NAMES + ("peak_flops", "flops_per_token", "flops_per_seq", "flops_per_attn_pair"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"FittedCostModel: {name} must be finite and >= 0, got {v}")
        for name in COEFFICIENT_NAMES:  # seconds per unit: past an hour a sum of steps could overflow to inf
            if getattr(self, name) > 3600:
                raise ValueError(f"FittedCostModel: coefficients.{name} must be at most 3600 s, "
                                 f"got {getattr(self, name)}")
        idle, extra = self.wake_idle, self.wake_extra
        if len(idle) != len(extra):
            raise ValueError("FittedCostModel: wake_curve needs one extra time per idle time")
        for i, (a, b) in enumerate(zip(idle, extra, strict=True)):
            if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and 0 <= b <= 3600):
                raise ValueError(f"FittedCostModel: wake_curve.{i} must be [idle seconds >= 0, extra seconds in "
                                 f"[0, 3600]], both finite, got [{a}, {b}]")
            if i and a < idle[i - 1]:
                raise ValueError(f"FittedCostModel: wake_curve.{i}: idle times must increase, got {a} after "
                                 f"{idle[i - 1]}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedCostModel:
        """From a parsed profile (see ``CalibrationProfile``)."""
        p = CalibrationProfile.model_validate(dict(data))
        if p.schema_version not in SUPPORTED_PROFILE_VERSIONS:
            raise ValueError(f"calibration profile schema_version {p.schema_version} is not supported "
                             f"(this servesim reads versions {', '.join(map(str, SUPPORTED_PROFILE_VERSIONS))})")
        if p.schema_version == 1 and (p.num_gpu_blocks is not None or p.overheads or p.fit or p.samples):
            raise ValueError("calibration profile schema_version 1 has no num_gpu_blocks, overheads, fit or samples "
                             "(those came with version 2)")
        flops = p.flops
        label = p.model if isinstance(p.model, str) else str(p.model.get("_name_or_path", "custom"))
        if flops is None:
            spec = None
            if isinstance(p.model, dict):
                spec = resolve_model(p.model)
            elif p.model and is_model_preset(p.model):  # else a free-text label: no model FLOPs
                spec = resolve_model(p.model)
            if spec is not None:
                s = spec.shard(1)
                flops = ProfileFlops(token=2.0 * s.active_body_params, seq=2.0 * s.lm_head_params,
                                     attn_pair=float(spec.attn_flops_per_pair))
            else:
                flops = ProfileFlops(token=0.0, seq=0.0, attn_pair=0.0)  # an unknown model: no FLOPs counted
        return cls(**p.coefficients.model_dump(), peak_flops=p.peak_flops, flops_per_token=flops.token,
                   flops_per_seq=flops.seq, flops_per_attn_pair=flops.attn_pair, model=label, device=p.device,
                   provenance=dict(p.provenance), wake_idle=tuple(float(a) for a, _ in p.wake_curve),
                   wake_extra=tuple(float(b) for _, b in p.wake_curve),
                   token_knots=tuple(float(a) for a, _ in p.token_curve),
                   token_extra=tuple(float(b) for _, b in p.token_curve))

    @classmethod
    def from_profile(cls, path: str | PathLike[str]) -> FittedCostModel:
        """Load a calibration profile JSON file (at most 64 MiB are read: /dev/zero is not a profile)."""
        data = read_json_file(path, 64 << 20)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a calibration profile is a JSON object, got a {type(data).__name__}")
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """This model as a profile dict (``from_dict`` reads it back)."""
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "model": self.model,
            "device": self.device,
            "coefficients": {n: getattr(self, n) for n in COEFFICIENT_NAMES},
            "peak_flops": self.peak_flops,
            "flops": {"token": self.flops_per_token, "seq": self.flops_per_seq,
                      "attn_pair": self.flops_per_attn_pair},
            "provenance": dict(self.provenance),
            "wake_curve": [[a, b] for a, b in zip(self.wake_idle, self.wake_extra, strict=True)],
            "token_curve": [[a, b] for a, b in zip(self.token_knots, self.token_extra, strict=True)],
        }

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
        a, b, c = shape.num_seqs, shape.num_tokens, shape.num_decode_seqs
        d, e, f = shape.attn_pairs, shape.kv_read_tokens, shape.swap_blocks
        t = (self.step + b * self.token + c * self.decode_seq + a * self.seq + d * self.attn_pair
             + e * self.kv_read_token + f * self.swap_block + (a - c) * self.prefill_seq)
        if self.token_knots:  # the linear layers' stairs in the row count
            t = t + np.interp(b, self.token_knots, self.token_extra)
        h = self.decode_pad_token
        if h:  # the padded decode gather; an unknown longest context (0) is taken as the decode rows' mean
            m = shape.max_decode_len
            if _is_array(a, c, e, m):
                t = t + np.where(np.asarray(m) > 0, c * m, e * c / np.maximum(a, 1)) * h
            else:
                t = t + (c * m if m > 0 else e * c / max(a, 1)) * h
        g = shape.idle_before
        if self.wake_idle:  # a step after an idle period: the engine's wake-up, interpolated from the curve
            t = t + np.interp(g, self.wake_idle, self.wake_extra)
        if shape.host_load_time:
            t = t + shape.host_load_time
        return t if _is_array(a, b, c, d, e, f, g, shape.max_decode_len) else float(t)

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        """Useful model FLOPs of the step (0 when the profile names no model FLOPs)."""
        a, b, p, d = shape.num_seqs, shape.num_tokens, shape.num_padding_tokens, shape.attn_pairs
        r = (b - p) * self.flops_per_token + a * self.flops_per_seq + d * self.flops_per_attn_pair
        return r if _is_array(a, b, p, d) else float(r)

    def decode_steps(self, rows: list[int], reads: list[int],
                     longest: list[int] | None = None) -> tuple[list[float], list[float]]:
        """``step_time``/``step_flops`` of unpadded one-token-per-row steps, bit-identical (same expression).
        ``longest[i]``: step i's ``max_decode_len`` (None: unknown)."""
        step, token, dseq, seq = self.step, self.token, self.decode_seq, self.seq
        pair, kvr, swap, pseq = self.attn_pair, self.kv_read_token, self.swap_block, self.prefill_seq
        ft, fs, fp = self.flops_per_token, self.flops_per_seq, self.flops_per_attn_pair
        times = [step + n * token + n * dseq + n * seq + c * pair + c * kvr + 0 * swap + (n - n) * pseq
                 for n, c in zip(rows, reads, strict=True)]
        if self.token_knots:
            kx, ky = self.token_knots, self.token_extra
            times = [float(t + np.interp(n, kx, ky)) for t, n in zip(times, rows, strict=True)]
        h = self.decode_pad_token
        if h:
            ms = longest if longest is not None else [0] * len(rows)
            times = [t + (n * m if m > 0 else c * n / max(n, 1)) * h
                     for t, n, c, m in zip(times, rows, reads, ms, strict=True)]
        flops = [float((n - 0) * ft + n * fs + c * fp) for n, c in zip(rows, reads, strict=True)]
        return times, flops
