"""Pre-flight limits on what one run may hold in host memory, estimated from the scenario before anything is
built, so that a run that could not finish says what it would need and how to shrink it (exit 2) instead of
ending in a MemoryError.

The paged KV manager keeps state only for blocks it has handed out (untouched blocks are one range), so what
counts is the blocks a run can touch, not the size of the pool:

- without prefix caching a block is reused as soon as it is freed (a stack), so at most the blocks the running
  requests can hold are ever touched: ``min(num_blocks, max_num_seqs * ceil(max_model_len / block_size))``;
- with prefix caching a freed block keeps its prefix until evicted, least recently freed first, so every block of
  the pool is touched before any is reused: ``num_blocks``.

Bytes per touched block were measured with tracemalloc on a 200,000-block allocation
(``benchmarks/bench_limits.py`` measures whole runs): about 40 B without prefix caching (an int in a block table or
on the free stack), about 275 B with it (reference count, prefix hash, free queue and set entries).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_KV_BOOKKEEPING_BYTES = 2 * 10**9  # host memory all replicas' KV managers of one run may take together
BYTES_PER_BLOCK = 48  # per touched block, no prefix caching (measured 40 B, rounded up)
BYTES_PER_CACHED_BLOCK = 300  # per touched block with prefix caching (measured 275 B, rounded up)
MAX_POOL_BLOCKS = 1 << 40  # a pool past this is a typo, not a GPU (an H200 holds ~2^34 one-token fp8 blocks)
# Requests one run may hold: the most that was run. A long run's finished requests, step log and readers are kept in
# columns, spilled or read a block at a time (issue 40): benchmarks/bench_million.py took 1,667 MB at its peak for
# 10,000,000 requests (docs/benchmarks.md). This bound refuses a typo of 1e8 up front. (Past 2^20 steps the step
# log also takes about 0.8 KB a request of disk, in TMPDIR: 8 GB at ten million.)
MAX_REQUESTS = 10_000_000
# Seconds of simulated time by which every request must have arrived. float64 seconds near 1e9 (~32 years) still
# resolve 0.1 us, so step times of microseconds add up; at a rate of 1e-300 req/s arrivals near 1e300 s swallowed
# every step (TTFT 0.0 for every request), a silently wrong run rather than a slow one.
MAX_ARRIVAL_S = 1e9
_REQUEST_BYTES = 200  # peak memory per request, for the message that refuses a larger run (175 B at 10,000,000)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def too_many_requests(n: int) -> str:
    """Why a run of ``n`` requests is refused, with what it would need."""
    return (f"{n} requests would need about {n * _REQUEST_BYTES / 1e9:.3g} GB of memory for their records; a run "
            f"holds at most {MAX_REQUESTS} (split the load over several runs, or sample it)")


@dataclass(frozen=True, slots=True)
class KVFootprint:
    """What the KV bookkeeping of a run can hold at once, per replica and in all."""

    touched_blocks: int  # per replica, at most
    bytes_per_block: int
    replicas: int

    @property
    def total_bytes(self) -> int:
        return self.touched_blocks * self.bytes_per_block * self.replicas


def kv_footprint(
    num_blocks: int, block_size: int, max_model_len: int, max_num_seqs: int, *, prefix_caching: bool, replicas: int = 1
) -> KVFootprint:
    """The most KV blocks a replica's manager can touch in a run, and what they cost in host memory."""
    if prefix_caching:
        return KVFootprint(num_blocks, BYTES_PER_CACHED_BLOCK, replicas)
    running = max_num_seqs * _cdiv(max_model_len, block_size)
    return KVFootprint(min(num_blocks, running), BYTES_PER_BLOCK, replicas)


def check_kv_footprint(fp: KVFootprint, *, num_blocks: int, block_size: int, prefix_caching: bool) -> str | None:
    """None when the run fits; else one sentence saying what it would need and how to shrink it."""
    if fp.total_bytes <= MAX_KV_BOOKKEEPING_BYTES:
        return None
    on = f" on each of {fp.replicas} replicas" if fp.replicas > 1 else ""
    why = ("with prefix caching every block is touched before any is reused" if prefix_caching
           else "the running requests can hold that many")
    shrink = "set deployment.num_gpu_blocks, a larger block_size"
    shrink += ", fewer replicas" if fp.replicas > 1 else ""
    shrink += ", or turn enable_prefix_caching off" if prefix_caching else ", or a smaller max_num_seqs"
    return (f"the KV cache would have {num_blocks} blocks of {block_size} tokens{on}, and the simulator would track "
            f"up to {fp.touched_blocks} of them ({why}), about {fp.total_bytes / 1e9:.3g} GB of memory; at most "
            f"{MAX_KV_BOOKKEEPING_BYTES / 1e9:.3g} GB ({shrink})")


def default_workers() -> int:
    """Parallel simulations for ``plan`` when -j is not given. A worker process costs its start-up (imports, the
    workload pickled to it) and a 2-core machine shares its cores with the parent and the system: measured on 2
    cores, plan-chat took 6.8 s with 1 worker and 10.2 s with 2 (CPU 3.1 s against 5.7 s). One core is therefore
    left to the parent, and below 4 usable cores the search runs in-process."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return 1 if cores < 4 else cores - 1
