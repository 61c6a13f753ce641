"""Capacity: what the weights take, how many KV bytes a token and a session need, and how many sessions fit at
once, for every weight and KV data type and tensor-parallel degree of one model on one GPU.

Plain arithmetic on ``sim.hardware.kv_budget`` (vLLM's KV sizing: usable memory minus weights minus the activation
reserve, cut into whole blocks); nothing is simulated. ``capacity_table`` is the Python entry, ``format_capacity``
its text table, ``servesim capacity`` the command line.

Units: bytes and tokens. "Per GPU" means one tensor-parallel shard; a *replica* is the ``tp`` GPUs that hold one
copy of the model. A session of ``c`` tokens (prompt + output) occupies ``ceil(c / block_size)`` whole blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.hardware.dtypes import GiB, canonical_dtype, kv_dtype_bytes, resolve_kv_dtype
from sim.hardware.gpu import GPULike, GPUSpec, resolve_gpu
from sim.hardware.kv_budget import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    estimate_activation_reserve,
    kv_budget,
)
from sim.hardware.models import ModelLike, ModelSpec, check_tensor_parallel, resolve_model
from sim.serving.pipeline import check_pipeline, stage_model

KiB = 1 << 10
MiB = 1 << 20

DEFAULT_CONTEXTS = (1024, 4096, 32768, 131072)  # tokens per session (prompt + output)
DEFAULT_WEIGHT_DTYPES = ("bf16", "fp8", "int8", "int4")
DEFAULT_KV_DTYPES = ("auto", "fp8")  # auto: the activation dtype (bf16 for these weights); int8 has fp8's size
DEFAULT_TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # those that do not split the model are left out


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One (weight dtype, KV dtype, tensor-parallel degree) of a model on a GPU."""

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str  # resolved (never "auto")
    tensor_parallel_size: int
    fits: bool  # at least one KV block fits next to the weights and the activation reserve
    reason: str  # why it does not fit; "" when it fits
    weight_bytes: int  # resident weights on one GPU
    activation_reserve: int  # bytes per GPU vLLM's profiling run keeps for activations and runtime
    usable_memory: int  # memory_bytes * gpu_memory_utilization, per GPU
    kv_memory: int  # bytes per GPU the KV cache may take (0 when it does not fit)
    kv_bytes_per_token: int  # on one GPU
    kv_bytes_per_token_replica: int  # over the replica's tp GPUs (KV heads replicated when tp > KV heads)
    block_size: int  # tokens per KV block
    num_gpu_blocks: int  # blocks per GPU (each replica's GPUs hold the same block count)
    contexts: tuple[int, ...]  # session lengths in tokens
    sessions: tuple[int | None, ...]  # sessions one replica holds at once, per context; None: beyond the model
    pipeline_parallel_size: int = 1  # stages, each of tp GPUs holding its share of the layers (sim/serving/pipeline.py)

    @property
    def num_gpus(self) -> int:
        """GPUs of one replica: tp x pp."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def capacity_tokens(self) -> int:
        """Tokens one replica's KV cache holds when every block is full."""
        return self.num_gpu_blocks * self.block_size

    @property
    def sessions_per_gpu(self) -> tuple[float | None, ...]:
        """``sessions`` divided by the replica's GPU count (the figure to compare across tp and pp degrees)."""
        return tuple(None if s is None else s / self.num_gpus for s in self.sessions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "fits": self.fits,
            "reason": self.reason,
            "weight_bytes_per_gpu": self.weight_bytes,
            "activation_reserve_per_gpu": self.activation_reserve,
            "usable_memory_per_gpu": self.usable_memory,
            "kv_memory_per_gpu": self.kv_memory,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "kv_bytes_per_token": self.kv_bytes_per_token_replica,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "capacity_tokens": self.capacity_tokens,
            "sessions": {str(c): s for c, s in zip(self.contexts, self.sessions, strict=True)},
            "sessions_per_gpu": {str(c): s for c, s in zip(self.contexts, self.sessions_per_gpu, strict=True)},
        }


@dataclass(frozen=True, slots=True)
class CapacityTable:
    """Every row for one model on one GPU, with what is common to them."""

    model: ModelSpec
    gpu: GPUSpec
    gpu_memory_utilization: float
    block_size: int
    contexts: tuple[int, ...]
    rows: tuple[CapacityRow, ...]

    def kv_bytes_per_session(self, context: int, kv_dtype: str = "bf16") -> int:
        """KV bytes a session of ``context`` tokens takes in the whole model (all layers and KV heads, no tensor
        parallel replication, no block rounding): context * kv_bytes_per_token."""
        return context * self.model.kv_bytes_per_token(kv_dtype)

    def row(self, weight_dtype: str, kv_dtype: str, tensor_parallel_size: int = 1,
            pipeline_parallel_size: int = 1) -> CapacityRow:
        """The row of these settings (``kv_dtype`` may be ``auto``)."""
        wd = canonical_dtype(weight_dtype)
        kd = resolve_kv_dtype(kv_dtype, wd)
        key = (wd, kd, tensor_parallel_size, pipeline_parallel_size)
        for r in self.rows:
            if (r.weight_dtype, r.kv_dtype, r.tensor_parallel_size, r.pipeline_parallel_size) == key:
                return r
        raise KeyError(f"no row for weights {wd}, KV {kd}, tp {tensor_parallel_size}, pp {pipeline_parallel_size}")

    def to_dict(self) -> dict[str, Any]:
        kv_dtypes = sorted({r.kv_dtype for r in self.rows}, key=lambda d: -kv_dtype_bytes(d))
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "num_params": self.model.num_params,
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "max_model_len": self.model.max_position_embeddings,
            "contexts": list(self.contexts),
            "kv_bytes_per_token": {d: self.model.kv_bytes_per_token(d) for d in kv_dtypes},
            "kv_bytes_per_session": {d: {str(c): self.kv_bytes_per_session(c, d) for c in self.contexts}
                                     for d in kv_dtypes},
            "rows": [r.to_dict() for r in self.rows],
        }




def capacity_row(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    weight_dtype: str,
    kv_dtype: str,
    tensor_parallel_size: int,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    pipeline_parallel_size: int = 1,
) -> CapacityRow:
    """One row; a combination that does not fit gives ``fits=False`` and the reason rather than an error. With
    pipeline stages, each GPU holds its (largest) stage's layers."""
    wd = canonical_dtype(weight_dtype)
    kd = resolve_kv_dtype(kv_dtype, wd)
    tp = check_tensor_parallel(model, tensor_parallel_size)
    pp = pipeline_parallel_size
    usable = int(gpu.memory_bytes * gpu_memory_utilization)

    def reserve_of(m: ModelSpec) -> int:
        return estimate_activation_reserve(m, weight_dtype=wd, tensor_parallel_size=tp,
                                           max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)

    def kv_tokens(m: ModelSpec) -> float:  # tokens a stage's GPU holds (the fewest size every stage's cache)
        return (usable - m.shard(tp).weight_bytes(wd) - reserve_of(m)) / m.kv_elements_per_token(tp)

    whole, model = model, stage_model(model, pp, kv_tokens)  # the layers (and embedding, LM head) one GPU holds
    per_token = model.kv_elements_per_token(tp) * kv_dtype_bytes(kd)
    weights = model.shard(tp).weight_bytes(wd)
    reserve = reserve_of(model)
    # the fields both rows share; Any because they are of several types (CapacityRow's fields check them)
    common: dict[str, Any] = dict(
        model=whole.name, gpu=gpu.name, weight_dtype=wd, kv_dtype=kd, tensor_parallel_size=tp, weight_bytes=weights,
        activation_reserve=reserve, usable_memory=usable, kv_bytes_per_token=per_token,
        kv_bytes_per_token_replica=per_token * tp * pp, block_size=block_size, contexts=tuple(contexts),
        pipeline_parallel_size=pp)
    if usable - weights - reserve < block_size * per_token:
        if weights + reserve > usable:
            reason = (f"{weights / GiB:.1f} GiB weights + {reserve / GiB:.1f} GiB activations per GPU > "
                      f"{usable / GiB:.1f} GiB usable")
        else:  # the weights fit; what is left holds no whole block (a large block_size)
            reason = (f"{(usable - weights - reserve) / GiB:.1f} GiB left per GPU after weights and activations "
                      f"< one {block_size:,}-token KV block ({block_size * per_token / GiB:.1f} GiB)")
        return CapacityRow(fits=False, reason=reason, kv_memory=0, num_gpu_blocks=0,
                           sessions=tuple(0 for _ in contexts), **common)
    budget = kv_budget(model, gpu, gpu_memory_utilization=gpu_memory_utilization, weight_dtype=wd, kv_dtype=kd,
                       block_size=block_size, tensor_parallel_size=tp,
                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    sessions = tuple(
        None if c > model.max_position_embeddings else budget.num_gpu_blocks // -(-c // block_size)
        for c in contexts
    )
    return CapacityRow(fits=True, reason="", kv_memory=budget.kv_memory, num_gpu_blocks=budget.num_gpu_blocks,
                       sessions=sessions, **common)


def capacity_table(
    model: ModelLike,
    gpu: GPULike,
    *,
    contexts: Sequence[int] | None = None,
    weight_dtypes: Sequence[str] | None = None,
    kv_dtypes: Sequence[str] | None = None,
    tensor_parallel_sizes: Sequence[int] | None = None,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    pipeline_parallel_sizes: Sequence[int] | None = None,
    num_gpus: int | None = None,
) -> CapacityTable:
    """Capacity of ``model`` on ``gpu`` for every weight dtype x KV dtype x tensor-parallel degree.

    Defaults: contexts 1k, 4k, 32k, 128k tokens; weights bf16, fp8, int8, int4; KV auto (bf16) and fp8; tp 1, 2,
    4, 8, keeping only the degrees that split the model (given ones that do not are an error, as in vLLM);
    pipeline stages 1 (``pipeline_parallel_sizes`` adds others). ``num_gpus``: instead, every tp x pp split of that
    many GPUs (tp from those given, or any that splits the model). The activation reserve is vLLM's
    profile for its defaults (8192 batched tokens, 256 sequences). Raises ValueError
    for unknown names, dtypes or impossible settings.
    """
    m, g = resolve_model(model), resolve_gpu(gpu)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    ctxs = tuple(dict.fromkeys(DEFAULT_CONTEXTS if not contexts else contexts))  # a repeat is one column
    for c in ctxs:
        if c < 1:
            raise ValueError(f"context lengths must be >= 1 token, got {c}")
    wds = list(dict.fromkeys(canonical_dtype(d) for d in (weight_dtypes or DEFAULT_WEIGHT_DTYPES)))
    if tensor_parallel_sizes:
        tps = list(dict.fromkeys(check_tensor_parallel(m, t) for t in tensor_parallel_sizes))
    else:
        tps = []
        for t in DEFAULT_TENSOR_PARALLEL_SIZES:
            try:
                tps.append(check_tensor_parallel(m, t))
            except ValueError:
                continue
    pps = list(dict.fromkeys(check_pipeline(m, p) for p in (pipeline_parallel_sizes or [1])))
    splits = [(tp, pp) for pp in pps for tp in tps]
    if num_gpus is not None:
        if num_gpus < 1:
            raise ValueError(f"the GPU count must be >= 1, got {num_gpus}")
        if not tensor_parallel_sizes:  # any degree that splits the model, up to the GPU count
            tps = [t for t in range(1, num_gpus + 1) if _splits(m, t)]
        splits = [(t, num_gpus // t) for t in tps if num_gpus % t == 0 and num_gpus // t <= m.num_layers]
        if pipeline_parallel_sizes:  # filtered as the tensor-parallel degrees are, not dropped
            splits = [(t, p) for t, p in splits if p in pps]
        if not splits:
            stages = f" with pp in {pps}" if pipeline_parallel_sizes else ""
            raise ValueError(f"no tp x pp split of {num_gpus} GPUs{stages} suits {m.name}")
    rows = []
    for wd in wds:
        kds = list(dict.fromkeys(resolve_kv_dtype(k, wd) for k in (kv_dtypes or DEFAULT_KV_DTYPES)))
        for kd in kds:
            for tp, pp in splits:
                rows.append(capacity_row(m, g, weight_dtype=wd, kv_dtype=kd, tensor_parallel_size=tp,
                                         contexts=ctxs, gpu_memory_utilization=gpu_memory_utilization,
                                         block_size=block_size, pipeline_parallel_size=pp))
    return CapacityTable(m, g, gpu_memory_utilization, block_size, ctxs, tuple(rows))


def _splits(m: ModelSpec, tp: int) -> bool:
    try:
        check_tensor_parallel(m, tp)
    except ValueError:
        return False
    return True


# ---- text -----------------------------------------------------------------------------------------------------
def _bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _tokens(c: int) -> str:
    if c % 1024 == 0:
        return f"{c // 1024}k"
    return f"{c:,}"


def format_capacity(table: CapacityTable) -> str:
    """The table as text: a header with the model-wide figures, then one line per row."""
    m, g = table.model, table.gpu
    kv_dtypes = sorted({r.kv_dtype for r in table.rows}, key=lambda d: -kv_dtype_bytes(d))
    lines = [
        (f"{m.name} on {g.name}: {m.num_params / 1e9:.2f} B parameters ({m.weight_bytes('bf16') / 1e9:.2f} GB in "
        f"bf16); {g.memory_bytes / GiB:.1f} GiB per GPU, gpu_memory_utilization {table.gpu_memory_utilization:g}; "
        f"{table.block_size}-token KV blocks"),
        "KV per token (whole model): " + ", ".join(f"{_bytes(m.kv_bytes_per_token(d))} in {d}" for d in kv_dtypes),
    ]
    # each context's columns as wide as their widest text, one space apart at least (a context such as 200,000 or
    # a session count of 1,000,000 ran into its neighbour: "4k tok200,000 tok", "@4k@200,000")
    kv_w = [max(11, len(f"{_tokens(c)} tok") + 1, *(len(_bytes(table.kv_bytes_per_session(c, d))) + 1
                                                     for d in kv_dtypes)) for c in table.contexts]
    lines.append("KV per session:  " + "".join(f"{_tokens(c) + ' tok':>{w}}" for c, w in zip(table.contexts, kv_w,
                                                                                          strict=True)))
    for d in kv_dtypes:
        lines.append(f"  {d:<14}" + "".join(f"{_bytes(table.kv_bytes_per_session(c, d)):>{w}}"
                                           for c, w in zip(table.contexts, kv_w, strict=True)))
    lines.append("")
    piped = any(r.pipeline_parallel_size > 1 for r in table.rows)  # a pp column only when a row has stages
    pp_head = f"{'pp':>3}" if piped else ""
    head = f"{'weights':<8}{'kv':<6}{'tp':>3}{pp_head}{'weights/GPU':>13}{'KV cache/GPU':>14}{'KV tokens':>11}"
    sess_w = [max(8, len(f"@{_tokens(c)}") + 1, *(len(f"{r.sessions[i] or 0:,}") + 1 for r in table.rows if r.fits))
              for i, c in enumerate(table.contexts)]
    head += "".join(f"{'@' + _tokens(c):>{w}}" for c, w in zip(table.contexts, sess_w, strict=True))
    lines.append(" " * len(f"{'weights':<8}{'kv':<6}{'tp':>3}{pp_head}{'weights/GPU':>13}{'KV cache/GPU':>14}"
                           f"{'':>11}") + "  max concurrent sessions per replica")
    lines.append(head)
    for r in table.rows:
        pp_cell = f"{r.pipeline_parallel_size:>3}" if piped else ""
        left = (f"{r.weight_dtype:<8}{r.kv_dtype:<6}{r.tensor_parallel_size:>3}{pp_cell}"
                f"{_bytes(r.weight_bytes):>13}")
        if not r.fits:
            lines.append(f"{left}  does not fit: {r.reason}")
            continue
        cells = "".join(f"{'-' if s is None else f'{s:,}':>{w}}" for s, w in zip(r.sessions, sess_w, strict=True))
        lines.append(f"{left}{_bytes(r.kv_memory):>14}{r.capacity_tokens:>11,}{cells}")
    notes = [
        (f"sessions: requests of that many tokens (prompt + output) one replica of tp GPUs holds in KV at once, in "
        f"whole blocks; divide by tp for per GPU; '-': beyond {m.name}'s {m.max_position_embeddings:,}-token context."),
    ]
    if piped:
        notes.append("pp: pipeline stages of tp GPUs each; a GPU holds its stage's layers (weights and KV), so a "
                     "replica has tp x pp GPUs and sessions per GPU divide by both.")
    notes += [
        ("activation reserve as vLLM profiles it for 8192 batched tokens and 256 sequences (vLLM's max_num_seqs "
        "also caps concurrency at 256 by default)."),
    ]
    return "\n".join(lines + [""] + notes)
