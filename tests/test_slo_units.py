"""SLOs are seconds, where `vllm bench serve --goodput ttft:200` takes ms: a bare number that reads as milliseconds
(``slos: {ttft: 200}``) warns, in one line naming the key and what to write; a unit makes the value unambiguous."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sim.cli.common import _input_warning_line
from sim.config.scenario import load_scenario, parse_scenario
from sim.config.schema import ScenarioError
from sim.config.slos import SLOUnitWarning, implausible_slo, slo_unit_warnings

BASE: dict[str, Any] = {
    "name": "slo-units",
    "workload": {"num_requests": 4, "arrival": {"type": "poisson", "rate": 1.0},
                 "prompt_len": {"type": "fixed", "value": 8}, "output_len": {"type": "fixed", "value": 4}},
    "deployment": {"model": "tiny", "gpu": "l4"},
}


def _parse(slos: dict | None = None, class_slo: dict | None = None) -> tuple[Any, list[str]]:
    raw = copy.deepcopy(BASE)
    if slos is not None:
        raw["slos"] = slos
    if class_slo is not None:
        raw["workload"]["classes"] = [{"name": "chat", "share": 1.0, "slo": class_slo}]
    return parse_scenario(raw, warn_units=False), slo_unit_warnings(raw)  # the warnings as a list, not emitted


def test_an_slo_written_in_vllm_milliseconds_warns_naming_the_key() -> None:
    """Before: slos {ttft: 200, tpot: 50} (meant as ms) ran silently as 200 s and 50 s, goodput all but 100%."""
    sc, said = _parse({"ttft": 200, "tpot": 50, "e2el": 5})
    assert sc.slos.ttft == 200.0 and sc.slos.tpot == 50.0  # plausible bounds for someone: kept, only warned
    assert len(said) == 2
    assert said[0].startswith("slos.ttft: 200 seconds") and "write 0.2 or '200ms'" in said[0]
    assert said[1].startswith("slos.tpot: 50 seconds") and "write 0.05 or '50ms'" in said[1]
    _, said = _parse(class_slo={"tpot": 40})
    assert len(said) == 1 and said[0].startswith("workload.classes.0.slo.tpot: 40 seconds")
    said = slo_unit_warnings({"variants": [{"name": "v", "workload": {"classes": [{"slo": {"ttft": 500}}]}}]})
    assert len(said) == 1 and said[0].startswith("variants.0.workload.classes.0.slo.ttft: 500 seconds")


def test_shipped_bounds_and_values_with_a_unit_do_not_warn() -> None:
    sc, said = _parse({"ttft": 60.0, "tpot": 0.1, "e2el": 600})  # the loosest the shipped scenarios hold
    assert said == []
    sc, said = _parse({"ttft": "200ms", "tpot": " 50 ms", "e2el": "900s"}, class_slo={"ttft": "1.5s"})
    assert said == []
    assert (sc.slos.ttft, sc.slos.tpot, sc.slos.e2el) == (pytest.approx(0.2), pytest.approx(0.05), 900.0)
    assert sc.workload.classes[0].slo.ttft == 1.5


@pytest.mark.parametrize("value", ["200 msec", "fast", "-5ms", True])
def test_an_slo_that_is_no_duration_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ScenarioError, match=r"slos\.ttft"):
        _parse({"ttft": value})


def test_the_command_prints_the_warning_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    _input_warning_line(SLOUnitWarning("slos.ttft: 200 seconds ..."), SLOUnitWarning, "pydantic/main.py", 792)
    assert capsys.readouterr().err == "warning: slos.ttft: 200 seconds ...\n"


def test_reading_the_file_warns_once(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "variants": [{"name": "a"}, {"name": "b"}]}))
    with pytest.warns(SLOUnitWarning) as caught:
        load_scenario(path, {"slos.ttft": 200})  # as --set slos.ttft=200 gives it
    assert [str(w.message) for w in caught] == [slo_unit_warnings({"slos": {"ttft": 200}})[0]]


def test_a_number_yaml_reads_as_text_stays_seconds(tmp_path: Path) -> None:
    """YAML reads 5e-1 (no dot) and a quoted "0.05" as text, which the SLO fields took as seconds until units came
    (pydantic's lax float); the unit parser then refused them ('expected seconds (a number) or a number with its
    unit'). A bare number as text is seconds again, and warns as the number does."""
    path = tmp_path / "s.yaml"
    path.write_text("name: t\nslos: {ttft: 5e-1, tpot: \"0.05\"}\n"
                    "workload: {num_requests: 4, arrival: {type: poisson, rate: 1.0}, prompt_len: {type: fixed, "
                    "value: 8}, output_len: {type: fixed, value: 4}}\ndeployment: {model: tiny, gpu: l4}\n")
    sc, _ = load_scenario(path)
    assert (sc.slos.ttft, sc.slos.tpot) == (0.5, 0.05)
    said = slo_unit_warnings({"slos": {"ttft": "200"}})
    assert len(said) == 1 and said[0].startswith("slos.ttft: 200 seconds")


def test_a_dict_given_to_the_python_api_warns_once() -> None:
    """Before: only a file read (load_scenario) warned; servesim.run(dict) with slos {ttft: 200} ran silently."""
    import servesim

    raw = {**copy.deepcopy(BASE), "slos": {"ttft": 200}, "sweep": {"seed": [1, 2]}}
    with pytest.warns(SLOUnitWarning) as caught:
        servesim.run(raw)  # two sweep points, each validated again: still one warning
    assert [str(w.message) for w in caught] == slo_unit_warnings({"slos": {"ttft": 200}})


def test_an_slo_read_as_milliseconds_does_not_size_the_plans_steady_state_window() -> None:
    # plan-chat with `slos: {ttft: 500}` (ms meant) judged every deployment on 3 x 507 s of arrivals, 24,000
    # requests, and ran for minutes without a line; `tpot: 30` too made it 380,000 requests
    from sim.config.slos import SLOs
    from sim.studies.plan_capacity import slo_lifetime

    assert slo_lifetime(SLOs(ttft=0.5, tpot=0.03), 250.0) == pytest.approx(0.5 + 249 * 0.03)
    assert slo_lifetime(SLOs(ttft=500.0, tpot=0.03), 250.0) == pytest.approx(249 * 0.03)
    assert slo_lifetime(SLOs(ttft=500.0, tpot=30.0), 250.0) is None  # measured, as for a TTFT SLO alone
    assert slo_lifetime(SLOs(ttft=0.5, e2el=5000.0), 250.0) is None


def test_slo_values_given_in_a_sweep_warn_once_each() -> None:
    """Before: sweep {workload.classes.0.slo.ttft: [200, 500]} ran both points silently as 200 s and 500 s bounds
    (only the scenario's own SLOs were checked; each point is parsed with warn_units=False)."""
    import servesim

    raw = copy.deepcopy(BASE)
    raw["workload"]["classes"] = [{"name": "chat", "share": 1.0, "slo": {"ttft": 1}}]
    raw["sweep"] = {"workload.classes.0.slo.ttft": [200, "500ms", 500], "seed": [1, 2]}
    with pytest.warns(SLOUnitWarning) as caught:
        servesim.run(raw)  # six points: each value warned once, a unit ('500ms') not at all
    said = [str(w.message) for w in caught]
    assert [s.split(" seconds")[0] for s in said] == ["sweep: workload.classes.0.slo.ttft: 200",
                                                       "sweep: workload.classes.0.slo.ttft: 500"]
    # a whole section as a sweep's value is walked for its SLOs
    classes = {"workload.classes": [[{"name": "chat", "share": 1.0, "slo": {"tpot": 50}}]]}
    assert slo_unit_warnings({**raw, "sweep": classes}) == [
        "sweep: workload.classes.0.slo." + implausible_slo("tpot", 50)]
