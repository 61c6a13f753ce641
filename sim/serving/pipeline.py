"""Pipeline parallelism (vLLM's ``pipeline_parallel_size``): the model's layers split over ``pp`` stages, each a
tensor-parallel group of ``tp`` GPUs, activations handed from stage to stage over a link.

Memory. Each GPU holds its stage's layers, as vLLM lays them out (``stage_models``): ``num_layers // pp`` layers
a stage, the remainder one each to the stages before the last (vLLM's ``get_pp_indices``); the embedding on the
first stage, the LM head, the final norm and the sampler's logits on the last (``get_pp_group().is_first_rank`` /
``is_last_rank``; a tied LM head keeps the embedding matrix on the last stage too), neither on a middle stage
(``PPMissingLayer``). OPT is laid out otherwise: vLLM's ``OPTDecoder`` builds its embeddings, project_in/out and
final norm, and ``OPTForCausalLM`` its LM head, on every rank, so every OPT stage holds them. A quantized
checkpoint's unconverted layers (sim/hardware/quant.py) count on the stages that hold them. vLLM sizes the cache
by the minimum of its workers' free blocks, so ``stage_model`` is the stage whose GPU holds the fewest KV tokens
(Llama-3.1-70B bf16 at tp1 pp8 on an H100: the last, 1,329,872).

Time. vLLM keeps up to ``pp`` batches in flight (v0's virtual engines, v1's batch queue): the running requests
are split into ``m = min(pp, rows)`` micro-batches that follow one another through the stages. One step of the
simulator is one round in which every running request advances by its tokens; a request's next token needs its
previous one, so a round lasts as long as one micro-batch takes through the whole pipeline (or, with uneven
stages, as long as the slowest stage takes for all of them)::

    round = overhead(rows) + max(work + (pp - 1) * hop, m * max(body * s, body * s_last + head))

where ``work`` is the cost model's time of a micro-batch of ``rows / m`` rows on all layers (each stage does its
share of it, weights and KV read included), ``overhead`` the host's per-step cost (scheduling, input
preparation, sampling) and ``hop = link latency + tokens x hidden_size x activation bytes / link bandwidth``.
The second term is the slowest stage computing all ``m`` micro-batches: ``head`` is the LM head's time (and the
sampler's sort, top-p, sim/engines/sampling.py), which the last stage computes alone (``AnalyticCostModel.
lm_head_time``; 0 for a fitted profile, which does not tell it apart), ``body = work - head`` the layers', ``s``
the largest stage's share of the layers and ``s_last`` the last's. It binds once the micro-batches fill the
stages: Llama-3.1-70B's head (1.2 layers' worth of weights) makes the last of 4 even stages the slowest, and
with 32 layers over 3 stages the 11-layer stages or the last (10 and the head) set the pace. Where a stage's layers
are not like the others' (DeepSeek's ``first_k_dense_replace`` dense MLPs, on the first stages; OPT's project_in
on the first and project_out on the last), each stage's share of ``body`` is its share of the stages' analytic GPU
times (``stage_costs``), the host's time (penalty inputs, a capped host time) staying in ``work`` once, and the stage
utilisation (``stage_busy``) reads the round with those shares at the step's shape. Rows and
tokens are split evenly over the micro-batches, an optimistic balance (vLLM's virtual engines each schedule
their own requests). The stages compute ``m`` micro-batches, a
total of ``m * work`` per round, so their mean utilisation is ``m * work / (pp * round)``: with one micro-batch
the stages take turns and each idles ``(pp - 1) / pp`` of the time (the *bubble*, GPipe's ``(p - 1) / (m + p -
1)`` at ``m = 1``); with ``pp`` micro-batches every stage is busy but for the hops and the host overhead. A
pipeline therefore raises throughput only with load, and never lowers a single request's latency below the whole
model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import CostModel, StepShape
from sim.costs.fitted import FittedCostModel
from sim.hardware.dtypes import DTYPE_BITS, activation_dtype
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec, ShardSpec

# The links between stages, one direction, as achieved by NCCL send/recv (bandwidth in B/s, latency in s).
#   nvlink:     H100 NVLink 4: 900 GB/s total per GPU, 450 GB/s each way (NVIDIA H100 datasheet); one small
#               send/recv costs about 5 us.
#   pcie:       PCIe 5.0 x16: 32 GT/s x 16 lanes = 63 GB/s raw each way (PCI-SIG), about 50 GB/s achieved (the
#               GPU presets' pcie_bandwidth); peer-to-peer through the host bridge, about 10 us per message.
#   infiniband: NDR 400 Gb/s per GPU (ConnectX-7) = 50 GB/s each way, GPUDirect RDMA between nodes; about 20 us
#               per message across the switch.
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "nvlink": (450e9, 5e-6),
    "pcie": (50e9, 10e-6),
    "infiniband": (50e9, 20e-6),
}
PipelineLink = Literal["auto", "nvlink", "pcie", "infiniband"]


def resolve_link(link: str, gpu: GPUSpec) -> tuple[str, float, float]:
    """(name, bandwidth B/s, latency s) of a stage link; ``auto``: NVLink when the GPU has it (stages in one
    node), else PCIe."""
    if link == "auto":
        link = "nvlink" if gpu.nvlink_bandwidth > 0 else "pcie"
    if link not in LINK_PRESETS:
        raise ValueError(f"pipeline_link must be one of auto, {', '.join(LINK_PRESETS)}; got {link!r}")
    bw, lat = LINK_PRESETS[link]
    return link, bw, lat


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers of each stage, first to last, as vLLM's ``get_pp_indices`` splits them: the remainder of
    ``num_layers / pp`` goes one layer each to the stages before the last (which holds the LM head)."""
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


@dataclass(frozen=True, slots=True)
class StageSpec(ModelSpec):
    """The part of a model one pipeline stage holds: its layers (``num_layers``), the embedding only on the first
    stage and the LM head, final norm and sampler only on the last (a tied head keeps the embedding there too)."""

    ALL_DENSE_OK = True  # DeepSeek's first_k_dense_replace dense layers may fill a first stage
    first: bool = True
    last: bool = True
    # the stage as its forward computes it (a stage's cost model, ``stage_costs``), not as its GPU holds it: OPT's
    # project_in on the first stage only and project_out on the last only (vLLM's OPTDecoder.forward), though
    # every stage builds both
    computed: bool = False

    @property
    def samples(self) -> bool:
        return self.last

    def shard(self, tensor_parallel_size: int = 1) -> ShardSpec:
        s = ModelSpec.shard(self, tensor_parallel_size)
        if self.model_type == "opt":
            # vLLM's OPTDecoder builds embed_tokens, embed_positions, project_in/out and the final norm on every
            # rank, and OPTForCausalLM its LM head (tied: the embedding), none of them a PPMissingLayer: every stage
            # holds them all, as the whole model does (vllm/model_executor/models/opt.py)
            if not self.computed or self.word_embed_proj_dim == self.hidden_size:
                return s
            # project_in (word_embed_proj_dim -> hidden_size) and project_out (back), each e x h
            unused = (2 - self.first - self.last) * self.word_embed_proj_dim * self.hidden_size
            return dataclasses.replace(s, body_matmul_params=s.body_matmul_params - unused)
        vocab_rows = s.vocab_size * self.word_embed_proj_dim
        final = (2 if self.norm == "layer" else 1) * self.hidden_size if self.final_norm and not self.last else 0
        embedding = s.embedding_params if self.first else vocab_rows if self.last and s.tied else 0
        return dataclasses.replace(s, embedding_params=embedding, lm_head_params=s.lm_head_params * self.last,
                                   other_params=s.other_params - final)


def stage_models(model: ModelSpec, pp: int, computed: bool = False) -> list[ModelSpec]:
    """What each GPU of a ``pp``-stage pipeline holds, first stage to last; ``[model]`` for 1. ``computed``: what
    each computes instead (``StageSpec.computed``)."""
    if check_pipeline(model, pp) == 1:
        return [model]
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
    counts = stage_layer_counts(model.num_layers, pp)
    starts = [sum(counts[:i]) for i in range(pp)]
    # layers the whole model counts lie on the stages that hold them, not on each: the first first_k_dense_replace
    # (DeepSeek's dense MLPs), and a quantized checkpoint's unconverted ones where sim/hardware/quant.py's
    # modules_not_converted puts them (the first layers' attention; the MLP of the first and the last layers)
    first_mlp = (model.unquantized_mlp_layers + 1) // 2
    last_mlp = model.num_layers - model.unquantized_mlp_layers // 2
    return [StageSpec(**{**fields, "num_layers": n,
                         "first_k_dense_replace": _overlap(start, n, 0, model.first_k_dense_replace),
                         "unquantized_attention_layers": _overlap(start, n, 0, model.unquantized_attention_layers),
                         "unquantized_mlp_layers": _overlap(start, n, 0, first_mlp)
                         + _overlap(start, n, last_mlp, model.num_layers)},
                      first=i == 0, last=i == pp - 1, computed=computed)
            for i, (n, start) in enumerate(zip(counts, starts, strict=True))]


def _overlap(start: int, n: int, lo: int, hi: int) -> int:
    """Layers of [lo, hi) among a stage's [start, start + n)."""
    return max(0, min(start + n, hi) - max(start, lo))


def check_pipeline(model: ModelSpec, pp: int) -> int:
    """A pipeline degree vLLM accepts: at least one layer per stage."""
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise ValueError(f"pipeline_parallel_size must be a positive integer, got {pp!r}")
    if pp > model.num_layers:
        raise ValueError(f"pipeline_parallel_size={pp} exceeds {model.name}'s {model.num_layers} layers")
    return pp


def stage_model(model: ModelSpec, pp: int, kv_tokens: Callable[[ModelSpec], float]) -> ModelSpec:
    """The stage of a ``pp``-stage pipeline whose GPU holds the fewest KV tokens (``kv_tokens(stage)``), which
    sizes every stage's cache as vLLM takes the minimum of its workers' free blocks; the model itself for 1."""
    stages = stage_models(model, pp)
    return stages[0] if len(stages) == 1 else min(stages, key=kv_tokens)


def _overhead(cost: CostModel, rows: Any) -> Any:
    """The host's share of a step (paid once per round, not per stage)."""
    if isinstance(cost, AnalyticCostModel):
        return cost.step_overhead + rows * cost.per_request_overhead
    if isinstance(cost, FittedCostModel):
        return cost.step + 0 * rows
    return 0 * rows


def _head(cost: CostModel, rows: Any) -> Any:
    """The LM head's time for a micro-batch of ``rows`` rows, the sampler's sort included (sim/engines/sampling.py):
    GPU work of the last stage alone, once per micro-batch; 0 where the cost model does not tell it apart."""
    return cost.lm_head_time(rows) if isinstance(cost, AnalyticCostModel) else 0 * rows


@dataclass(frozen=True, slots=True)
class PipelineCostModel(CostModel):
    """Step (round) times of a ``pp``-stage pipeline around ``inner``, the cost model of the whole model on one
    stage's tensor-parallel group (see the module docstring). Scalar and array shapes give the same numbers."""

    inner: CostModel
    pipeline_parallel_size: int
    hidden_size: int
    activation_bytes: float  # bytes per activation element handed between stages
    link: str = "nvlink"
    link_bandwidth: float = LINK_PRESETS["nvlink"][0]  # B/s
    link_latency: float = LINK_PRESETS["nvlink"][1]  # s per hop
    stage_share: float = 0.0  # the largest stage's share of the layers; 0: 1 / pipeline_parallel_size
    last_share: float = 0.0  # the last stage's share of the layers (it holds the LM head); 0: stage_share
    # each stage's own cost model (an AnalyticCostModel of the layers it holds, ``stage_costs``), first to last, where
    # its layers are not alike (DeepSeek's dense first layers); empty: the stages' shares of the layers
    stages: tuple[AnalyticCostModel, ...] = ()
    _peak: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pipeline_parallel_size < 1 or not self.link_bandwidth > 0 or self.link_latency < 0:
            raise ValueError("PipelineCostModel: pipeline_parallel_size >= 1, link_bandwidth > 0 and "
                             "link_latency >= 0 are required")
        object.__setattr__(self, "_peak", float(self.inner.peak_flops) * self.pipeline_parallel_size)
        if self.stage_share == 0.0:
            object.__setattr__(self, "stage_share", 1.0 / self.pipeline_parallel_size)
        if not 1.0 / self.pipeline_parallel_size <= self.stage_share <= 1.0:
            raise ValueError(f"PipelineCostModel: stage_share must be in [1/pp, 1], got {self.stage_share}")
        if self.last_share == 0.0:
            object.__setattr__(self, "last_share", self.stage_share)
        if not 0.0 < self.last_share <= self.stage_share:
            raise ValueError(f"PipelineCostModel: last_share must be in (0, stage_share], got {self.last_share}")

    @property
    def peak_flops(self) -> float:
        """Peak FLOP/s of every GPU of the pipeline."""
        return self._peak

    def micro_batches(self, rows: Any) -> Any:
        """Micro-batches in flight for a step of ``rows`` rows."""
        p = self.pipeline_parallel_size
        return np.clip(rows, 1, p) if isinstance(rows, np.ndarray) else min(max(rows, 1), p)

    def hop_time(self, tokens_per_micro_batch: Any) -> Any:
        """Seconds to hand one micro-batch's activations to the next stage."""
        return self.link_latency + tokens_per_micro_batch * (self.hidden_size * self.activation_bytes
                                                              / self.link_bandwidth)

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        p = self.pipeline_parallel_size
        m = self.micro_batches(shape.num_seqs)
        mb = StepShape(shape.num_seqs / m, shape.num_tokens / m, shape.num_decode_seqs / m,
                       shape.kv_read_tokens / m, shape.attn_pairs / m, shape.num_padding_tokens / m,
                       shape.swap_blocks, shape.idle_before, shape.max_decode_len)
        head = _head(self.inner, mb.num_seqs)
        work = self.inner.step_time(mb) - _overhead(self.inner, mb.num_seqs)
        mx = np.maximum if isinstance(work, np.ndarray) or isinstance(head, np.ndarray) else max
        if self.stages:  # each stage's layers timed as what they are: a dense stage's MLPs, a MoE stage's experts
            # each stage's share of the body is its GPU time's (host-free stage models, ``stage_costs``): the host's
            # penalty inputs or capped host time lie in ``work`` once, not once a stage
            bodies = [st.step_time(mb) - _overhead(st, mb.num_seqs) - _head(st, mb.num_seqs) for st in self.stages]
            body, total = work - head, sum(bodies)
            slowest = body * (bodies[-1] / total) + head
            for b in bodies[:-1]:
                slowest = mx(slowest, body * (b / total))
        else:
            # the largest stage, or the last with its layers and the LM head (and the sampler's sort)
            slowest = mx((work - head) * self.stage_share, (work - head) * self.last_share + head)
        through = work + (p - 1) * self.hop_time(mb.num_tokens)  # one micro-batch through every stage
        pace = m * slowest  # the slowest stage computing all m micro-batches
        t = _overhead(self.inner, shape.num_seqs) + mx(through, pace)
        if shape.host_load_time:
            t = t + shape.host_load_time
        return t if isinstance(t, np.ndarray) else float(t)

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        return self.inner.step_flops(shape)

    def stage_busy(self, rows: np.ndarray, tokens: np.ndarray, duration: np.ndarray,
                   decode: np.ndarray | None = None, kv: np.ndarray | None = None) -> np.ndarray:
        """Seconds each stage computed during steps of these rows, tokens and durations (the step log's): the
        inverse of ``step_time``, ``m * work / pp``. ``decode`` and ``kv`` (the log's decode tokens and stored KV
        tokens, taken as the KV the step read) give the shape at which uneven stages (``stages``) are weighed."""
        p = self.pipeline_parallel_size
        rows = np.asarray(rows, dtype=np.float64)
        m = np.clip(rows, 1, p)
        span = np.asarray(duration, dtype=np.float64) - _overhead(self.inner, rows)
        # span = max(work + hops, m * max(body * share, body * last_share + head)), body = work - head: each
        # reading gives work where its term binds, more elsewhere (both grow with the body)
        head = _head(self.inner, rows / m)
        shares = [np.full_like(rows, self.stage_share), np.full_like(rows, self.last_share)]
        if self.stages:  # step_time's shares of the body: each stage's GPU time at the step's micro-batch
            tok = np.asarray(tokens, dtype=np.float64)
            read = np.zeros_like(rows) if kv is None else np.asarray(kv, dtype=np.float64) / m
            mb = StepShape(rows / m, tok / m, (rows if decode is None else np.asarray(decode, np.float64)) / m,
                           read, read)
            bodies = [st.step_time(mb) - _overhead(st, mb.num_seqs) - _head(st, mb.num_seqs) for st in self.stages]
            shares = [b / sum(bodies) for b in bodies]
        body = (span / m - head) / shares[-1]
        for share in shares[:-1]:
            body = np.minimum(body, span / m / share)
        work = np.minimum(span - (p - 1) * self.hop_time(np.asarray(tokens, dtype=np.float64) / m), body + head)
        return np.maximum(work, 0.0) * m / p

    def summary(self, steps: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """``pipeline`` in summary.json: stage utilisation and bubble fraction over the run's steps."""
        rows = steps["batch_size"] + steps["padded_rows"]
        tokens = steps["prefill_tokens"] + steps["decode_tokens"] + steps["padding_tokens"]
        dur = np.asarray(steps["duration"], dtype=np.float64)
        per_step = self.stage_busy(rows, tokens, dur, steps.get("decode_tokens"), steps.get("kv_tokens"))
        busy = float(per_step.sum())
        total = float(dur.sum())
        util = busy / total if total > 0 else float("nan")
        m = np.clip(np.asarray(rows, dtype=np.float64), 1, self.pipeline_parallel_size)
        # by micro-batches in flight (what the bubble depends on): share of the run's step time, utilisation
        by_m = []
        for k in np.unique(m):
            sel = m == k
            t = float(dur[sel].sum())
            by_m.append({"micro_batches": int(k), "time_fraction": t / total if total > 0 else float("nan"),
                         "stage_utilization": float(per_step[sel].sum()) / t if t > 0 else float("nan")})
        return {
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "link": self.link,
            "stage_utilization": util,
            "bubble_fraction": 1.0 - util,
            "mean_micro_batches": float((m * dur).sum() / total) if total > 0 else float("nan"),
            "hop_seconds": float(((self.pipeline_parallel_size - 1) * self.hop_time(tokens / m)).sum()),
            "by_micro_batches": by_m,
        }


def wrap_pipeline(cost: CostModel, model: ModelSpec, gpu: GPUSpec, *, pipeline_parallel_size: int,
                  link: str = "auto", weight_dtype: str = "bf16") -> CostModel:
    """``cost`` as one stage group of a pipeline (itself when ``pipeline_parallel_size`` is 1)."""
    pp = check_pipeline(model, pipeline_parallel_size)
    if pp == 1:
        return cost
    name, bw, lat = resolve_link(link, gpu)
    act_bytes = DTYPE_BITS[activation_dtype(weight_dtype)] / 8
    counts = stage_layer_counts(model.num_layers, pp)
    return PipelineCostModel(cost, pp, model.hidden_size, act_bytes, name, bw, lat, max(counts) / model.num_layers,
                             counts[-1] / model.num_layers, stage_costs(cost, model, pp))


def stage_costs(cost: CostModel, model: ModelSpec, pp: int) -> tuple[AnalyticCostModel, ...]:
    """Each stage's own analytic cost model, first to last, where the stages' layers are not alike: DeepSeek's
    ``first_k_dense_replace`` dense MLPs (a dense layer reads its whole MLP, a MoE layer the experts a step touches) lie
    on the stages that hold them (``stage_models``), where a share of the layers timed them as MoE layers; OPT's
    project_in is computed on the first stage and project_out on the last (OPT-350M's 512 <-> 1024), where a share of
    the layers spread them over every stage. Empty otherwise (a stage's time is its share of the layers, as before), and
    for a fitted profile, which times the whole model only."""
    if not isinstance(cost, AnalyticCostModel) or not (model.num_experts and model.first_k_dense_replace
                                                      or model.model_type == "opt"
                                                      and model.word_embed_proj_dim != model.hidden_size):
        return ()
    # GPU time alone: the host's penalty inputs and host time are the round's once (``work``), not each stage's
    return tuple(dataclasses.replace(cost, model=st, penalty_host_time=0.0, host_time_ratio=0.0)
                 for st in stage_models(model, pp, computed=True))
