"""Scheduler-side behaviours of the serving engines (``deployment.engine``) beyond sim.engines.registry' defaults.

vLLM v1's prefix cache. vLLM v1 (0.8-0.11) turns prefix caching on by default (vllm/engine/arg_utils.py:
``enable_prefix_caching`` None becomes True under V1) and hashes *every* full block of every prompt
(vllm/v1/core/kv_cache_utils.py hash_request_tokens), not only prefixes that requests share. What this buys near
KV capacity is the reason chunked prefill does not thrash there: the scheduler (vllm/v1/core/sched/scheduler.py
``schedule``) plans running requests first and, when a chunk finds no free block, preempts the last running
request, often the newest prefill itself (``self.running.pop()``, by recompute); its freed blocks keep their
hashes in the free queue, tail first, so when it comes back ``get_computed_blocks`` finds its computed chunks
and ``allocate_slots`` must take those blocks out of the free queue as well as the next chunk's. It therefore
waits until blocks for both are free (a running request finishes) instead of re-running its first chunks into
the same shortage step after step. servesim's chunked scheduler already follows the same loop (running first,
preempt the latest admitted, no new prompts in a step that preempted); without the cache its preempted prompt
restarted from nothing and was re-admitted at once, 1,922 preemptions in issue 13's scenario against 16 unchunked.

Multi-step scheduling, vLLM 0.6 (``--num-scheduler-steps N``; vllm/engine/llm_engine.py, vllm/core/scheduler.py
``_schedule_default`` with ``num_lookahead_slots``, vllm/engine/output_processor/multi_step.py): the scheduler
plans a block of N decode steps at once and the GPU runs them back to back; it is asked again only when the
block ends, so a prompt that arrives meanwhile waits for the rest of the block (TTFT grows by up to N decode
steps). servesim counts the decode-only steps taken since the last step with a prompt (``View.decode_run``);
inside a block (a count that is not a multiple of N) the policy schedules the running decodes only. Not
modelled: the lookahead slots vLLM reserves for a whole block (blocks are taken step by step here) and the slots
a request that finishes inside a block keeps until it ends (it leaves at once here).

SGLang's prefill priority (0.4, python/sglang/srt/managers/scheduler.py ``get_next_batch_to_run``): each
iteration first tries to form a prefill batch from the waiting queue (``get_new_batch_prefill``, chunks of
``chunked_prefill_size`` through schedule_policy.py's PrefillAdder, admitting while the KV pool has room) and
runs it alone; only when no prompt can start does it run the decode batch. The one request whose prompt is
being chunked continues first. ``--enable-mixed-chunk`` (off by default) mixes the chunk into the decode batch
instead, which is servesim's mixed chunked step.

CUDA-graph batch padding. vLLM replays a CUDA graph captured for a fixed batch size, so a decode step of B
requests runs (and is priced) as the next captured size up, the extra rows computing nothing; a batch above
the largest size runs eagerly, unpadded. vLLM v1 (0.11, vllm/config/vllm.py ``_set_cudagraph_sizes``): sizes
1, 2, 4, then multiples of 8 below 256 and of 16 from 256 up to min(2 x max_num_seqs, 512). vLLM v0 (0.5-0.6,
vllm/worker/model_runner.py ``_BATCH_SIZES_TO_CAPTURE``, decode only): 1, 2, 4 and multiples of 8 up to 256, no
larger than max_num_seqs padded the same way. ``enforce_eager`` turns it off; ``cudagraph_capture_sizes`` (vLLM's
name) replaces the list. Only decode-only steps are padded here (v1 also pads small mixed steps, under its
piecewise graphs: not modelled); TensorRT-LLM 0.17 (CUDA graphs off by default in its C++ runtime), SGLang and
classic run unpadded.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from sim.engines.base import engine_of
from sim.serving.block_manager import PagedBlockManager
from sim.serving.kv_manager import KVManager


def engine_kv_cache(kv_cache: Any, engine: Any) -> Any:
    """The ``kv_cache`` section with the engine's prefix-caching default where the scenario leaves it unset:
    vLLM v1 turns it on; a value the scenario gives wins, and every other engine keeps servesim's default (off)."""
    if not engine_of(engine).caches_every_prompt_block or getattr(kv_cache, "type", None) != "paged":
        return kv_cache
    if "enable_prefix_caching" in kv_cache.model_fields_set:
        return kv_cache
    return kv_cache.model_copy(update={"enable_prefix_caching": True})


def configure_kv(kv: KVManager, engine: Any) -> KVManager:
    """Under vLLM v1 a paged KV manager with prefix caching caches each request's own prompt blocks too."""
    if engine_of(engine).caches_every_prompt_block and isinstance(kv, PagedBlockManager):
        kv.cache_own_blocks = kv.enable_prefix_caching
    return kv


def configure_policy(policy: Any, engine: Any) -> Any:
    """The engine's scheduler behaviours that the policy's own config does not name: vLLM 0.6's multi-step, V0's
    whole-prompt admission."""
    if engine_of(engine).prefill_priority(engine) and hasattr(policy, "prefill_priority"):
        policy.prefill_priority = True
    watermark = engine_of(engine).whole_prompt_watermark
    if watermark is not None and hasattr(policy, "whole_prompt_watermark"):
        policy.whole_prompt_watermark = watermark
    if hasattr(policy, "cudagraph_capture_sizes"):
        policy.cudagraph_capture_sizes = capture_sizes(engine, policy.limits.max_num_seqs)
    steps = getattr(engine, "num_scheduler_steps", None)
    if steps is not None and steps > 1 and hasattr(policy, "num_scheduler_steps"):
        if policy.enable_chunked_prefill:
            raise ValueError("deployment.engine.num_scheduler_steps > 1 is modelled with chunked prefill off: set "
                             "policy.enable_chunked_prefill: false")
        policy.num_scheduler_steps = steps
    return policy


def capture_sizes(engine: Any, max_num_seqs: int) -> tuple[int, ...]:
    """The decode batch sizes the engine captures CUDA graphs for, ascending; () where it runs eagerly."""
    return engine_of(engine).capture_sizes(engine, max_num_seqs)


def graph_padding(sizes: tuple[int, ...], rows: int) -> int:
    """Rows a decode step of ``rows`` runs for nobody: up to the next captured size; 0 above the largest."""
    if not sizes or rows > sizes[-1]:
        return 0
    return sizes[bisect_left(sizes, rows)] - rows
