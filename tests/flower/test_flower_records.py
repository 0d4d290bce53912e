"""fedgp records in Flower messages: bit for bit, and in as few Flower objects as a deployment can
carry (each object is one request to the SuperLink)."""

import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedgp.messages import TENSOR_DTYPES, Record, Task

if os.environ.get("CI", "").strip().lower() == "true":
    import flwr  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("flwr")

from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from fedgp.flower.records import ARRAYS, HEADER, get_record, put_record, task_from_content, task_to_content  # noqa: E402

DTYPES = TENSOR_DTYPES


def a_record(shapes, seed, prefix="t") -> Record:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (shape, dtype) in enumerate(shapes):
        values = torch.randn(shape, generator=g, dtype=torch.float64)
        tensors[f"{prefix}{i}"] = values > 0 if dtype is torch.bool else (values * 1e3).to(dtype)
    return Record(tensors, {"note": "x", "k": 3})


shapes = st.lists(
    st.tuples(st.lists(st.integers(0, 4), max_size=3).map(tuple), st.sampled_from(DTYPES)), max_size=4
)


@given(shapes=shapes, seed=st.integers(0, 2**16), limit=st.sampled_from([0, 10**9]))
def test_a_record_comes_back_bit_for_bit_inline_or_as_an_array(shapes, seed, limit):
    from flwr.app import RecordDict

    record = a_record(shapes, seed)
    content = RecordDict()
    put_record(content, "r", record, inline_limit=limit)
    inline = "r.bytes" in content.config_records[HEADER]
    nbytes = sum(t.numel() * t.element_size() for t in record.tensors.values())
    assert inline == (nbytes <= limit)
    assert (ARRAYS in content.array_records) == (not inline)
    back = get_record(content, "r")
    assert back.settings == record.settings and list(back.tensors) == list(record.tensors)
    for key, value in record.tensors.items():
        assert back.tensors[key].dtype == value.dtype and torch.equal(back.tensors[key], value)


def test_a_train_task_is_three_flower_objects():
    task = Task(
        "train", 2, a_record([((5,), torch.float64)], 0), a_record([((7, 2), torch.float64)], 1, "p"), {}
    )
    content = task_to_content(task, {"first_key": 0})
    assert len(get_all_nested_objects(content)) == 2  # the RecordDict and the fedgp ConfigRecord (+ message)
    back, head = task_from_content(content)
    assert int(head["first_key"]) == 0 and back.kind == "train" and back.round == 2
    assert torch.equal(back.personal.tensors["p0"], task.personal.tensors["p0"])
