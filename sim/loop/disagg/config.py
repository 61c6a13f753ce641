"""The ``disaggregation`` section of a variant: a prefill pool, a decode pool and the KV link between them.

    variants:
      - name: 2P1D
        disaggregation:
          prefill: {replicas: 2, deployment: {tensor_parallel_size: 1}, policy: {type: continuous}}
          decode: {replicas: 1, router: least_outstanding}
          kv_link: {kind: infiniband}            # or nvlink | roce | pcie; bandwidth/latency override the preset

Each pool's ``deployment`` keys merge into the variant's deployment (as a variant's keys merge into the
scenario's default); its ``policy`` replaces the variant's. The xPyD ratio is ``prefill.replicas`` to
``decode.replicas``. Both pools serve the same model with the same KV dtype (what vLLM's NIXL connector
requires: the decode pool reads the prefill pool's blocks as they are).

The sections here hold the pool's deployment and policy as plain mappings, validated against
``sim.config.deployment.Deployment`` and ``sim.policies.configs.PolicyConfig`` at load.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from sim.config.deployment import Deployment
from sim.config.input_model import Float, InputModel, Int
from sim.config.scenario_messages import format_validation
from sim.policies.configs import PolicyConfig
from sim.words import counted

# Link presets: bandwidth per GPU in one direction (GB/s, 1e9 bytes) and the fixed cost of one transfer
# (seconds: the connector's handshake, memory registration lookup and completion notification, which dominate
# a transfer of a few blocks). Overridable per scenario.
LINK_PRESETS: dict[str, tuple[float, float]] = {
    # NVLink 4 (H100 SXM): 900 GB/s total per GPU, 450 GB/s each way (NVIDIA H100 Tensor Core GPU datasheet)
    "nvlink": (450.0, 10e-6),
    # InfiniBand NDR, one 400 Gb/s ConnectX-7 NIC per GPU = 50 GB/s (NVIDIA ConnectX-7 datasheet; the DGX H100
    # rail-optimised layout gives each GPU its own NIC)
    "infiniband": (50.0, 20e-6),
    # RoCE v2 over 200 GbE, one ConnectX-6 Dx port per GPU = 25 GB/s (NVIDIA ConnectX-6 Dx datasheet); Ethernet
    # congestion control adds latency over InfiniBand
    "roce": (25.0, 40e-6),
    # PCIe Gen5 x16 through host memory: 64 GB/s raw each way (PCI-SIG PCIe 5.0 spec, 32 GT/s x 16 lanes), about
    # 50 GB/s reached by cudaMemcpy between pinned buffers; the copy goes GPU -> host -> GPU, so half of it
    "pcie": (25.0, 15e-6),
}


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class KVLinkConfig(_Model):
    kind: Literal["nvlink", "infiniband", "roce", "pcie"] = Field(
        default="infiniband", description="Link preset: nvlink, infiniband, roce or pcie (figures in "
        "sim/loop/disagg/config.py's LINK_PRESETS, with their sources).")
    # At least 1 MB/s: at 1e-300 GB/s a transfer took 1e300 s, past which every decode step rounded away (TPOT 0.0)
    bandwidth_gbps: Float | None = Field(
        default=None, ge=1e-3, le=1e6, description="GB/s (1e9 bytes, not bits: a 400 Gb/s NIC is 50) per GPU, one "
        "direction; none: the preset's.")
    latency_s: Float | None = Field(
        default=None, ge=0, le=60, description="Seconds each transfer costs on top of its bytes; none: the preset's.")

    @property
    def bandwidth(self) -> float:
        """Bytes per second per GPU."""
        return (self.bandwidth_gbps if self.bandwidth_gbps is not None else LINK_PRESETS[self.kind][0]) * 1e9

    @property
    def latency(self) -> float:
        return self.latency_s if self.latency_s is not None else LINK_PRESETS[self.kind][1]


class PoolConfig(_Model):
    replicas: Int = Field(default=1, ge=1, le=1024, description="Replicas in the pool (x or y of xPyD).")
    router: Literal["round_robin", "least_outstanding", "least_kv"] = Field(
        default="least_outstanding", description="Which replica of the pool gets a request.")
    deployment: dict[str, Any] | None = Field(
        default=None, description="Keys merged into the variant's deployment (gpu, tensor_parallel_size, ...).")
    policy: dict[str, Any] | None = Field(default=None, description="Replaces the variant's policy in this pool.")

    @model_validator(mode="after")
    def _sections(self) -> PoolConfig:
        if self.deployment is not None:
            bad = sorted(set(self.deployment) - set(Deployment.model_fields))
            if bad:
                raise ValueError(f"deployment: unknown key {bad[0]!r}")
        if self.policy is not None:
            try:
                TypeAdapter(PolicyConfig).validate_python(self.policy)
            except ValidationError as e:  # worded as the file's own policy section is ("policy.type: required
                # key is missing", not pydantic's "Unable to extract tag using discriminator 'type'")
                first = format_validation(e, "", prefix="policy.").splitlines()[0]
                raise ValueError(first.removeprefix(": ")) from None
        return self


class DisaggConfig(_Model):
    """Prefill/decode disaggregation (see sim/loop/disagg/config.py)."""

    xpyd: str | None = Field(
        default=None, description="The split in vLLM's spelling, e.g. 2P1D: sets prefill.replicas and "
        "decode.replicas (which may then be left out, or must agree).")
    prefill: PoolConfig = Field(default_factory=PoolConfig, description="The pool that computes prompts.")
    decode: PoolConfig = Field(default_factory=PoolConfig, description="The pool that generates the output.")
    kv_link: KVLinkConfig = Field(default_factory=KVLinkConfig, description="The link the KV moves over.")

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("xpyd") is None:
            return data
        # case aside (2p1d is as plain as vLLM's 2P1D); recorded in vLLM's spelling
        m = re.fullmatch(r"([1-9][0-9]*)P([1-9][0-9]*)D", str(data["xpyd"]).strip(), flags=re.IGNORECASE)
        if m is None:
            raise ValueError(f"xpyd: {data['xpyd']!r} is not of the form xPyD (e.g. 2P1D)")
        out = dict(data, xpyd=f"{m.group(1)}P{m.group(2)}D")
        for role, n in (("prefill", int(m.group(1))), ("decode", int(m.group(2)))):
            pool = dict(out.get(role) or {})
            if pool.get("replicas", n) != n:
                raise ValueError(f"xpyd {data['xpyd']} says {counted(n, role + ' replica')}, {role}.replicas says "
                                 f"{pool['replicas']}")
            pool["replicas"] = n
            out[role] = pool
        return out

    @property
    def ratio(self) -> str:
        """The xPyD name of the split (vLLM's and the papers' spelling)."""
        return f"{self.prefill.replicas}P{self.decode.replicas}D"


class PlanDisaggConfig(_Model):
    """``plan.disaggregation``: also search prefill/decode splits (sim/loop/disagg/plan.py)."""

    kv_link: KVLinkConfig = Field(default_factory=KVLinkConfig, description="The link every split moves KV over.")
    min_replicas_per_pool: Int = Field(default=1, ge=1, description="Fewest replicas in either pool.")
