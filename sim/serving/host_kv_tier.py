"""A host-memory tier under the GPU prefix cache, as LMCache, vLLM's CPU KV offloading and SGLang's HiCache have.

When the paged block manager evicts a free block that still holds a cached prefix, the block's KV is copied to
a pool of host (CPU) memory instead of being lost. A later request whose prompt continues past its GPU prefix
hits with blocks that the host pool holds gets them loaded back over the host link (PCIe) instead of computing
them again: the load costs ``latency + blocks x block bytes / bandwidth`` seconds, added to the step that admits
the request (serial with it, as a swap-in is; LMCache's layer-wise pipelining would hide part of it). The copy
out to host at eviction is asynchronous in these systems and is not priced.

The pool is sized in GiB per GPU (each tensor-parallel GPU offloads its own shard, over its own link) and
evicts least recently used blocks when full. A block loaded back stays in host memory too (a copy, not a move),
so a prefix that bounces between the tiers is offloaded once.

The tier is plain Python and keyed by the block manager's chained prefix hashes, so equal keys are equal
prefixes; it knows nothing of GPU block ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Fixed cost of one load: a cudaMemcpyAsync launch plus the stream synchronisation before the forward reads the
# blocks (a few to tens of microseconds on current drivers).
DEFAULT_HOST_LOAD_LATENCY = 2.0e-5  # s per request loaded


@dataclass(slots=True)
class HostKVTier:
    """An LRU pool of prefix blocks in host memory, and what it saved."""

    capacity_blocks: int  # blocks the pool holds (per GPU: host_cache_gib // KV bytes per block)
    bytes_per_block: int  # KV bytes of one block on one GPU
    bandwidth: float  # B/s of the host-to-GPU link (one direction, pinned memory)
    latency: float = DEFAULT_HOST_LOAD_LATENCY  # s per load
    _lru: OrderedDict[int, None] = field(default_factory=OrderedDict, repr=False)
    pending_seconds: float = 0.0  # load time of the step being planned, taken by the core (``take_pending``)
    stored_blocks: int = 0  # blocks copied out to host at eviction (a block already there is only refreshed)
    evicted_blocks: int = 0  # blocks the host pool dropped to make room
    loaded_blocks: int = 0  # blocks loaded back to the GPU on a hit
    loads: int = 0  # requests that loaded blocks

    def __post_init__(self) -> None:
        if self.capacity_blocks < 0 or self.bytes_per_block < 1 or not self.bandwidth > 0 or self.latency < 0:
            raise ValueError("HostKVTier: capacity_blocks >= 0, bytes_per_block >= 1, bandwidth > 0 and "
                             "latency >= 0 are required")

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, h: int) -> bool:
        return h in self._lru

    def store(self, h: int) -> None:
        """The GPU evicts the block holding prefix hash ``h``: keep a copy (the least recently used one goes
        when the pool is full)."""
        self.store_all((h,))

    def store_all(self, hashes: Sequence[int]) -> None:
        """``store`` each of ``hashes`` in turn (the blocks one allocation evicts, in order)."""
        lru, cap = self._lru, self.capacity_blocks
        if cap == 0:
            return
        stored = evicted = 0
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            if len(lru) >= cap:
                lru.popitem(last=False)
                evicted += 1
            lru[h] = None
            stored += 1
        self.stored_blocks += stored
        self.evicted_blocks += evicted

    def run_length(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (a request's prefix chain past its GPU hits), from the first, the pool holds."""
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def load(self, hashes: Sequence[int]) -> None:
        """Load these blocks back to the GPU for one request: priced into the step being planned."""
        lru = self._lru
        for h in hashes:
            lru.move_to_end(h)
        self.loaded_blocks += len(hashes)
        self.loads += 1
        self.pending_seconds += self.latency + len(hashes) * self.bytes_per_block / self.bandwidth

    def take_pending(self) -> float:
        """Seconds of loads the step just planned pays (and reset for the next step)."""
        t = self.pending_seconds
        self.pending_seconds = 0.0
        return t

    def summary(self, block_size: int) -> dict[str, Any]:
        """What the tier did over a run: ``host_kv`` in summary.json."""
        return {
            "capacity_blocks": self.capacity_blocks,
            "capacity_gib": self.capacity_blocks * self.bytes_per_block / 2**30,
            "link_bandwidth": self.bandwidth,
            "stored_blocks": self.stored_blocks,
            "evicted_blocks": self.evicted_blocks,
            "hit_loads": self.loads,
            "loaded_blocks": self.loaded_blocks,
            "loaded_bytes": self.loaded_blocks * self.bytes_per_block,
            # prefill tokens the GPU did not compute again because the host held them
            "recompute_saved_tokens": self.loaded_blocks * block_size,
            "load_seconds": self.loads * self.latency + self.loaded_blocks * self.bytes_per_block / self.bandwidth,
        }



def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``host_kv`` of a fleet: every replica's pool and counts added up (the link is each replica's own)."""
    if not parts:
        return None
    out = {k: sum(p[k] for p in parts) for k in parts[0] if k != "link_bandwidth"}
    out["link_bandwidth"] = parts[0]["link_bandwidth"]
    return {k: out[k] for k in parts[0]}
