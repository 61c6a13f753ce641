"""What a serving engine adds to the analytic cost model: its host (CPU) time per step, and how a static batch's
activations are sized.

**Host time.** vLLM up to 0.5 ran the API server, the scheduler, input preparation and output processing in the
process that drives the GPU, one after the other: while the CPU works the GPU idles, so a step takes its GPU time
plus the host time. The vLLM team's profile of 0.5.3 ("vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency
Reduction", blog.vllm.ai 2024-09-05, Performance Diagnosis, Llama 3 8B on one H100) splits the run into 33% HTTP
API server, 29% scheduling (gathering the last step's results, scheduling, preparing inputs) and 38% GPU
execution. servesim reads that as a ratio: each step's host time is ``(0.33 + 0.29) / 0.38`` of its GPU time.

vLLM 0.6 moved the API server into its own process, added asynchronous output processing and multi-step
scheduling (same post). What is left is what vLLM V1 then removed: the V1 alpha post ("vLLM V1: A Major Upgrade
to vLLM's Core Architecture", blog.vllm.ai 2025-01-27) measures V1 "up to 1.7x higher throughput compared to V0
(without multi-step scheduling)", with "almost identical" kernels, so the difference is CPU overhead: a V0.6
step takes up to 1.7x V1's, a host ratio of 0.7. Multi-step scheduling (``--num-scheduler-steps n``) schedules
and prepares inputs once for n steps, so the ratio is divided by n. These ratios are sim/engines/vllm_v0.py's
(``Engine.host_time_ratio``).

vLLM V1, TensorRT-LLM (C++ executor, the host work overlapped with the GPU) and SGLang (its scheduler overlaps the
next batch's preparation with the GPU) keep the analytic model's defaults (``DEFAULT_STEP_OVERHEAD``, stated for
an optimized engine with CUDA graphs). The ratio multiplies only the GPU parts of a step (linear layers,
attention, all-reduces, swaps); the step and per-row overheads stay as they are. A step of prompts alone (no decode
row: vLLM V0 without chunked prefill runs prompts in steps of their own) waits instead for the host time of the
decode step of the same rows: V0's host work is per step and per sequence (scheduling, input preparation, sampling,
output processing), and both figures above were measured on runs whose steps decode, so a prompt's thousand tokens of
compute add none of it (sim/costs/analytic.py ``_prefill_host``). France Travail's closed loops through vLLM 0.4.3
and 0.6 measure it: one 1,000-token prompt of Llama-3-8B on an A100 took 82-98 ms to its first token, the GPU time
alone, where the whole-step stretch gave 1.7-2.6x that (docs/throughput-residuals.md). Steps with a decode row,
chunked prefill's mixed steps among them, stay stretched as a whole.

**Static batching's activations.** An engine that runs a padded static batch (HF Transformers' generate,
FasterTransformer, TensorRT-LLM's static batching) computes the batch's prompts in one forward and then one token
per row per step: its largest forward is ``batch_size x the longest prompt``, never ``batch_size x max_model_len``
(the generated tokens are computed one row at a time). An engine is built for its longest prompt:
TensorRT-LLM's build takes ``max_input_len`` apart from ``max_seq_len`` (prompt + output) and sizes its context
buffers for ``max_batch_size x max_input_len``. With ``deployment.engine`` set, servesim sizes a static batch's
activation reserve for ``batch_size x policy.max_input_len`` tokens (none: ``max_model_len``, the longest a prompt
may be); the classic engine keeps ``batch_size x max_model_len``, so that existing results stay the same.

**Attention's achievable FLOP/s.** Prefill attention runs the engine's attention kernel, whose achievable share of
the dense peak its authors measured: FlashAttention-2 (Dao, arXiv 2307.08691) reaches 50-73% of an A100's peak in
the forward pass, the low end at the short sequences serving sees; on an H100 it reaches only 35%
(FlashAttention-3, Shah et al., arXiv 2407.08608, abstract), and FlashAttention-3 reaches 75% there (740 TFLOP/s
in FP16). vLLM 0.5-0.6 runs FlashAttention-2 (its vllm-flash-attn build) on both; vLLM V1 runs FlashAttention-3 on
Hopper (vllm/attention/utils/fa_utils.py picks version 3 on compute capability 9.0) and 2 elsewhere. The
presets set ``attention_efficiency`` from these; TensorRT-LLM's and SGLang's kernels have no such published
figure and keep the cost model's default (its compute efficiency). Each engine's module picks its kernel's
share by the GPU's architecture (``Engine.attention_efficiency``). Decode attention is bound by the KV reads
(bandwidth), which this does not change.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import engine_of


def host_time_ratio(engine: Any, num_scheduler_steps: int = 1) -> float:
    """Host seconds per GPU second of a step under ``engine`` (an ``EngineConfig`` or None): its
    ``host_time_ratio`` when given, else the version's (vLLM 0.5: 1.63, 0.6: 0.7 divided by the steps scheduled
    at once), else 0."""
    if engine is None:
        return 0.0
    given = getattr(engine, "host_time_ratio", None)
    if given is not None:
        return float(given)
    return engine_of(engine).host_time_ratio(engine, num_scheduler_steps)


# achievable shares of the dense peak FLOP/s of the attention kernels (papers above)
FA2_AMPERE_EFFICIENCY = 0.50  # FlashAttention-2 paper: 50-73% on A100, the low end at short sequences
FA2_HOPPER_EFFICIENCY = 0.35  # FlashAttention-3 paper: FlashAttention-2 reaches 35% on H100
FA3_HOPPER_EFFICIENCY = 0.75  # FlashAttention-3 paper: up to 740 TFLOP/s in FP16 on H100, 75%


def _architecture(gpu: Any) -> str:
    """The GPU's declared ``architecture`` (FlashAttention-3 needs Hopper); "" for none or an unknown one."""
    return str(getattr(gpu, "architecture", "") or "")


def attention_efficiency(engine: Any, gpu: Any) -> float | None:
    """The preset's ``attention_efficiency`` on ``gpu``; None: the cost model's default."""
    if engine is None:
        return None
    return engine_of(engine).attention_efficiency(engine, _architecture(gpu))


def engine_cost_knobs(engine: Any, gpu: Any = None, tensor_parallel_size: int = 1) -> dict[str, float]:
    """``AnalyticCostModel`` keywords the engine sets (the scenario's own ``cost_model`` keys win); empty without
    an engine or when the engine adds nothing, so those runs build exactly the cost model they built before. The
    host time cap rides with the version's ratio: a ``host_time_ratio`` given in the engine block stands alone."""
    knobs: dict[str, float] = {}
    r = host_time_ratio(engine)
    if r > 0:
        knobs["host_time_ratio"] = r
        cap, per_row = engine_of(engine).host_time_cap(engine, tensor_parallel_size)
        if getattr(engine, "host_time_ratio", None) is None and (cap > 0 or per_row > 0):
            knobs["host_time_cap"], knobs["host_time_cap_per_row"] = cap, per_row
    a = attention_efficiency(engine, gpu)
    if a is not None:
        knobs["attention_efficiency"] = a
    if engine is not None and (ar := engine_of(engine).allreduce_latency(engine, tensor_parallel_size)) is not None:
        knobs["allreduce_latency"] = ar
    if engine is not None and (o := engine_of(engine).linear_overlap(engine)) is not None:
        knobs["linear_overlap"] = o
    if engine is not None and engine_of(engine).context_decode_pass(engine):
        knobs["context_decode_pass"] = True
    if engine is not None and engine_of(engine).per_request_busy(engine):
        knobs["per_request_busy"] = True
    return knobs


def static_reserve_tokens(engine: Any, batch_size: int, max_model_len: int, max_input_len: int | None) -> int:
    """Tokens of the largest forward a static batch's activations are sized for (see the module docstring)."""
    return engine_of(engine).static_reserve_tokens(batch_size, max_model_len, max_input_len)



def omit_when_unset(*keys: str) -> Any:
    """A pydantic wrap serializer dropping ``keys`` while they are None: the keys this module added to
    ``deployment.engine``, ``deployment.cost_model`` and the static policy are recorded only when set, so a run
    that does not use them writes exactly what it wrote before."""
    from pydantic import model_serializer

    def serialize(self: Any, handler: Any) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for k in keys:
                if k in out and out[k] is None:
                    del out[k]
        return out

    return model_serializer(mode="wrap")(serialize)
