"""The KV-cache budget a model leaves on a GPU, sized as vLLM sizes it: usable memory minus the weights minus the
activation reserve of its profiling forward, in whole blocks. Memory figures are per GPU (one tensor-parallel shard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.hardware.dtypes import (
    DTYPE_BITS,
    GiB,
    MiB,
    activation_dtype,
    canonical_dtype,
    dtype_bytes,
    kv_dtype_bytes,
    resolve_kv_dtype,
)
from sim.hardware.gpu import GPUSpec, resolve_gpu
from sim.hardware.models import ModelLike, ModelSpec, check_tensor_parallel, resolve_model

# Memory outside PyTorch's view that vLLM's profiling sees grow: CUDA context share, cuBLAS/NCCL workspaces and
# allocator fragmentation. CUDA graphs are captured after the KV cache is sized and live in the
# (1 - gpu_memory_utilization) headroom, so they are not counted here.
DEFAULT_RUNTIME_OVERHEAD_BYTES = 1 * GiB
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM v1's default for online serving on large GPUs
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default


class ModelDoesNotFitError(ValueError):
    """The weights plus the activation reserve leave no room for a single KV block on one GPU."""


@dataclass(frozen=True, slots=True)
class KVBudget:
    """How vLLM would size the paged KV cache. Memory figures are per GPU (one tensor-parallel shard)."""

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    total_memory: int  # bytes on one GPU
    usable_memory: int  # total_memory * gpu_memory_utilization
    weight_bytes: int  # resident weights on one GPU
    activation_reserve: int  # peak activations of the profiling forward plus runtime overhead
    kv_memory: int  # usable - weights - reserve: what the KV cache may take
    block_size: int  # tokens per KV block
    bytes_per_token: int  # KV bytes one token takes on one GPU
    kv_bytes_per_block: int  # block_size * bytes_per_token
    num_gpu_blocks: int  # blocks the cache holds (kv_memory // kv_bytes_per_block, or the override)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the KV cache holds when every block is full."""
        return self.num_gpu_blocks * self.block_size


def estimate_activation_reserve(
    model: ModelLike,
    *,
    weight_dtype: str = "bf16",
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    runtime_overhead_bytes: int = DEFAULT_RUNTIME_OVERHEAD_BYTES,
) -> int:
    """Bytes vLLM's profiling forward would find in use besides weights and KV, estimated from the shapes.

    vLLM runs one dummy forward of ``max_num_batched_tokens`` tokens and one sampler pass over ``max_num_seqs``
    rows, and reserves their peak. The peak sits in the MLP of one layer: per token about 4 hidden-sized tensors
    (residual, normed input, attention output, allocator slack) and the up projection(s) plus the activated
    output (3 intermediate-sized tensors for SwiGLU, 2 for a plain MLP), in the activation dtype. The sampler
    holds fp32 logits and one same-sized copy (softmax) per row. Add ``runtime_overhead_bytes``.

        reserve = max_num_batched_tokens * (4 * hidden + k * intermediate / tp) * act_bytes
                  + max_num_seqs * vocab * 4 * 2 + runtime_overhead_bytes        (k = 3 gated, 2 plain)

    For Llama-3.1-8B in bf16 with the defaults this is about 2.15 GiB, in line with what vLLM reports on an H100.
    """
    m = resolve_model(model)
    s = m.shard(tensor_parallel_size)
    act = int(dtype_bytes(activation_dtype(weight_dtype)))
    k = 3 if m.mlp == "gated" else 2
    # MoE: each token's k experts hold their intermediate tensors at once (vLLM's fused-MoE caches)
    per_token = (4 * m.hidden_size + k * s.intermediate_size * max(1, s.experts_per_tok)) * act
    logits = max_num_seqs * m.vocab_size * 4 * 2 if m.samples else 0  # a pipeline's last stage alone samples
    return max_num_batched_tokens * per_token + logits + runtime_overhead_bytes


def _kv_memory(m: ModelSpec, g: GPUSpec, util: float, weight_dtype: str, tp: int, reserve: int | None,
               reserve_kwargs: dict[str, Any]) -> tuple[int, int, int, int]:
    usable = int(g.memory_bytes * util)
    weights = m.shard(tp).weight_bytes(weight_dtype)
    if reserve is None:
        reserve = estimate_activation_reserve(m, weight_dtype=weight_dtype, tensor_parallel_size=tp,
                                              **reserve_kwargs)
    return usable, weights, reserve, usable - weights - reserve


def kv_budget(
    model: ModelLike,
    gpu: GPUSpec | str | Mapping[str, Any],
    *,
    gpu_memory_utilization: float = 0.9,
    weight_dtype: str = "bf16",
    kv_dtype: str = "auto",
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    activation_reserve_bytes: int | None = None,
    num_gpu_blocks_override: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> KVBudget:
    """Size the KV cache as vLLM does, per GPU:

        usable      = int(memory_bytes * gpu_memory_utilization)
        kv_memory   = usable - weight_bytes(per GPU) - activation_reserve
        num_blocks  = kv_memory // (block_size * kv_bytes_per_token(per GPU))

    ``activation_reserve_bytes`` replaces the estimate of ``estimate_activation_reserve`` (which uses
    ``max_num_batched_tokens`` and ``max_num_seqs``). ``kv_dtype="auto"`` is the model's activation dtype.
    ``num_gpu_blocks_override`` fixes the block count (as vLLM's option does) once the weights are known to fit.
    Raises ``ModelDoesNotFitError`` when not even one block fits, with suggestions that would.
    """
    m, g = resolve_model(model), resolve_gpu(gpu)
    wd = canonical_dtype(weight_dtype)
    kd = resolve_kv_dtype(kv_dtype, wd)
    tp = check_tensor_parallel(m, tensor_parallel_size)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    rk = dict(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    usable, weights, reserve, kv_mem = _kv_memory(m, g, gpu_memory_utilization, wd, tp, activation_reserve_bytes,
                                                  rk)
    per_token = m.kv_elements_per_token(tp) * kv_dtype_bytes(kd)
    per_block = block_size * per_token
    if kv_mem < per_block:
        options = []
        # the same dtype on more GPUs, then smaller weight formats (fp8 runs weight-only where unsupported)
        for dt in [wd] + [d for d in ("fp8", "int4") if DTYPE_BITS[d] < DTYPE_BITS[wd]]:
            for t in (1, 2, 4, 8):
                try:
                    check_tensor_parallel(m, t)
                except ValueError:
                    continue
                kvt = m.kv_elements_per_token(t) * kv_dtype_bytes(kd)
                if _kv_memory(m, g, gpu_memory_utilization, dt, t, activation_reserve_bytes, rk)[3] >= \
                        block_size * kvt:
                    options.append(f"tensor_parallel_size={t} with weight_dtype={dt}")
                    break
        hint = ("; options that fit on " + g.name + ": " + ", ".join(options)) if options else \
            f"; no weight dtype with up to 8 x {g.name} fits: use a GPU with more memory"
        raise ModelDoesNotFitError(
            f"{m.name} does not fit on {tp} x {g.name}: per GPU it needs {weights / GiB:.2f} GiB of {wd} weights "
            f"+ {reserve / GiB:.2f} GiB activation reserve + {per_block / MiB:.2f} MiB for one KV block, but "
            f"{gpu_memory_utilization} x {g.memory_bytes / GiB:.2f} GiB = {usable / GiB:.2f} GiB is available"
            f"{hint}"
        )
    blocks = kv_mem // per_block
    if num_gpu_blocks_override is not None:
        if num_gpu_blocks_override < 1:
            raise ValueError(f"num_gpu_blocks_override must be >= 1, got {num_gpu_blocks_override}")
        blocks = num_gpu_blocks_override
    return KVBudget(
        model=m.name, gpu=g.name, weight_dtype=wd, kv_dtype=kd, tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization, total_memory=g.memory_bytes, usable_memory=usable,
        weight_bytes=weights, activation_reserve=reserve, kv_memory=kv_mem, block_size=block_size,
        bytes_per_token=per_token, kv_bytes_per_block=per_block, num_gpu_blocks=int(blocks),
    )


def max_concurrent_sequences(budget: KVBudget, context_len: int) -> int:
    """How many sequences of ``context_len`` tokens (prompt + output) the cache holds at once, whole blocks each."""
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    return budget.num_gpu_blocks // -(-context_len // budget.block_size)
