"""LMDeploy 0.6 with its TurboMind engine (the version of the vLLM v0.6.0 post's comparison): ``deployment.engine:
lmdeploy``; ``version: "0.1"`` follows TurboMind before prefill and decode shared a forward (below).

Its memory rule gives the KV cache a share of the memory still free once the weights are loaded; its persistent
batch runs every running sequence's decode and up to ``max_prefill_token_num`` prompt tokens in one forward (a
longer prompt continues in the next), so steps mix prompts and decodes as chunked prefill does; a sequence that
cannot get a block makes the newest ones give theirs back and recompute later. TurboMind is C++ throughout: no host
time per step is added. Its tensor-parallel all-reduces are NCCL's under a host-synchronizing guard, not a custom
kernel's, and cost what NCCL costs over one (``TURBOMIND_NCCL_OVER_CUSTOM_S``). Not modelled (kept out rather than
guessed): its own attention and GEMM kernels' efficiency (the cost model's defaults price them), and its 64-token KV
blocks (``deployment.block_size`` stays the scenario's; set 64 to follow TurboMind's ``cache_block_seq_len``).

Version 0.1 (v0.1.0a1, the release of LMDeploy's December 2023 A100 tables): each loop of
src/turbomind/models/llama/LlamaBatch.cc runs ``ContextDecode()`` on the new prompts less their last token
("subtract input/context len by 1 to skip last input token (will process with decoder later)"), then
``Generate()``, one decode forward of every active sequence (``step_length`` 1), which computes the prompt's last
token and samples its first; the stream callback follows. A prompt's first token costs both forwards, the weights
read twice. "Unify prefill & decode passes" (InternLM/lmdeploy#775, 2023-12-04, after the v0.1.0a1 tag) made them one.
``ContextDecode()`` takes every sequence the loop admitted (``max_batch_size``, the KV blocks), split into
sub-batches of at most ``max_context_token_num`` x ``session_len`` tokens that all run before that one
``Generate()``: the sub-batch bounds a kernel's buffers, not a step, so every first token of a loop's arrivals
waits for all their prompts, and a prompt is never chunked (a longer one runs in a sub-batch of its own).
"""

from __future__ import annotations

from typing import Any

from sim.costs.analytic import DEFAULT_ALLREDUCE_LATENCY
from sim.engines.base import VERSION_KEY, Engine, EngineKey
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import DEFAULT_RUNTIME_OVERHEAD_BYTES, KVBudget
from sim.hardware.models import ModelSpec

# LMDeploy v0.6.0a0 (lmdeploy/messages.py TurbomindEngineConfig, lmdeploy/cli/utils.py): cache_max_entry_count
# 0.8, "the percentage of FREE gpu memory" the KV cache takes once the model is loaded; max_batch_size 128;
# max_prefill_token_num 8192. src/turbomind/models/llama/LlamaBatch.cc: a forward holds at most
# max_prefill_token_num + max_batch_size tokens (max_forward_token_num_), every active sequence's next token
# included; prefix caching off (enable_prefix_caching false). From v0.6.0 on, max_batch_size defaults by GPU
# (lmdeploy/utils.py get_max_batch_size: 256 on A100, 512 on H100); give policy.max_num_seqs to follow that.
# TurboMind's tensor-parallel all-reduce, from its start (src/fastertransformer renamed src/turbomind, InternLM/lmdeploy
# #33) until "Add collective communication kernels" (#3163, 2025-03-03), v0.1.0a1 and v0.6.0a0 alike: every one is
# NCCL's (``ftNcclAllReduceSum`` in LlamaFfnLayer.cc and the attention layers) inside an ``NcclGuard``
# (LlamaNcclGuard.h), which hands a mutex between the rank threads and, on leaving, polls ``cudaStreamQuery`` until
# the stream has drained (``ftNcclStreamSynchronize``); the FasterTransformer custom all-reduce the tree carries
# (utils/custom_ar_comm.cc) is not called by the llama layers. What NCCL costs over a custom all-reduce kernel, which
# the cost model's ``allreduce_latency`` (10 us) stands for, was measured by vLLM's custom all-reduce PR
# (vllm-project/vllm#2192, hanzhi713, 2023-12; benchmark_latency.py, 256 in and 256 out, batch 64, A100-80G NVLink):
# Llama-70B at TP 4 16.37 s with NCCL -> 14.57 s, LLaMA-33B at TP 2 15.88 -> 14.38 s, over 255 decode steps of 160
# and 120 all-reduces (the 16,384-token prefill's all-reduces are past the custom kernel's size limit): 44.1 and
# 49.0 us an all-reduce. Their mean is added to TurboMind's; NCCL there ran under CUDA graphs, so TurboMind's host
# synchronization after each one (not measured apart) is not priced, and the figure is a floor
TURBOMIND_NCCL_OVER_CUSTOM_S = (1.80 / (255 * 160) + 1.50 / (255 * 120)) / 2
LMDEPLOY_CACHE_MAX_ENTRY_COUNT = 0.8
LMDEPLOY_MAX_BATCH_SIZE = 128
LMDEPLOY_MAX_PREFILL_TOKEN_NUM = 8192


class LMDeploy(Engine):
    name = "lmdeploy"
    memory_key = "cache_max_entry_count"
    keys = (EngineKey(("cache_max_entry_count",), "cache_max_entry_count is lmdeploy's; engine {name} sizes its "
                      "KV cache with {memory_key}"), VERSION_KEY)
    versions = ("0.1", "0.6")

    def chunked_prefill(self, max_model_len: int) -> bool:
        return True

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        budget = LMDEPLOY_MAX_PREFILL_TOKEN_NUM + LMDEPLOY_MAX_BATCH_SIZE
        return budget if chunked else max(budget, max_model_len)

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return LMDEPLOY_MAX_BATCH_SIZE

    def context_decode_pass(self, cfg: Any) -> bool:
        return getattr(cfg, "version", None) == "0.1"

    def allreduce_latency(self, cfg: Any, tensor_parallel_size: int) -> float | None:
        # NCCL under TurboMind's NcclGuard, both versions (TURBOMIND_NCCL_OVER_CUSTOM_S)
        return DEFAULT_ALLREDUCE_LATENCY + TURBOMIND_NCCL_OVER_CUSTOM_S if tensor_parallel_size > 1 else None

    def fill_policy(self, policy: Any, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> Any:
        """Version 0.1: a step holds every admitted prompt whole (``ContextDecode()``'s sub-batches, above), so
        its token budget is every sequence's longest context and nothing is chunked, unless the scenario says."""
        filled = super().fill_policy(policy, cfg, gpu, max_model_len, kv_tokens)
        if not self.context_decode_pass(cfg):
            return filled
        update: dict[str, Any] = {}
        if policy.enable_chunked_prefill is None:
            update["enable_chunked_prefill"] = False
        if policy.max_num_batched_tokens is None:
            update["max_num_batched_tokens"] = filled.max_num_seqs * max_model_len
        return filled.model_copy(update=update)

    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """``cache_max_entry_count x (total - weights - runtime overhead)``: the share of what cudaMemGetInfo
        reports free after loading (the CUDA context and allocator's share counted as the runtime overhead)."""
        frac = cfg.cache_max_entry_count or LMDEPLOY_CACHE_MAX_ENTRY_COUNT
        return self.free_share_budget(model, gpu, kw, frac, DEFAULT_RUNTIME_OVERHEAD_BYTES, "cache_max_entry_count ",
                                      "runtime")


ENGINE = LMDeploy()
