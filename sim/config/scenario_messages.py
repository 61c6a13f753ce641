"""Error messages of scenario loading: a pydantic validation error or a YAML error as lines that name the key of
the file and say what it should hold, with the offending value shortened (aliases can expand a value to millions of
items: it is never rendered whole)."""

from __future__ import annotations

import difflib
import re
import reprlib
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

_MAX_PROBLEMS = 5  # validation problems listed in one message


def _clean_loc(loc: tuple[Any, ...], raw: Any, keep_last: bool = False) -> str:
    """A pydantic error location as the dotted path of the scenario file.

    pydantic inserts the member a union tried (a ``type`` tag such as ``poisson``, or a type name such as ``str``)
    into the location; those are not keys of the file. Walking the input keeps only the parts that are keys (or
    list indices) there, plus a final part that is absent (a missing or unknown key)."""
    parts: list[str] = []
    node = raw
    for i, p in enumerate(loc):
        last = i == len(loc) - 1
        if not last and isinstance(node, dict) and p in _UNION_TAGS and node.get("type") == p:
            continue  # the member label of a tagged union, also a key there (a trace arrival has a ``trace`` key)
        if isinstance(node, dict) and p in node:
            node = node[p]
            parts.append(str(p))
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
            parts.append(str(p))
        elif last and (keep_last or not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p or p in _TYPE_LABELS))):
            parts.append(str(p))
        # else: a union member label: not part of the file
    return ".".join(parts)


_NAME_ERRORS = {"literal_error", "string_type", "enum"}  # a union's name member refusing a mapping
_TYPE_LABELS = {"str", "int", "float", "bool", "none", "list", "dict", "tuple"}
_UNION_TAGS = {
    "analytic", "fitted", "paged", "contiguous", "static", "continuous", "poisson", "gamma", "constant",
    "all_at_once", "closed_loop", "trace", "fixed", "uniform", "normal", "lognormal", "exponential", "empirical",
}


_REPR = reprlib.Repr()  # Python 3.11 takes no keyword arguments here
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 4, 4, 50, 50, 50


def short(value: Any) -> str:
    # reprlib: a value that aliases expand to millions of items is not rendered whole
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {  # pydantic error type -> what the file should hold there
    "model_attributes_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "none_required": "null",
}


def _reason(e: ErrorDetails) -> str:
    kind = e["type"]
    if kind in _EXPECTED:
        return "expected " + _EXPECTED[kind]
    if kind == "union_tag_invalid":  # the closest kind first, as a misspelt key gets it
        tag, expected = str(e["ctx"]["tag"]), str(e["ctx"]["expected_tags"])
        close = closest_keys(tag, re.findall(r"'([^']*)'", expected))
        return f"unknown type {tag}; {f'did you mean {either(close)}? ' if close else ''}expected one of {expected}"
    msg = e["msg"].removeprefix("Value error, ")
    return "must be " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else msg


def _member_types(annotation: Any) -> list[Any]:
    """The types a value of this annotation can hold, with Annotated, Optional and unions unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _member_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(annotation) for t in _member_types(a)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _models_at(model: type[BaseModel], path: tuple[Any, ...], kind: bool = False) -> list[type[BaseModel]]:
    """The models that can stand at ``path`` below ``model``. A path element that names no field (a tagged
    union's tag, as pydantic puts it in an error's location) is stepped over; with ``kind``, it keeps only the
    tagged kind (a continuous policy's model, not a custom one's)."""
    current: list[Any] = [model]
    for part in path:
        nxt: list[Any] = []
        for t in current:
            if isinstance(part, int):  # an item of a list or tuple field
                nxt += [m for a in typing.get_args(t) for m in _member_types(a)]
            elif _is_model(t) and part in t.model_fields:
                nxt += _member_types(t.model_fields[part].annotation)
        if not nxt and not isinstance(part, int):
            tagged = [t for t in current if _is_model(t) and "type" in t.model_fields
                      and typing.get_args(t.model_fields["type"].annotation)[:1] == (part,)]
            current = tagged if kind and tagged else current
            continue
        current = nxt
    return [t for t in current if _is_model(t)]


def _acronym(name: str) -> str:
    return "".join(w[0] for w in name.split("_") if w)


def closest_key(unknown: str, known: list[str]) -> str | None:
    """The known key a misspelt or abbreviated one most likely meant: ``tp`` -> ``tensor_parallel_size`` (the
    initials of its words, as vLLM's users abbreviate them), ``max_num_seq`` -> ``max_num_seqs`` (spelling). The
    first in ``known``'s order of several equally close; a hint names them all (``closest_keys``)."""
    keys = closest_keys(unknown, known)
    return keys[0] if keys else None


def either(keys: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: equally close keys as a hint names them."""
    return " or ".join(filter(None, (", ".join(keys[:-1]), keys[-1])))


def closest_keys(unknown: str, known: list[str]) -> list[str]:
    """Every known key as close to ``unknown`` as ``closest_key``'s, in ``known``'s order: ``top_`` is as close to
    ``top_k`` as to ``top_p``, and naming one of them (difflib's pick on a tie, the larger string) was a guess."""
    key = unknown.lower()
    words = key.split("_")
    for rule in (
        # tp; only names of three words or more are shortened to initials (top_p, a short name, is not "tp")
        lambda k: len(key) >= 2 and "_" not in key and k.count("_") >= 2 and _acronym(k).startswith(key),
        lambda k: len(k.split("_")) == len(words) and all(  # gpu_mem_util
            w and kw.startswith(w) for w, kw in zip(words, k.split("_"), strict=True)
        ),
    ):
        hits = sorted((k for k in known if rule(k)), key=len)
        # the shortest when several share the initials: tensor_parallel_size before the plan's _sizes
        if hits and (len(hits) == 1 or len(hits[0]) < len(hits[1])):
            return hits[:1]
    ratio = {k: difflib.SequenceMatcher(None, k, key).ratio() for k in known}
    best = max(ratio.values(), default=0.0)
    return [k for k in known if ratio[k] == best] if best >= 0.75 else []


def _schema_keys(model: type[BaseModel], item: str = "") -> dict[str, str]:
    """Every key of the schema below ``model``, each with its shallowest dotted place (breadth first): depth first,
    ``replicas`` was placed under ``variants.cluster`` (a list's item, where --set needs an index), the top-level
    ``cluster`` section's model being already seen there. ``item``: written after a list's name in a place (".0",
    the first item, for a --set key: ``variants.0.disaggregation``)."""
    keys: dict[str, str] = {}
    seen: set[type] = {model}
    level: list[tuple[type[BaseModel], str]] = [(model, "")]
    while level:
        below: list[tuple[type[BaseModel], str]] = []
        for m, where in level:
            for name, field in m.model_fields.items():
                keys.setdefault(name, where)
                for t in _member_types(field.annotation):
                    place = (f"{where}.{name}" if where else name) + (item if typing.get_origin(t) is list else "")
                    for sub in [t, *(a for a in typing.get_args(t) for a in _member_types(a))]:
                        if _is_model(sub) and sub not in seen:
                            seen.add(sub)
                            below.append((sub, place))
        level = below
    return keys


def all_keys(model: type[BaseModel]) -> list[str]:
    """Every key name of the schema below ``model``."""
    return list(_schema_keys(model))


def key_section(model: type[BaseModel], name: str) -> str | None:
    """The dotted place of the section below ``model`` that has the key ``name`` itself, the shallowest ("" for
    ``model``'s own keys; ``policy`` for ``max_num_seqs``), or None where no section has it."""
    return _schema_keys(model, item=".0").get(name)


# Keys users bring from `vllm bench serve` and `vllm serve` (their options' names), which no spelling rule leads to
# servesim's key:
# unknown key -> (servesim's key, where the other name comes from)
OTHER_NAMES: dict[str, tuple[str, str]] = {
    "concurrency": ("num_users", "vllm bench's --max-concurrency"),
    "max_concurrency": ("num_users", "vllm bench's --max-concurrency"),
    "num_prompts": ("num_requests", "vllm bench's --num-prompts"),
    "request_rate": ("rate", "vllm bench's --request-rate"),
    "burstiness": ("cv", "vllm bench's --burstiness B, the gaps' gamma shape: cv = 1/sqrt(B)"),
    # vLLM's engine arguments whose servesim key is named otherwise: deployment.dtype was told "did you mean
    # deployment.kv_dtype?", the KV cache's dtype, where vLLM's --dtype is the weights'
    "dtype": ("weight_dtype", "vLLM's --dtype"),
    "quantization": ("weight_dtype", "vLLM's --quantization"),
    "kv_cache_dtype": ("kv_dtype", "vLLM's --kv-cache-dtype"),
}


# numpy's lognormal(mu, sigma) in a length distribution, whose mean and std are the length's own; elsewhere
# (policy.predictor) sigma is a key
_LENGTH_NAMES = {
    "mu": ("mean", "the length's mean in tokens, where numpy's lognormal mu is of its log"),
    "sigma": ("std", "the length's standard deviation in tokens, where numpy's lognormal sigma is of its log"),
}


def key_place(model: type[BaseModel], name: str) -> str | None:
    """The dotted place of the schema key ``name`` most likely means (``model`` -> ``deployment.model``, ``tp`` ->
    ``deployment.tensor_parallel_size``), for a command-line option that is a scenario key; None when none is
    close."""
    everywhere = _schema_keys(model, item=".0")
    key = name if name in everywhere else closest_key(name, sorted(everywhere))
    if key is None:
        return None
    return f"{everywhere[key]}.{key}" if everywhere[key] else key


def unknown_key_hint(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """``; did you mean ...?`` for an unknown key at ``loc``: a key of the same section first, else one from
    elsewhere in the schema with the section it belongs to; empty when nothing is close."""
    if model is None or not loc or not isinstance(loc[-1], str):
        return ""
    models = _models_at(model, tuple(loc[:-1]))
    here = sorted({k for m in models for k in m.model_fields})
    own = _models_at(model, tuple(loc[:-1]), kind=True)  # the kind written, where the section is a tagged union
    other, source = OTHER_NAMES.get(loc[-1].lower(), ("", ""))
    if other in here:
        return f"; did you mean {other} ({source})?"
    # not sent to policy.predictor's sigma, nor to a mean the kind written lacks ({type: fixed, mu: 3})
    if (near := _LENGTH_NAMES.get(loc[-1].lower())) and any(near[0] in m.model_fields for m in own):
        return f"; did you mean {near[0]} ({near[1]})?"
    if other:
        where = _schema_keys(model).get(other)
        if where is not None:
            return f"; did you mean {other} ({source}; a key of {where or 'the top level'})?"
    close = closest_keys(loc[-1], here)
    best = close[0] if close else None
    # a user's class: its own parameter written beside cls, where the constructor never sees it
    to_args = (f"your class's constructor arguments go under args: {{args: {{{loc[-1]}: ...}}}}"
               if any({"cls", "args"} <= m.model_fields.keys() for m in own) else "")
    if best is None and to_args:
        return f"; {to_args}"
    if best == loc[-1]:  # the section's other kinds have the key, this kind not (a custom policy's chunking)
        kind = f" {loc[-2]!r}" if len(loc) > 1 and isinstance(loc[-2], str) else ""
        # QueuePolicy's constructor takes enable_chunked_prefill: the message left out where it goes
        return f"; other kinds of this section have it, the kind{kind} not" + (f" ({to_args})" if to_args else "")
    if best is not None:
        return f"; did you mean {either(close)}?"
    everywhere = _schema_keys(model)
    close = [k + (f" (a key of {everywhere[k]})" if everywhere[k] else "")
             for k in closest_keys(loc[-1], sorted(everywhere))]
    if close:
        return f"; did you mean {either(close)}?"
    # nothing close: what the section takes (slos.ttft_p99 said "unknown key" alone)
    keys = sorted({k for m in own for k in m.model_fields})
    return f"; expected one of {', '.join(keys)}" if 0 < len(keys) <= _KEYS_LISTED else ""


_KEYS_LISTED = 12  # an unknown key with no close one lists the section's keys when it has at most this many


def _same_in_variants(found: list[tuple[str, str]], raw: Any) -> list[tuple[str, str]]:
    """One (key, reason) for a mistake repeated in several variants, where the first is: two variants with the same
    bad pool value gave two lines that read as two problems. The key names every variant it is in."""
    def split(loc: str) -> tuple[str, int | None]:  # the key within a variant and the variant's index
        head, _, rest = loc.partition(".")
        index, _, key = rest.partition(".")
        return (key, int(index)) if head == "variants" and index.isdigit() and key else (loc, None)

    at: dict[tuple[str, str], list[int]] = {}
    for loc, reason in found:
        key, i = split(loc)
        if i is not None:
            at.setdefault((key, reason), []).append(i)
    variants = raw.get("variants") if isinstance(raw, dict) else None
    names = [v.get("name") if isinstance(v, dict) else None for v in variants or []]
    # the same mistake at the top level too (`serve --policy fcfss`, a swept cluster.router set in the top-level
    # section and in the variants'): one line for the top-level key naming the variants, where two said it twice
    top = {(loc, reason) for loc, reason in found if split(loc)[1] is None}
    merged: list[tuple[str, str]] = []
    for loc, reason in found:
        key, i = split(loc)
        idx = at.get((key, reason), []) if i is not None else []
        if i is None and (loc, reason) in at:
            merged.append((f"{loc} (and in {_variants_text(at[(loc, reason)], names)})", reason))
        elif i is not None and (key, reason) in top:
            continue
        elif len(idx) < 2:
            merged.append((loc, reason))
        elif i == idx[0]:
            merged.append((f"{_variants_text(idx, names)}: {key}", reason))
    return merged


def digits_of_size(text: object) -> str | None:
    """``4096 or 4000`` for a size written with a k or m (``4k``, ``32K``, ``1m``; vLLM's --max-model-len takes
    them, with 1000 for k and 1024 for K), which servesim reads as digits only; None for any other value. Which k
    is meant is not guessed: the capacity table's headings are of 1024."""
    size = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM])", text.strip()) if isinstance(text, str) else None
    if size is None:
        return None
    n, binary = float(size.group(1)), 1 << (10 if size.group(2) in "kK" else 20)
    return f"{int(n * binary)} or {int(n * 1000 ** (1 if binary == 1024 else 2))}"


def _kind_written_bare(model: type[BaseModel] | None, loc: tuple[Any, ...], value: Any) -> str:
    """``: write {type: fcfs}`` for a section given as its kind's bare name (``policy: fcfs``, as a tournament spec
    and ``cluster.router`` take it), as a user's ``file.py:Class``, or as a number where a kind ``fixed`` takes it
    (``prompt_len: 800``); "" otherwise."""
    if model is None or not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return ""
    models = _models_at(model, loc)
    kinds = {typing.get_args(m.model_fields["type"].annotation)[:1]: m for m in models if "type" in m.model_fields}
    if not isinstance(value, str):  # a length or a think time written as its number: the fixed kind holds it
        fixed = kinds.get(("fixed",))
        if fixed is None or "value" not in fixed.model_fields:
            return ""
        try:  # only a number the fixed kind takes (prompt_len: -5 was told to write a length refused in turn)
            fixed.model_validate({"type": "fixed", "value": value})
        except ValueError:
            return ""
        return f": write {{type: fixed, value: {value}}}"
    if (value,) in kinds:  # with ", ..." where the kind needs more keys (poisson its rate)
        more = any(f.is_required() for k, f in kinds[(value,)].model_fields.items() if k != "type")
        return f": write {{type: {value}{', ...' if more else ''}}}"
    if ":" in value and any({"cls", "args"} <= m.model_fields.keys() for m in models):
        return f": write {{type: custom, cls: '{value}'}}"
    return ""


# what other tools call a section's kind (a tag no union here has as a key): ``policy: {kind: fcfs}``
_TYPE_SYNONYMS = ("kind", "name", "policy")


def _written_for(loc: str, errs: list[ErrorDetails]) -> str:
    """`` (typ is written: did you mean type?)`` for a section's kind (the tag of a union) missing beside a key that
    spells it almost, or another word for it (kind, name, policy): a union whose tag is missing reports only that,
    so ``policy: {typ: fcfs}`` never named typ."""
    given = next((e.get("input") for e in errs if e["type"] == "union_tag_not_found"), None)
    name = loc.rpartition(".")[2]
    if not isinstance(given, dict):
        return ""
    near = [k for k in given if isinstance(k, str) and (closest_key(k, [name]) == name
                                                        or name == "type" and k in _TYPE_SYNONYMS)]
    return f" ({near[0]} is written: did you mean {name}?)" if near else ""


def _missing_as_misspelled(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Without "X.cls: required key is missing" where "X.class: unknown key; did you mean cls?" says it: the two
    lines of one misspelled key read as two problems, the first as if the key written were not there."""
    meant = set()
    for loc, reason in found:
        # a name from vLLM's options hints with its source: "did you mean num_users (vllm bench's ...)?"
        m = re.fullmatch(r"unknown key; did you mean (\w+)(?: \(.*\))?\?", reason)
        if m:
            meant.add(f"{loc.rpartition('.')[0]}.{m[1]}".lstrip("."))
    return [(loc, reason) for loc, reason in found if not (reason == "required key is missing" and loc in meant)]


def _variants_text(idx: list[int], names: list[Any]) -> str:
    """``variant 1 (2P2D)`` or ``variants 0 and 3 (colocated, colocated-chunked)``: the variants by index, with
    their names where every one has a name."""
    which = str(idx[0]) if len(idx) == 1 else ", ".join(str(j) for j in idx[:-1]) + f" and {idx[-1]}"
    named = [str(names[j]) for j in idx if j < len(names) and names[j] is not None]
    which += f" ({', '.join(named)})" if len(named) == len(idx) else ""
    return f"variant{'s' if len(idx) > 1 else ''} {which}"


def _decimal_comma(loc: tuple[Any, ...], raw: Any) -> tuple[str, str] | None:
    """(key, reason) for a number written with a decimal comma in a flow mapping: YAML reads ``{rate: 7,5}`` as
    rate 7 and a key 5 with no value, which was told "workload.arrival.5: Keys should be strings"."""
    node = raw
    for part in loc[:-1]:
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int):
            node = node[part]
    keys = list(node) if isinstance(node, dict) else []
    if loc[-1] not in keys or node[loc[-1]] is not None or not re.fullmatch(r"\d+", str(loc[-1])):
        return None
    before = keys[keys.index(loc[-1]) - 1] if keys.index(loc[-1]) else None
    whole = node.get(before)
    if not isinstance(before, str) or isinstance(whole, bool) or not isinstance(whole, int):
        return None
    # the digits after the comma are not shown back: YAML reads 0,05's 05 as the octal 5
    return before, (f"a number with a decimal comma is read as {whole} and a key {loc[-1]} (a comma ends an entry "
                    "of a {...} mapping): write decimals with a point")


def format_validation(
    err: ValidationError, source: str, raw: Any = None, prefix: str = "", model: type[BaseModel] | None = None
) -> str:
    """One line per offending key: ``source: dotted.path: reason (got value)``. The errors a union reports once
    per member at the same key are merged into one line. With the validated ``model``, an unknown key names the
    closest known one."""
    grouped: dict[str, list[ErrorDetails]] = {}
    for e in err.errors():
        loc = _clean_loc(tuple(e["loc"]), raw, keep_last=e["type"] in ("missing", "extra_forbidden"))
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):  # name the tag key itself
            loc = ".".join(x for x in (loc, str(e["ctx"]["discriminator"]).strip("'")) if x)
        loc = prefix + loc if loc else prefix.rstrip(".")
        grouped.setdefault(loc, []).append(e)
    for loc in [k for k in grouped if any(o.startswith(k + ".") for o in grouped)]:
        # a union of a name and a mapping (a router): for a mapping written, the name's complaint ("must be
        # 'round_robin', ...") stood first and the mapping's own problem, named a line below, read as an aside
        kept = [e for e in grouped[loc] if not (isinstance(e.get("input"), dict) and e["type"] in _NAME_ERRORS)]
        if kept:
            grouped[loc] = kept
        else:
            del grouped[loc]
    found: list[tuple[str, str]] = []
    commas: dict[str, str] = {}  # a decimal comma's key -> its line, which replaces that key's own
    for loc, errs in grouped.items():
        kinds = {e["type"] for e in errs}
        if kinds & {"invalid_key", "extra_forbidden"} and (comma := _decimal_comma(tuple(errs[0]["loc"]), raw)):
            commas[f"{loc.rpartition('.')[0]}.{comma[0]}".lstrip(".")] = comma[1]
            continue
        if "extra_forbidden" in kinds:
            reason = "unknown key" + unknown_key_hint(model, tuple(errs[0]["loc"]))
        elif kinds & {"missing", "union_tag_not_found"}:
            reason = "required key is missing" + _written_for(loc, errs)
        else:
            reasons: list[str] = []
            for e in errs:
                r = _reason(e)
                if r not in reasons:
                    reasons.append(r)
            if len(reasons) > 1 and all(r.startswith("expected ") for r in reasons):
                reason = "expected " + " or ".join(r.removeprefix("expected ") for r in reasons)
            else:
                reason = "; or ".join(reasons)
            value = errs[0].get("input")
            scalar = not isinstance(value, (dict, list))
            if "union_tag_invalid" not in kinds and (scalar or kinds & set(_EXPECTED)):
                reason += f" (got {short(value)})" + _kind_written_bare(model, tuple(errs[0]["loc"]), value)
                if "int_parsing" in kinds and (digits := digits_of_size(value)) is not None:
                    reason += f": give it in digits, {digits} (no k or m)"
        found.append((loc, reason))
    found = [(loc, r) for loc, r in found if loc not in commas] + list(commas.items())
    found = _same_in_variants(_missing_as_misspelled(found), raw)
    lines = [f"{source}: {loc or '(top level)'}: {reason}" for loc, reason in found[:_MAX_PROBLEMS]]
    more = len(found) - _MAX_PROBLEMS
    if more > 0:
        lines.append(f"... and {more} more problem(s)")
    return "\n".join(lines)


def yaml_error(e: yaml.YAMLError) -> str:
    """A YAML error on one line: ``line:column: problem (context)``."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(e, "context", None)
    cmark = getattr(e, "context_mark", None)
    ctx = ""
    if context:
        ctx = f" ({context}" + (f" at line {cmark.line + 1}, column {cmark.column + 1}" if cmark else "") + ")"
    return f"{where}{problem}{ctx}"
