"""Quantization on the engine: weight-only int8, int4 and fp8 linear layers, and an fp8 or int8 KV cache.

Weights (the decoder's linear layers only: q/k/v, o, gate/up, down; the embedding, LM head and norms keep the
model's dtype, which is what the simulator's ``ShardSpec.weight_bytes`` assumes):

- ``int8``: symmetric, one float32 scale per output channel (``absmax / 127``);
- ``int4``: symmetric, one float16 scale per group of ``group_size`` inputs (``absmax / 7``), two weights per byte;
- ``fp8``: float8 e4m3 with one float32 scale per output channel (``absmax / 448``).

On a CPU every product dequantizes the weight on the fly to the activation dtype and calls an ordinary matmul:
the memory is saved, the time is not (on a CPU the dequantization costs more than the fp32 product it feeds).
On CUDA, fp8 weights use ``torch._scaled_mm`` (fp8 tensor cores, W8A8 with a dynamic per-row activation scale)
on GPUs of compute capability 8.9 or more (Ada, Hopper) — the path vLLM takes for fp8 checkpoints; int8 and int4
dequantize on the fly there too (a real deployment uses fused kernels such as Marlin). The CUDA path has not been
run on a GPU by this project: it is guarded by the device check and untested.

KV cache (``QuantKVCache``, a ``KVCache`` whose per-layer tensors store one byte per element):

- ``fp8``: e4m3 with a static per-tensor scale of 1.0 (vLLM's default ``kv_cache_dtype="fp8"`` without
  calibrated scales); values beyond +-448 saturate;
- ``int8``: symmetric with one float16 scale per (token, head) (``absmax / 127``), which costs 2 bytes per
  ``head_dim`` elements on top of the simulator's one byte per element.

New K/V are quantized as they are written; attention reads them back dequantized to the model's dtype (the
gather + SDPA reference; the Triton decode kernel reads plain tensors only, so on CUDA a quantized cache must run
with ``attention.register_cuda_decode_kernel(None)``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from realengine.kv_cache import KVCache
from realengine.model import LlamaModel
from sim.hardware.models import ModelSpec

WEIGHT_FORMATS = ("int8", "int4", "fp8")
KV_FORMATS = ("fp8", "int8")
FP8_MAX = 448.0  # largest finite float8 e4m3fn
_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _fp8_lut(device: torch.device) -> Tensor:
    """float32 value of each of the 256 e4m3 bit patterns: a table lookup dequantizes faster than a cast on CPUs."""
    return torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()


def _fp8_bits(x: Tensor) -> Tensor:
    """Round float values to e4m3 (saturating at +-448) and return their bit patterns as uint8."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


# ---- weights ----------------------------------------------------------------------------------------------------


class QuantLinear(nn.Module):
    """A linear layer whose weight is stored quantized and dequantized for each product (see the module doc).

    ``qweight``: int8 ``[out, in]`` (int8), uint8 ``[out, in / 2]`` (int4, low nibble first, offset 8), uint8 bit
    patterns ``[out, in]`` (fp8). ``scale``: float32 ``[out, 1]`` (int8, fp8) or float16 ``[out, in / group]``
    (int4)."""

    # registered buffers, declared so that a type checker sees tensors rather than ``Module.__getattr__``'s union
    qweight: Tensor
    scale: Tensor

    def __init__(self, weight: Tensor, bias: Tensor | None, fmt: str, *, group_size: int = 64,
                 cuda_fast_path: bool = True) -> None:
        super().__init__()
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"weight format {fmt!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
        self.fmt = fmt
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        self.out_dtype = weight.dtype
        w = weight.detach().float()
        if fmt == "int8":
            scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
            q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
        elif fmt == "fp8":
            scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
            q = _fp8_bits(w / scale)
        else:
            if self.in_features % group_size or group_size % 2:
                raise ValueError(f"int4 groups of {group_size} do not divide {self.in_features} inputs")
            g = w.view(self.out_features, -1, group_size)
            scale = (g.abs().amax(dim=2, keepdim=True) / 7.0).clamp_min(1e-8).to(torch.float16)
            codes = torch.round(g / scale.float()).clamp_(-8, 7).to(torch.int16).add_(8).to(torch.uint8)
            codes = codes.view(self.out_features, self.in_features // 2, 2)
            q = codes[..., 0] | (codes[..., 1] << 4)
            scale = scale.view(self.out_features, -1)
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.cuda_fast_path = cuda_fast_path
        self._lut = _fp8_lut(weight.device) if fmt == "fp8" else None
        self._cached: Tensor | None = None  # a dequantized copy, only while cache_dequantized(True)

    @property
    def nbytes(self) -> int:
        """Bytes stored: quantized weight, scales and bias."""
        n = self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()
        return n + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The weight ``[out, in]`` in ``dtype`` (default: the original weight's dtype)."""
        dtype = dtype or self.out_dtype
        if self.fmt == "int8":
            w = self.qweight.to(dtype) * self.scale.to(dtype)
        elif self.fmt == "fp8":
            assert self._lut is not None  # built in __init__ for fp8
            w = torch.take(self._lut, self.qweight.long()).to(dtype) * self.scale.to(dtype)
        else:
            q = self.qweight
            codes = torch.stack((q & 15, q >> 4), dim=-1).view(self.out_features, -1, self.group_size)
            w = (codes.to(dtype) - 8) * self.scale.to(dtype)[..., None]
            w = w.view(self.out_features, self.in_features)
        return w

    def cache_dequantized(self, on: bool) -> None:
        """Keep a dequantized copy (same numbers, no per-product dequantization): for quality evaluation on a CPU,
        where dequantizing on the fly would only make it slower. Throughput is measured with it off."""
        self._cached = self.dequantize() if on else None

    def _use_scaled_mm(self, x: Tensor) -> bool:
        return (self.fmt == "fp8" and self.cuda_fast_path and x.is_cuda
                and torch.cuda.get_device_capability(x.device) >= (8, 9) and hasattr(torch, "_scaled_mm"))

    def forward(self, x: Tensor) -> Tensor:
        if self._cached is not None:
            return F.linear(x, self._cached.to(x.dtype), self.bias)
        if self._use_scaled_mm(x):  # untested here: no GPU was available to this project
            xs = (x.float().abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
            xq = (x.float() / xs).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            wq = self.qweight.view(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=self.scale.float().t().contiguous(),
                                 out_dtype=x.dtype if x.dtype != torch.float32 else torch.bfloat16)
            y = y.to(x.dtype)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.dequantize(x.dtype), self.bias)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.fmt == "int4" else ""
        return f"{self.in_features} -> {self.out_features}, {self.fmt}{g}"


def quantize_model(model: LlamaModel, fmt: str, *, group_size: int = 64, cuda_fast_path: bool = True) -> LlamaModel:
    """A copy of ``model`` with its decoder's linear layers quantized to ``fmt``. The copy shares every other
    tensor (embedding, norms) with the original, which is left unchanged."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {fmt!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
    memo: dict[int, Tensor] = {id(p): p for p in model.parameters()}  # deepcopy shares them instead of copying
    memo.update({id(b): b for b in model.buffers()})
    q = copy.deepcopy(model, memo)
    for layer in q.layers:
        for path in _LINEARS:
            parent_name, attr = path.split(".")
            parent = getattr(layer, parent_name)
            lin = getattr(parent, attr)
            setattr(parent, attr, QuantLinear(lin.weight.data, None if lin.bias is None else lin.bias.data, fmt,
                                              group_size=group_size, cuda_fast_path=cuda_fast_path))
    return q


def quant_linears(model: nn.Module) -> list[QuantLinear]:
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


def cache_dequantized(model: nn.Module, on: bool) -> None:
    """``QuantLinear.cache_dequantized`` on every quantized layer of ``model``."""
    for m in quant_linears(model):
        m.cache_dequantized(on)


@dataclass(frozen=True, slots=True)
class WeightMemory:
    """Measured bytes of a (possibly quantized) model's weights."""

    total: int  # every stored tensor: quantized weights, scales, embedding, norms (a tied head counted once)
    linear_params: int  # elements of the decoder's linear-layer weights
    linear_bytes: int  # their bytes as stored, quantized weights only
    scale_bytes: int  # bytes of their quantization scales

    @property
    def bytes_per_linear_weight(self) -> float:
        return self.linear_bytes / self.linear_params

    @property
    def scale_overhead(self) -> float:
        """Scales as a fraction of the quantized weights' bytes."""
        return self.scale_bytes / self.linear_bytes


def weight_memory(model: LlamaModel) -> WeightMemory:
    """Bytes of the weights as this model stores them (measured on its tensors, not computed from a dtype)."""
    lin_params = lin_bytes = scale_bytes = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            lin_params += m.out_features * m.in_features
            lin_bytes += m.qweight.numel() * m.qweight.element_size()
            scale_bytes += m.scale.numel() * m.scale.element_size()
    for layer in model.layers:
        for path in _LINEARS:
            parent_name, attr = path.split(".")
            lin = getattr(getattr(layer, parent_name), attr)
            if not isinstance(lin, QuantLinear):
                lin_params += lin.weight.numel()
                lin_bytes += lin.weight.numel() * lin.weight.element_size()
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return WeightMemory(total, lin_params, lin_bytes, scale_bytes)


# ---- KV cache ---------------------------------------------------------------------------------------------------


class QuantKVTensor:
    """One layer's K or V cache stored in one byte per element (plus int8's scales), with the few tensor
    operations the attention and the swap code use: ``shape``, ``view``, ``index_copy_`` (quantizes what it
    writes), ``index_select``, ``to`` and indexing (which returns values dequantized to ``out_dtype``)."""

    def __init__(self, data: Tensor, scale: Tensor | None, fmt: str, out_dtype: torch.dtype,
                 fp8_scale: float = 1.0) -> None:
        self.data = data  # uint8 (fp8 bit patterns) or int8
        self.scale = scale  # int8: float16 [..., heads] (one per token and head); fp8: None
        self.fmt = fmt
        self.out_dtype = out_dtype
        self.fp8_scale = fp8_scale
        self._lut = _fp8_lut(data.device) if fmt == "fp8" else None

    def _like(self, data: Tensor, scale: Tensor | None) -> QuantKVTensor:
        return QuantKVTensor(data, scale, self.fmt, self.out_dtype, self.fp8_scale)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size()
        return n + (0 if self.scale is None else self.scale.numel() * self.scale.element_size())

    def view(self, *shape: int) -> QuantKVTensor:
        data = self.data.view(*shape)
        return self._like(data, None if self.scale is None else self.scale.view(data.shape[:-1]))

    def quantize(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.fmt == "fp8":
            return _fp8_bits(x.float() / self.fp8_scale), None
        xf = x.float()
        scale = (xf.abs().amax(dim=-1) / 127.0).clamp_min(1e-6).to(torch.float16)
        q = torch.round(xf / scale.float()[..., None]).clamp_(-127, 127).to(torch.int8)
        return q, scale

    def index_copy_(self, dim: int, index: Tensor, src) -> QuantKVTensor:
        if dim != 0:
            raise ValueError("only dim 0 is supported")
        if isinstance(src, QuantKVTensor):
            data, scale = src.data.to(self.device), None if src.scale is None else src.scale.to(self.device)
        else:
            data, scale = self.quantize(src)
        self.data.index_copy_(0, index, data)
        if self.scale is not None:
            assert scale is not None, "int8 KV is written with its scales"
            self.scale.index_copy_(0, index, scale)
        return self

    def index_select(self, dim: int, index: Tensor) -> QuantKVTensor:
        return self._like(self.data.index_select(dim, index),
                          None if self.scale is None else self.scale.index_select(dim, index))

    def to(self, device) -> QuantKVTensor:
        return self._like(self.data.to(device), None if self.scale is None else self.scale.to(device))

    def dequantize(self, data: Tensor, scale: Tensor | None) -> Tensor:
        if self.fmt == "fp8":
            assert self._lut is not None  # built in __init__ for fp8
            x = torch.take(self._lut, data.long())
            return (x * self.fp8_scale if self.fp8_scale != 1.0 else x).to(self.out_dtype)
        assert scale is not None, "int8 KV is stored with its scales"
        return (data.to(self.out_dtype) * scale.to(self.out_dtype)[..., None])

    def __getitem__(self, idx) -> Tensor:
        return self.dequantize(self.data[idx], None if self.scale is None else self.scale[idx])


class QuantKVCache(KVCache):
    """A ``KVCache`` (same layouts, block addressing and swap) whose K and V are stored in ``kv_format``
    (``fp8`` or ``int8``, see the module doc) and read back in ``dtype`` (the model's)."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, kv_format: str = "fp8", fp8_scale: float = 1.0,
                 device: str | torch.device = "cpu", **kw) -> None:
        if kv_format not in KV_FORMATS:
            raise ValueError(f"KV format {kv_format!r}: expected one of {', '.join(KV_FORMATS)}")
        # the base class allocates one byte per element: exactly the quantized storage, no float copy
        super().__init__(spec, dtype=torch.uint8, device=device, **kw)
        self.dtype = dtype
        self.kv_format = kv_format
        pin = self.device.type == "cuda"

        def wrap(t: Tensor, on_device: bool) -> QuantKVTensor:
            data = t if kv_format == "fp8" else t.view(torch.int8)  # reuse the base class's bytes
            scale = None
            if kv_format == "int8":
                scale = torch.zeros(t.shape[:-1], dtype=torch.float16, device=t.device,
                                    pin_memory=pin and not on_device)
            return QuantKVTensor(data, scale, kv_format, dtype, fp8_scale)

        def wrap_all(ts: list[Tensor], on_device: bool) -> list[Tensor]:
            # QuantKVTensor is not a Tensor: it duck-types the few Tensor operations that KVCache, the swap code and
            # the gather attention apply to a layer's cache (see its doc), so the lists keep the base class's type.
            return [wrap(t, on_device) for t in ts]  # type: ignore[misc]

        self.k, self.v = wrap_all(self.k, True), wrap_all(self.v, True)
        self.cpu_k, self.cpu_v = wrap_all(self.cpu_k, False), wrap_all(self.cpu_v, False)

    @property
    def nbytes(self) -> int:
        """Device bytes of all K and V storage, scales included."""
        return sum(t.nbytes for t in self.k + self.v)

    @property
    def bytes_per_block(self) -> int:
        return self.nbytes // self.num_blocks

    @property
    def bytes_per_token(self) -> float:
        return self.nbytes / (self.num_blocks * self.block_size)


def kv_cache_class(kv_format: str | None):
    """The cache class (a constructor taking ``KVCache``'s arguments) for a KV format; None: the plain cache."""
    if kv_format is None:
        return KVCache
    if kv_format not in KV_FORMATS:
        raise ValueError(f"KV format {kv_format!r}: expected one of {', '.join(KV_FORMATS)}")

    def make(spec: ModelSpec, **kw) -> QuantKVCache:
        return QuantKVCache(spec, kv_format=kv_format, **kw)

    return make


__all__ = [
    "KV_FORMATS",
    "WEIGHT_FORMATS",
    "QuantKVCache",
    "QuantKVTensor",
    "QuantLinear",
    "WeightMemory",
    "cache_dequantized",
    "kv_cache_class",
    "quant_linears",
    "quantize_model",
    "weight_memory",
]
