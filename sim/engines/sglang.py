"""SGLang 0.4: ``deployment.engine: sglang``.

Its memory rule takes a static share of the card for weights plus KV; its request pool follows the KV cache's
size; its scheduler runs a step of prompts whenever one can start, else a step of decodes (prefill priority,
sim/engines/sched.py), unless ``enable_mixed_chunk``. Not modelled yet (kept out rather than guessed): its
new-token-ratio admission (it admits while blocks are free and recomputes on shortage).
"""

from __future__ import annotations

import math
from typing import Any

from sim.engines.base import Engine, EngineKey
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import DEFAULT_RUNTIME_OVERHEAD_BYTES, KVBudget
from sim.hardware.models import ModelSpec

# SGLang 0.4 (python/sglang/srt/server_args.py): mem_fraction_static (weights + KV pool share of the whole GPU) is
# 0.88 at tp 1, 0.87 at tp >= 2, 0.85 at >= 4, 0.81 at >= 8, 0.79 at >= 16; the rest is for activations and CUDA
# graphs. chunked_prefill_size 8192 (2048 on GPUs under 25 GB). model_runner.py sizes the request pool as
# min(max(kv_tokens / context_len * 512, 2048), 4096): that bounds the running requests.
SGLANG_MEM_FRACTION_STATIC = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
SGLANG_CHUNKED_PREFILL_SIZE = 8192
SGLANG_SMALL_GPU_BYTES = 25_000 * (1 << 20)
SGLANG_SMALL_GPU_CHUNK = 2048


def sglang_mem_fraction_static(tensor_parallel_size: int) -> float:
    """SGLang's default mem_fraction_static for a tensor-parallel degree (server_args.py)."""
    return next(f for tp, f in SGLANG_MEM_FRACTION_STATIC if tensor_parallel_size >= tp)


class SGLang(Engine):
    name = "sglang"
    memory_key = "mem_fraction_static"
    keys = (EngineKey(("enable_mixed_chunk",), "enable_mixed_chunk is sglang's; engine {name} sets how steps mix "
                      "with policy.enable_chunked_prefill and policy.prefill_mode"),
            EngineKey(("mem_fraction_static",), "mem_fraction_static is sglang's; engine {name} sizes its KV cache "
                      "with {memory_key}"))
    needs_kv_tokens = True

    def chunked_prefill(self, max_model_len: int) -> bool:
        return True

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        chunk = SGLANG_SMALL_GPU_CHUNK if gpu.memory_bytes < SGLANG_SMALL_GPU_BYTES else SGLANG_CHUNKED_PREFILL_SIZE
        return chunk if chunked else max(chunk, max_model_len)

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return 2048 if kv_tokens is None else int(min(max(kv_tokens / max_model_len * 512, 2048), 4096))

    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """model_runner.py profile_max_num_token: ``mem_fraction_static x total - weights - runtime overhead``
        (what is in use besides the weights when it measures the free memory)."""
        tp = kw.get("tensor_parallel_size", 1)
        weights = model.shard(tp).weight_bytes(kw.get("weight_dtype", "bf16"))
        total = gpu.memory_bytes
        frac = cfg.mem_fraction_static or sglang_mem_fraction_static(tp)
        reserve = DEFAULT_RUNTIME_OVERHEAD_BYTES
        kv_mem = math.floor(frac * total) - weights - reserve
        rule = f"mem_fraction_static {frac} x {total / GiB:.2f} GiB less {weights / GiB:.2f} GiB of weights and " \
               f"{reserve / GiB:.2f} GiB of runtime"
        return self.kv_budget_of(model, gpu, kw, weights, reserve, kv_mem, rule)

    def prefill_priority(self, cfg: Any) -> bool:
        # python/sglang/srt/managers/scheduler.py get_next_batch_to_run; --enable-mixed-chunk (off by default)
        # mixes the chunk into the decode batch instead
        return not cfg.enable_mixed_chunk


ENGINE = SGLang()
