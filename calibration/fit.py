"""Fitting the simulator's cost model to measured step times (torch-free).

The model is ``sim.costs.fitted.FittedCostModel``: a step's time is a non-negative combination of its shape's
aggregates, each a physical cost of the engine::

    time = step                        fixed per step: Python scheduling, input preparation, launches, sampling
         + token       * num_tokens     linear layers (weights x new tokens), embedding, RoPE, KV writes
         + decode_seq  * num_decode_seqs  per decode row: its metadata, its share of the batched decode attention
         + prefill_seq * (num_seqs - num_decode_seqs)  per prompt (chunk) row: metadata, its own attention call
         + attn_pair   * attn_pairs     causal query-key pairs: prefill attention FLOPs, chunk x cached context
         + kv_read_token * kv_read_tokens  KV tokens read: the memory-bound side of attention
         + swap_block  * swap_blocks    KV blocks copied between device and host

Coefficients come from non-negative least squares (``scipy.optimize.nnls``) on relative errors (each sample
weighted by 1 / its predicted time, so a 1 ms decode step counts as much as a 100 ms prefill: first by 1 / its
measured time, then reweighted by the prediction, ``FIT_BIAS``), with the swap cost measured
on its own. Held-out error: every script of the grid is left out in turn, the model is fitted on the others and
asked to predict the steps it never saw; the errors are reported per shape class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from sim.costs.costmodel import StepShape
from sim.costs.fitted import COEFFICIENT_NAMES, PROFILE_SCHEMA_VERSION, FittedCostModel

# the columns the fit solves for, in the order of the design matrix (swap_block is measured separately)
# (``seq`` is left at 0: every row is either a decode row or a prompt row, so ``seq`` would be the sum of the two
# columns below and the fit would not be unique)
FIT_TERMS: tuple[str, ...] = ("step", "token", "decode_seq", "prefill_seq", "attn_pair", "kv_read_token",
                              "decode_pad_token")
CLASSES: tuple[str, ...] = ("decode", "prefill", "mixed", "padded", "serving")


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured step: its shape (the core's ``StepShape`` aggregates), its median duration over the repeats,
    the forward pass's share of it and the spread of the repeats (interquartile range / median)."""

    script: str  # the grid script it comes from (the unit held out together)
    kind: str  # shape class of the script: decode | prefill | mixed | padded
    index: int  # step number within the script
    num_seqs: int
    num_tokens: int
    num_decode_seqs: int
    kv_read_tokens: int
    attn_pairs: int
    num_padding_tokens: int
    swap_blocks: int
    duration: float  # s, median over repeats
    forward: float = 0.0  # s, median time in the model's forward pass
    spread: float = 0.0  # (p75 - p25) / median of the repeats
    # tokens attended by the longest decode row (its context + 1; 0: no decodes, or not recorded): the engine's
    # batched decode attention pads every decode row to it
    max_decode_len: int = 0

    @property
    def shape(self) -> StepShape:
        return StepShape(self.num_seqs, self.num_tokens, self.num_decode_seqs, self.kv_read_tokens, self.attn_pairs,
                         self.num_padding_tokens, self.swap_blocks, max_decode_len=self.max_decode_len)

    @property
    def step_class(self) -> str:
        """The class of the step itself (a decode script's first step is a prefill of every prompt)."""
        if self.kind in ("padded", "serving"):
            return self.kind
        if self.num_decode_seqs == self.num_seqs:
            return "decode"
        return "prefill" if self.num_decode_seqs == 0 else "mixed"


def samples_to_columns(samples: Sequence[Sample]) -> dict[str, np.ndarray]:
    """The samples as numpy columns (one per field)."""
    cols: dict[str, list[Any]] = {k: [] for k in Sample.__slots__}
    for s in samples:
        for k in cols:
            cols[k].append(getattr(s, k))
    return {k: np.asarray(v) for k, v in cols.items()}


def token_knots(samples: Sequence[Sample], min_samples: int = 3) -> tuple[int, ...]:
    """Where the token curve bends: 1, then every power of two that at least ``min_samples`` steps compute
    exactly (a knot between measured row counts would be guessed, not measured)."""
    counts: dict[int, int] = {}
    for s in samples:
        counts[s.num_tokens] = counts.get(s.num_tokens, 0) + 1
    top = max(counts, default=1)
    return (1,) + tuple(k for k in (2**i for i in range(1, max(top, 2).bit_length() + 1))
                        if counts.get(k, 0) >= min_samples)


def design_matrix(samples: Sequence[Sample], knots: Sequence[int] = ()) -> np.ndarray:
    """Rows: samples; columns: ``FIT_TERMS`` (the constant column is 1), then one column per knot after the
    first: the hat function of the token curve there (``np.interp`` of a unit value, flat past the last)."""
    c = samples_to_columns(samples)
    n = len(samples)
    cols = [np.ones(n), c["num_tokens"], c["num_decode_seqs"], c["num_seqs"] - c["num_decode_seqs"],
            c["attn_pairs"], c["kv_read_tokens"], padded_decode_tokens(c)]
    if len(knots) > 1:
        tok = c["num_tokens"].astype(np.float64)
        for i in range(1, len(knots)):
            cols.append(np.interp(tok, knots, np.eye(len(knots))[i]))
    return np.column_stack(cols).astype(np.float64)


def padded_decode_tokens(c: dict[str, np.ndarray]) -> np.ndarray:
    """Decode rows x the longest decode context: the tokens the engine's batched decode attention gathers. An
    unrecorded longest context (0) is taken as the rows' mean, as ``FittedCostModel.step_time`` takes it."""
    nd, m = c["num_decode_seqs"].astype(np.float64), c["max_decode_len"].astype(np.float64)
    mean = c["kv_read_tokens"] * nd / np.maximum(c["num_seqs"], 1)
    return np.where(m > 0, nd * m, mean)


def nnls_fit(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``argmin ||w * (x @ b - y)||`` over ``b >= 0``, with the columns scaled to unit norm for conditioning (a
    per-pair coefficient is 10 orders of magnitude below the per-step one). All-zero columns get 0."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    xw = x * w[:, None]
    norms = np.linalg.norm(xw, axis=0)
    live = norms > 0
    b = np.zeros(x.shape[1])
    if live.any():
        sol, _ = nnls(xw[:, live] / norms[live], y * w, maxiter=50 * x.shape[1])
        b[live] = sol / norms[live]
    return b


TOKEN_CURVE_KEY = "token_curve"  # in a fit's result: [[tokens, extra seconds], ...] (see FittedCostModel)


# FIT_BIAS: weighting each sample's error by 1 / its measured duration gives a slow (noisy-high) sample less weight
# than a fast one, so the fit lands below the mean step time: on llama-57m's shipped profile the serving steps'
# measured sum was 1.042x the prediction, decode grid steps 1.120x (benchmarks/bench_step_bias.py). The serving
# loop's metrics add step times up, so the fit must follow the mean: the weights are refitted from the prediction
# (iteratively reweighted least squares; one round converges on the shipped samples, two are taken).
RELATIVE_ROUNDS = 2


def fit_coefficients(samples: Sequence[Sample], curve: bool = False) -> dict[str, Any]:
    """NNLS on relative error (relative to the prediction: ``FIT_BIAS``): the coefficients of ``FIT_TERMS``
    (seconds per unit); with ``curve``, also the token curve at ``token_knots(samples)`` under ``TOKEN_CURVE_KEY``."""
    knots = token_knots(samples) if curve else ()
    if len(samples) < len(FIT_TERMS) + max(len(knots) - 1, 0):
        raise ValueError(f"{len(samples)} samples cannot fit {len(FIT_TERMS)} terms")
    x = design_matrix(samples, knots)
    y = np.array([s.duration for s in samples], dtype=np.float64)
    if not (y > 0).all():
        raise ValueError("every sample needs a positive duration")
    b = nnls_fit(x, y, 1.0 / y)
    for _ in range(RELATIVE_ROUNDS):  # relative to the prediction, not to the noisy measurement (FIT_BIAS)
        pred = x @ b
        b = nnls_fit(x, y, 1.0 / np.where(pred > 0, pred, y))
    out: dict[str, Any] = dict(zip(FIT_TERMS, (float(v) for v in b), strict=False))
    if len(knots) > 1:
        weights = b[len(FIT_TERMS):]
        out[TOKEN_CURVE_KEY] = [[1.0, 0.0]] + [[float(k), float(v)] for k, v in zip(knots[1:], weights, strict=True)]
    return out


def predict(coefficients: dict[str, Any], samples: Sequence[Sample]) -> np.ndarray:
    curve = coefficients.get(TOKEN_CURVE_KEY) or []
    knots = [p[0] for p in curve]
    beta = [coefficients.get(k, 0.0) for k in FIT_TERMS] + [p[1] for p in curve[1:]]
    return design_matrix(samples, knots) @ np.array(beta, dtype=np.float64)


def _error_stats(rel: np.ndarray) -> dict[str, float | int]:
    a = np.abs(rel)
    if a.size == 0:
        return {"n": 0, "median_abs": float("nan"), "p90_abs": float("nan"), "max_abs": float("nan"),
                "mean_signed": float("nan")}
    return {"n": int(a.size), "median_abs": float(np.median(a)), "p90_abs": float(np.percentile(a, 90)),
            "max_abs": float(a.max()), "mean_signed": float(np.mean(rel))}


def heldout_errors(samples: Sequence[Sample], curve: bool = False
                   ) -> tuple[dict[str, dict[str, float | int]], np.ndarray]:
    """Leave-one-script-out: for each script, fit on every other script and predict its steps. Returns the
    relative error statistics per step class (plus ``"all"``) and the held-out prediction of every sample."""
    scripts = sorted({s.script for s in samples})
    pred = np.full(len(samples), np.nan)
    idx = {name: [i for i, s in enumerate(samples) if s.script == name] for name in scripts}
    for name in scripts:
        train = [s for s in samples if s.script != name]
        coef = fit_coefficients(train, curve)
        test = idx[name]
        pred[test] = predict(coef, [samples[i] for i in test])
    y = np.array([s.duration for s in samples])
    rel = (pred - y) / y
    classes = np.array([s.step_class for s in samples])
    out = {c: _error_stats(rel[classes == c]) for c in CLASSES if (classes == c).any()}
    out["all"] = _error_stats(rel)
    return out, pred


def fit_errors(coefficients: dict[str, Any], samples: Sequence[Sample]) -> dict[str, dict[str, float | int]]:
    """In-sample relative errors of a fit, per step class (and ``"all"``)."""
    y = np.array([s.duration for s in samples])
    rel = (predict(coefficients, samples) - y) / y
    classes = np.array([s.step_class for s in samples])
    out = {c: _error_stats(rel[classes == c]) for c in CLASSES if (classes == c).any()}
    out["all"] = _error_stats(rel)
    return out


def host_overheads(samples: Sequence[Sample]) -> dict[str, float]:
    """The engine's host-side cost per step (step time minus forward pass: the core's bookkeeping, the policy,
    input preparation, sampling), fitted as a fixed cost per step plus a cost per row and per token. Only the
    grid's steps time the forward pass; serving steps (``calibration/serving.py``) record ``forward = 0``, and
    counting them would read their whole step as host time. Empty when no sample timed its forward pass."""
    samples = [s for s in samples if s.forward > 0]
    if not samples:
        return {}
    c = samples_to_columns(samples)
    x = np.column_stack([np.ones(len(samples)), c["num_tokens"], c["num_seqs"]]).astype(np.float64)
    y = np.array([max(s.duration - s.forward, 0.0) for s in samples])
    d = np.array([s.duration for s in samples])
    b = nnls_fit(x, y, 1.0 / d)
    return {"step": float(b[0]), "token": float(b[1]), "seq": float(b[2]),
            "host_fraction_median": float(np.median(y / d))}


def build_profile(model: str, device: str, samples: Sequence[Sample], *, swap_block: float = 0.0,
                  wake_curve: Sequence[tuple[float, float]] = (),
                  num_gpu_blocks: int | None = None, peak_flops: float = 0.0,
                  provenance: dict[str, Any] | None = None, keep_samples: bool = True,
                  token_curve: bool = True) -> dict[str, Any]:
    """Fit and assemble a calibration profile (the ``sim.costs.fitted.CalibrationProfile`` dict). ``token_curve``:
    fit the linear layers' cost in stairs of the row count too (``token_knots``)."""
    coef = fit_coefficients(samples, token_curve)
    heldout, _ = heldout_errors(samples, token_curve)
    coefficients = {name: 0.0 for name in COEFFICIENT_NAMES}
    curve = coef.pop(TOKEN_CURVE_KEY, [])
    coefficients.update(coef)
    coefficients["swap_block"] = float(swap_block)
    cols = samples_to_columns(samples)
    profile: dict[str, Any] = {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "model": model,
        "device": device,
        "coefficients": coefficients,
        "peak_flops": float(peak_flops),
        "num_gpu_blocks": num_gpu_blocks,
        "overheads": host_overheads(samples),
        "fit": {
            "method": "scipy.optimize.nnls on error relative to the prediction (reweighted); swap_block and the "
                      "wake-up curve measured separately",
            "num_samples": len(samples),
            "num_scripts": len({s.script for s in samples}),
            "heldout": heldout,
            "insample": fit_errors({**coef, TOKEN_CURVE_KEY: curve}, samples),
            "median_repeat_spread": float(np.median(cols["spread"])) if len(samples) else 0.0,
        },
        "provenance": dict(provenance or {}),
        "samples": [asdict(s) for s in samples] if keep_samples else [],
        "wake_curve": [[float(a), float(b)] for a, b in wake_curve],
        "token_curve": curve,
    }
    FittedCostModel.from_dict(profile)  # the profile must load
    return profile


def samples_from_profile(profile: dict[str, Any]) -> list[Sample]:
    return [Sample(**s) for s in profile.get("samples", [])]


def profile_coefficients(profile: dict[str, Any]) -> dict[str, Any]:
    """A profile's coefficients with its token curve, as ``predict`` and ``fit_errors`` take them."""
    return {**profile["coefficients"], TOKEN_CURVE_KEY: profile.get("token_curve", [])}


def format_errors(errors: dict[str, dict[str, Any]], title: str = "held-out error") -> str:
    """A small table: per class, samples and |relative error| median, p90 and max."""
    lines = [f"{title:<16}{'steps':>7}{'median':>9}{'p90':>9}{'max':>9}{'bias':>9}"]
    for cls, e in errors.items():
        if not e.get("n"):
            continue
        lines.append(f"{cls:<16}{e['n']:>7}{100 * e['median_abs']:>8.1f}%{100 * e['p90_abs']:>8.1f}%"
                     f"{100 * e['max_abs']:>8.1f}%{100 * e['mean_signed']:>+8.1f}%")
    return "\n".join(lines)


def summarize_coefficients(coefficients: dict[str, float]) -> Iterable[str]:
    units = {"step": ("ms/step", 1e3), "token": ("us/token", 1e6), "seq": ("us/row", 1e6),
             "decode_seq": ("us/decode row", 1e6), "prefill_seq": ("us/prompt row", 1e6), "attn_pair": ("ns/pair", 1e9),
             "kv_read_token": ("ns/KV token", 1e9), "decode_pad_token": ("ns/padded decode token", 1e9),
             "swap_block": ("us/block", 1e6)}
    for k, (unit, scale) in units.items():
        yield f"{k:<14}{coefficients.get(k, 0.0) * scale:>12.4g} {unit}"
