"""The fitted cost model: a step's time as a non-negative combination of its shape's aggregates, with coefficients
fitted to a real engine by calibration (calibration/fit.py), and the calibration profile's file format.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from os import PathLike
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sim.costs.costmodel import CostModel, StepShape, is_array
from sim.hardware.models import is_model_preset, read_json_file, resolve_model

PROFILE_SCHEMA_VERSION = 2
SUPPORTED_PROFILE_VERSIONS = (1, 2)  # version 2 added the optional calibration record (samples, fit, overheads)
COEFFICIENT_NAMES = ("step", "token", "decode_seq", "seq", "attn_pair", "kv_read_token", "swap_block", "prefill_seq",
                     "decode_pad_token")


class ProfileCoefficients(BaseModel):
    """Seconds per unit of each ``StepShape`` aggregate; all >= 0, absent ones are 0."""

    model_config = ConfigDict(extra="forbid")
    step: float = Field(0.0, ge=0, description="s per step (fixed overhead)")
    token: float = Field(0.0, ge=0, description="s per new token computed (num_tokens)")
    decode_seq: float = Field(0.0, ge=0, description="s per decode row (num_decode_seqs)")
    seq: float = Field(0.0, ge=0, description="s per row (num_seqs)")
    attn_pair: float = Field(0.0, ge=0, description="s per causal query-key pair (attn_pairs)")
    kv_read_token: float = Field(0.0, ge=0, description="s per token of KV read (kv_read_tokens)")
    swap_block: float = Field(0.0, ge=0, description="s per KV block swapped (swap_blocks)")
    prefill_seq: float = Field(0.0, ge=0, description="s per row that is not a decode (num_seqs - num_decode_seqs): "
                               "engines run each prompt chunk's attention on its own (schema version 2)")
    decode_pad_token: float = Field(0.0, ge=0, description="s per token of the padded decode batch (decode rows x "
                                    "max_decode_len): the decode attention's gather of every row padded to the "
                                    "longest context")


class ProfileFlops(BaseModel):
    """Model FLOPs per unit, for ``step_flops`` (model FLOPs utilisation)."""

    model_config = ConfigDict(extra="forbid")
    token: float = Field(0.0, ge=0, description="FLOPs per non-padding token (2 x body matmul params)")
    seq: float = Field(0.0, ge=0, description="FLOPs per row (2 x LM head params)")
    attn_pair: float = Field(0.0, ge=0, description="FLOPs per query-key pair (4 x layers x heads x head_dim)")


class CalibrationProfile(BaseModel):
    """The file ``FittedCostModel.from_profile`` reads (JSON)::

        {
          "schema_version": 1,
          "model": "llama-3.1-8b",            # preset name, or a Hugging Face config dict, or any label
          "device": "NVIDIA H200",            # free text
          "coefficients": {"step": 1.4e-3, "token": 2.0e-5, "decode_seq": 0.0, "seq": 8e-6,
                           "attn_pair": 1.1e-11, "kv_read_token": 4.0e-8, "swap_block": 6e-5},
          "peak_flops": 9.894e14,             # optional: FLOP/s of the device (all shards); 0 -> MFU is NaN
          "flops": {"token": ..., "seq": ..., "attn_pair": ...},   # optional; default from "model" when it is
                                                                   # a preset name or a config dict, else 0
          "provenance": {"date": "...", "torch": "...", "engine_commit": "...", "grid": "...", "rmse": ...},
          # version 2, all optional (written by `servesim calibrate`; step_time does not read them):
          "num_gpu_blocks": 2048,             # KV blocks the engine got for this model on this device
          "overheads": {"step": ..., "token": ..., "seq": ...},   # host-side share (scheduling, input, sampling)
          "fit": {"heldout": {"decode": {"n": ..., "median_abs": ...}, ...}, ...},   # fit quality per class
          "samples": [{"script": ..., "kind": ..., "num_seqs": ..., "duration": ...}, ...]   # the measurements
        }

    Coefficient units are seconds per unit (see ``ProfileCoefficients``); unknown keys are refused so that a
    misspelt coefficient cannot silently count as zero. Version 1 files (without the calibration record) load.
    """

    model_config = ConfigDict(extra="forbid")
    schema_version: int = PROFILE_SCHEMA_VERSION
    model: str | dict[str, Any] = ""
    device: str = ""
    coefficients: ProfileCoefficients
    peak_flops: float = Field(0.0, ge=0)
    flops: ProfileFlops | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)
    num_gpu_blocks: int | None = Field(None, ge=1, description="KV blocks the engine got (calibration record)")
    overheads: dict[str, float] = Field(default_factory=dict, description="host-side s per step, token, row")
    fit: dict[str, Any] = Field(default_factory=dict, description="fit method and held-out errors per class")
    samples: list[dict[str, Any]] = Field(default_factory=list, description="the measured steps")
    wake_curve: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[idle seconds, extra seconds] pairs, idle increasing from 0: how much longer a step takes "
        "after the engine idled that long (interpolated, flat past the last point); empty: no wake-up cost")

    token_curve: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[new tokens, extra seconds] pairs, tokens increasing from 1, the first extra 0: the linear "
        "layers' cost as a function of the step's new tokens beyond the linear `token` term (a CPU BLAS or a GPU "
        "kernel picks its tiling by the row count, so the cost climbs in stairs); interpolated, flat past the last "
        "point; empty: none")

    @field_validator("token_curve")
    @classmethod
    def _token_curve_ok(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if v:
            x = [p[0] for p in v]
            increasing = all(b > a for a, b in zip(x, x[1:], strict=False))
            if tuple(v[0]) != (1, 0) or not increasing or any(not p[1] >= 0 for p in v):
                raise ValueError("token_curve must start at [1, 0] with tokens increasing and extra times >= 0")
        return v

    @field_validator("wake_curve")
    @classmethod
    def _wake_curve_ok(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if v:
            idle = [p[0] for p in v]
            increasing = all(a < b for a, b in zip(idle, idle[1:], strict=False))
            if tuple(v[0]) != (0, 0) or not increasing or any(p[1] < 0 for p in v):
                raise ValueError("wake_curve must start at [0, 0] with idle increasing and extra times >= 0")
        return v


@dataclass(frozen=True, slots=True)
class FittedCostModel(CostModel):
    """Step time as a non-negative linear combination of the ``StepShape`` aggregates, with coefficients fitted
    to a real engine by calibration::

        time = step + token * num_tokens + decode_seq * num_decode_seqs + seq * num_seqs
             + attn_pair * attn_pairs + kv_read_token * kv_read_tokens + swap_block * swap_blocks
             + prefill_seq * (num_seqs - num_decode_seqs)
             (+ the wake-up curve at idle_before, when the profile has one)

    Scalar and array shapes give bit-identical results (the same expression). Load one with ``from_profile``;
    the file format is ``CalibrationProfile``.
    """

    step: float = 0.0  # s per step
    token: float = 0.0  # s per new token
    decode_seq: float = 0.0  # s per decode row
    seq: float = 0.0  # s per row
    attn_pair: float = 0.0  # s per causal query-key pair
    kv_read_token: float = 0.0  # s per token of KV read
    swap_block: float = 0.0  # s per KV block swapped
    prefill_seq: float = 0.0  # s per row that is not a decode (its own attention call)
    decode_pad_token: float = 0.0  # s per token of the padded decode batch (decode rows x longest decode context)
    peak_flops: float = 0.0  # FLOP/s of the device over all shards; 0: unknown (MFU reported as NaN)
    flops_per_token: float = 0.0  # model FLOPs per non-padding token
    flops_per_seq: float = 0.0  # model FLOPs per row (LM head)
    flops_per_attn_pair: float = 0.0  # model FLOPs per query-key pair
    model: str = ""
    device: str = ""
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    wake_idle: tuple[float, ...] = ()  # the wake-up curve: idle seconds (from 0, increasing) ...
    wake_extra: tuple[float, ...] = ()  # ... and the seconds a step then takes longer
    token_knots: tuple[float, ...] = ()  # the token curve: new tokens (from 1, increasing) ...
    token_extra: tuple[float, ...] = ()  # ... and the linear layers' seconds beyond the ``token`` term

    def __post_init__(self) -> None:
        for name in COEFFICIENT_NAMES + ("peak_flops", "flops_per_token", "flops_per_seq", "flops_per_attn_pair"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"FittedCostModel: {name} must be finite and >= 0, got {v}")
        for name in COEFFICIENT_NAMES:  # seconds per unit: past an hour a sum of steps could overflow to inf
            if getattr(self, name) > 3600:
                raise ValueError(f"FittedCostModel: coefficients.{name} must be at most 3600 s, "
                                 f"got {getattr(self, name)}")
        idle, extra = self.wake_idle, self.wake_extra
        if len(idle) != len(extra):
            raise ValueError("FittedCostModel: wake_curve needs one extra time per idle time")
        for i, (a, b) in enumerate(zip(idle, extra, strict=True)):
            if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and 0 <= b <= 3600):
                raise ValueError(f"FittedCostModel: wake_curve.{i} must be [idle seconds >= 0, extra seconds in "
                                 f"[0, 3600]], both finite, got [{a}, {b}]")
            if i and a < idle[i - 1]:
                raise ValueError(f"FittedCostModel: wake_curve.{i}: idle times must increase, got {a} after "
                                 f"{idle[i - 1]}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedCostModel:
        """From a parsed profile (see ``CalibrationProfile``)."""
        p = CalibrationProfile.model_validate(dict(data))
        if p.schema_version not in SUPPORTED_PROFILE_VERSIONS:
            raise ValueError(f"calibration profile schema_version {p.schema_version} is not supported "
                             f"(this servesim reads versions {', '.join(map(str, SUPPORTED_PROFILE_VERSIONS))})")
        if p.schema_version == 1 and (p.num_gpu_blocks is not None or p.overheads or p.fit or p.samples):
            raise ValueError("calibration profile schema_version 1 has no num_gpu_blocks, overheads, fit or samples "
                             "(those came with version 2)")
        flops = p.flops
        label = p.model if isinstance(p.model, str) else str(p.model.get("_name_or_path", "custom"))
        if flops is None:
            spec = None
            if isinstance(p.model, dict):
                spec = resolve_model(p.model)
            elif p.model and is_model_preset(p.model):  # else a free-text label: no model FLOPs
                spec = resolve_model(p.model)
            if spec is not None:
                s = spec.shard(1)
                flops = ProfileFlops(token=2.0 * s.active_body_params, seq=2.0 * s.lm_head_params,
                                     attn_pair=float(spec.attn_flops_per_pair))
            else:
                flops = ProfileFlops(token=0.0, seq=0.0, attn_pair=0.0)  # an unknown model: no FLOPs counted
        return cls(**p.coefficients.model_dump(), peak_flops=p.peak_flops, flops_per_token=flops.token,
                   flops_per_seq=flops.seq, flops_per_attn_pair=flops.attn_pair, model=label, device=p.device,
                   provenance=dict(p.provenance), wake_idle=tuple(float(a) for a, _ in p.wake_curve),
                   wake_extra=tuple(float(b) for _, b in p.wake_curve),
                   token_knots=tuple(float(a) for a, _ in p.token_curve),
                   token_extra=tuple(float(b) for _, b in p.token_curve))

    @classmethod
    def from_profile(cls, path: str | PathLike[str]) -> FittedCostModel:
        """Load a calibration profile JSON file (at most 64 MiB are read: /dev/zero is not a profile)."""
        data = read_json_file(path, 64 << 20)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a calibration profile is a JSON object, got a {type(data).__name__}")
        # `calibrate --from-bench` writes the other two kinds of file (calibration/bench_fit.py); all are "profiles"
        if data.get("kind") == "servesim-analytic-knobs":
            raise ValueError(f"{path}: analytic knobs (servesim calibrate --from-bench), not an engine profile: use "
                             f"them as deployment.cost_model: {{type: analytic, profile: {path}}}")
        if data.get("kind") == "servesim-live-fit":
            raise ValueError(f"{path}: a live server's fit (servesim calibrate --from-bench --profile), not an engine "
                             "profile: copy its deployment sections (cost_model, serving) into the scenario")
        try:
            return cls.from_dict(data)
        except ValidationError as e:  # pydantic's own text is a dozen lines with links: one line per field instead
            fields = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'top level'}: {err['msg']}" for err in e.errors())
            raise ValueError(f"{path}: not a calibration profile (servesim calibrate): {fields}") from None

    def scaled(self, scale: float, step_overhead: float) -> FittedCostModel:
        """This model with every step time multiplied by ``scale`` and ``step_overhead`` seconds added: the step
        time is linear in the coefficients and the two curves, so each of them is scaled."""
        if not (math.isfinite(scale) and scale > 0 and math.isfinite(step_overhead) and step_overhead >= 0):
            raise ValueError(f"FittedCostModel.scaled: scale must be > 0 and step_overhead >= 0, both finite, got "
                             f"{scale}, {step_overhead}")
        coef = {n: getattr(self, n) * scale for n in COEFFICIENT_NAMES}
        coef["step"] += step_overhead
        return replace(self, **coef, wake_extra=tuple(b * scale for b in self.wake_extra),
                       token_extra=tuple(b * scale for b in self.token_extra))

    def to_dict(self) -> dict[str, Any]:
        """This model as a profile dict (``from_dict`` reads it back)."""
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "model": self.model,
            "device": self.device,
            "coefficients": {n: getattr(self, n) for n in COEFFICIENT_NAMES},
            "peak_flops": self.peak_flops,
            "flops": {"token": self.flops_per_token, "seq": self.flops_per_seq,
                      "attn_pair": self.flops_per_attn_pair},
            "provenance": dict(self.provenance),
            "wake_curve": [[a, b] for a, b in zip(self.wake_idle, self.wake_extra, strict=True)],
            "token_curve": [[a, b] for a, b in zip(self.token_knots, self.token_extra, strict=True)],
        }

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
        a, b, c = shape.num_seqs, shape.num_tokens, shape.num_decode_seqs
        d, e, f = shape.attn_pairs, shape.kv_read_tokens, shape.swap_blocks
        t = (self.step + b * self.token + c * self.decode_seq + a * self.seq + d * self.attn_pair
             + e * self.kv_read_token + f * self.swap_block + (a - c) * self.prefill_seq)
        if self.token_knots:  # the linear layers' stairs in the row count
            t = t + np.interp(b, self.token_knots, self.token_extra)
        h = self.decode_pad_token
        if h:  # the padded decode gather; an unknown longest context (0) is taken as the decode rows' mean
            m = shape.max_decode_len
            if is_array(a, c, e, m):
                t = t + np.where(np.asarray(m) > 0, c * m, e * c / np.maximum(a, 1)) * h
            else:
                t = t + (c * m if m > 0 else e * c / max(a, 1)) * h
        g = shape.idle_before
        if self.wake_idle:  # a step after an idle period: the engine's wake-up, interpolated from the curve
            t = t + np.interp(g, self.wake_idle, self.wake_extra)
        if shape.host_load_time:
            t = t + shape.host_load_time
        return t if is_array(a, b, c, d, e, f, g, shape.max_decode_len) else float(t)

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        """Useful model FLOPs of the step (0 when the profile names no model FLOPs)."""
        a, b, p, d = shape.num_seqs, shape.num_tokens, shape.num_padding_tokens, shape.attn_pairs
        r = (b - p) * self.flops_per_token + a * self.flops_per_seq + d * self.flops_per_attn_pair
        return r if is_array(a, b, p, d) else float(r)

    def decode_steps(self, rows: Sequence[int], reads: Sequence[int],
                     longest: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """``step_time``/``step_flops`` of unpadded one-token-per-row steps, bit-identical (same expression).
        ``longest[i]``: step i's ``max_decode_len`` (None: unknown)."""
        step, token, dseq, seq = self.step, self.token, self.decode_seq, self.seq
        pair, kvr, swap, pseq = self.attn_pair, self.kv_read_token, self.swap_block, self.prefill_seq
        ft, fs, fp = self.flops_per_token, self.flops_per_seq, self.flops_per_attn_pair
        times = [step + n * token + n * dseq + n * seq + c * pair + c * kvr + 0 * swap + (n - n) * pseq
                 for n, c in zip(rows, reads, strict=True)]
        if self.token_knots:
            kx, ky = self.token_knots, self.token_extra
            times = [float(t + np.interp(n, kx, ky)) for t, n in zip(times, rows, strict=True)]
        h = self.decode_pad_token
        if h:
            ms = longest if longest is not None else [0] * len(rows)
            times = [t + (n * m if m > 0 else c * n / max(n, 1)) * h
                     for t, n, c, m in zip(times, rows, reads, ms, strict=True)]
        flops = [float((n - 0) * ft + n * fs + c * fp) for n, c in zip(rows, reads, strict=True)]
        return times, flops

