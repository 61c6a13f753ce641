"""Request classes: the workload's ``classes`` (shares, lengths, priority, tenant, SLOs), trace class columns, and
that a workload without classes draws exactly what it drew before they existed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from sim.traces import load_trace
from sim.workload import Workload

BASE: dict[str, Any] = {
    "arrival": {"type": "poisson", "rate": 5.0},
    "num_requests": 10_000,
    "prompt_len": {"type": "lognormal", "mean": 300, "std": 200, "max": 2000},
    "output_len": {"type": "exponential", "mean": 100, "max": 1000},
}
TWO = [
    {"name": "interactive", "share": 0.2, "priority": 0, "tenant": "web", "slo": {"ttft": 1.0, "tpot": 0.05},
     "output_len": {"type": "fixed", "value": 7}},
    {"name": "batch", "share": 0.8, "priority": 1, "tenant": "etl", "prompt_len": {"type": "uniform", "min": 3000,
                                                                                    "max": 3010}},
]


def _gen(workload: dict[str, Any], seed: int = 0):
    return Workload.model_validate(workload).generate(np.random.default_rng(seed)).requests


def test_class_shares_within_two_points_on_10000_requests() -> None:
    """Seeded: each class's share of 10,000 arrivals lies within 0.02 of its target (binomial std is 0.004)."""
    for seed in (0, 1, 2):
        reqs = _gen({**BASE, "classes": TWO}, seed)
        counts = Counter(r.slo_class for r in reqs)
        assert set(counts) == {"interactive", "batch"}
        for c in TWO:
            assert abs(counts[c["name"]] / len(reqs) - c["share"]) < 0.02


def test_each_class_carries_its_fields_and_its_own_lengths() -> None:
    reqs = _gen({**BASE, "classes": TWO})
    inter = [r for r in reqs if r.slo_class == "interactive"]
    batch = [r for r in reqs if r.slo_class == "batch"]
    assert {(r.priority, r.tenant, r.ttft_slo, r.tpot_slo) for r in inter} == {(0, "web", 1.0, 0.05)}
    assert {(r.priority, r.tenant, r.ttft_slo, r.tpot_slo) for r in batch} == {(1, "etl", None, None)}
    assert {r.output_len for r in inter} == {7}  # the class's own output length
    assert all(3000 <= r.prompt_len <= 3010 for r in batch)  # the class's own prompt length
    # where a class keeps the workload's distribution, its requests keep the very draws of the classless workload
    plain = _gen(BASE)
    assert [r.prompt_len for r in inter] == [plain[r.id].prompt_len for r in inter]
    assert [r.output_len for r in batch] == [plain[r.id].output_len for r in batch]


def test_classes_leave_arrivals_and_lengths_of_the_workload_unchanged() -> None:
    """The class stream is spawned after every other: adding classes changes no arrival nor any length that no
    class overrides, so a classless scenario's requests are those it always drew."""
    classes = [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.5, "priority": 3}]
    with_classes = _gen({**BASE, "num_requests": 500, "classes": classes})
    plain = _gen({**BASE, "num_requests": 500})
    key = [(r.arrival, r.prompt_len, r.output_len) for r in plain]
    assert [(r.arrival, r.prompt_len, r.output_len) for r in with_classes] == key
    assert {(r.priority, r.tenant, r.slo_class, r.ttft_slo) for r in plain} == {(0, "", "", None)}
    assert Workload.model_validate(BASE).model_dump().keys() == {
        "arrival", "num_requests", "prompt_len", "output_len", "shared_prefix", "failures"}  # as before classes


@pytest.mark.parametrize("classes, message", [
    ([], "at least one class"),
    ([{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}], "names must be unique; 'a'"),
    ([{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}], "shares must sum to 1, got 0.9"),
    ([{"name": "a", "share": 0.5}, {"name": "b"}], "give every class a share, or none"),
    ([{"name": "a"}], "give each class a share"),
    ([{"name": "a", "share": 1.0, "slo": {"ttft": 0}}], "greater than 0"),
    ([{"name": "a", "share": 1.0, "weight": 2}], "Extra inputs are not permitted"),
])
def test_bad_classes_are_refused(classes: list, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Workload.model_validate({**BASE, "classes": classes})


def test_shares_written_as_decimals_sum_to_one() -> None:
    three = [{"name": "a", "share": 0.7}, {"name": "b", "share": 0.2}, {"name": "c", "share": 0.1}]
    assert 0.7 + 0.2 + 0.1 != 1.0
    assert len(_gen({**BASE, "num_requests": 10, "classes": three})) == 10


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def test_trace_class_columns_are_read_in_every_layout(tmp_path: Path) -> None:
    own = _write(tmp_path, "own.csv", "arrival_s,prompt_tokens,output_tokens,priority,tenant,slo_class\n"
                 "1.0,10,2,1,acme,batch\n0.5,12,3,0,web,chat\n2.0,9,1,,,\n")
    t = load_trace(own)
    assert t.classes is not None and t.classes.priority is not None  # sorted by arrival with the rows
    assert t.classes.priority.tolist() == [0, 1, 0]
    assert t.classes.tenant == ("web", "acme", "")
    assert t.classes.slo_class == ("chat", "batch", "")
    azure = _write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,tenant\n"
                   "2023-11-16 18:15:46.6805900,374,44,a\n2023-11-16 18:15:50.9951690,396,109,b\n")
    t = load_trace(azure)
    assert t.classes is not None and t.classes.tenant == ("a", "b") and t.classes.priority is None
    moon = _write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": []}\n'
                  '{"timestamp": 10, "input_length": 6, "output_length": 3, "hash_ids": [], "priority": -2}\n')
    t = load_trace(moon, repeat_to=4)
    assert t.classes is not None and t.classes.priority is not None
    assert t.classes.priority.tolist() == [0, -2, 0, -2]  # tiled with the window
    assert load_trace(_write(tmp_path, "plain.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n")).classes is None
    with pytest.raises(ValueError, match=r"bad.csv:2: priority must be an integer, got 'high'"):
        load_trace(_write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,high\n"))


def test_trace_columns_reach_the_requests_and_name_their_classes(tmp_path: Path) -> None:
    path = _write(tmp_path, "own.csv", "arrival_s,prompt_tokens,output_tokens,tenant,slo_class\n"
                  "0,10,2,acme,batch\n1,12,3,web,chat\n2,9,1,web,batch\n")
    arrival = {"type": "trace", "trace": str(path)}
    reqs = _gen({"arrival": arrival})
    assert [(r.priority, r.tenant, r.slo_class, r.ttft_slo) for r in reqs] == [
        (0, "acme", "batch", None), (0, "web", "chat", None), (0, "web", "batch", None)]
    # with classes but no shares, the trace's slo_class names each request's class; its tenant column wins
    classes = [{"name": "chat", "priority": 0, "tenant": "x", "slo": {"ttft": 0.5}},
               {"name": "batch", "priority": 2, "output_len": {"type": "fixed", "value": 40}}]
    reqs = _gen({"arrival": arrival, "classes": classes})
    assert [(r.priority, r.tenant, r.slo_class, r.ttft_slo, r.output_len) for r in reqs] == [
        (2, "acme", "batch", None, 40), (0, "web", "chat", 0.5, 3), (2, "web", "batch", None, 40)]
    with pytest.raises(ValueError, match=r"slo_class column names 'chat', which workload.classes does not define"):
        _gen({"arrival": arrival, "classes": [{"name": "batch"}]})
