"""Service-level objectives: configuration (a scenario's ``slos`` section, sim/config/scenario.py) that the metrics
judge
requests against (goodput, SLO attainment, sim/metrics/summary.py). Below both, so that reading a scenario needs no
metrics."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SLOs:
    """Service-level objectives in seconds, as `vllm bench serve --goodput` takes them (it takes ms). A request
    meets an objective when its value is at most the threshold; None means no bound on that metric."""

    ttft: float | None = None
    tpot: float | None = None  # requests with a single output token have TPOT 0, as in vLLM
    e2el: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "e2el"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO {name} must be > 0 seconds, got {v}")

    @property
    def empty(self) -> bool:
        return self.ttft is None and self.tpot is None and self.e2el is None

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft": self.ttft, "tpot": self.tpot, "e2el": self.e2el}


# Seconds above which a bare number given as an SLO reads as the milliseconds `vllm bench serve --goodput ttft:200`
# takes (200 s for a first token, 50 s a token): loose bounds a user may mean, so a warning, not an error. The
# shipped scenarios' loosest are TTFT 60 s (a reasoning user) and TPOT 0.1 s.
SLO_WARN_ABOVE = {"ttft": 60.0, "tpot": 1.0, "e2el": 600.0}


class SLOUnitWarning(UserWarning):
    """An SLO that reads as milliseconds written where seconds are meant (the command prints it as one line)."""


def parse_slo_seconds(value: object) -> object:
    """An SLO as written: a number of seconds, or a string with its unit ("200ms", "0.2s"); other values are
    returned as they are, for the number type to refuse."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if (bare := _bare_seconds(text)) is not None:  # "5e-3": YAML reads it as text, pydantic read it as the number
        return bare
    for unit, scale in (("ms", 1e-3), ("s", 1.0)):
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)].strip()) * scale
            except ValueError:
                break
    raise ValueError("expected seconds (a number) or a number with its unit, '200ms' or '0.2s'")


def _bare_seconds(text: str) -> float | None:
    """A number written as text without a unit (YAML reads ``5e-3``, without a dot, as text), or None."""
    try:
        return float(text)
    except ValueError:
        return None


def implausible_slo(name: str, seconds: object) -> str | None:
    """Why a bare number given as SLO ``name`` (ttft, tpot, e2el) looks like milliseconds, or None."""
    if isinstance(seconds, str):  # "200" is as bare as 200
        seconds = _bare_seconds(seconds.strip())
    limit = SLO_WARN_ABOVE.get(name)
    if limit is None or isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > limit:
        return None
    return (f"{name}: {seconds:g} seconds is an unusually loose {name.upper()} bound (above {limit:g} s); SLOs are "
            f"seconds, where vllm bench serve --goodput takes ms: for {seconds:g} ms write {seconds / 1000:g} or "
            f"'{seconds:g}ms'; '{seconds:g}s' keeps {seconds:g} seconds without this warning")


def slo_unit_warnings(raw: object) -> list[str]:
    """The warnings a scenario as written (its dict, before validation) earns: each SLO given as a bare number that
    reads as milliseconds (``implausible_slo``), named by its key path. A string with its unit earns none."""
    if not isinstance(raw, dict):
        return []
    # the run's slos, then each class's slo in the workload and in each variant's, then a sweep's values (sweep:
    # {workload.classes.0.slo.ttft: [200, 500]} ran silently): each once here, where the scenario is warned of as a
    # whole, not at each of its points
    found: list[tuple[str, Any]] = [(m[1], {m[2]: leaf}) for key in ("slos", "workload", "variants") if key in raw
                                    for path, leaf in _leaves(key, raw[key]) if (m := _SLO_LEAF.match(path))]
    sweep = raw.get("sweep")
    for key, values in sweep.items() if isinstance(sweep, dict) else ():
        for value in values if isinstance(values, list) else [values]:
            found += [(f"sweep: {m[1]}", {m[2]: leaf}) for path, leaf in _leaves(str(key), value)
                      if (m := _SLO_LEAF.match(path))]
    said = [f"{path}.{why}" for path, slos in found if isinstance(slos, dict)
            for name, value in slos.items() if (why := implausible_slo(str(name), value)) is not None]
    return list(dict.fromkeys(said))


# an SLO's key path in a scenario: the run's slos, or a class's slo in the workload or a variant's
_SLO_LEAF = re.compile(r"^(slos|(?:variants\.\d+\.)?workload\.classes\.\d+\.slo)\.(ttft|tpot|e2el)$")


def _leaves(path: str, value: object) -> list[tuple[str, object]]:
    """Each leaf of ``value`` (dicts and lists walked) with its dotted key path under ``path``."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(f"{path}.{k}", v)]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(f"{path}.{i}", v)]
    return [(path, value)]


def warn_slo_units(raw: object) -> None:
    """``slo_unit_warnings`` as SLOUnitWarnings, attributed to the caller of parse_scenario."""
    for why in slo_unit_warnings(raw):
        warnings.warn(why, SLOUnitWarning, stacklevel=3)
