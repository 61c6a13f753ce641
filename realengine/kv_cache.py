"""The KV cache tensors, their sizing, and swapping to CPU memory.

Per layer, K and V are ``[rows, row_len, kv_heads, head_dim]`` tensors:

- paged (vLLM's layout): ``rows = num_blocks``, ``row_len = block_size``; a request's tokens live in the blocks
  its block table in the core's ``PagedBlockManager`` names, token ``p`` at ``(table[p // bs], p % bs)``;
- contiguous (the layout paging replaced): one row of ``max_model_len`` tokens (rounded up to whole blocks) per
  request slot, ``max_num_seqs`` slots, handed out by ``take_slot``.

Both are also viewed as blocks of ``block_size`` tokens (``blocks(layer)``), so that swapping copies blocks in
either layout. The CPU swap space is a pool of ``num_cpu_blocks`` blocks (pinned on CUDA), allocated once, so
swapping never allocates and the cache's memory never changes size.

The cache is zero-filled: the decode gather reads whole blocks and masks the tail, and masked stale values must
be finite (0 * NaN would poison the softmax's weighted sum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from realengine.attention import build_metadata, cdiv
from sim.hardware.models import ModelSpec


def kv_bytes_per_block(spec: ModelSpec, dtype: torch.dtype, block_size: int) -> int:
    """Bytes one block takes over all layers: 2 (K and V) * layers * kv_heads * head_dim * block_size * elem."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * spec.num_key_value_heads * spec.head_dim * block_size * elem


def num_blocks_for_memory(
    model: ModelSpec,
    dtype: torch.dtype,
    block_size: int,
    gpu_memory_utilization: float,
    total_memory: int,
    weight_bytes: int,
    peak_activation_bytes: int,
) -> int:
    """vLLM's sizing: ``(int(total_memory * gpu_memory_utilization) - weights - peak activations) // block bytes``.
    The same arithmetic as ``sim.hardware.kv_budget.kv_budget``, fed with measured numbers instead of estimates."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    per_block = kv_bytes_per_block(model, dtype, block_size)
    kv_memory = int(total_memory * gpu_memory_utilization) - weight_bytes - peak_activation_bytes
    if kv_memory < per_block:
        raise ValueError(
            f"{model.name}: {gpu_memory_utilization} x {total_memory / 2**30:.2f} GiB leaves "
            f"{kv_memory / 2**30:.2f} GiB after {weight_bytes / 2**30:.2f} GiB of weights and "
            f"{peak_activation_bytes / 2**30:.2f} GiB of activations: not one KV block ({per_block} bytes)"
        )
    return kv_memory // per_block


def profile_num_blocks(
    model,
    *,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = 0.9,
    num_blocks_override: int | None = None,
) -> int:
    """Blocks for a ``LlamaModel``'s cache, sized as vLLM does after a warm-up forward at the largest step.

    ``num_blocks_override`` wins (tests force small caches; CPU runs must give it). On CUDA: run one forward of
    ``max_num_batched_tokens`` tokens split over ``min(max_num_seqs, tokens)`` sequences, all sampling, without a
    cache; its peak allocation above the weights is the activation reserve; device memory is
    ``torch.cuda.mem_get_info``'s total. (Not exercised by the CPU tests.)"""
    if num_blocks_override is not None:
        if num_blocks_override < 1:
            raise ValueError(f"num_blocks_override must be >= 1, got {num_blocks_override}")
        return num_blocks_override
    device = model.device
    if device.type != "cuda":
        raise ValueError(f"sizing the KV cache from device memory needs CUDA; on {device.type} give num_blocks")
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    lens = [max_num_batched_tokens // seqs + (i < max_num_batched_tokens % seqs) for i in range(seqs)]
    meta = build_metadata([0] * seqs, lens, device=device, block_size=block_size)
    ids = torch.zeros(max_num_batched_tokens, dtype=torch.long, device=device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    model(ids, meta.positions, meta, None)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    total = torch.cuda.mem_get_info(device)[1]
    return num_blocks_for_memory(model.spec, model.dtype, block_size, gpu_memory_utilization, total,
                                 model.weight_bytes(), peak)


@dataclass(slots=True)
class SwapHandle:
    """A request's KV in CPU swap space: the CPU blocks holding its GPU blocks, in token order."""

    cpu_blocks: list[int]

    def __len__(self) -> int:
        return len(self.cpu_blocks)


class KVCache:
    """K and V tensors for every layer, in the paged or the contiguous layout."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        block_size: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        layout: str = "paged",
        num_blocks: int = 0,  # paged: blocks of block_size tokens (the block manager's num_blocks)
        max_num_seqs: int = 0,  # contiguous: request slots
        max_model_len: int = 0,  # contiguous: tokens per slot (rounded up to whole blocks)
        num_cpu_blocks: int = 0,  # swap space, in blocks (the block manager's num_cpu_blocks)
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.spec = spec
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.layout = layout
        h, d = spec.num_key_value_heads, spec.head_dim
        if layout == "paged":
            if num_blocks < 1:
                raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
            shape = (num_blocks, block_size, h, d)
            self.row_len = block_size
        elif layout == "contiguous":
            if max_num_seqs < 1 or max_model_len < 1:
                raise ValueError("the contiguous layout needs max_num_seqs >= 1 and max_model_len >= 1")
            self.row_len = cdiv(max_model_len, block_size) * block_size
            shape = (max_num_seqs, self.row_len, h, d)
            self._free_slots = list(range(max_num_seqs - 1, -1, -1))  # a stack: slot 0 first
        else:
            raise ValueError(f"layout must be 'paged' or 'contiguous', got {layout!r}")
        self.num_blocks = shape[0] * shape[1] // block_size  # in blocks of block_size, either layout
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(spec.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(spec.num_layers)]
        self.num_cpu_blocks = num_cpu_blocks
        pin = self.device.type == "cuda"
        cpu_shape = (num_cpu_blocks, block_size, h, d)
        self.cpu_k = [torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(spec.num_layers)]
        self.cpu_v = [torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(spec.num_layers)]
        self._free_cpu = list(range(num_cpu_blocks - 1, -1, -1))

    # ---- views -----------------------------------------------------------------------------------------------
    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's ``(k_cache, v_cache)`` in the layout's own shape (what attention reads)."""
        return self.k[i], self.v[i]

    def blocks(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's cache viewed as ``[num_blocks, block_size, kv_heads, head_dim]`` (either layout)."""
        k, v = self.k[i], self.v[i]
        shape = (self.num_blocks, self.block_size) + tuple(k.shape[2:])
        return k.view(shape), v.view(shape)

    @property
    def nbytes(self) -> int:
        """Device bytes of all K and V tensors."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.spec, self.dtype, self.block_size)

    # ---- contiguous slots ------------------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots) if self.layout == "contiguous" else 0

    def take_slot(self) -> int:
        if not self._free_slots:
            raise RuntimeError(f"all {self.k[0].shape[0]} contiguous KV slots are taken (raise max_num_seqs)")
        return self._free_slots.pop()

    def free_slot(self, slot: int) -> None:
        self._free_slots.append(slot)

    def slot_blocks(self, slot: int, n: int) -> list[int]:
        """The first ``n`` blocks of a contiguous slot, as block ids of ``blocks()``."""
        per = self.row_len // self.block_size
        if n > per:
            raise ValueError(f"{n} blocks exceed a slot of {per}")
        return list(range(slot * per, slot * per + n))

    # ---- swap ------------------------------------------------------------------------------------------------
    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._free_cpu)

    def swap_out(self, gpu_blocks: list[int]) -> SwapHandle:
        """Copy these device blocks (every layer's K and V) into free CPU blocks. The copy has completed when
        this returns, so the device blocks may be overwritten at once."""
        n = len(gpu_blocks)
        if n > len(self._free_cpu):
            raise RuntimeError(f"swap out of {n} blocks, {len(self._free_cpu)} CPU blocks free")
        cpu = [self._free_cpu.pop() for _ in range(n)]
        if n:
            gidx = torch.tensor(gpu_blocks, dtype=torch.long, device=self.device)
            cidx = torch.tensor(cpu, dtype=torch.long)
            for i in range(len(self.k)):
                k, v = self.blocks(i)
                self.cpu_k[i].index_copy_(0, cidx, k.index_select(0, gidx).to("cpu"))
                self.cpu_v[i].index_copy_(0, cidx, v.index_select(0, gidx).to("cpu"))
        return SwapHandle(cpu)

    def swap_in(self, handle: SwapHandle, gpu_blocks: list[int]) -> None:
        """Copy a swapped request's blocks back into these device blocks (as many as the handle holds), and free
        its CPU blocks."""
        n = len(handle.cpu_blocks)
        if len(gpu_blocks) != n:
            raise ValueError(f"swap in of {n} blocks into {len(gpu_blocks)} device blocks")
        if n:
            gidx = torch.tensor(gpu_blocks, dtype=torch.long, device=self.device)
            cidx = torch.tensor(handle.cpu_blocks, dtype=torch.long)
            for i in range(len(self.k)):
                k, v = self.blocks(i)
                k.index_copy_(0, gidx, self.cpu_k[i].index_select(0, cidx).to(self.device))
                v.index_copy_(0, gidx, self.cpu_v[i].index_select(0, cidx).to(self.device))
        self.free_handle(handle)

    def free_handle(self, handle: SwapHandle) -> None:
        """Forget a CPU copy without bringing it back (the request ended while swapped)."""
        self._free_cpu.extend(reversed(handle.cpu_blocks))
        handle.cpu_blocks = []
