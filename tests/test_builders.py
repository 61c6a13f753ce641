"""Each scenario section builds its own object; the planner resolves a deployment with the very same builders;
one resolver per model and per GPU; the protocols carry the defaults the core relies on."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import VariantConfig
from sim.config.schema import (
    AdmissionConfig,
    AnalyticCost,
    ContiguousKV,
    ContinuousPolicyConfig,
    CostModelConfig,
    Deployment,
    FittedCost,
    KVCacheConfig,
    KVCacheConfigBase,
    PagedKV,
    PolicyConfig,
    PolicyConfigBase,
    ScenarioError,
    StaticPolicyConfig,
)
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import CostModel, StepShape, optional_member
from sim.costs.fitted import FittedCostModel
from sim.hardware.gpu import GPU_PRESETS, GPUSpec, resolve_gpu
from sim.hardware.models import MODEL_PRESETS, ModelSpec, resolve_model
from sim.loop.build import build
from sim.policies import Admission, ContinuousPolicy, Limits, Plan, Policy, StaticPolicy
from sim.serving.block_manager import PagedBlockManager
from sim.serving.contiguous_allocator import ContiguousAllocator
from sim.serving.core import ServingCore
from sim.serving.kv_manager import BlockError
from sim.serving.request import Request, RequestSpec
from sim.studies.planner import _resolve


def _members(union: object) -> tuple[type, ...]:
    """The config classes of one discriminated union (``Annotated[A | B, Field(...)]``)."""
    return typing.get_args(typing.get_args(union)[0])


POLICY_KINDS = _members(PolicyConfig)
KV_KINDS = _members(KVCacheConfig)
COST_KINDS = _members(CostModelConfig)


def _variant(policy=None, kv=None, cost=None, **deployment) -> VariantConfig:
    dep = Deployment.model_validate({"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 4096, **deployment,
                                     **({"cost_model": cost} if cost is not None else {})})
    return VariantConfig("v", dep, kv or PagedKV(), policy or ContinuousPolicyConfig(), AdmissionConfig(), {})


# ---- policies -------------------------------------------------------------------------------------------------
def test_the_unions_list_every_config_kind() -> None:
    assert sorted(k.__name__ for k in POLICY_KINDS) == [
        "ContinuousPolicyConfig", "CustomPolicyConfig", "EDFPolicyConfig", "FCFSPolicyConfig", "LOFPolicyConfig",
        "LPMPolicyConfig", "PriorityPolicyConfig", "SJFPolicyConfig", "StaticPolicyConfig", "VTCPolicyConfig"]
    assert sorted(k.__name__ for k in KV_KINDS) == ["ContiguousKV", "PagedKV"]
    assert sorted(k.__name__ for k in COST_KINDS) == ["AnalyticCost", "FittedCost"]


@pytest.mark.parametrize("kind", POLICY_KINDS, ids=lambda k: k.__name__)
def test_every_policy_config_builds_its_policy(kind: type[PolicyConfigBase]) -> None:
    # a user's class (custom) needs its name: the FCFS example on the public API
    cfg = kind(cls="sim.policies.queue:FCFSPolicy") if kind.__name__ == "CustomPolicyConfig" else kind()
    limits = cfg.limits(4096)
    assert isinstance(limits, Limits) and limits.max_model_len == 4096
    admission = Admission(max_queue_len=3)
    policy = cfg.build(limits, admission)
    assert policy.limits is limits and policy.admission is admission
    assert callable(policy.schedule) and callable(policy.wake_time)
    assert Policy in type(policy).__mro__  # subclasses the protocol: its defaults and mypy's checks apply
    # build() gives the same policy through the scenario's path
    built, _, _, b = build(_variant(policy=cfg))
    assert type(built) is type(policy) and b.limits == limits and built.limits == limits


def test_static_config_copies_its_fields_and_sizes_a_padded_batch() -> None:
    cfg = StaticPolicyConfig(batch_size=4, max_wait=0.5, preemption_mode="swap")
    assert cfg.limits(1000) == Limits(256, 4 * 1000, 1000)  # a padded batch: batch_size x max_model_len tokens
    assert StaticPolicyConfig(batch_size=300).limits(10) == Limits(300, 3000, 10)
    p = cfg.build(cfg.limits(1000), Admission())
    assert isinstance(p, StaticPolicy)
    assert (p.batch_size, p.max_wait, p.preemption_mode) == (4, 0.5, "swap")


@pytest.mark.parametrize(
    "fields, max_model_len, mnbt",
    [
        ({}, 4096, 8192),  # vLLM's default budget
        ({}, 20000, 20000),  # without chunking a whole prompt must fit in one step
        ({"enable_chunked_prefill": True}, 20000, 8192),  # with chunking it need not
        ({"max_num_batched_tokens": 512, "enable_chunked_prefill": True}, 20000, 512),  # given: used as is
    ],
)
def test_continuous_config_limits(fields: dict, max_model_len: int, mnbt: int) -> None:
    cfg = ContinuousPolicyConfig(max_num_seqs=7, **fields)
    assert cfg.limits(max_model_len) == Limits(7, mnbt, max_model_len)


def test_continuous_config_copies_its_fields() -> None:
    cfg = ContinuousPolicyConfig(enable_chunked_prefill=True, prefill_mode="mixed", preemption_mode="swap")
    p = cfg.build(cfg.limits(4096), Admission())
    assert isinstance(p, ContinuousPolicy)
    assert (p.enable_chunked_prefill, p.prefill_mode, p.preemption_mode) == (True, "mixed", "swap")


def test_a_policy_config_without_builders_cannot_be_created() -> None:
    class Forgetful(PolicyConfigBase):  # a new kind that defines no limits() or build()
        type: typing.Literal["forgetful"] = "forgetful"

    with pytest.raises(TypeError, match="abstract"):
        Forgetful()  # type: ignore[abstract]  # the very mistake this test makes on purpose


@pytest.mark.parametrize("section", ["policy", "kv_cache", "cost_model"])
def test_build_refuses_what_is_no_config_with_a_clear_error(section: str) -> None:
    from pydantic import BaseModel

    class Stranger(BaseModel):  # e.g. a config written for another project, or a section of the wrong kind
        type: str = "static"
        batch_size: int = 8

    cfg = _variant()
    if section == "policy":
        cfg = VariantConfig("v", cfg.deployment, cfg.kv_cache, Stranger(), cfg.admission, {})  # type: ignore[arg-type]
        base = "PolicyConfigBase"
    elif section == "kv_cache":
        cfg = VariantConfig("v", cfg.deployment, Stranger(), cfg.policy, cfg.admission, {})  # type: ignore[arg-type]
        base = "KVCacheConfigBase"
    else:
        dep = cfg.deployment.model_copy(update={"cost_model": Stranger()})
        cfg = VariantConfig("v", dep, cfg.kv_cache, cfg.policy, cfg.admission, {})
        base = "CostModelConfigBase"
    with pytest.raises(ScenarioError, match=f"variant 'v': .*{section}: Stranger is not a {base}"):
        build(cfg)


def test_admission_config_builds_admission() -> None:
    assert AdmissionConfig(max_queue_len=5, max_queue_delay=2.5).build() == Admission(5, 2.5)
    assert AdmissionConfig().build() == Admission()


# ---- KV caches ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KV_KINDS, ids=lambda k: k.__name__)
def test_every_kv_config_builds_a_manager_of_the_given_size(kind: type[KVCacheConfigBase]) -> None:
    kv = kind().build(40, 16, max_model_len=128, num_cpu_blocks=9)
    assert (kv.num_blocks, kv.block_size, kv.num_free_blocks, kv.num_free_cpu_blocks) == (40, 16, 40, 9)


def test_kv_configs_pass_their_own_fields() -> None:
    paged = PagedKV(enable_prefix_caching=True).build(8, 4, max_model_len=32, num_cpu_blocks=0)
    assert isinstance(paged, PagedBlockManager) and paged.enable_prefix_caching
    contiguous = ContiguousKV(reserve="request").build(8, 4, max_model_len=32, num_cpu_blocks=0)
    assert isinstance(contiguous, ContiguousAllocator)
    assert (contiguous.reserve, contiguous.max_model_len) == ("request", 32)


# ---- cost models ----------------------------------------------------------------------------------------------
def test_analytic_config_builds_the_deployments_roofline() -> None:
    dep = Deployment(model="llama-3.2-1b", gpu="h100-sxm", weight_dtype="fp8", tensor_parallel_size=2,
                     block_size=32, cost_model=AnalyticCost(step_overhead=2e-3, compute_efficiency=0.5))
    m, g = resolve_model("llama-3.2-1b"), resolve_gpu("h100-sxm")
    cost = dep.cost_model.build(m, g, dep)
    assert cost == AnalyticCostModel(m, g, weight_dtype="fp8", tensor_parallel_size=2, block_size=32,
                                     step_overhead=2e-3, compute_efficiency=0.5)
    # the efficiencies not given keep the cost model's defaults
    assert cost.bandwidth_efficiency == AnalyticCostModel(m, g).bandwidth_efficiency


def test_fitted_config_reads_its_profile_and_names_it_when_it_cannot(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema_version": 2, "model": "tiny", "coefficients": {"step": 1e-3, "token": 2e-5}}))
    m, g = resolve_model("tiny"), resolve_gpu("l4")
    dep = Deployment(model="tiny")
    cost = FittedCost(profile=str(path)).build(m, g, dep)
    assert cost == FittedCostModel(step=1e-3, token=2e-5, model="tiny",
                                   flops_per_token=cost.flops_per_token, flops_per_seq=cost.flops_per_seq,
                                   flops_per_attn_pair=cost.flops_per_attn_pair)
    assert cost.step_time(StepShape(1, 10, 0, 10, 55)) == 1e-3 + 10 * 2e-5
    with pytest.raises(ScenarioError, match="cost_model.profile: file not found"):
        FittedCost(profile=str(tmp_path / "missing.json")).build(m, g, dep)
    with pytest.raises(ScenarioError, match=r"variant 'v': deployment\.cost_model\.profile: file not found"):
        build(_variant(cost={"type": "fitted", "profile": str(tmp_path / "missing.json")}))


@pytest.mark.parametrize("kind", ["fitted", "analytic"])
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_profile_path_is_named(kind: str, value: str) -> None:
    """``profile: ""`` (an unset variable in a templated scenario) said "file not found: [Errno 2] No such file or
    directory: ''"; it is named as every other empty input path is."""
    with pytest.raises(ScenarioError, match=r"^variant 'v': deployment\.cost_model\.profile: empty path; name the "
                       r"file or folder to read$"):
        build(_variant(cost={"type": kind, "profile": value}))


# ---- the planner resolves with build's rules ------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy, deployment",
    [
        (ContinuousPolicyConfig(), {}),
        (ContinuousPolicyConfig(enable_chunked_prefill=True, max_num_seqs=64), {"kv_dtype": "fp8"}),
        (ContinuousPolicyConfig(max_num_batched_tokens=2048, max_num_seqs=8, enable_chunked_prefill=True),
         {"gpu": "h100-sxm", "tensor_parallel_size": 2}),
    ],
)
def test_planner_resolves_a_deployment_exactly_as_build(policy: ContinuousPolicyConfig, deployment: dict) -> None:
    cfg = _variant(policy=policy, **deployment)
    _, kv, cost, b = build(cfg)
    p_cost, p_budget, p_mnbt = _resolve(cfg, b.model, b.gpu)
    assert p_cost == cost and p_budget == b.budget and p_mnbt == b.limits.max_num_batched_tokens
    assert kv.num_blocks == p_budget.num_gpu_blocks


def test_planner_refuses_what_build_refuses_with_the_same_words() -> None:
    cfg = _variant(model="llama-3.1-70b")
    with pytest.raises(ScenarioError) as built:
        build(cfg)
    with pytest.raises(ScenarioError) as planned:
        _resolve(cfg, resolve_model("llama-3.1-70b"), resolve_gpu("l4"))
    assert "does not fit" in str(planned.value)
    assert str(built.value) == f"variant 'v': {planned.value}"


# ---- one resolver per concept ---------------------------------------------------------------------------------
def test_resolve_model_takes_every_form_a_user_gives(tmp_path) -> None:
    spec = ModelSpec.from_name("llama-3.2-1b")
    assert resolve_model(spec) is spec
    assert resolve_model("Llama-3.2-1B") == spec  # preset names are case-insensitive
    cfg = spec.to_hf_config()
    assert resolve_model(cfg) == ModelSpec.from_hf_config(cfg)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    from_file, from_folder = resolve_model(str(folder / "config.json")), resolve_model(folder)
    assert from_file == from_folder == ModelSpec.from_hf_config(cfg, name=from_file.name)
    with pytest.raises(ValueError, match="unknown model 'llama-9'; presets: "):
        resolve_model("llama-9")
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "nowhere" / "config.json"))


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_resolve_model_is_from_name_for_every_preset(name: str) -> None:
    assert resolve_model(name) == ModelSpec.from_name(name)


def test_resolve_gpu_takes_a_spec_a_name_or_fields() -> None:
    h100 = GPU_PRESETS["h100-sxm"]
    assert resolve_gpu(h100) is h100 and resolve_gpu("H100") == h100
    fields = {"name": "x", "memory_bytes": 1 << 34, "mem_bandwidth": 1e12, "peak_flops": {"bf16": 1e14},
              "pcie_bandwidth": 2.5e10}
    assert resolve_gpu(fields) == GPUSpec.from_dict(fields)
    with pytest.raises(ValueError, match="unknown GPU 'tpu'"):
        resolve_gpu("tpu")


def test_no_module_keeps_its_own_resolver() -> None:
    import sim.config.scenario
    import sim.hardware.capacity
    import sim.studies.planner

    for module in (sim.hardware.capacity, sim.studies.planner, sim.config.scenario):
        for name in ("resolve_model", "resolve_gpu"):
            f = getattr(module, name, None)
            assert f is None or f.__module__ in ("sim.hardware.models", "sim.hardware.gpu"), (module.__name__, name)
    assert not hasattr(sim.config.scenario, "_model_spec") and not hasattr(sim.studies.planner, "_model_of")


# ---- the KV manager's public block grab -----------------------------------------------------------------------
def _filled(prefix: bool, num_blocks: int, lengths: list[int]) -> tuple[PagedBlockManager, list[Request]]:
    kv = PagedBlockManager(num_blocks, 4, enable_prefix_caching=prefix)
    reqs = []
    for i, n in enumerate(lengths):
        r = Request(RequestSpec(i, 0.0, n, 100), arrival=0.0)
        if kv.blocks_needed(r, n) > kv.num_free_blocks:
            break
        kv.allocate(r, n)
        r.num_computed_tokens = n
        reqs.append(r)
    return kv, reqs


@settings(max_examples=60, deadline=None)
@given(prefix=st.booleans(), num_blocks=st.integers(1, 24), lengths=st.lists(st.integers(1, 12), max_size=8),
       pick=st.lists(st.integers(0, 7), max_size=8, unique=True))
def test_try_grow_is_can_grow_then_grow_or_nothing(prefix: bool, num_blocks: int, lengths: list[int],
                                                  pick: list[int]) -> None:
    kv, reqs = _filled(prefix, num_blocks, lengths)
    twin, twin_reqs = _filled(prefix, num_blocks, lengths)
    chosen = [reqs[i] for i in pick if i < len(reqs)]
    before = {r.id: kv.block_table(r) for r in reqs}
    ok = kv.try_grow(chosen)
    assert ok == twin.can_grow(len(chosen))
    if ok:
        twin.grow([twin_reqs[i] for i in pick if i < len(reqs)])
    else:  # nothing taken
        assert {r.id: kv.block_table(r) for r in reqs} == before
    assert kv.tables == twin.tables and kv.num_free_blocks == twin.num_free_blocks
    kv.check_invariants()


def test_grow_without_blocks_raises_and_block_table_is_a_copy() -> None:
    kv, reqs = _filled(False, 2, [4, 4])
    assert not kv.can_grow(1)
    with pytest.raises(BlockError):
        kv.grow(reqs[:1])
    table = kv.block_table(reqs[0])
    table.append(99)
    assert kv.block_table(reqs[0]) == kv.tables[reqs[0].id] != table
    assert kv.block_table(Request(RequestSpec(9, 0.0, 4, 4), arrival=0.0)) == []


def test_contiguous_block_table_is_its_reservation() -> None:
    kv = ContiguousAllocator(10, 4, max_model_len=8)
    a, b = (Request(RequestSpec(i, 0.0, 4, 4), arrival=0.0) for i in range(2))
    kv.allocate(a, 4)
    kv.allocate(b, 4)
    assert kv.block_table(a) == [0, 1] and kv.block_table(b) == [2, 3]
    assert kv.try_grow([a, b]) and kv.num_free_blocks == 6  # decoding writes into the reservation


# ---- protocol defaults ----------------------------------------------------------------------------------------
class _BareCost:
    """A cost model with only the required members, as a user might write one."""

    peak_flops = 1.0

    def step_time(self, s: StepShape) -> float:
        return float(1e-3 + 1e-5 * s.num_tokens + 1e-7 * s.kv_read_tokens)

    def step_flops(self, s: StepShape) -> float:
        return float(2.0 * s.num_tokens)


def test_a_bare_cost_model_gets_the_protocols_decode_pricing() -> None:
    cost = _BareCost()
    times, flops = optional_member(cost, "decode_steps")([2, 3], [10, 40])
    assert times == [cost.step_time(StepShape(2, 2, 2, 10, 10)), cost.step_time(StepShape(3, 3, 3, 40, 40))]
    assert flops == [4.0, 6.0]
    assert optional_member(cost, "decode_step_time")(3, 40) == cost.step_time(StepShape(3, 3, 3, 40, 40))


def test_cost_models_keep_their_own_decode_pricing() -> None:
    analytic = AnalyticCostModel(resolve_model("llama-3.2-1b"), resolve_gpu("l4"))
    assert optional_member(analytic, "decode_steps") == analytic.decode_steps
    fitted = FittedCostModel(step=1e-3, token=1e-5, kv_read_token=1e-8, wake_idle=(0.0, 1.0), wake_extra=(0.0, 0.1))
    # FittedCostModel inherits decode_step_time from the protocol: step_time of the one-step shape
    assert fitted.decode_step_time(4, 100) == fitted.step_time(StepShape(4, 4, 4, 100, 100))
    assert CostModel in type(analytic).__mro__ and CostModel in type(fitted).__mro__
    assert not hasattr(fitted, "__dict__")  # subclassing the protocol keeps the dataclass's slots


@pytest.mark.parametrize("policy, group, steady", [
    (ContinuousPolicy(), True, True), (StaticPolicy(), True, False)])
def test_policies_declare_their_flags(policy: Policy, group: bool, steady: bool) -> None:
    core = ServingCore(policy, PagedBlockManager(16, 4))
    assert (core.group is not None, core.steady_ok, core.admission) == (group, steady, policy.admission)
    assert ServingCore(policy, PagedBlockManager(16, 4), fast_path=False).group is None


def test_a_bare_policy_gets_the_protocols_defaults() -> None:
    class Bare:  # only the required members
        limits = Limits(4, 64, 64)

        def schedule(self, view) -> Plan:
            return Plan(scheduled=[(r, r.num_remaining) for r in view.waiting])

        def wake_time(self, view) -> float | None:
            return None

    # not a Policy to mypy, which sees the optional members declared: the runtime still gives their defaults
    core = ServingCore(Bare(), PagedBlockManager(16, 4))  # type: ignore[arg-type]
    assert (core.group, core.steady_ok, core.admission) == (None, False, None)
    r = Request(RequestSpec(0, 0.0, 8, 2), arrival=0.0)
    assert core.add_request(r, 0.0)  # no admission control: queued, whatever its length
    batch = core.schedule(0.0)
    assert batch is not None and batch.prefill_tokens == 8


# ---- no import circle -----------------------------------------------------------------------------------------
def test_report_does_not_import_output_and_output_does_not_import_plotly() -> None:
    code = ("import sys\nimport sim.output.report\nassert 'sim.output.run_folder' not in sys.modules, 'report imports output'\n"
            "del sys.modules['sim.output.report']\n"
            "for m in [m for m in sys.modules if m.startswith('plotly')]:\n    del sys.modules[m]\n"
            "import sim.output.run_folder\nassert 'plotly' not in sys.modules and 'sim.output.report' not in sys.modules\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
