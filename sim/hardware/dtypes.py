"""Number formats (dtypes), their bytes per element, and the byte units GiB and MiB.

vLLM's names: ``kv_cache_dtype="auto"`` is the model's activation dtype; int4 exists for weights only.
"""

from __future__ import annotations

import math
from typing import Any, Literal

GiB = 1 << 30
MiB = 1 << 20


def finite_number(v: Any) -> bool:
    """A real number (bools are not), finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


DType = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]

# Bits per element. int4 packs two weights per byte; it exists for weights only.
DTYPE_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
}
QUANTIZED_DTYPES = frozenset({"fp8", "int8", "int4"})
# The names the real engine's --dtype accepts (realengine.model.torch_dtype); torch-free, so the CLI's help lists them.
ENGINE_DTYPE_NAMES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
}
ENGINE_DTYPES = tuple(dict.fromkeys(ENGINE_DTYPE_NAMES.values()))  # fp32, bf16, fp16, fp64


def canonical_dtype(name: str) -> str:
    """``name`` as one of ``fp32 bf16 fp16 fp8 int8 int4`` (also accepts torch-style names such as bfloat16)."""
    key = str(name).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_BITS)}")
    return key


def dtype_bytes(name: str) -> float:
    """Bytes per element (0.5 for int4)."""
    return DTYPE_BITS[canonical_dtype(name)] / 8


def kv_dtype_bytes(name: str) -> int:
    """Bytes per element of a KV-cache dtype. int4 is a weight-only format and is refused here."""
    key = canonical_dtype(name)
    if key == "int4":
        raise ValueError("int4 is a weight-only format; the KV cache supports fp32, bf16, fp16, fp8 or int8")
    return DTYPE_BITS[key] // 8


def activation_dtype(weight_dtype: str) -> str:
    """The dtype activations (and unquantized tensors) use with these weights: fp32 and fp16 models keep their
    dtype; bf16 and every quantized format run their activations in bf16, as vLLM does by default."""
    key = canonical_dtype(weight_dtype)
    return key if key in ("fp32", "fp16") else "bf16"


def resolve_kv_dtype(kv_dtype: str, weight_dtype: str) -> str:
    """vLLM's ``kv_cache_dtype``: ``auto`` means the activation dtype of the model."""
    if str(kv_dtype).strip().lower() == "auto":
        return activation_dtype(weight_dtype)
    key = canonical_dtype(kv_dtype)
    kv_dtype_bytes(key)  # refuses int4
    return key
