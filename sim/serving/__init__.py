"""The serving core, shared by the simulator and the real engine: requests, KV managers (paged, contiguous, host tier),
the decode group and its fast path, speculative decoding and pipeline stages.
"""
