"""docs/engines-and-hardware.md against the presets in code: every engine with its row, its aliases and its
attention kernels' share of the peak."""

from __future__ import annotations

import re
from pathlib import Path

from sim.engines.registry import EngineConfig, engines

DOC = (Path(__file__).resolve().parent.parent / "docs" / "engines-and-hardware.md").read_text(encoding="utf-8")
ENGINES = {name: e for name, e in engines().items() if name != "classic"}  # classic: no table row, no defaults


def _section(heading: str) -> str:
    return DOC.partition(heading)[2].partition("\n## ")[0]


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
