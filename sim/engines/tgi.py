"""Hugging Face Text Generation Inference 2.2 (the release vLLM's nightly comparisons of 2024 ran):
``deployment.engine: tgi``.

Its memory rule gives the KV cache 95% of what is free after the weights and a warm-up prefill of its whole prompt
budget; its router (the block allocator of router/src/infer/v3) admits a request only when the blocks of its prompt
and of its ``max_new_tokens`` are all free, so nothing is ever preempted; new requests are prefilled in a forward
of their own while the running batch waits (no chunking), and decode batches of up to 32 replay CUDA graphs.
Not modelled (kept out rather than guessed): the router's waiting_served_ratio (0.3) and max_waiting_tokens (20),
which hold a prefill back until enough requests wait or the batch has decoded 20 tokens; and
max_concurrent_requests (128), past which TGI answers HTTP 429 instead of queueing (here: at most 128 running).
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import CudaGraphEngine, EngineKey
from sim.engines.costs import FA2_AMPERE_EFFICIENCY, FA2_HOPPER_EFFICIENCY
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget
from sim.hardware.models import ModelSpec

# TGI 2.2.0 launcher/src/main.rs: max_concurrent_requests 128; max_input_tokens min(max_position_embeddings - 1,
# 4095); max_batch_prefill_tokens max_input_tokens + 50; cuda_graphs [1, 2, 4, 8, 16, 32]; cuda_memory_fraction
# 1.0. server/text_generation_server/models/flash_causal_lm.py warmup: after a prefill of max_batch_prefill_tokens,
# num_blocks = 0.95 x free memory // one block's KV ("5% for some wiggle room"); BLOCK_SIZE 16 (globals.py).
# router/src/infer/v3/queue.rs: a request's blocks cover input_length + max_new_tokens. launcher/src/main.rs
# refuses to start unless max_input_tokens < max_total_tokens and max_batch_prefill_tokens >= max_input_tokens;
# router/src/validation.rs answers a prompt past max_input_tokens with an error (422), so a prompt is bounded by
# max_input_tokens and prompt + output by max_total_tokens (servesim's max_model_len).
TGI_MAX_CONCURRENT_REQUESTS = 128
TGI_MAX_INPUT_TOKENS = 4095
TGI_PREFILL_MARGIN = 50
TGI_FREE_MEMORY_SHARE = 0.95
TGI_CUDA_GRAPHS = (1, 2, 4, 8, 16, 32)


class TGI(CudaGraphEngine):
    name = "tgi"
    aliases = ("text-generation-inference",)
    # named in the refusal of another engine's memory key: TGI reads none (deployment.gpu_memory_utilization
    # neither; its --cuda-memory-fraction stays at 1.0)
    memory_key = "0.95 of the memory free after its warm-up prefill (no key)"
    keys = (CudaGraphEngine.CUDA_GRAPH_KEYS,
            EngineKey(("max_input_tokens",), "max_input_tokens is tgi's (--max-input-tokens); engine {name} bounds "
                      "a prompt by deployment.max_model_len alone"))
    prefill_mode = "prefill_first"
    capacity_scheduler_policy = "guaranteed_no_evict"

    def chunked_prefill(self, max_model_len: int) -> bool:
        return False

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        # max_batch_prefill_tokens: max_input_tokens + 50; a deployment that does not state max_input_tokens but
        # serves prompts past 4095 tokens raises it with max_model_len
        given = getattr(cfg, "max_input_tokens", None)  # checked against max_model_len by max_prompt_len
        return (max(TGI_MAX_INPUT_TOKENS, max_model_len - 1) if given is None else given) + TGI_PREFILL_MARGIN

    def max_prompt_len(self, cfg: Any, max_model_len: int) -> int | None:
        given = getattr(cfg, "max_input_tokens", None)
        if given is not None and given >= max_model_len:
            raise ValueError(f"max_input_tokens {given} must be < max_model_len {max_model_len} (TGI's "
                             "--max-input-tokens under its --max-total-tokens, prompt + output)")
        return given

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return TGI_MAX_CONCURRENT_REQUESTS

    def default_capture_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        return TGI_CUDA_GRAPHS

    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """``0.95 x (total - weights - the warm-up prefill's activations)``."""
        reserve = self.step_activations(model, kw)
        return self.free_share_budget(model, gpu, kw, TGI_FREE_MEMORY_SHARE, reserve, "TGI's ", "activations")

    def attention_efficiency(self, cfg: Any, architecture: str) -> float | None:
        # TGI 2.2 prefills with FlashAttention-2 (server/text_generation_server/layers/attention/cuda.py)
        if architecture == "hopper":
            return FA2_HOPPER_EFFICIENCY
        return FA2_AMPERE_EFFICIENCY if architecture == "ampere" else None


ENGINE = TGI()
