"""The base of every section of a scenario file, and its number types: unknown keys refused, every float finite,
``true``/``false`` never read as a number."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from sim.config.slos import parse_slo_seconds


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads true/false as 1/0; in a scenario file that is always a slip
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]  # an integer field of a scenario file
Float = Annotated[float, BeforeValidator(_not_bool)]  # a number field of a scenario file (finite: see InputModel)


class InputModel(BaseModel):
    """Base of every section of a scenario file: unknown keys are refused and every float must be finite
    (``.inf`` and ``.nan`` are refused where they enter). Number fields use ``Int`` and ``Float``, which refuse
    ``true``/``false``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class FrozenInputModel(InputModel):
    """A section that cannot be changed once validated (the workload and its parts)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


SLO_UNIT_HELP = " (or a string with its unit: '200ms', '0.2s')"
# an SLO field (the scenario's slos, a class's slo): seconds, or a string with its unit ("200ms", "0.2s"); a bare
# number that reads as milliseconds is warned about where the scenario is validated (sim.config.scenario.parse_scenario)
SLOSeconds = Annotated[float, BeforeValidator(_not_bool),
                       BeforeValidator(parse_slo_seconds, json_schema_input_type=float | str)]


KIND_TEXT = "Which kind of section this is; each kind takes the keys of its own table."


def kind_description(doc: str | None) -> str:
    """What a section's ``type`` key means where the field says nothing itself (``servesim schema``, the key
    reference): the first paragraph of its model's docstring, which says what that kind is."""
    first = " ".join((doc or "").strip().split("\n\n")[0].split())
    return first or KIND_TEXT
