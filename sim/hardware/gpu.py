"""GPUs: ``GPUSpec``, the presets (datasheet figures in sim/hardware/presets/gpus.py), ``register_gpu`` for a
plugin's, and ``resolve_gpu``, the one way a name, a spec or a mapping of fields becomes a ``GPUSpec``.

Units: bytes, bytes per second, FLOP per second, watts, USD per GPU-hour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sim.hardware.dtypes import canonical_dtype, finite_number
from sim.hardware.presets.gpus import (
    AMBIGUOUS_GPU_NAMES,
    BASE_GPU_ALIASES,
    BASE_GPU_PRESETS,
    MORE_GPU_ALIASES,
    MORE_GPU_PRESETS,
)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator. ``peak_flops`` holds dense (non-sparse) tensor-core FLOP/s by dtype; 0 or absent means
    the dtype has no hardware support (the A100 has no fp8). Treat the dict as read-only."""

    name: str
    memory_bytes: int  # memory.total as nvidia-smi reports it (what vLLM's gpu_memory_utilization multiplies)
    mem_bandwidth: float  # B/s, datasheet peak
    peak_flops: dict[str, float] = field(hash=False)  # FLOP/s by dtype: fp32, bf16, fp16, fp8, int8
    pcie_bandwidth: float  # B/s, effective host<->device copy rate in one direction (pinned memory)
    nvlink_bandwidth: float = 0.0  # B/s per GPU in one direction (half the datasheet bidirectional total); 0: none
    price_per_hour: float = 0.0  # USD per GPU-hour on demand (an assumption, see GPU_PRESETS)
    tdp_w: float = 0.0  # W, the board's default power limit (datasheet); 0: unknown (no energy is modelled)
    idle_w: float = 0.0  # W drawn with nothing running (static power; an assumption, see sim/hardware/presets/gpus.py)
    # the chip generation (hopper, ampere, ada, blackwell, cdna3; "" unknown): what its kernels can run, e.g.
    # FlashAttention-3 only on hopper (sim/engines/costs.py); declared by the GPU, never guessed from its name
    architecture: str = ""

    def __post_init__(self) -> None:
        # Rates are divided by: a NaN or infinite one, or one below 1 per second, makes step times NaN or
        # infinite, so each must be a finite number, rates at least 1 (or 0 where 0 means "none").
        for f in ("memory_bytes", "mem_bandwidth", "pcie_bandwidth"):
            v = getattr(self, f)
            if not finite_number(v) or v < 1:
                raise ValueError(f"GPU {self.name!r}: {f} must be a finite number >= 1, got {v!r}")
        v = self.nvlink_bandwidth
        if not finite_number(v) or v < 0 or 0 < v < 1:
            raise ValueError(f"GPU {self.name!r}: nvlink_bandwidth must be 0 (none) or a finite number >= 1, "
                             f"got {v!r}")
        if not finite_number(self.price_per_hour) or self.price_per_hour < 0:
            raise ValueError(f"GPU {self.name!r}: price_per_hour must be a finite number >= 0, "
                             f"got {self.price_per_hour!r}")
        for f in ("tdp_w", "idle_w"):
            v = getattr(self, f)
            if not finite_number(v) or v < 0:
                raise ValueError(f"GPU {self.name!r}: {f} must be a finite number >= 0, got {v!r}")
        if self.idle_w > self.tdp_w:
            raise ValueError(f"GPU {self.name!r}: idle_w ({self.idle_w}) must not exceed tdp_w ({self.tdp_w})")
        if not float(self.memory_bytes).is_integer():
            raise ValueError(f"GPU {self.name!r}: memory_bytes must be a whole number of bytes, "
                             f"got {self.memory_bytes!r}")
        object.__setattr__(self, "memory_bytes", int(self.memory_bytes))
        if not isinstance(self.peak_flops, Mapping):
            raise ValueError(f"GPU {self.name!r}: peak_flops must map dtypes to FLOP/s, got {self.peak_flops!r}")
        peaks: dict[str, float] = {}
        for k, v in self.peak_flops.items():
            if not finite_number(v) or v < 0 or 0 < v < 1:
                raise ValueError(f"GPU {self.name!r}: peak_flops.{k} must be 0 (unsupported) or a finite number "
                                 f">= 1 FLOP/s, got {v!r}")
            peaks[canonical_dtype(k)] = float(v)
        if "bf16" in peaks and "fp16" not in peaks:
            peaks["fp16"] = peaks["bf16"]
        if peaks.get("bf16", 0.0) <= 0 and peaks.get("fp16", 0.0) <= 0:
            raise ValueError(f"GPU {self.name!r}: peak_flops needs a positive bf16 (or fp16) rate")
        object.__setattr__(self, "peak_flops", peaks)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for matmuls in ``dtype``; 0.0 when unsupported."""
        return self.peak_flops.get(canonical_dtype(dtype), 0.0)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GPUSpec:
        """A custom GPU from a mapping with this class's field names (unknown keys are refused)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown GPU field(s) {sorted(unknown)}; expected {sorted(names)}")
        missing = {"name", "memory_bytes", "mem_bandwidth", "peak_flops", "pcie_bandwidth"} - set(d)
        if missing:
            raise ValueError(f"GPU spec lacks the field(s) {sorted(missing)}")
        return cls(**dict(d))

    @classmethod
    def from_name(cls, name: str) -> GPUSpec:
        """A preset by name, case-insensitive (see ``GPU_PRESETS``)."""
        key = name.strip().lower().replace("_", "-")
        if key not in GPU_PRESETS and key not in _GPU_ALIASES:
            from sim.plugins import load_plugins

            load_plugins()
        key = _GPU_ALIASES.get(key, key)
        if key not in GPU_PRESETS and key in AMBIGUOUS_GPU_NAMES:
            choices = ", ".join(f"{c} ({GPU_PRESETS[c].memory_bytes >> 30} GiB)" for c in AMBIGUOUS_GPU_NAMES[key])
            raise ValueError(f"GPU {name!r} is ambiguous: its memory changes the KV cache and the answer; give one "
                             f"of {choices}")
        if key not in GPU_PRESETS:
            raise ValueError(f"unknown GPU {name!r}; presets: {', '.join(GPU_PRESETS)} (or, in a scenario's "
                             "deployment.gpu, a mapping of GPUSpec's fields)")
        return GPU_PRESETS[key]


# Datasheet figures, with their sources and assumptions, in sim/hardware/presets/gpus.py.
GPU_PRESETS: dict[str, GPUSpec] = {k: GPUSpec(**v) for k, v in (BASE_GPU_PRESETS | MORE_GPU_PRESETS).items()}
_GPU_ALIASES = dict(BASE_GPU_ALIASES) | MORE_GPU_ALIASES


def register_gpu(gpu: GPUSpec | Mapping[str, Any], aliases: tuple[str, ...] = ()) -> GPUSpec:
    """Add a GPU preset (a plugin's, see sim/plugins.py): afterwards ``deployment.gpu: NAME`` and ``--gpu NAME``
    find it like a shipped one. ``gpu`` is a GPUSpec or a mapping of its fields (with its ``architecture``).
    Registering a different GPU under a name already taken is refused; the same one again is a no-op."""
    spec = gpu if isinstance(gpu, GPUSpec) else GPUSpec.from_dict(gpu)
    key = spec.name.strip().lower().replace("_", "-")
    for name in (key, *(a.strip().lower().replace("_", "-") for a in aliases)):
        taken = GPU_PRESETS.get(_GPU_ALIASES.get(name, name))
        if taken is not None and taken != spec:
            raise ValueError(f"GPU {name!r} is already registered as a different GPU")
    GPU_PRESETS[key] = spec
    for a in aliases:
        _GPU_ALIASES[a.strip().lower().replace("_", "-")] = key
    return spec


GPULike = GPUSpec | str | Mapping[str, Any]


def resolve_gpu(gpu: GPULike) -> GPUSpec:
    """The one way a GPU given by the user becomes a ``GPUSpec``: a spec as it is, a preset name
    (case-insensitive, see ``GPU_PRESETS``), or a mapping of ``GPUSpec`` fields."""
    if isinstance(gpu, GPUSpec):
        return gpu
    if isinstance(gpu, Mapping):
        return GPUSpec.from_dict(gpu)
    return GPUSpec.from_name(gpu)
