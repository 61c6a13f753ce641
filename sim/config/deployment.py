"""The ``deployment`` section of a scenario (model, GPU, dtypes, parallelism, KV sizing, engine, cost model).

Below ``sim.config.schema``, which assembles the scenario from it, so that a section of a lower layer may name it: a
disaggregated pool's ``deployment`` keys are checked against it (sim/loop/disagg/config.py).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.errors import ScenarioError
from sim.config.files import input_path
from sim.config.input_model import Float, InputModel, Int
from sim.config.limits import MAX_POOL_BLOCKS
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import CostModel
from sim.costs.energy import clock_share
from sim.costs.fitted import FittedCostModel
from sim.costs.online import ServingConfig
from sim.engines.base import Engine, engine_of
from sim.engines.costs import engine_cost_knobs, omit_when_unset
from sim.engines.registry import EngineConfig, EngineField, engine_validator
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec
from sim.serving import spec_decode
from sim.serving.pipeline import PipelineLink


class CostModelConfigBase(InputModel):
    """A ``cost_model`` section: each kind builds its own cost model (``build``), so adding a kind touches only
    its class and the ``CostModelConfig`` union."""

    @abstractmethod
    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> CostModel:
        """The cost model of one replica of ``deployment`` (``model`` on ``gpu``, already resolved)."""


class AnalyticCost(CostModelConfigBase):
    """A roofline from the model's and the GPU's specs: FLOPs and bytes against peak rates, plus fixed overheads."""

    type: Literal["analytic"] = "analytic"
    compute_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of peak FLOP/s matmuls reach."
    )
    bandwidth_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of HBM bandwidth reached."
    )
    attention_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of peak FLOP/s attention kernels reach; none: the engine's "
        "(sim/engines/costs.py: FlashAttention-2/3 for vLLM), else compute_efficiency.")
    linear_overlap: Float | None = Field(
        default=None, ge=0, le=1, description="Share of the smaller side of a decode step's linear layers (compute "
        "or weight reads) run under the larger: 1 the roofline's max, 0 their sum; none: the engine's "
        "(sim/engines/vllm_v1.py: 0), else 1.")
    weight_only_bandwidth: Float | None = Field(
        default=None, gt=0, le=1, description="Share of bandwidth_efficiency at which weight-only quantized weights "
        "(int8, int4) stream through their dequantizing kernels; none: 1 (sim/costs/analytic.py "
        "TORCH_WEIGHT_ONLY_BANDWIDTH: PyTorch's, as gpt-fast and torchao run them).")
    _record_set_keys = omit_when_unset("attention_efficiency", "linear_overlap",
                                       "weight_only_bandwidth")  # recorded only when given
    step_overhead: Float | None = Field(
        default=None, ge=0, le=3600, description="Fixed seconds per step (CPU, launches)."
    )
    per_request_overhead: Float | None = Field(default=None, ge=0, le=3600, description="Seconds per request per step.")
    profile: str | None = Field(default=None, description="Knobs fitted by `servesim calibrate --from-bench` (JSON); "
                                "knobs given here override the profile's.")

    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> AnalyticCostModel:
        """The roofline of ``model`` on ``gpu`` in the deployment's dtypes and parallelism; the efficiencies and
        overheads given here (or in the profile) replace the cost model's defaults."""
        # sim/engines/costs.py; the keys below win
        extra: dict[str, Any] = engine_cost_knobs(deployment.engine, gpu, deployment.tensor_parallel_size)
        if self.profile is not None:
            from sim.output.benchfiles.knobs import read_knob_profile, read_knob_source

            input_path(self.profile, "cost_model.profile")  # '' read as no such file: "No such file or directory: ''"
            try:
                extra.update(read_knob_profile(self.profile))
                # knobs fitted to an H100's measurements gave an A100's roofline the H100's efficiencies and
                # per-step overhead without a word, as an engine profile of another GPU did (FittedCost)
                problem = profile_gpu_problem(read_knob_source(self.profile)[1], deployment,
                                              "its efficiencies and overheads were fitted to the {m}'s measurements "
                                              "and would scale the {s}'s roofline")
                if problem is not None:
                    raise ValueError(problem)
            except FileNotFoundError as e:
                raise ScenarioError(f"cost_model.profile: file not found: {e.filename or e}") from None
            except (ValueError, OSError) as e:
                raise ScenarioError(f"cost_model.profile: {e}") from None
        extra.update({k: v for k, v in self.model_dump().items() if k not in ("type", "profile") and v is not None})
        if deployment.power_limit_w is not None:
            extra["compute_clock"] = capped_clock(gpu, deployment.power_limit_w)
        return AnalyticCostModel(
            model,
            gpu,
            weight_dtype=deployment.weight_dtype,
            kv_dtype=deployment.kv_dtype,
            tensor_parallel_size=deployment.tensor_parallel_size,
            block_size=deployment.block_size,
            **extra,
        )


def capped_clock(gpu: GPUSpec, limit_w: float) -> float:
    """The SM clock share under ``deployment.power_limit_w`` (sim.costs.energy.clock_share); a ScenarioError when the
    GPU
    has no power figures or the cap is outside what its board accepts."""
    if gpu.tdp_w <= 0:
        raise ScenarioError(f"power_limit_w: GPU {gpu.name!r} has no tdp_w/idle_w power figures (give them in "
                            "deployment.gpu)")
    if not gpu.idle_w < limit_w <= gpu.tdp_w:
        raise ScenarioError(f"power_limit_w: {limit_w:g} W is outside the range of GPU {gpu.name}: above its "
                            f"idle {gpu.idle_w:g} W, at most its TDP {gpu.tdp_w:g} W")
    return clock_share(gpu.idle_w, gpu.tdp_w, limit_w)


class FittedCost(CostModelConfigBase):
    """Step times fitted to an engine's measured steps: a calibration profile (servesim calibrate)."""

    type: Literal["fitted"] = "fitted"
    profile: str = Field(description="Path of a calibration profile JSON (see `servesim calibrate`).")
    # The engine's profile is measured on the engine alone; a live server around it (HTTP threads sharing the
    # interpreter and the cores, streaming, other jobs) takes longer per step. These two, fitted by `servesim
    # calibrate --from-bench --profile`, describe that server: each step takes profile x scale + step_overhead.
    scale: Float | None = Field(default=None, gt=0, le=1000, description="Factor on every step time of the "
                                "profile; none: 1.")
    step_overhead: Float | None = Field(default=None, ge=0, le=3600, description="Seconds added to every step "
                                        "on top of the profile; none: 0.")
    _record_set_keys = omit_when_unset("scale", "step_overhead")  # recorded only when given

    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> FittedCostModel:
        """The profile's fitted model (it describes one device and model: ``model`` and ``gpu`` are not read),
        scaled and offset when ``scale`` or ``step_overhead`` are given. A profile that cannot be read is a
        ``ScenarioError`` naming ``cost_model.profile``."""
        input_path(self.profile, "cost_model.profile")  # '' read as no such file: "No such file or directory: ''"
        if deployment.power_limit_w is not None:  # a capped clock slows only the roofline's compute
            raise ScenarioError(f"deployment.power_limit_w: a calibration profile's steps were measured at the "
                                "power limit its GPU had then and cannot be slowed to another; a cap of "
                                f"{deployment.power_limit_w:g} W is modelled with cost_model analytic (the default)")
        try:
            fitted = FittedCostModel.from_profile(self.profile)
            problem = (profile_model_problem(fitted.model, deployment.model)
                       or profile_gpu_problem(fitted.device, deployment))
            if problem is not None:
                raise ValueError(problem)
            if self.scale is None and self.step_overhead is None:
                return fitted
            return fitted.scaled(self.scale if self.scale is not None else 1.0, self.step_overhead or 0.0)
        except FileNotFoundError as e:
            raise ScenarioError(f"cost_model.profile: file not found: {e.filename or e}") from None
        except KeyError as e:
            raise ScenarioError(f"cost_model.profile: lacks the field {e}") from None
        except (ValueError, TypeError, OSError) as e:
            raise ScenarioError(f"cost_model.profile: {e}") from None


def profile_model_problem(measured: object, simulated: str | dict[str, Any]) -> str | None:
    """Why a profile measured on the model preset ``measured`` cannot price a deployment of ``simulated`` (its
    step times are that model's: naive-vs-continuous, Llama-3.1-8B on an A100, on the tiny CPU profile ran without
    a word, every step the tiny model's), or None. A model given as a config, or a profile naming no preset, is
    not judged."""
    from sim.hardware.models import is_model_preset

    if not (is_model_preset(measured) and is_model_preset(simulated)):
        return None
    assert isinstance(measured, str) and isinstance(simulated, str)
    if ModelSpec.from_name(measured).name == ModelSpec.from_name(simulated).name:
        return None
    return (f"measured on {measured}, but deployment.model is {simulated}: its step times are {measured}'s; give "
            f"deployment.model: {measured}, or calibrate {simulated} (servesim calibrate --model {simulated})")


def profile_gpu_problem(device: object, deployment: Deployment,
                        what: str = "its step times are the {m}'s while the KV cache and power would be the {s}'s"
                        ) -> str | None:
    """Why a profile measured on ``device`` cannot price a deployment on ``deployment.gpu``, or None: its step times
    are that GPU's, while the KV cache's size and the power figures come from deployment.gpu (a profile measured on
    an H200 ran on the default h100-sxm without a word, an H200's steps in an H100's memory). A device that names
    no GPU preset (a CPU) or a GPU given as fields is not judged. ``what``: what the profile's numbers are, with
    {m} the measured GPU and {s} the simulated one."""
    from sim.hardware.names import match_gpu

    measured = match_gpu(device) if isinstance(device, str) and device else None
    simulated = match_gpu(deployment.gpu) if isinstance(deployment.gpu, str) else None
    if measured is None or simulated is None or measured == simulated:
        return None
    default = "" if "gpu" in deployment.model_fields_set else " (the default)"
    named = "" if device == measured else f" ({measured})"
    return (f"measured on {device}{named}, but deployment.gpu is {deployment.gpu}{default}: "
            f"{what.format(m=measured, s=simulated)}; give deployment.gpu: {measured}, or calibrate on the "
            f"{simulated}")


CostModelConfig = Annotated[AnalyticCost | FittedCost, Field(discriminator="type")]


GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


class Deployment(InputModel):
    model: str | dict[str, Any] = Field(
        default="llama-3.1-8b",
        description="Model preset name, path to a Hugging Face config.json, or its fields inline.",
    )
    gpu: str | dict[str, Any] = Field(default="h100-sxm", description="GPU preset name, or GPUSpec fields inline.")
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] = Field(
        default="bf16", description="Data type of the weights."
    )
    kv_dtype: Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"] = Field(
        default="auto", description="Data type of the KV cache; auto: the model's activation dtype."
    )
    tensor_parallel_size: Int = Field(default=1, ge=1, description="GPUs one replica's weights and KV are split over.")
    pipeline_parallel_size: Int = Field(
        default=1, ge=1, le=1024, description="Pipeline stages the layers are split over, each tensor_parallel_size "
        "GPUs (sim/serving/pipeline.py); a replica has tp x pp GPUs.")
    pipeline_link: PipelineLink = Field(default="auto", description="Link between pipeline stages: nvlink, pcie or "
                                        "infiniband (between nodes); auto: NVLink when the GPU has it, else PCIe.")
    gpu_memory_utilization: Float = Field(
        default=GPU_MEMORY_UTILIZATION, gt=0, le=1,
        description="Share of GPU memory the engine may use (weights + activations + KV)."
    )
    num_gpu_blocks: Int | None = Field(default=None, ge=1, description="Override the KV block count vLLM would size.")
    block_size: Int = Field(default=16, ge=1, description="Tokens per KV block.")
    max_model_len: Int | None = Field(
        default=None, ge=1, description="Longest prompt+output a request may have; none: the model's context length."
    )
    swap_space: Float = Field(
        default=4.0, ge=0, le=1 << 20, description="CPU swap space per GPU in GiB (vLLM's swap_space)."
    )
    cost_model: CostModelConfig = Field(default_factory=AnalyticCost, description="How step times are predicted.")
    engine: EngineConfig | None = EngineField  # sim/engines/registry.py
    _engine = engine_validator
    serving: ServingConfig | None = Field(
        default=None, description="The run is an online benchmark through the engine's HTTP server: 'online' (the "
        "engine preset's defaults) or {request_handling_s, request_latency_s, tokenize_s_per_token, "
        "detokenize_s_per_token} (sim/costs/online.py); none: offline, nothing outside the engine.")
    speculative: spec_decode.SpeculativeConfig | None = Field(
        default=None, description="Speculative decoding (vLLM's speculative_config); none: off.")
    power_limit_w: Float | None = Field(
        default=None, gt=0, le=1e5, description="Board power limit per GPU in watts (nvidia-smi -pl); none: the "
        "GPU's TDP. A cap below the TDP runs the SM clocks down: compute-bound steps slow, memory-bound ones barely "
        "(sim/costs/energy.py); with the analytic cost model only (a calibration profile's measured steps are refused "
        "a cap).")
    # recorded only when given, so that runs without them write what they did
    _record_set_keys = omit_when_unset("serving", "power_limit_w")
    leak_kv_on_failure: bool = Field(
        default=False,
        description="The bug the failure-mode scenarios show: the KV blocks of a request that fails mid-flight "
        "are never freed. Off: they are freed at once, as a correct server does.",
    )

    @model_validator(mode="after")
    def _memory_rule_reads_it(self) -> Deployment:
        """An engine with a memory rule of its own (TensorRT-LLM, SGLang, LMDeploy, TGI) never reads
        gpu_memory_utilization: another value than the default would be ignored without a word. (The value, not
        whether it was given: variants and sweeps validate the dumped section again, default included.)"""
        own = engine_of(self.engine)
        if own.memory_key != Engine.memory_key and self.gpu_memory_utilization != GPU_MEMORY_UTILIZATION:
            raise ValueError(f"gpu_memory_utilization {self.gpu_memory_utilization:g} is vLLM's; engine {own.name} "
                             f"sizes its KV cache with {own.memory_key}")
        return self

    @field_validator("num_gpu_blocks")
    @classmethod
    def _blocks_cap(cls, n: int | None) -> int | None:
        if n is not None and n > MAX_POOL_BLOCKS:
            raise ValueError(f"{n} blocks is past any GPU (at most {MAX_POOL_BLOCKS}); the simulator tracks only the "
                             "blocks in use, so size the pool as the GPU would")
        return n
