"""Model and GPU names as published tables, benchmark files and model hubs write them, matched to servesim's presets.

A table says "meta-llama/Meta-Llama-3-8B-Instruct", "Llama 3.1 70B Instruct FP8" or "NVIDIA H100 80GB HBM3 (SXM)";
the presets are ``llama-3-8b`` and ``h100-sxm``. ``match_model`` and ``match_gpu`` strip what does not change the
shape or the chip (the organisation, "Meta-", "Instruct"/"chat"/"hf", a quantisation tag: the dtype is a column of
its own; a vendor word, a note in brackets) and return the preset's key, or None when no preset is that model or
chip. In a published table an A100 without its memory is read as the 80 GB SXM part, the one such tables ran on
(``--gpu a100`` is refused as ambiguous, see AMBIGUOUS_GPU_NAMES), and an H100 without its form factor the SXM one.
"""

from __future__ import annotations

import re
from pathlib import Path

from sim.hardware.gpu import GPU_PRESETS, GPUSpec, resolve_gpu
from sim.hardware.models import MODEL_PRESETS, ModelSpec, is_model_preset, resolve_model

# words a model name carries that do not change its shape (the weights' dtype is given apart)
_MODEL_SUFFIXES = ("instruct", "chat", "hf", "it", "base", "fp8", "kv", "dynamic", "awq", "gptq", "int4", "int8",
                   "w4a16", "w8a8", "bf16", "fp16")


def _key(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def match_model(text: str) -> str | None:
    """The model preset ``text`` names, or None."""
    name = _key(text.split("/")[-1])
    name = re.sub(r"\(.*?\)", "", name).strip("-")
    name = re.sub(r"^meta-", "", name)
    name = re.sub(r"^llama(\d)", r"llama-\1", name)  # llama3-8b, llama2-7b
    # strip a tag or a version from the end, one at a time, trying the name after each step
    tail = re.compile(rf"-({'|'.join(_MODEL_SUFFIXES)}|v\d+(\.\d+)*)$")
    while True:
        try:
            return ModelSpec.from_name(name).name
        except ValueError:
            stripped = tail.sub("", name)
            if stripped == name:
                return None
            name = stripped


_40GB = r"40(-?gb)?(?!\d)"  # 40 GB, not the 400 W of a power cap
# (pattern on the normalised name, preset): first match wins, the longer chip names first (h200 before h20)
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gh200", "gh200"), (r"gb200", "gb200"), (r"b200", "b200"), (r"h200", "h200"), (r"h800", "h800"),
    (r"h100.*nvl|h100.*94", "h100-nvl"), (r"h100.*pcie", "h100-pcie"), (r"h100", "h100-sxm"),
    (r"h20\b|h20-", "h20"),
    # 40 GB said as such ("400W" is a power cap); an 80 GB A100 or an H800 of any form factor is the SXM preset,
    # the only one of its memory
    # ("a100-40" too, where the hint said a100-80gb)
    (rf"a100.*{_40GB}.*pcie|a100.*pcie.*{_40GB}", "a100-40gb-pcie"), (rf"a100.*{_40GB}", "a100-40gb"),
    (r"a100", "a100-80gb"),
    (r"a800", "a800"), (r"a10g", "a10g"), (r"\ba10\b|^a10-|-a10-|-a10$", "a10"), (r"l40s", "l40s"),
    (r"l40\b|l40-", "l40"), (r"\bl20\b|^l20-|-l20-|-l20$", "l20"), (r"\bl4\b|-l4-|^l4", "l4"),
    (r"mi325x", "mi325x"), (r"mi300x", "mi300x"), (r"4090", "rtx-4090"), (r"\bt4\b|^t4-|-t4-|-t4$", "t4"),
)


def match_gpu(text: str) -> str | None:
    """The GPU preset ``text`` names, or None."""
    try:
        spec = GPUSpec.from_name(text)  # a preset's name or alias as it is
        return next(k for k, v in GPU_PRESETS.items() if v is spec)
    except (ValueError, StopIteration):
        pass
    name = _key(re.sub(r"\(.*?\)", "", text))
    name = re.sub(r"\b(nvidia|amd|instinct|tesla|geforce)-?", "", name)
    for pattern, preset in _GPU_PATTERNS:
        if re.search(pattern, name):
            return preset
    return None


def preset_hint(text: object, kind: str, said: str = "") -> str:
    """What to append to the error of a ``kind`` ("model" or "gpu") given as ``text`` that no preset or file is,
    when a preset is that model or chip: the scenario said "file not found: meta-llama/Llama-3.1-8B-Instruct" (the
    name a vLLM user serves, read as a config.json path) and "unknown GPU 'NVIDIA H100 80GB HBM3'" (nvidia-smi's).
    Nothing where the error ``said`` already asks "did you mean" that preset ('llama3-8b' was told twice) or gives the
    choices of an ambiguous name ('a100' was told a100-80gb beside them)."""
    if not isinstance(text, str):
        return ""
    preset = match_model(text) if kind == "model" else match_gpu(text)
    if preset is None or preset == text or f"did you mean {preset!r}" in said or "is ambiguous" in said:
        return ""
    hub = " (a Hugging Face model id is not downloaded)" if kind == "model" and "/" in text else ""
    return f"; the preset for {text!r} is {preset!r}{hub}"


def failed_name_hint(model: str, gpu: str, said: str = "") -> str:
    """``preset_hint`` for whichever of ``model`` and ``gpu`` resolves to no spec, "" when both do: servesim
    capacity's error may be about either or neither (``--tp 3``), and the model's hint took the place of the GPU's
    ('Llama-3.1-8B', a preset as given, named beside an unknown GPU)."""
    for text, kind, resolve in ((model, "model", resolve_model), (gpu, "gpu", resolve_gpu)):
        try:
            resolve(text)
        except (ValueError, KeyError, TypeError, OSError):
            return preset_hint(text, kind, said)
    return ""


# why calibrate's --model takes a preset only (the CLI's check and calibration.measure's, for library callers)
CALIBRATE_PRESETS_ONLY = ("calibrate --model takes a model preset: a profile names the model it measured by its "
                          "preset, which run, validate and the engine look up")


def config_path_refusal(text: str, why: str) -> str | None:
    """The error for a config.json path, or the folder holding one, given to a --model that takes a preset only
    (the engine's, calibrate's), else None: `engine run --model x/config.json` said "unknown model
    'x/config.json'; presets: ..." without a word on paths. ``why``: why a preset only, or what takes the path."""
    if is_model_preset(text) or not text or not (text.endswith(".json") or _exists(text)):
        return None
    return f"--model {text}: a config.json path, and {why}; presets: {', '.join(MODEL_PRESETS)}"


def _exists(text: str) -> bool:
    """Whether a file or folder is at ``text``; False for a name no file can have (300 letters: the OS's "File
    name too long" was a traceback from engine run and calibrate --model, not the unknown model's message)."""
    try:
        return Path(text).exists()
    except OSError:
        return False


def model_preset(text: str, why: str) -> ModelSpec:
    """The preset ``text`` names, for a --model that takes presets only (the engine's, calibrate's); else one
    ValueError starting "--model": a config path refused with ``why`` (``config_path_refusal``), an unknown name
    with the preset a typo or a Hugging Face id is (``preset_hint``)."""
    refused = config_path_refusal(text, why)
    if refused is not None:
        raise ValueError(refused)
    try:
        return ModelSpec.from_name(text)
    except ValueError as e:
        raise ValueError(f"--model: {e}{preset_hint(text, 'model', str(e))}") from None


__all__ = ["CALIBRATE_PRESETS_ONLY", "config_path_refusal", "failed_name_hint", "match_gpu", "match_model",
           "model_preset", "preset_hint"]
