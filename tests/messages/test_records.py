"""Records, tasks and their bytes: only tensors and plain settings, bit-exact round trips, clear errors."""

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fedgp.messages import (
    Field,
    Record,
    Task,
    check_reply,
    record_from_bytes,
    record_to_bytes,
    task_from_bytes,
    task_to_bytes,
)

names = st.text(alphabet="abcdefghij./_0123456789", min_size=1, max_size=12)
shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
settings_values = st.one_of(
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


@st.composite
def tensors(draw, rows=None):
    shape = draw(shapes)
    if rows is not None:
        shape = (rows, *shape)
    kind = draw(st.sampled_from(["float64", "int64", "bool"]))
    n = math.prod(shape)
    if kind == "float64":
        values = draw(
            st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=n, max_size=n)
        )
        return torch.tensor(values, dtype=torch.float64).reshape(shape)
    if kind == "int64":
        values = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
        return torch.tensor(values, dtype=torch.int64).reshape(shape)
    return torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(
        shape
    )


@st.composite
def records(draw, rows=None):
    entries = draw(st.dictionaries(names, tensors(rows), max_size=4))
    return Record(entries, draw(st.dictionaries(names, settings_values, max_size=4)))


def same(a: Record, b: Record) -> bool:
    if set(a.tensors) != set(b.tensors) or dict(a.settings) != dict(b.settings):
        return False
    for k, v in a.tensors.items():
        w = b.tensors[k]
        if v.dtype != w.dtype or v.shape != w.shape:
            return False
        if v.dtype == torch.float64:  # bit for bit, NaN payloads included
            if not torch.equal(v.view(torch.int64), w.view(torch.int64)):
                return False
        elif not torch.equal(v, w):
            return False
    return True


@given(records())
def test_record_round_trips_through_bytes_bit_for_bit(record):
    assert same(record_from_bytes(record_to_bytes(record)), record)


@given(st.integers(1, 3).flatmap(lambda b: st.tuples(records(), records(rows=b))), st.integers(0, 10**6))
def test_task_round_trips_through_bytes(parts, rnd):
    shared, personal = parts
    personal = Record({f"p_{k}": v for k, v in personal.tensors.items()}, personal.settings)
    task = Task("train", rnd, shared, personal, {"simulate_failures": 0.25})
    back = task_from_bytes(task_to_bytes(task))
    assert back.kind == "train" and back.round == rnd and dict(back.options) == {"simulate_failures": 0.25}
    assert same(back.shared, shared) and same(back.personal, personal)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_refused_with_a_value_error_never_executed(data):
    with pytest.raises(ValueError):
        task_from_bytes(data)


def test_only_tensors_and_plain_settings_enter_a_record():
    with pytest.raises(TypeError, match="'model' is a dict; only tensors travel"):
        Record({"model": {"a": 1}})
    with pytest.raises(TypeError, match="dtype torch.float32"):
        Record({"x": torch.zeros(2, dtype=torch.float32)})
    with pytest.raises(TypeError, match="setting 'fn' is a function"):
        Record({}, {"fn": lambda: 0})
    with pytest.raises(ValueError, match="requires grad"):
        Record({"x": torch.zeros(2, dtype=torch.float64, requires_grad=True)})
    with pytest.raises(ValueError, match="not finite"):
        Record({}, {"lr": float("nan")})
    with pytest.raises(ValueError, match="both shared and personal"):
        Task(
            "train",
            0,
            Record({"a": torch.zeros(1, dtype=torch.float64)}),
            Record({"a": torch.zeros(1, 1, dtype=torch.float64)}),
        )


def test_replies_are_checked_row_by_row_against_the_declaration():
    fields = {"loss": Field(), "choice": Field((2,), torch.long, bounds=(0, 2)), "state": Field((3,))}
    good = {
        "loss": torch.tensor([0.5, float("nan"), 1.0], dtype=torch.float64),
        "choice": torch.tensor([[0, 2], [1, 1], [0, 3]]),
        "state": torch.zeros(3, 3, dtype=torch.float64),
    }
    reasons = check_reply(Record(good), fields, 3)
    assert reasons[0] is None
    assert "'loss' is not finite" in reasons[1]
    assert "'choice' is outside [0, 2]" in reasons[2]
    wrong_shape = {**good, "state": torch.zeros(3, 4, dtype=torch.float64)}
    assert all(
        "'state' has shape (4,), expected (3,)" in r for r in check_reply(Record(wrong_shape), fields, 3)
    )
    missing = {k: v for k, v in good.items() if k != "loss"}
    assert all("missing field(s) ['loss']" in r for r in check_reply(Record(missing), fields, 3))
    extra = {**good, "rows": torch.zeros(3, dtype=torch.float64)}
    assert all("undeclared field(s) ['rows']" in r for r in check_reply(Record(extra), fields, 3))
    wrong_type = {**good, "choice": good["choice"].to(torch.float64)}
    assert all(
        "dtype torch.float64, expected torch.int64" in r for r in check_reply(Record(wrong_type), fields, 3)
    )
