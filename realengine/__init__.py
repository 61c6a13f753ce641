"""A small real inference engine, driven by the simulator's own serving core.

- ``model``: a Llama-style decoder built from ``sim.hardware.models.ModelSpec`` (random seeded weights, or safetensors).
- ``kv_cache``: paged (or contiguous) K/V tensors addressed by the core's block tables; swap to CPU; sizing.
- ``attention``: the step's varlen metadata and attention over the cache (gather + SDPA reference).
- ``runner``: ``ModelRunner.execute(batch)`` turns a core ``Batch`` into tensors and returns the sampled tokens.

This package needs torch; ``sim`` never imports it.
"""

from realengine.attention import AttentionMetadata, build_metadata
from realengine.kv_cache import KVCache, SwapHandle, kv_bytes_per_block, num_blocks_for_memory, profile_num_blocks
from realengine.model import LlamaModel, load_safetensors, save_safetensors, torch_dtype
from realengine.runner import ModelRunner, prompt_token_ids

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "LlamaModel",
    "ModelRunner",
    "SwapHandle",
    "build_metadata",
    "kv_bytes_per_block",
    "load_safetensors",
    "num_blocks_for_memory",
    "profile_num_blocks",
    "prompt_token_ids",
    "save_safetensors",
    "torch_dtype",
]
