"""Speculative decoding: a proposer drafts k tokens per decoding row, one target step verifies them.

The scenario key is ``deployment.speculative``, vLLM's ``speculative_config``::

    speculative: {method: draft_model, model: llama-3.2-1b, num_speculative_tokens: 4,
                  acceptance: {type: geometric, rate: 0.7}}

What a step of a speculating row does, as vLLM v1 runs it:

- propose: ``draft_model`` runs k small decode passes of the draft (its first pass also catches up on the
  tokens the target step computes, the prompt chunks and the tokens accepted last time); ``eagle`` the same with
  a one-decoder-layer head on the target's hidden states; ``ngram`` looks the continuation up in the prompt on
  the CPU, for no GPU time.
- verify: the target computes the row's last token and its k drafts in one step: the row is priced as a prefill
  chunk of k + 1 tokens (``StepShape`` counts them; ``num_decode_seqs`` leaves the row out).
- emit: 1 + the accepted drafts (a prefix of the k), drawn from the acceptance model with the run's seeded
  generator (``seed``), or read from what an engine measured. The rejected drafts' KV slots are overwritten
  later; the KV blocks for all k + 1 stay allocated, as vLLM's lookahead slots do.

The analytic model prices the LM head once per row; a verifying row's logits at its k draft positions are not
priced (at batch 256 of Llama-3.1-8B on an H100 with k = 4, 1.8 ms a step), so the loss at large batches is if anything
understated.

Drafts per row are capped so that a request never drafts past its last output token, the step never exceeds
``max_num_batched_tokens`` (rows keep the 1 token the policy planned; drafts fill what the budget leaves, in plan
order) and the draft slots fit the free KV blocks. A request drafts only once it has its first token.

Latency as ``vllm bench serve`` measures it when a step delivers several tokens: they arrive in one chunk, so ITL
has one gap per step (not per token) and TPOT is (E2EL - TTFT) / (output tokens - 1).

Memory: the draft's weights and its KV per token come out of the target's KV memory (fewer blocks); an EAGLE
head is one decoder layer and a 2h x h projection (its embeddings and LM head are the target's); n-gram costs
nothing.

Metrics (vLLM's names): ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
``num_accepted_tokens_per_pos``; draft acceptance rate = accepted / draft tokens; mean acceptance length =
1 + accepted / drafts (tokens per verified row and step); per-position acceptance rate = accepted at position i
/ drafts.

The core drafts with the fast path off (``ServingCore(spec=...)``): runs without speculation are untouched.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from sim.config.files import read_text_capped
from sim.config.input_model import Float, InputModel, Int
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import CostModel, StepShape
from sim.hardware.dtypes import DTYPE_BITS, canonical_dtype, kv_dtype_bytes, resolve_kv_dtype
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget
from sim.hardware.models import ModelSpec, resolve_model
from sim.serving.request import Request

METHODS = ("draft_model", "ngram", "eagle")
MAX_SPECULATIVE_TOKENS = 32
# A draft pass runs inside the target's step, launched as one CUDA graph: it pays kernel launches, not the
# step's scheduling and sampling (DEFAULT_STEP_OVERHEAD, 1.5 ms)
DEFAULT_DRAFT_STEP_OVERHEAD = 2.0e-4  # s per draft pass
MAX_ACCEPTANCE_FILE_BYTES = 64 << 20


# ---- acceptance models -----------------------------------------------------------------------------------------
class GeometricAcceptance(InputModel):
    """Each draft token is accepted with probability ``rate`` given that the ones before it were (Leviathan et al.
    2023's alpha): position i is reached with probability rate**i, and the mean accepted of k is
    rate (1 - rate**k) / (1 - rate)."""

    type: Literal["geometric"] = "geometric"
    rate: Float = Field(ge=0, le=1, description="alpha: the chance a draft token is accepted once the ones before "
                        "it were.")

    def per_position(self, k: int) -> list[float]:
        return [self.rate ** (i + 1) for i in range(k)]


class PerPositionAcceptance(InputModel):
    """vLLM's per-position acceptance rate: ``rates[i]`` = drafts whose token i (from 0) was accepted / drafts.
    Non-increasing (a token is accepted only after every one before it); past the list, the last rate's decay
    continues geometrically."""

    type: Literal["per_position"] = "per_position"
    rates: list[Float] = Field(min_length=1, max_length=MAX_SPECULATIVE_TOKENS,
                               description="Share of drafts whose i-th token was accepted, i = 0, 1, ...")

    @field_validator("rates")
    @classmethod
    def _non_increasing(cls, v: list[float]) -> list[float]:
        if any(not 0 <= x <= 1 for x in v):
            raise ValueError("each rate is a share of drafts, in [0, 1]")
        if any(b > a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"rates must not increase with the position (a token is accepted only after the "
                             f"ones before it): {v}")
        return v

    def per_position(self, k: int) -> list[float]:
        return _extend(self.rates, k)


class MeasuredAcceptance(InputModel):
    """Acceptance an engine measured, from a JSON file: ``{"num_accepted_tokens_per_pos": [...],
    "num_drafts": n}`` (vLLM's counters: per-position rates are their ratio) or ``{"accepted": {"<request id>":
    [accepted at its 1st draft, 2nd, ...]}}`` (replayed draft by draft: the simulator then reproduces an engine
    run exactly)."""

    type: Literal["measured"] = "measured"
    file: str = Field(description="JSON file of measured acceptance (see the type's description), or a run "
                      "folder's summary.json (an engine run's, say): its spec_decode counters.")
    variant: str | None = Field(default=None, description="summary.json: the variant whose counters to take "
                                "(default: the first that speculated).")

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(read_text_capped(self.file, MAX_ACCEPTANCE_FILE_BYTES, "a JSON acceptance file"))
        except FileNotFoundError:
            raise ValueError(f"acceptance file not found: {self.file}") from None
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError, as is the size cap
            raise ValueError(f"acceptance file {self.file}: {e}") from None
        if isinstance(data, dict) and isinstance(data.get("variants"), dict):  # a run folder's summary.json
            found = {n: v["spec_decode"] for n, v in data["variants"].items()
                     if isinstance(v, dict) and isinstance(v.get("spec_decode"), dict)}
            if not found or (self.variant is not None and self.variant not in found):
                raise ValueError(f"acceptance file {self.file}: no variant {self.variant or ''} with spec_decode "
                                 f"counters (speculating: {', '.join(found) or 'none'})")
            data = found[self.variant] if self.variant is not None else next(iter(found.values()))
        if not isinstance(data, dict) or not ({"accepted"} <= set(data) or {"num_accepted_tokens_per_pos",
                                                                           "num_drafts"} <= set(data)):
            raise ValueError(f"acceptance file {self.file}: needs 'accepted' or 'num_accepted_tokens_per_pos' and "
                             "'num_drafts'")
        return data


AcceptanceConfig = Annotated[GeometricAcceptance | PerPositionAcceptance | MeasuredAcceptance,
                             Field(discriminator="type")]


def _extend(rates: Sequence[float], k: int) -> list[float]:
    out = list(rates[:k])
    if len(out) < k:
        last = out[-1]
        prev = out[-2] if len(out) > 1 else 1.0
        decay = last / prev if prev > 0 else 0.0
        while len(out) < k:
            out.append(out[-1] * decay)
    return out


# ---- the scenario section --------------------------------------------------------------------------------------
class SpeculativeConfig(InputModel):
    """``deployment.speculative``: vLLM's ``speculative_config``."""

    method: Literal["draft_model", "ngram", "eagle"] = Field(
        description="Proposer: draft_model (a small model of the same vocabulary), ngram (prompt lookup on the "
        "CPU), eagle (a one-layer head on the target's hidden states).")
    num_speculative_tokens: Int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS,
                                        description="k: draft tokens proposed per row and step.")
    model: str | dict[str, Any] | None = Field(
        default=None, description="The draft model (draft_model: required), a preset, config.json or fields; "
        "eagle: the head's shape is the target's.")
    draft_tensor_parallel_size: Int | None = Field(
        default=None, ge=1, description="GPUs the draft is split over: 1 or the target's (default: the target's).")
    acceptance: AcceptanceConfig = Field(description="How many drafts the target accepts.")
    disable_by_batch_size: Int | None = Field(
        default=None, ge=1, description="Draft nothing in a step that schedules at least this many requests "
        "(vLLM's disable_by_batch_size: speculation off under load); none: always draft.")
    seed: Int = Field(default=0, ge=0, description="Seed of the acceptance draws (a stream of their own: the "
                      "workload's draws are untouched).")
    draft_step_overhead: Float = Field(default=DEFAULT_DRAFT_STEP_OVERHEAD, ge=0,
                                       description="Seconds each draft pass adds besides its own roofline.")

    @model_validator(mode="after")
    def _draft_needs_model(self) -> SpeculativeConfig:
        if self.method == "draft_model" and self.model is None:
            raise ValueError("method draft_model needs the draft's model (a preset such as llama-3.2-1b)")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("method ngram proposes from the prompt: it takes no model")
        return self


# ---- memory and cost ---------------------------------------------------------------------------------------------
def draft_spec(cfg: SpeculativeConfig, target: ModelSpec) -> ModelSpec | None:
    """The model the proposer runs: the draft, EAGLE's one-layer head (the target's shape), None for n-gram."""
    if cfg.method == "ngram":
        return None
    if cfg.method == "eagle":
        return dataclasses.replace(target, name=f"{target.name}-eagle-head", num_layers=1)
    assert cfg.model is not None  # the validator checked it
    spec = resolve_model(cfg.model)
    if spec.vocab_size != target.vocab_size:
        raise ValueError(f"the draft {spec.name} has a vocabulary of {spec.vocab_size}, the target {target.name} "
                         f"{target.vocab_size}: a draft must share the target's tokenizer")
    return spec


def draft_tp(cfg: SpeculativeConfig, target_tp: int) -> int:
    tp = cfg.draft_tensor_parallel_size or target_tp
    if tp not in (1, target_tp):
        raise ValueError(f"draft_tensor_parallel_size {tp}: vLLM takes 1 or the target's ({target_tp})")
    return tp


def draft_memory(cfg: SpeculativeConfig, target: ModelSpec, *, weight_dtype: str, kv_dtype: str,
                 tensor_parallel_size: int) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) the proposer takes on one GPU of the target's."""
    spec = draft_spec(cfg, target)
    if spec is None:
        return 0, 0
    tp = draft_tp(cfg, tensor_parallel_size)
    wd = canonical_dtype(weight_dtype)
    kd = resolve_kv_dtype(kv_dtype, wd)
    shard = spec.shard(tp)
    kv_per_token = spec.kv_elements_per_token(tp) * kv_dtype_bytes(kd)
    if cfg.method == "eagle":  # one decoder layer (the 2-layer model less the 1-layer one) + the 2h x h projection
        two = dataclasses.replace(spec, num_layers=2).shard(tp).weight_bytes(wd)
        layer = two - shard.weight_bytes(wd)
        fc = 2 * spec.hidden_size * spec.hidden_size * DTYPE_BITS[wd] // 8 // tp
        return layer + fc, kv_per_token
    return shard.weight_bytes(wd), kv_per_token



def budget_with_draft(cfg: SpeculativeConfig, budget: KVBudget, target: ModelSpec, *, weight_dtype: str,
                      kv_dtype: str, tensor_parallel_size: int, num_gpu_blocks_override: int | None) -> KVBudget:
    """The target's KV budget once the proposer's weights and KV are in the same memory: every target block
    needs the draft's KV for the same tokens, so a block costs both."""
    w, per_token = draft_memory(cfg, target, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                tensor_parallel_size=tensor_parallel_size)
    if w == 0 and per_token == 0:
        return budget
    kv_memory = budget.kv_memory - w
    bpt = budget.bytes_per_token + per_token
    per_block = budget.block_size * bpt
    blocks = num_gpu_blocks_override if num_gpu_blocks_override is not None else max(kv_memory, 0) // per_block
    if blocks < 1:
        raise ValueError(f"the draft's {w / 2**30:.2f} GiB of weights leave no room for one KV block "
                         f"({budget.kv_memory / 2**30:.2f} GiB was left for the KV cache)")
    return dataclasses.replace(budget, weight_bytes=budget.weight_bytes + w, kv_memory=kv_memory,
                               bytes_per_token=bpt, kv_bytes_per_block=per_block, num_gpu_blocks=int(blocks))


@dataclasses.dataclass(slots=True)
class SpecDecodeCost(CostModel):
    """The target's cost model plus the proposer's time. A step with speculating rows takes the target's time
    for its shape (the rows' k + 1 tokens included) plus, for a draft model or an EAGLE head: one pass over the
    step's shape (catching up on the new tokens) and k - 1 decode passes of the speculating rows."""

    target: CostModel
    draft: CostModel | None  # None: n-gram (no GPU time)
    draft_seconds: float = 0.0  # proposer time of the steps priced so far

    @property
    def peak_flops(self) -> float:
        return float(self.target.peak_flops)

    def draft_time(self, shape: StepShape) -> float:
        rows = int(shape.num_spec_seqs)
        if self.draft is None or not rows:
            return 0.0
        passes = -(-int(shape.num_draft_tokens) // rows)  # the longest draft, rows drafting about alike
        t = float(self.draft.step_time(shape))
        ctx = int(shape.spec_context_tokens)
        for j in range(1, passes):
            read = ctx + (j + 1) * rows
            t += float(self.draft.step_time(StepShape(rows, rows, rows, read, read)))
        return t

    def step_time(self, shape: StepShape) -> float:
        t = float(self.target.step_time(shape))
        if shape.num_spec_seqs:
            d = self.draft_time(shape)
            self.draft_seconds += d
            t += d
        return t

    def step_flops(self, shape: StepShape) -> float:
        return float(self.target.step_flops(shape))


def build_cost(cfg: SpeculativeConfig, target_cost: CostModel, target: ModelSpec, gpu: GPUSpec, *, weight_dtype: str,
               kv_dtype: str, tensor_parallel_size: int, block_size: int) -> SpecDecodeCost:
    """The proposer priced by the analytic model on the draft's spec (the GPU is the target's)."""
    spec = draft_spec(cfg, target)
    draft = None
    if spec is not None:
        draft = AnalyticCostModel(spec, gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                  tensor_parallel_size=draft_tp(cfg, tensor_parallel_size), block_size=block_size,
                                  step_overhead=cfg.draft_step_overhead, per_request_overhead=0.0)
    return SpecDecodeCost(target_cost, draft)


def budget_for(dep: Any, budget: KVBudget, target: ModelSpec, max_model_len: int) -> KVBudget:
    """``budget_with_draft`` for a scenario's deployment (``sim.config.schema.Deployment``); a ValueError where the
    longest request no longer fits."""
    cfg = dep.speculative
    out = budget_with_draft(cfg, budget, target, weight_dtype=dep.weight_dtype, kv_dtype=dep.kv_dtype,
                            tensor_parallel_size=dep.tensor_parallel_size, num_gpu_blocks_override=dep.num_gpu_blocks)
    if max_model_len > out.capacity_tokens:
        raise ValueError(f"with the draft in memory the KV cache holds {out.capacity_tokens} tokens, less than "
                         f"max_model_len {max_model_len}: lower deployment.max_model_len or use a smaller draft")
    return out


def cost_for(dep: Any, target_cost: CostModel, target: ModelSpec, gpu: GPUSpec) -> SpecDecodeCost:
    """``build_cost`` for a scenario's deployment; the acceptance model is built once here too, so that a bad
    acceptance file fails while the scenario is resolved, before anything runs."""
    build_acceptor(dep.speculative)
    return build_cost(dep.speculative, target_cost, target, gpu, weight_dtype=dep.weight_dtype,
                      kv_dtype=dep.kv_dtype, tensor_parallel_size=dep.tensor_parallel_size, block_size=dep.block_size)


# ---- the proposer and verifier the core calls ------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class SpecStats:
    """vLLM's counters (``vllm:spec_decode_*``)."""

    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.k

    def add(self, other: SpecStats) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n


Acceptor = Callable[[Request, int], int]  # (request, drafts proposed) -> drafts accepted, a prefix


class RateAcceptor:
    """Accepted drafts drawn from per-position rates with one uniform per draft: positions reached are those
    whose rate exceeds it, so the counts follow the rates exactly and one draw is spent per draft whatever k."""

    def __init__(self, rates: Sequence[float], seed: int) -> None:
        self.rates = list(rates)
        self.rng = np.random.default_rng([seed, 19, 2])

    def __call__(self, req: Request, k: int) -> int:
        u = self.rng.random()
        a = 0
        rates = self.rates
        while a < k and u < rates[a]:
            a += 1
        return a


class ReplayAcceptor:
    """Accepted counts replayed request by request, draft by draft (an engine's measured run)."""

    def __init__(self, accepted: dict[int, list[int]]) -> None:
        self.accepted = {int(i): list(v) for i, v in accepted.items()}
        self.used: dict[int, int] = {}

    def __call__(self, req: Request, k: int) -> int:
        i = self.used.get(req.id, 0)
        seq = self.accepted.get(req.id)
        if seq is None or i >= len(seq):
            raise ValueError(f"measured acceptance has no draft {i + 1} for request {req.id}")
        self.used[req.id] = i + 1
        return min(int(seq[i]), k)


def build_acceptor(cfg: SpeculativeConfig) -> Acceptor:
    k = cfg.num_speculative_tokens
    acc = cfg.acceptance
    if isinstance(acc, MeasuredAcceptance):
        data = acc.load()
        if "accepted" in data:
            return ReplayAcceptor(data["accepted"])
        drafts = float(data["num_drafts"])
        per_pos = [float(x) for x in data["num_accepted_tokens_per_pos"]]
        if drafts <= 0 or not per_pos or not all(math.isfinite(x) and x >= 0 for x in per_pos):
            raise ValueError(f"acceptance file {acc.file}: num_drafts must be > 0 and the counts finite and >= 0")
        return RateAcceptor(_extend([min(1.0, x / drafts) for x in per_pos], k), cfg.seed)
    return RateAcceptor(acc.per_position(k), cfg.seed)


class SpecDecoder:
    """What the serving core calls: ``propose`` when it applies a plan, ``accept`` when it completes the step."""

    def __init__(self, k: int, acceptor: Acceptor, disable_by_batch_size: int | None = None) -> None:
        self.k = k
        self.disable_by_batch_size = disable_by_batch_size
        self.acceptor = acceptor
        self.stats = SpecStats(k)
        # per request, accepted drafts in order (what an engine measured can be replayed from: MeasuredAcceptance)
        self.accepted: dict[int, list[int]] | None = None

    def propose(self, scheduled: list[tuple[Request, int]], kv: Any, room: int
                ) -> tuple[dict[int, int], int, int, int, int]:
        """Drafts for the plan's decoding rows: ({request id: drafts}, rows, draft tokens, their context, extra
        attention pairs). ``room``: tokens left under max_num_batched_tokens. Takes the KV slots for them."""
        drafts: dict[int, int] = {}
        tokens = ctx = pairs = 0
        if self.disable_by_batch_size is not None and len(scheduled) >= self.disable_by_batch_size:
            return drafts, 0, 0, 0, 0
        for r, n in scheduled:
            if room <= 0:
                break
            c = r.num_computed_tokens
            if n != 1 or r.num_output_tokens < 1 or c + 1 != r.num_tokens:
                continue  # not decoding (a prefill chunk, or the first token still to come)
            k = min(self.k, r.output_len - r.num_output_tokens - 1, room)
            while k > 0 and kv.blocks_needed(r, 1 + k) > kv.num_free_blocks:
                k -= 1
            if k <= 0:
                continue
            kv.allocate(r, 1 + k)
            drafts[r.id] = k
            room -= k
            tokens += k
            ctx += c
            q = 1 + k
            pairs += k * c + q * (q + 1) // 2 - 1  # beyond the 1 token's c + 1 pairs the core counted
        return drafts, len(drafts), tokens, ctx, pairs

    def emit(self, r: Request, k: int, end: float) -> int:
        """``r`` verified ``k`` drafts in the step that ended at ``end``: the accepted ones become output tokens
        (their KV computed); returns how many. The core then samples the target's own token as usual."""
        a = self.accept(r, k)
        if a:
            r.num_output_tokens += a
            if r.token_times is not None:
                r.token_times.extend([end] * a)
        return a

    def accept(self, r: Request, k: int) -> int:
        a = self.acceptor(r, k)
        if not 0 <= a <= k:
            raise ValueError(f"request {r.id}: {a} drafts accepted of {k}")
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += k
        s.num_accepted_tokens += a
        per_pos = s.num_accepted_tokens_per_pos
        for i in range(a):
            per_pos[i] += 1
        if self.accepted is not None:
            self.accepted.setdefault(r.id, []).append(a)
        return a


def build_decoder(cfg: SpeculativeConfig) -> SpecDecoder:
    return SpecDecoder(cfg.num_speculative_tokens, build_acceptor(cfg), cfg.disable_by_batch_size)


# ---- summary -------------------------------------------------------------------------------------------------
def summary_inputs(decoders: Sequence[SpecDecoder], costs: Sequence[object], cfg: SpeculativeConfig) -> dict:
    """What a run's ``RunResult.spec_decode`` holds: the counters summed over replicas and the proposer's time."""
    total = SpecStats(cfg.num_speculative_tokens)
    for d in decoders:
        total.add(d.stats)
    draft_s = sum(float(getattr(c, "draft_seconds", 0.0)) for c in costs)
    return {"method": cfg.method, "num_speculative_tokens": cfg.num_speculative_tokens,
            **dataclasses.asdict(total), "draft_seconds": draft_s}


def summarize_spec(inputs: dict, busy_seconds: float) -> dict:
    """The summary's ``spec_decode`` section."""
    drafts = inputs["num_drafts"]
    dtok = inputs["num_draft_tokens"]
    acc = inputs["num_accepted_tokens"]
    nan = float("nan")
    return {
        "method": inputs["method"],
        "num_speculative_tokens": inputs["num_speculative_tokens"],
        "num_drafts": drafts,
        "num_draft_tokens": dtok,
        "num_accepted_tokens": acc,
        "num_accepted_tokens_per_pos": list(inputs["num_accepted_tokens_per_pos"]),
        "draft_acceptance_rate": acc / dtok if dtok else nan,
        "mean_acceptance_length": 1 + acc / drafts if drafts else nan,
        "per_position_acceptance_rate": [n / drafts if drafts else nan
                                         for n in inputs["num_accepted_tokens_per_pos"]],
        "draft_seconds": inputs["draft_seconds"],
        "draft_time_share": inputs["draft_seconds"] / busy_seconds if busy_seconds > 0 else nan,
    }


def openmetrics_lines(inputs: dict, labels: str, ts: str) -> list[str]:
    """vLLM v1's speculative decoding counters (``vllm:spec_decode_*``) as OpenMetrics lines: ``labels`` the
    sample's labels (model_name, engine), ``ts`` its timestamp suffix."""
    lines: list[str] = []
    for key, help_ in (("num_drafts", "Number of spec decoding drafts."),
                       ("num_draft_tokens", "Number of draft tokens."),
                       ("num_accepted_tokens", "Number of accepted tokens.")):
        name = f"vllm:spec_decode_{key}"
        lines += [f"# TYPE {name} counter", f"# HELP {name} {help_}",
                  f"{name}_total{{{labels}}} {int(inputs[key])}{ts}"]
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# TYPE {name} counter", f"# HELP {name} Accepted tokens per draft position."]
    lines += [f'{name}_total{{{labels},position="{i}"}} {int(n)}{ts}'
              for i, n in enumerate(inputs["num_accepted_tokens_per_pos"])]
    return lines


def write_measured(path: str | Path, accepted: dict[int, list[int]]) -> None:
    """Write an engine's accepted counts as a MeasuredAcceptance file (replayed draft by draft)."""
    Path(path).write_text(json.dumps({"accepted": {str(k): v for k, v in sorted(accepted.items())}}))
