"""``RequestRecord.from_request`` and ``SpecTable`` build through a mutable twin class (for speed): what they
return must be like what the constructors make, frozen, equal, hashed and pickled alike."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from sim.metrics.records import RequestRecord
from sim.serving.request import Outcome, Request, RequestSpec


def _finished() -> Request:
    r = Request(RequestSpec(7, 0.5, 100, 20, session_id=3, priority=2, tenant="a", slo_class="chat", ttft_slo=1.0), 0.5)
    r.first_scheduled, r.first_token, r.finish = 0.6, 0.7, 2.0
    r.num_output_tokens, r.num_preemptions = 20, 1
    r.preempted_at, r.resumed_at = [1.0], [1.2]
    r.outcome = Outcome.COMPLETED
    r.replica = 1
    return r


def test_from_request_makes_a_frozen_record_equal_to_the_constructors() -> None:
    rec = RequestRecord.from_request(_finished())
    made = RequestRecord(7, 0.5, 0.6, 0.7, 2.0, 100, 20, 20, 1, "completed", "", 1, 3, (1.0,), (1.2,), 2, "a", "chat",
                         1.0, -1.0)
    assert type(rec) is RequestRecord
    assert rec == made and hash(rec) == hash(made)
    assert dataclasses.astuple(rec) == dataclasses.astuple(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.finish = 3.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(rec)) == made


def test_a_spec_tables_specs_are_request_specs_equal_to_the_constructors() -> None:
    import numpy as np

    from sim.serving.spec_table import SpecTable

    table = SpecTable(np.array([0.0, 1.5]), np.array([10, 20]), np.array([3, 4]), hash_block_size=16,
                      sessions=[None, 5])
    made = (RequestSpec(0, 0.0, 10, 3, (), 16, None), RequestSpec(1, 1.5, 20, 4, (), 16, 5))
    assert all(type(s) is RequestSpec for s in table)
    assert tuple(table) == made and [hash(s) for s in table] == [hash(s) for s in made]
    with pytest.raises(dataclasses.FrozenInstanceError):
        table[0].arrival = 2.0  # type: ignore[misc]


def test_checked_specs_are_request_specs_equal_to_the_constructors() -> None:
    from sim.serving.request import checked_specs

    specs = checked_specs([(0, 0.0, 10, 3), (1, 1.5, 20, 4, (7,), 16, 5)])
    assert all(type(s) is RequestSpec for s in specs)
    assert specs == [RequestSpec(0, 0.0, 10, 3), RequestSpec(1, 1.5, 20, 4, (7,), 16, 5)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs[0].prompt_len = 2  # type: ignore[misc]


def test_a_subclass_makes_its_own_records() -> None:
    # Before: from_request assigned cls to the twin's __class__, and for a subclass of RequestRecord (its layout its
    # own: a __dict__, or fields of its own) raised "TypeError: __class__ assignment: ... object layout differs",
    # where it had made a record of the subclass
    class Tagged(RequestRecord):
        pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Extra(RequestRecord):
        note: str = "x"

    for kind in (Tagged, Extra):
        rec = kind.from_request(_finished())
        assert type(rec) is kind and rec.id == 7 and rec.resumed_at == (1.2,) and rec.slo_class == "chat"
    assert Extra.from_request(_finished()).note == "x"


def test_a_twin_of_a_class_with_fields_init_does_not_take_is_refused() -> None:
    # the twin's __init__ would take such a field as an argument, and the values after it would land a field late
    from sim.serving.request import unfrozen_twin

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived:
        a: int
        b: int = dataclasses.field(init=False, default=0)
        c: int = 0

    with pytest.raises(TypeError, match=r"\['b'\] are not __init__ arguments"):
        unfrozen_twin(Derived)
