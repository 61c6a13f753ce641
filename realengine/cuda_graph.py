"""Decode steps replayed as one CUDA graph.

A decode step of a small model at batch 1 is a few hundred tiny kernels; launched one by one from Python, the
launches, not the weights' bytes, set the step time. Recording the step once as a CUDA graph and replaying it
launches them all at once, which is how a real engine reaches its memory bandwidth in decode (vLLM captures one
graph per padded batch size).

A graph replays fixed addresses, so the step's inputs live in static buffers that ``step`` overwrites in place:
token ids, positions, the block tables (padded to ``max_blocks`` columns), the sequence lengths and the cache
slots of the new tokens. The attention bound ``max_decode_len`` is the table width in tokens; the kernels mask
each sequence at its own length, so one graph serves any context up to that width. Without CUDA (``capture``
False) the same buffers run eagerly, which is how the CPU tests check the buffer bookkeeping.
"""

from __future__ import annotations

import torch
from torch import Tensor

from realengine.attention import AttentionMetadata


class DecodeGraph:
    """One decode step of ``batch_size`` sequences (one new token each) on ``model`` over the paged ``kv``."""

    def __init__(self, model, kv, batch_size: int, max_blocks: int, *, capture: bool | None = None) -> None:
        if batch_size < 1 or max_blocks < 1:
            raise ValueError(f"batch_size and max_blocks must be >= 1, got {batch_size} and {max_blocks}")
        if kv.layout != "paged":
            raise ValueError("decode graphs address the paged layout")
        self.model = model
        self.kv = kv
        self.batch_size = batch_size
        self.max_blocks = max_blocks
        dev = model.device
        self.capture = dev.type == "cuda" if capture is None else capture
        b, bs = batch_size, kv.block_size
        self.input_ids = torch.zeros(b, dtype=torch.long, device=dev)
        self.positions = torch.zeros(b, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(b, max_blocks, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(b, dtype=torch.long, device=dev)
        self.slot_mapping = torch.zeros(b, dtype=torch.long, device=dev)
        self.meta = AttentionMetadata(
            query_start_loc=list(range(b + 1)),
            context_lens=[0] * b,  # read only for prefills, of which a decode step has none
            num_decodes=b,
            max_decode_len=max_blocks * bs,
            positions=self.positions,
            logits_indices=torch.arange(b, device=dev),
            block_size=bs,
            slot_mapping=self.slot_mapping,
            block_tables=self.block_tables,
            seq_lens=self.seq_lens,
        )
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        if self.capture:
            self._capture()

    def _forward(self) -> None:
        logits = self.model(self.input_ids, self.positions, self.meta, self.kv)
        self.tokens.copy_(logits.argmax(dim=-1))

    def _capture(self) -> None:
        # the slots point at block 0 of a zero table: the warm-up and capture writes land in one scratch block
        # that a real step's table then covers or overwrites before reading
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up on a side stream, as capture requires (allocator, autotuning)
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._forward()
        self.graph = graph

    def step(self, input_ids: Tensor, context_lens: Tensor, block_tables: Tensor) -> Tensor:
        """Decode one token for each sequence: ``input_ids [B]`` (its last token), ``context_lens [B]`` (tokens
        cached before it), ``block_tables [B, <= max_blocks]`` covering context + 1 tokens. Writes the new
        tokens' K/V into the cache and returns the greedy next tokens ``[B]`` (a view of a static buffer)."""
        b, bs = self.batch_size, self.kv.block_size
        if input_ids.shape != (b,) or context_lens.shape != (b,):
            raise ValueError(f"this graph decodes exactly {b} sequences")
        width = block_tables.shape[1]
        if width > self.max_blocks:
            raise ValueError(f"block tables of {width} blocks exceed the graph's {self.max_blocks}")
        self.input_ids.copy_(input_ids)
        self.positions.copy_(context_lens)
        self.seq_lens.copy_(context_lens + 1)
        self.block_tables[:, :width].copy_(block_tables)
        if width < self.max_blocks:
            self.block_tables[:, width:].zero_()
        block = self.block_tables.gather(1, (context_lens // bs).view(-1, 1).to(torch.long)).view(-1)
        self.slot_mapping.copy_(block * bs + context_lens % bs)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()
        return self.tokens
