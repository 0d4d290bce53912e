"""Property-based tests of the data entry points against their documented contract.

The oracle (``fuzz_contract.py``) is written from the contract, not the code: for every generated
input, a clear ``ValueError`` naming the client and a wrong field, or acceptance with the values
kept (float64, rounded to nearest) and owned by fedgp. Accepted clients then survive a one-round
fit on both engines, or fail it with an error naming the client. Example counts are fixed and the
CI profile is derandomised (tests/conftest.py).
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgp.data import ClientData, Federation

from .fuzz_contract import CASES, client_arrays, one_round_on_each_engine, outcome

_FAST = settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_FAST
@given(CASES)
def test_every_input_is_accepted_intact_or_refused_naming_client_and_field(case):
    category, detail = outcome(case)
    assert category in ("accepted", "rejected-clearly"), f"{category}: {detail}"


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_accepted_clients_fit_one_round_on_both_engines_or_fail_naming_the_client(data):
    d = data.draw(st.integers(1, 2))
    kwargs, bad, _, _ = data.draw(client_arrays("odd", n=data.draw(st.integers(2, 6)), d=d, allow_bad=False))
    if bad:
        return  # constant targets: refused, covered above
    rng = np.random.default_rng(0)
    good = ClientData(rng.normal(size=(8, d)), rng.normal(size=8), id="good")
    fed = Federation([good, ClientData(**kwargs)])
    for label in one_round_on_each_engine(fed):
        assert label == "fit-ok" or label.startswith("fit-fails-naming-client"), label


def test_inputs_are_copied_on_entry():
    X, y = np.arange(6.0).reshape(3, 2), np.array([0.0, 1.0, 3.0])
    Xt = torch.tensor(X)
    c = ClientData(Xt, y, id="a")
    Xt[0, 0], y[0] = float("nan"), float("nan")
    assert torch.isfinite(c.X).all() and torch.isfinite(c.y).all()


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64", "longdouble", "float16", "int8"])
def test_every_real_dtype_is_accepted(dtype):
    c = ClientData(np.array([[1], [2], [3]], dtype=dtype), np.array([0, 1, 2], dtype=dtype), id=0)
    assert c.X.dtype == torch.float64 and c.X.flatten().tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "X, message",
    [
        (np.array([["a"], ["b"]]), r"client 'c': X has dtype <U1; expected real numbers; text"),
        (np.array([[1], [2]], dtype="datetime64[s]"), r"client 'c': X has dtype datetime64\[s\]"),
        (torch.tensor([[1 + 1j], [2]]), r"client 'c': X has dtype torch.complex64"),
        (np.array([[1e300], [2.0]]), r"client 'c': X has values up to 1e\+300 .* Rescale"),
        (
            np.array([[np.longdouble("1e4000")], [2.0]], dtype=np.longdouble),
            r"client 'c': X has finite values beyond float64",
        ),
        ([[1.0], [2.0, 3.0]], r"client 'c': X cannot be read as a numeric array"),
        (np.ma.masked_array([[1.0], [2.0]], mask=[[True], [False]]), r"client 'c': X is a masked array"),
    ],
)
def test_non_real_and_overflowing_inputs_are_refused_by_name(X, message):
    with pytest.raises(ValueError, match=message):
        ClientData(X, np.array([0.0, 1.0]), id="c")


def test_ids_must_be_hashable_scalars_and_not_nan():
    X, y = np.zeros((2, 1)), np.array([0.0, 1.0])
    with pytest.raises(ValueError, match=r"client nan: id nan is not equal to itself"):
        ClientData(X, y, id=float("nan"))
    with pytest.raises(ValueError, match=r"id \[1\] is not hashable"):
        ClientData(X, y, id=[1])
    with pytest.raises(ValueError, match=r"is an array; use a str or an int"):
        ClientData(X, y, id=np.arange(2))


def test_from_partition_takes_masks_as_masks_and_refuses_bad_indices_by_client():
    X, y = np.arange(8.0)[:, None], np.arange(8.0) ** 2
    mask = np.arange(8) % 2 == 0
    fed = Federation.from_partition(X, y, [mask, np.array([1, 3], dtype=np.uint8)], ids=["m", "u"])
    assert fed.by_id("m").X.flatten().tolist() == [0.0, 2.0, 4.0, 6.0] and fed.by_id("u").n == 2
    for part, message in [
        (np.array([1.0, 2.0]), r"client 'b': its partition has dtype float64; row indices must be integers"),
        (
            np.array([1, -1]),
            r"client 'b': row index -1 is outside \[0, 8\) \(negative indices are not wrapped\)",
        ),
        (np.array([1, 8]), r"client 'b': row index 8 is outside \[0, 8\)"),
        (
            np.ones(7, dtype=bool),
            r"client 'b': its boolean mask has 7 entries but the pooled data have 8 rows",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            Federation.from_partition(X, y, [np.array([0, 1]), part], ids=["a", "b"])
    with pytest.raises(ValueError, match=r"from_partition \(pooled arrays\): X has 8 rows but y has 7"):
        Federation.from_partition(X, y[:7], [np.array([0, 1])])
