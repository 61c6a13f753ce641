"""docs/scenarios.md's "Every key" tables are the schema: every key of every section with its real default and the
values it takes (sim/config/key_reference.py writes them from the pydantic models); a key written there is
accepted, and a misspelt one is refused naming the key it meant."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from sim.config.key_reference import BEGIN, END, page_with_reference, reference, sections
from sim.config.scenario import parse_scenario
from sim.config.scenario_messages import closest_key
from sim.config.schema import ScenarioError

PAGE = Path(__file__).resolve().parent.parent / "docs" / "scenarios.md"


def _documented() -> dict[str, set[str]]:
    """The keys of each table of the page, by the model named in its title."""
    text = PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/scenarios.md has no key reference: python -m sim.config.key_reference"
    tables: dict[str, set[str]] = {}
    current = ""
    for line in text.partition(BEGIN)[2].partition(END)[0].splitlines():
        if (m := re.fullmatch(r"\*\*.*\((\w+)\)", line)) is not None:
            current = m.group(1)
            tables[current] = set()
        elif (m := re.match(r"\| `(\w+)` \|", line)) is not None:
            tables[current].add(m.group(1))
    return tables


def test_every_key_of_every_section_is_documented_and_every_documented_key_exists() -> None:
    documented = _documented()
    in_code = {model.__name__: set(model.model_fields) for model, _ in sections()}
    missing = sorted(f"{m}.{k}" for m, keys in in_code.items() for k in keys - documented.get(m, set()))
    extra = sorted(f"{m}.{k}" for m, keys in documented.items() for k in keys - in_code.get(m, set()))
    assert not missing and not extra, f"undocumented: {missing}; documented but not in the code: {extra}"


def test_the_reference_is_written_from_the_code_as_it_is_now() -> None:
    """Defaults, bounds and meanings too: run `python -m sim.config.key_reference --update` after changing a model."""
    text = PAGE.read_text(encoding="utf-8")
    assert page_with_reference(text) == text, "the key reference is stale: python -m sim.config.key_reference --update"
    assert text.count(BEGIN) == 1 and text.count(END) == 1


def test_a_table_states_the_real_default_and_bounds() -> None:
    ref = reference()
    assert "| `block_size` | integer (>= 1) | `16` | Tokens per KV block. |" in ref
    assert "| `gpu_memory_utilization` | number (> 0, <= 1) | `0.9` |" in ref
    assert "| `kv_cache` | a section (type: `paged`, `contiguous`) | `{type: paged}` |" in ref
    assert "| `reserve` | `max_model_len` \\| `request` | `max_model_len` |" in ref
    assert "| `workload` | a section | required |" in ref
    # a bound inside an optional type (Annotated[int, Field(ge=1)] | None), or on a list's items, was left out
    assert "| `max` | integer (>= 1, <= 1099511627776), or none | none | Upper clip in tokens;" in ref
    assert "| `max_num_seqs` | list of integer (>= 1) (length >= 1) | `[64, 256]` |" in ref


def test_every_section_has_a_meaning_for_each_key() -> None:
    blank = [line for line in reference().splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not blank, blank


def test_the_documented_example_is_accepted() -> None:
    text = PAGE.read_text(encoding="utf-8")
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    assert [v.name for v in parse_scenario(copy.deepcopy(example), source="doc").variants] == ["naive", "continuous"]
    bad = copy.deepcopy(example)
    bad["deployment"]["max_model_lenght"] = 4096
    with pytest.raises(ScenarioError, match=r"deployment\.max_model_lenght: unknown key; did you mean max_model_len\?"):
        parse_scenario(bad, source="doc")


def _slips(key: str) -> set[str]:
    half = len(key) // 2
    return {key[:-1], key[1:], key[:half] + key[half + 1:], key.replace("_", "", 1), key.upper()} - {key}


@pytest.mark.parametrize("model", [m for m, _ in sections()], ids=lambda m: m.__name__)
def test_a_misspelt_key_names_the_key_it_meant(model) -> None:
    """Each key of five letters or more, a letter dropped at its start, middle or end, an underscore dropped or
    written in capitals, leads back to itself among its section's keys (unless two keys slip to the same text:
    top_ is top_k's or top_p's)."""
    keys = sorted(model.model_fields)
    slips: dict[str, set[str]] = {}
    for key in (k for k in keys if len(k) >= 5):
        for wrong in _slips(key):
            slips.setdefault(wrong, set()).add(key)
    for wrong, meant in slips.items():
        if len(meant) == 1 and wrong not in keys:
            assert closest_key(wrong, keys) in meant, (model.__name__, wrong)


def test_every_sections_type_says_what_its_kind_is() -> None:
    """Before: the type key of 43 sections had no description in `servesim schema` (an editor's hover showed
    nothing) and the reference said of each only 'Which kind of section this is'."""
    from sim.config.schema import json_schema

    defs = json_schema()["$defs"]
    kinds = {name: d["properties"]["type"] for name, d in defs.items() if "type" in d.get("properties", {})}
    assert len(kinds) >= 43 and [name for name, t in kinds.items() if not t.get("description")] == []
    assert kinds["PoissonArrival"]["description"].startswith("Open loop, exponential inter-arrival gaps")
    assert kinds["PagedKV"]["description"].startswith("vLLM's paged KV cache")
    assert "Which kind of section this is" not in reference()
