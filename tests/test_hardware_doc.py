"""docs/engines-and-hardware.md against the presets in code: every engine with its row, its aliases and its
attention kernels' share of the peak; the model and GPU tables as the presets write them, with every alias."""

from __future__ import annotations

import re
from pathlib import Path

from sim.engines.registry import EngineConfig, engines

DOC = (Path(__file__).resolve().parent.parent / "docs" / "engines-and-hardware.md").read_text(encoding="utf-8")
ENGINES = {name: e for name, e in engines().items() if name != "classic"}  # classic: no table row, no defaults


def _section(heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    return re.split(r"\n#{2,3} ", DOC.partition(heading)[2])[0]


def test_every_engine_has_a_row_and_every_alias_is_named() -> None:
    """tensorrt-llm's alias tensorrtllm was taken and nowhere written."""
    text = _section("## Serving engines")
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`", text, re.M))
    assert rows == set(ENGINES), rows ^ set(ENGINES)
    aliases = {a for e in ENGINES.values() for a in e.aliases}
    assert not [a for a in sorted(aliases) if f"`{a}`" not in text], aliases


def test_each_engines_attention_share_is_the_one_written() -> None:
    """tgi sets FlashAttention-2's shares (0.35 on Hopper, 0.50 on Ampere) where the page said only the vLLM presets
    set any, and lmdeploy's default went unsaid."""
    paragraph = next(p for p in _section("## Serving engines").split("\n\n") if "attention_efficiency" in p)
    sentences = re.split(r"(?<=\.) (?=[A-Z`])", " ".join(paragraph.split()))
    for name, engine in ENGINES.items():
        cfg = EngineConfig(name=name)
        hopper, ampere = engine.attention_efficiency(cfg, "hopper"), engine.attention_efficiency(cfg, "ampere")
        said = [s for s in sentences if f"`{name}`" in s]
        assert said, f"{name}: its attention share is not written"
        if hopper is None and ampere is None:
            assert any("the cost model's default" in s for s in said), (name, said)
        else:
            assert any(f"{hopper:.2f} on Hopper" in s and f"{ampere:.2f} on Ampere" in s for s in said), (name, said)


def test_the_model_and_gpu_tables_are_written_from_the_presets_as_they_are_now() -> None:
    """The page named the later GPU presets in a sentence, without figures, aliases or sources, and the first six
    (h200, h100-sxm, a100-80gb, a100-40gb, l40s, l4) and every alias (h100, a100, h200-sxm, 4090, h100-94gb, ...)
    not at all; its model list left out nine presets (tiny, llama-57m, smollm2-135m, llama-3.2-1b, llama-3.1-8b,
    llama-3.1-70b, mistral-7b, qwen2.5-7b, opt-13b) and every alias but R1's."""
    from sim.doc_sections import with_section
    from sim.hardware.preset_tables import BEGIN, END, MODELS_BEGIN, MODELS_END, models_table, table

    written = with_section(with_section(DOC, BEGIN, END, table()), MODELS_BEGIN, MODELS_END, models_table())
    assert written == DOC, "the preset tables are stale: python -m sim.hardware.preset_tables --update"


def test_every_model_preset_and_alias_is_in_its_row() -> None:
    from sim.hardware.models import MODEL_PRESETS, ModelSpec
    from sim.hardware.presets.models import BASE_MODEL_ALIASES, MORE_MODEL_ALIASES

    for alias, name in (BASE_MODEL_ALIASES | MORE_MODEL_ALIASES).items():
        assert ModelSpec.from_name(alias.upper()) == ModelSpec.from_name(name), alias
        assert f"`{alias}`" in DOC.partition(f"| `{name}` | ")[2].partition("|")[0], alias
    assert all(f"| `{name}` | " in DOC for name in MODEL_PRESETS)


def test_every_gpu_preset_has_a_source_and_its_aliases_resolve_to_it() -> None:
    from sim.hardware.gpu import GPU_PRESETS, GPUSpec
    from sim.hardware.presets.gpus import BASE_GPU_ALIASES, GPU_SOURCES, MORE_GPU_ALIASES

    assert set(GPU_SOURCES) == set(GPU_PRESETS), set(GPU_SOURCES) ^ set(GPU_PRESETS)
    for alias, name in (BASE_GPU_ALIASES | MORE_GPU_ALIASES).items():
        assert GPUSpec.from_name(alias.upper().replace("-", "_")) is GPU_PRESETS[name], alias
        assert f"| `{name}` | " in DOC and f"`{alias}`" in DOC.partition(f"| `{name}` | ")[2].partition("|")[0], alias
