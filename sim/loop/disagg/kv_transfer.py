"""KV transfers between the pools: how many bytes a request's KV is, and when its copy over a link ends.

Bytes: the prefill replica holds ``prompt_len`` tokens of KV, ``kv_bytes_per_token`` of the model in the KV
dtype (2 x layers x KV heads x head_dim x bytes), split over its ``tensor_parallel_size`` GPUs by KV head.

Time: each prefill GPU sends its own shard over its own link (one NIC or NVLink port per GPU, as the
rail-optimised clusters the presets describe give it), the shards in parallel, so a request's transfer takes
``latency + shard_bytes / bandwidth``. The links of one prefill replica are a FIFO queue: transfers leave one
after the other at the full bandwidth, in the order their prefills ended (queueing, not fair sharing: what a
connector that posts one RDMA read per request after another does, and it keeps each transfer's time exact).
The decode side's receive links are not a bottleneck here: a decode replica receives from every prefill
replica, each at the sender's rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class KVLink:
    """The outgoing links of one prefill replica."""

    bandwidth: float  # bytes per second per GPU
    latency: float  # seconds per transfer
    tensor_parallel_size: int  # GPUs sending shards in parallel
    free_at: float = 0.0  # when the transfer in flight (if any) ends
    bytes_moved: float = 0.0
    busy_time: float = 0.0

    def transfer_time(self, nbytes: float) -> float:
        """Seconds one request's KV of ``nbytes`` (all shards) takes on an idle link."""
        return self.latency + nbytes / self.tensor_parallel_size / self.bandwidth

    def send(self, now: float, nbytes: float, duration: float | None = None) -> tuple[float, float]:
        """Queue a transfer of ``nbytes`` ready at ``now``; returns (start, end). ``duration``: the copy's
        seconds when it was measured (the real engine's), instead of the link's model."""
        start = max(now, self.free_at)
        d = self.transfer_time(nbytes) if duration is None else duration
        end = start + d
        self.free_at = end
        self.bytes_moved += nbytes
        self.busy_time += d
        return start, end


def kv_bytes(prompt_tokens: int, kv_bytes_per_token: float) -> float:
    """Bytes of the KV a prefill leaves for ``prompt_tokens`` tokens (the whole model, every TP shard)."""
    return float(prompt_tokens) * kv_bytes_per_token
