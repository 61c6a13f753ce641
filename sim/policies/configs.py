"""The ``policy`` section of a scenario: one config class per kind, each building its policy.

Adding a policy kind touches its class here and the ``PolicyConfig`` union below; the built-in queue policies
(``fcfs``, ``priority``, ``sjf``, ``edf``) and a user's own class (``custom``) all run on the public policy API
(``sim.policies.api``) through ``sim.policies.user.UserPolicy``.
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from sim.config.errors import PASS_THROUGH
from sim.config.input_model import Float, InputModel, Int
from sim.engines.costs import omit_when_unset
from sim.policies.base import Admission, Limits, Policy
from sim.policies.continuous import ContinuousPolicy
from sim.policies.shared_state import _SHARED, _containers, _shared_state_changed, _snapshot
from sim.policies.static import StaticPolicy


class PolicyModel(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- policies -------------------------------------------------------------------------------------------------
class PolicyConfigBase(PolicyModel):
    """A ``policy`` section: each kind gives its per-step limits and builds its policy, so adding a policy
    touches only its class and the ``PolicyConfig`` union (and a kind that lacks either cannot be created)."""

    @abstractmethod
    def limits(self, max_model_len: int) -> Limits:
        """The per-step limits the core checks this policy's plans against."""

    @abstractmethod
    def build(self, limits: Limits, admission: Admission) -> Policy:
        """The policy, planning within ``limits`` (from ``limits()``) and refusing whom ``admission`` says."""


class StaticPolicyConfig(PolicyConfigBase):
    """Static batching: a batch of up to batch_size requests runs until all of them end; the next forms after it."""

    type: Literal["static"] = "static"
    batch_size: Int = Field(default=8, ge=1, description="Requests per batch.")
    max_wait: Float = Field(
        default=1.0, ge=0, le=1e9, description="Seconds the oldest queued request waits for a full batch."
    )
    preemption_mode: Literal["recompute", "swap"] = Field(default="recompute", description="If paged KV runs out.")
    max_input_len: Int | None = Field(default=None, ge=1, description="Longest prompt the engine is built for "
                                      "(TensorRT-LLM's name): with deployment.engine the activations are sized for "
                                      "batch_size x this; none: max_model_len (sim/engines/costs.py).")
    _record_set_keys = omit_when_unset("max_input_len")  # recorded only when given

    def limits(self, max_model_len: int) -> Limits:
        # a padded batch computes at most batch_size x max_model_len tokens in one step
        return Limits(max(256, self.batch_size), self.batch_size * max_model_len, max_model_len)

    def build(self, limits: Limits, admission: Admission) -> StaticPolicy:
        return StaticPolicy(batch_size=self.batch_size, max_wait=self.max_wait, limits=limits,
                            preemption_mode=self.preemption_mode, admission=admission)


class ContinuousPolicyConfig(PolicyConfigBase):
    """Continuous batching (vLLM's scheduler): requests join and leave the running batch at every step."""

    type: Literal["continuous"] = "continuous"
    # None: the deployment.engine's default (sim/engines/registry.py), or without an engine the classic one named here
    max_num_seqs: Int | None = Field(default=None, ge=1, description="Requests in one step at most; none: the "
                                     "engine's default (256 without deployment.engine).")
    max_num_batched_tokens: Int | None = Field(
        default=None,
        ge=1,
        description="Tokens computed in one step at most; none: the engine's default (without deployment.engine: "
        "8192 with chunked prefill, else max(8192, max_model_len)).",
    )
    enable_chunked_prefill: bool | None = Field(
        default=None, description="Cut prompts into chunks that fill each step; none: the engine's default (off "
        "without deployment.engine).")
    prefill_mode: Literal["prefill_first", "mixed"] | None = Field(
        default=None, description="Without chunking: prompts-only steps first (vLLM v0), or mixed steps; none: the "
        "engine's default (prefill_first without deployment.engine)."
    )
    capacity_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] | None = Field(
        default=None, description="Admission (TensorRT-LLM's names): guaranteed_no_evict admits a request only when "
        "the KV of its whole prompt + output fits beside the running requests' (nothing is ever preempted); "
        "max_utilization admits while blocks are free now. none: the engine's default (max_utilization without "
        "deployment.engine).")
    preemption_mode: Literal["recompute", "swap"] = Field(
        default="recompute", description="What happens to the latest-admitted request when blocks run out."
    )

    def limits(self, max_model_len: int) -> Limits:
        mnbt = self.max_num_batched_tokens or (8192 if self.enable_chunked_prefill else max(8192, max_model_len))
        return Limits(self.max_num_seqs or 256, mnbt, max_model_len)

    def build(self, limits: Limits, admission: Admission) -> ContinuousPolicy:
        return ContinuousPolicy(limits=limits, enable_chunked_prefill=bool(self.enable_chunked_prefill),
                                prefill_mode=self.prefill_mode or "prefill_first", preemption_mode=self.preemption_mode,
                                admission=admission, no_evict=self.capacity_scheduler_policy == "guaranteed_no_evict")


# ---- policies on the public API --------------------------------------------------------------------------------
class OraclePredictorConfig(PolicyModel):
    """Predicts each request's true output length."""

    type: Literal["oracle"] = "oracle"

    def build(self) -> Any:
        from sim.policies.predictors import OraclePredictor

        return OraclePredictor()


class LognormalPredictorConfig(PolicyModel):
    """The true output length times lognormal noise: a predictor of a known error."""

    type: Literal["lognormal"] = "lognormal"
    sigma: Float = Field(ge=0, le=10, description="Standard deviation of the log of (prediction / truth).")
    seed: Int = Field(default=0, ge=0, description="Seed of the prediction noise (the same for every variant).")

    def build(self) -> Any:
        from sim.policies.predictors import NoisyOraclePredictor

        return NoisyOraclePredictor(self.sigma, self.seed)


class BucketPredictorConfig(PolicyModel):
    """Predicts the upper edge of the length bucket that holds the true output length (a classifier's answer)."""

    type: Literal["buckets"] = "buckets"
    edges: list[Int] = Field(min_length=1, max_length=1024, description="Increasing upper edges of the length "
                             "buckets (tokens); a request is predicted at its bucket's upper edge.")

    def build(self) -> Any:
        from sim.policies.predictors import BucketPredictor

        return BucketPredictor(self.edges)


PredictorConfig = Annotated[OraclePredictorConfig | LognormalPredictorConfig | BucketPredictorConfig,
                            Field(discriminator="type")]


class QueuePolicyConfigBase(PolicyConfigBase):
    """A policy that runs on the public API: the step limits with vLLM's names, and an optional output-length
    predictor its requests' ``predicted_output_len`` reads."""

    max_num_seqs: Int = Field(default=256, ge=1, description="Requests in one step at most.")
    max_num_batched_tokens: Int | None = Field(
        default=None, ge=1, description="Tokens computed in one step at most; none: 8192 with chunked prefill, "
        "else max(8192, max_model_len).")
    predictor: PredictorConfig | None = Field(
        default=None, description="Output-length predictor (oracle, lognormal noise on the oracle, or buckets); "
        "none: requests show no prediction.")

    def chunked(self) -> bool:
        return True

    def limits(self, max_model_len: int) -> Limits:
        mnbt = self.max_num_batched_tokens or (8192 if self.chunked() else max(8192, max_model_len))
        return Limits(self.max_num_seqs, mnbt, max_model_len)

    @abstractmethod
    def make(self) -> Any:
        """The public-API policy object."""

    def build(self, limits: Limits, admission: Admission) -> Policy:
        from sim.policies.user import UserPolicy

        pred = self.predictor.build() if self.predictor is not None else None
        return UserPolicy(self.make(), limits, admission, pred)


class _BuiltinQueueConfig(QueuePolicyConfigBase):
    enable_chunked_prefill: bool = Field(default=True, description="Cut prompts into chunks that fill each step "
                                         "(vLLM v1); off: a prompt runs whole, beside the decodes.")
    preemption_mode: Literal["recompute", "swap"] = Field(
        default="recompute", description="What happens to the preemption victim when blocks run out.")

    def chunked(self) -> bool:
        return self.enable_chunked_prefill


class FCFSPolicyConfig(_BuiltinQueueConfig):
    """First come, first served (vLLM's --scheduling-policy fcfs), on the public API."""

    type: Literal["fcfs"] = "fcfs"

    def make(self) -> Any:
        from sim.policies.queue import FCFSPolicy

        return FCFSPolicy(self.enable_chunked_prefill, self.preemption_mode)


class PriorityPolicyConfig(_BuiltinQueueConfig):
    """vLLM's --scheduling-policy priority: lower priority value first; a waiting request preempts lower-priority
    running work (vLLM V0's rule) or, under ``deployment.engine: vllm-v1``, waits (V1 preempts only when blocks run
    out)."""

    type: Literal["priority"] = "priority"
    preempt_for_waiting: bool | None = Field(
        default=None, description="A waiting request that finds no slot or blocks preempts lower-priority running "
        "work (vLLM V0); false: only a running request short of blocks preempts (vLLM V1). Default: the engine's "
        "rule (false under deployment.engine vllm-v1, true without an engine section and under the others).")

    def make(self) -> Any:
        from sim.policies.priority import PriorityPolicy

        return PriorityPolicy(self.enable_chunked_prefill, self.preemption_mode,
                              True if self.preempt_for_waiting is None else self.preempt_for_waiting)


class SJFPolicyConfig(_BuiltinQueueConfig):
    """Shortest job first on the predictor's output length (default predictor: the oracle)."""

    type: Literal["sjf"] = "sjf"
    shortest_remaining: bool = Field(default=False, description="Rank by predicted tokens still to generate, and "
                                     "let a shorter waiting request displace a running one (SRPT).")

    @model_validator(mode="after")
    def _default_oracle(self) -> SJFPolicyConfig:
        if self.predictor is None:
            self.predictor = OraclePredictorConfig()
        return self

    def make(self) -> Any:
        from sim.policies.sjf import ShortestJobFirst

        return ShortestJobFirst(self.enable_chunked_prefill, self.preemption_mode, self.shortest_remaining)


class EDFPolicyConfig(_BuiltinQueueConfig):
    """Earliest TTFT deadline first (arrival + the request's TTFT SLO)."""

    type: Literal["edf"] = "edf"
    reject_late: bool = Field(default=False, description="Reject a request whose TTFT deadline passed before it "
                              "ever ran.")

    def make(self) -> Any:
        from sim.policies.edf import EarliestDeadlineFirst

        return EarliestDeadlineFirst(self.enable_chunked_prefill, self.preemption_mode, self.reject_late)


class UserClassConfig(PolicyModel):
    """A user's class named by file or module, with the keyword arguments of its constructor: resolved and built
    once at validation, so a missing file, a bad name or bad arguments fail before anything runs."""

    cls: str = Field(min_length=3, max_length=4096, description="'path/to/file.py:Class' (relative to the scenario "
                     "file) or 'package.module:Class'.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the class's constructor.")
    # From Python only (``servesim.run(..., policy=obj)``): an object, copied afresh for every variant, sweep
    # point and replica so that no state leaks between runs; ``cls`` then only names it in the records.
    instance: Any = Field(default=None, exclude=True, description="Python API only: an object to copy.")
    _cls: Any = PrivateAttr(default=None)
    _chunked: bool = PrivateAttr(default=True)  # the object's enable_chunked_prefill (a QueuePolicy's), as made

    @model_validator(mode="after")
    def _resolve(self) -> UserClassConfig:
        from sim.policies.loader import load_class
        from sim.policies.user import call_user
        from sim.policies.watchdog import WATCH

        WATCH.arm()  # importing a user's module runs its code: a module that never finishes loading is stopped
        if self.instance is None:
            self._cls = call_user(f"cls {self.cls}: importing it", load_class, self.cls, wrap=False)
        made = self.make()  # the constructor validates its args
        self._chunked = getattr(made, "enable_chunked_prefill", True) is not False
        return self

    # the servesim class a user's class implements, and the check that says why an object does not
    _api: ClassVar[str] = ""

    @staticmethod
    def problem(obj: Any) -> str | None:
        """Why ``obj`` does not implement the API it is meant to, or None."""
        return None

    def make(self) -> Any:
        from sim.policies.loader import exception_text, fitted_args, unexpected_arg_hint
        from sim.policies.user import PolicyError, call_user
        from sim.policies.watchdog import WATCH

        what = "copying the object" if self.instance is not None else f"constructing it with args {self.args}"
        kind = type(self.instance) if self.instance is not None else self._cls
        # looked at again once the constructor has run: one that sets it afresh (CALLS[0] = 0, or global SERVED;
        # SERVED = {}) starts every object fresh, and was refused before it could
        stale = _shared_state_changed(kind)
        try:
            args = fitted_args(kind, self.args) if self.instance is None else {}
        except ValueError as e:
            raise ValueError(f"cls {self.cls}: {e}") from None
        WATCH.arm()  # a constructor that never returns (each variant and sweep point makes one) is stopped
        try:
            obj = call_user(f"cls {self.cls}: {what}", lambda: copy.deepcopy(self.instance) if self.instance
                            is not None else self._cls(**args), wrap=False)
        except (PolicyError, *PASS_THROUGH):
            raise
        except BaseException as e:  # not only Exception: sys.exit, GeneratorExit, a library's own BaseException
            raise ValueError(f"cls {self.cls}: {what} {exception_text(e)}{unexpected_arg_hint(kind, e)}") from None
        why = self.problem(obj)
        if why is not None:
            # "does not override" is said of a subclass only: the hint is for a class that is none
            hint = f" (subclass servesim.{self._api})" if why.startswith("has no ") else ""
            raise ValueError(f"cls {self.cls}: {type(obj).__name__} {why}{hint}")
        if stale is not None and (stale := _shared_state_changed(kind, stale)) is not None:
            where, _, name = stale.rpartition(" ")
            what = (f"{name} is a {type(_containers(kind)[stale]).__name__} at the top of {kind.__name__}'s "
                    "module, which its code uses" if where else
                    f"{kind.__name__}.{name} is a {type(getattr(kind, name)).__name__} on the class")
            raise ValueError(f"cls {self.cls}: {what}, shared by every object of it (each run's, each replica's), and "
                             "it changed after the last object of it was made (a run wrote to it?), so the one made "
                             f"now would not start fresh: create it in __init__ (self.{name} = ...), or pass what it "
                             "holds as args; or, if it only caches results no run changes, name it in "
                             f"shared_caches = ({name!r},) on the class")
        _SHARED[kind] = _snapshot(kind)  # after the constructor: what it does to the class is not a run's
        return obj


def user_code(*sections: Any) -> dict[str, str]:
    """``cls`` -> a digest of the file that defines it, for every user class in these config sections (policy,
    admission, cluster, ...): what a sweep's runs were made with, so that resuming one after the file was edited is
    refused rather than mixing old rows with new."""
    import sys

    from pydantic import BaseModel

    from sim.policies.loader import file_digest

    out: dict[str, str] = {}
    stack = list(sections)
    while stack:
        x = stack.pop()
        if isinstance(x, UserClassConfig):
            module = sys.modules.get(getattr(x._cls, "__module__", ""))
            digest = getattr(module, "__servesim_digest__", None)  # a file loaded by path (sim/policies/loader.py)
            path = getattr(module, "__file__", None)
            if digest is None and path is not None and path.endswith(".py"):  # package.module:Class
                digest = file_digest(path)
            if digest is not None:
                out[x.cls] = digest
        elif isinstance(x, BaseModel):
            stack.extend(getattr(x, k) for k in type(x).model_fields)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return out


class CustomPolicyConfig(UserClassConfig, QueuePolicyConfigBase):
    """A user's own class on the public API (``servesim.Policy``), named by file or module."""

    type: Literal["custom"] = "custom"
    _api: ClassVar[str] = "Policy"

    @staticmethod
    def problem(obj: Any) -> str | None:
        from sim.policies import api
        from sim.policies.queue import QueuePolicy

        why = api.implements_policy(obj)
        if why is None and isinstance(obj, QueuePolicy) and obj.preempt_for_waiting and \
                type(obj).rank is QueuePolicy.rank:
            # first come first served has no ranks to compare: the first displacement raised TypeError mid-run,
            # "rank(req) gave None for request 0 and None for request 1, which do not compare"
            why = ("sets preempt_for_waiting but keeps first come first served (no rank(req)): a waiting request "
                   "displaces running work of a larger rank, so give it rank(req)")
        return why

    def chunked(self) -> bool:
        # max_num_batched_tokens' default follows the class's chunking as the built-ins' does: a QueuePolicy made
        # with enable_chunked_prefill=False got the chunking default, 8192, and never ran a longer prompt
        return self._chunked

    def check_tenants(self, requests: Iterable[Any], declared: Iterable[str] = ()) -> str | None:
        """A VTC built from Python (``servesim.run(..., policy=VirtualTokenCounter(tenant_weights=...))``) or named
        by ``cls`` is checked against the workload as ``type: vtc`` is: a weight for a tenant that is not there."""
        from sim.policies.vtc import VirtualTokenCounter

        obj = self.make()
        return obj.check_tenants(requests, declared) if isinstance(obj, VirtualTokenCounter) else None


class CustomRouterConfig(UserClassConfig):
    """A user's router (``servesim.Router``): route(request, replicas) -> index."""

    type: Literal["custom"] = "custom"
    _api: ClassVar[str] = "Router"

    @staticmethod
    def problem(obj: Any) -> str | None:
        from sim.policies.gates import implements_router

        return implements_router(obj)


class CustomAdmissionConfig(UserClassConfig):
    """A user's admission rule (``servesim.Admission``): admit(request, state) -> None or a reason."""

    type: Literal["custom"] = "custom"
    _api: ClassVar[str] = "Admission"

    @staticmethod
    def problem(obj: Any) -> str | None:
        from sim.policies.gates import implements_admission

        return implements_admission(obj)


class TokenBucketConfig(PolicyModel):
    """A rate limit: ``rate`` requests per second refill a bucket of ``burst`` requests (BLIS's token bucket); on a
    cluster each replica has its own bucket, as every admission rule is the replica's."""

    type: Literal["token_bucket"] = "token_bucket"
    rate: Float = Field(gt=0, le=1e9, description="Requests per second the bucket refills (per replica).")
    burst: Float = Field(default=1.0, ge=1, le=1e9, description="Requests the bucket holds (a burst admitted at once).")

    def make(self) -> Any:
        from sim.policies.gates import TokenBucket

        return TokenBucket(self.rate, self.burst)


AdmissionRuleConfig = Annotated[TokenBucketConfig | CustomAdmissionConfig, Field(discriminator="type")]


class VTCPolicyConfig(_BuiltinQueueConfig):
    """Fair sharing between tenants by the Virtual Token Counter (Sheng et al., OSDI 2024)."""

    type: Literal["vtc"] = "vtc"
    input_weight: Float = Field(default=1.0, ge=0, le=1e6, description="Service counted per prompt token (the "
                                "paper's w_p).")
    output_weight: Float = Field(default=2.0, ge=0, le=1e6, description="Service counted per generated token (w_q).")
    tenant_weights: dict[str, Annotated[Float, Field(gt=0, le=1e6)]] = Field(
        default_factory=dict, description="Each tenant's share (> 0; tenants not named weigh 1): backlogged tenants "
        "are served in proportion.")

    def check_tenants(self, requests: Iterable[Any], declared: Iterable[str] = ()) -> str | None:
        """Why ``tenant_weights`` does not fit the workload, or None (sim.policies.vtc.tenant_weights_problem)."""
        from sim.policies.vtc import tenant_weights_problem

        return tenant_weights_problem(self.tenant_weights, requests, declared)

    def make(self) -> Any:
        from sim.policies.vtc import VirtualTokenCounter

        return VirtualTokenCounter(self.enable_chunked_prefill, self.preemption_mode, self.input_weight,
                                   self.output_weight, self.tenant_weights)


class LPMPolicyConfig(_BuiltinQueueConfig):
    """SGLang's longest prefix match first (--schedule-policy lpm), bounded and aged."""

    type: Literal["lpm"] = "lpm"
    max_waiting: Int = Field(default=128, ge=0, le=10**9, description="Above this many waiting requests the order is "
                             "first come first served (SGLang's bound on the cost of matching every prompt).")
    aging: Float = Field(default=16.0, ge=0, le=1e9, description="Cached tokens a request is credited per second it "
                         "has waited, so cache-cold requests are not starved; 0: SGLang's plain lpm.")

    def make(self) -> Any:
        from sim.policies.lpm import LongestPrefixMatch

        return LongestPrefixMatch(self.enable_chunked_prefill, self.preemption_mode, self.max_waiting, self.aging)


class LOFPolicyConfig(_BuiltinQueueConfig):
    """SGLang's longest output first (--schedule-policy lof) on the predictor's output length (default: oracle)."""

    type: Literal["lof"] = "lof"

    @model_validator(mode="after")
    def _default_oracle(self) -> LOFPolicyConfig:
        if self.predictor is None:
            self.predictor = OraclePredictorConfig()
        return self

    def make(self) -> Any:
        from sim.policies.lof import LongestOutputFirst

        return LongestOutputFirst(self.enable_chunked_prefill, self.preemption_mode)


PolicyConfig = Annotated[StaticPolicyConfig | ContinuousPolicyConfig | FCFSPolicyConfig | PriorityPolicyConfig
                         | SJFPolicyConfig | EDFPolicyConfig | CustomPolicyConfig | VTCPolicyConfig
                         | LPMPolicyConfig | LOFPolicyConfig,
                         Field(discriminator="type")]


# ---- routers on the public API (sim.policies.routers_public) ----------------------------------------------------
class _PublicRouterConfig(PolicyModel):
    """A built-in router written on ``servesim.Router`` (``sim.policies.routers_public``): its fields other than
    ``type`` are its constructor's keyword arguments; ``make()`` builds a fresh one per run."""

    _router: ClassVar[str]  # the class's name in sim.policies.routers_public

    def make(self) -> Any:
        from sim.policies import routers_public

        return getattr(routers_public, self._router)(**self.model_dump(exclude={"type"}))


class PowerOfTwoRouterConfig(_PublicRouterConfig):
    """Two replicas at random, the less loaded one (power of two choices), seeded."""

    type: Literal["power_of_two"] = "power_of_two"
    seed: Int = Field(default=0, ge=0, description="Seed of the random pairs (the same in every variant).")
    _router = "PowerOfTwoChoices"


class CacheLoadRouterConfig(_PublicRouterConfig):
    """llm-d's weighted scorers: prefix-cache share, queue and free KV, the highest total wins."""

    type: Literal["cache_load_score"] = "cache_load_score"
    prefix_weight: Float = Field(default=2.0, ge=0, le=1e6, description="Weight of the share of the prompt the "
                                 "replica's prefix cache holds.")
    queue_weight: Float = Field(default=1.0, ge=0, le=1e6, description="Weight of the queue score (shortest "
                                "waiting queue 1, longest 0).")
    kv_weight: Float = Field(default=1.0, ge=0, le=1e6, description="Weight of the free share of the KV cache.")
    _router = "CacheLoadScorer"


class SLOAwareRouterConfig(_PublicRouterConfig):
    """The replica predicted to meet the request's TTFT SLO that holds most of its prompt in cache."""

    type: Literal["slo_aware"] = "slo_aware"
    prefill_tokens_per_s: Float = Field(default=10_000.0, gt=0, le=1e12, description="Prompt tokens per second a "
                                        "replica prefills, for the TTFT prediction.")
    step_s: Float = Field(default=0.0, ge=0, le=1e6, description="Seconds added to the prediction per running "
                          "request (the decode work a prefill shares steps with).")
    _router = "SLOAwareRouter"


RouterConfig = Annotated[CustomRouterConfig | PowerOfTwoRouterConfig | CacheLoadRouterConfig | SLOAwareRouterConfig,
                         Field(discriminator="type")]
