"""Every key a scenario file may hold, as the Markdown reference at the end of docs/scenarios.md: one table per
section (each kind of a section with a ``type`` its own), each key with the values it takes, its default and its
meaning (the field's description, which carries the unit). Written from the pydantic models themselves, so the
reference is the schema; tests/test_scenario_keys.py fails when the page and the models part.

    python -m sim.config.key_reference           # print the reference
    python -m sim.config.key_reference --update  # rewrite docs/scenarios.md's section
"""

from __future__ import annotations

import json
import sys
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sim.config.input_model import kind_description
from sim.config.schema import Scenario
from sim.doc_sections import DOCS, update, with_section

BEGIN = "<!-- keys: written by `python -m sim.config.key_reference --update`; tests/test_scenario_keys.py checks it -->"
END = "<!-- end of keys -->"
PAGE = DOCS / "scenarios.md"

_NAMES = {int: "integer", float: "number", bool: "`true` or `false`", str: "text", Any: "any value"}
_BOUNDS = ((at.Ge, "ge", ">="), (at.Gt, "gt", ">"), (at.Le, "le", "<="), (at.Lt, "lt", "<"),
           (at.MinLen, "min_length", "length >="), (at.MaxLen, "max_length", "length <="))


def _bounds(metadata: list[Any]) -> str:
    # a bound inside an optional type (``Annotated[int, Field(ge=1)] | None``) sits in a FieldInfo of its own
    flat = [x for m in metadata for x in (m.metadata if isinstance(m, FieldInfo) else [m])]
    found = [f"{sign} {getattr(m, attr)}" for m in flat for kind, attr, sign in _BOUNDS if isinstance(m, kind)]
    return f" ({', '.join(found)})" if found else ""


def _allowed(tp: Any, metadata: list[Any] = ()) -> str:  # type: ignore[assignment]
    """The values an annotation takes, in words."""
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        return _allowed(inner, [*metadata, *extra])
    if origin in (Union, UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        kinds = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if kinds and len(kinds) == len(members):
            return _section(kinds)
        words = " or ".join(dict.fromkeys(_allowed(a, metadata) for a in members))
        return words + (", or none" if len(members) < len(get_args(tp)) else "")
    if origin is Literal:
        return " | ".join(f"`{json.dumps(v) if not isinstance(v, str) else v}`" for v in get_args(tp))
    if origin is list:
        item = _allowed(get_args(tp)[0]) if get_args(tp) else "values"
        return f"list of {item.replace('a section', 'sections', 1)}{_bounds(list(metadata))}"
    if origin is dict:
        key, value = get_args(tp) or (str, Any)
        return f"mapping of {_allowed(key)} to {_allowed(value)}{_bounds(list(metadata))}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _section([tp])
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp))) + _bounds(list(metadata))


def _kind(model: type[BaseModel]) -> str | None:
    tag = model.model_fields.get("type")
    return tag.default if tag is not None and isinstance(tag.default, str) else None


def _section(kinds: list[type[BaseModel]]) -> str:
    tags = [t for t in map(_kind, kinds) if t is not None]
    return "a section" + (f" (type: {', '.join(f'`{t}`' for t in tags)})" if tags else "")


def _value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, BaseModel):
        kind = _kind(type(v))
        return f"`{{type: {kind}}}`" if kind else "its defaults"
    return f"`{json.dumps(v) if not isinstance(v, str) or not v else v}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return _value(field.default)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def sections() -> list[tuple[type[BaseModel], list[str]]]:
    """Every model below ``Scenario`` with the dotted places where a file writes it (``[]``: a list's item),
    breadth first, each once."""
    places: dict[type[BaseModel], list[str]] = {Scenario: ["(top level)"]}
    level: list[tuple[type[BaseModel], str]] = [(Scenario, "")]
    while level:
        below = []
        for model, where in level:
            for name, field in model.model_fields.items():
                for sub, place in _below(field.annotation, f"{where}.{name}" if where else name):
                    if sub not in places:
                        places[sub] = []
                        below.append((sub, place))
                    if place not in places[sub]:
                        places[sub].append(place)
        level = below
    return list(places.items())


def _below(tp: Any, place: str) -> list[tuple[type[BaseModel], str]]:
    """The models an annotation holds, each with its place (a list's item: ``[]``; a mapping's value: ``.NAME``)."""
    origin = get_origin(tp)
    if origin is list:
        return [x for a in get_args(tp) for x in _below(a, place + "[]")]
    if origin is dict:
        return [x for a in get_args(tp)[1:] for x in _below(a, place + ".NAME")]
    if origin in (Union, UnionType, Annotated):
        return [x for a in get_args(tp) for x in _below(a, place)]
    return [(tp, place)] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def reference() -> str:
    """The tables, without the markers around them."""
    out = [""]
    for model, places in sections():
        kind = _kind(model)
        where = ", ".join(f"`{p}`" for p in places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
        out += [f"**{where}**" + (f", `type: {kind}`" if kind else "") + f" ({model.__name__})", "",
                "| key | values | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            annotation = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            out.append(f"| `{name}` | {_cell(_allowed(annotation))} | {_cell(_default(field))} | "
                       f"{_cell(field.description or (kind_description(model.__doc__) if name == 'type' else ''))} |")
        out.append("")
    return "\n".join(out)


def page_with_reference(text: str) -> str:
    """docs/scenarios.md's text with its reference section replaced by (or, missing, followed by) ``reference()``."""
    return with_section(text, BEGIN, END, reference())


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update(PAGE, BEGIN, END, reference())
    else:
        print(reference())
