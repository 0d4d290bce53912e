"""Wrong types and extreme scales at the front door get an error that names the argument and the
fix, and a value the data transforms made is never blamed on the user's data."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import InputError, InputTypeError

NOT_A_LIST_OF_CLIENTS = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.builds(lambda n: torch.zeros(n, 2), st.integers(0, 3)),
    st.builds(lambda n: np.zeros((n, 2)), st.integers(0, 3)),
)


@settings(max_examples=60, deadline=None)
@given(NOT_A_LIST_OF_CLIENTS)
def test_federation_of_a_wrong_type_names_the_argument_and_the_fix(clients):
    with pytest.raises(
        InputTypeError, match=r"Federation\(clients\): clients must be a list of .*ClientData"
    ):
        Federation(clients)


def test_federation_of_one_client_is_refused_not_iterated():
    client = ClientData(torch.rand(4, 1, dtype=torch.float64), torch.randn(4, dtype=torch.float64), id="a")
    with pytest.raises(InputTypeError, match="got ClientData"):
        Federation(client)
    assert Federation([client]).ids == ["a"]


@settings(max_examples=30, deadline=None)
@given(
    st.one_of(st.text(min_size=2, max_size=2), st.integers(), st.dictionaries(st.integers(), st.integers()))
)
def test_from_partition_ids_of_a_wrong_type_are_refused(ids):
    X, y = np.random.default_rng(0).random((4, 1)), np.arange(4.0)
    with pytest.raises(InputTypeError, match="from_partition: ids must be a list"):
        Federation.from_partition(X, y, [[0, 1], [2, 3]], ids=ids)


def _federation(x_scale: float, y_scale: float, test: bool = False) -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = []
    for i in range(3):
        X = torch.rand(20, 2, dtype=torch.float64, generator=g) * x_scale
        y = torch.randn(20, dtype=torch.float64, generator=g) * y_scale
        extra = {}
        if test:  # ordinary test inputs, far outside a tiny training box
            extra = dict(
                X_test=torch.rand(5, 2, dtype=torch.float64), y_test=torch.randn(5, dtype=torch.float64)
            )
        clients.append(ClientData(X, y, id=f"c{i}", **extra))
    return Federation(clients)


def test_a_tiny_spread_is_not_called_constant():
    with pytest.raises(InputError, match="vary too little to measure in float64") as caught:
        fedgp.fit(fedgp.GPSpec(), _federation(1.0, 1e-200), rounds=1)
    assert "are constant" not in str(caught.value) and "rescale y" in str(caught.value)


def test_a_value_the_transforms_made_is_not_blamed_on_the_data():
    with pytest.raises(InputError, match="the data transforms map X_test") as caught:
        fedgp.fit(fedgp.GPSpec(), _federation(1e-300, 1.0, test=True), rounds=1)
    message = str(caught.value)
    assert "client 'c0'" in message and "passed every check" in message and "Normalize(bounds=" in message


def test_tiny_but_measurable_scales_still_fit():
    """The checks only refuse what float64 cannot represent: targets of scale 1e-100 standardise."""
    result = fedgp.fit(
        fedgp.GPSpec(), _federation(1.0, 1e-100), rounds=2, callbacks=[fedgp.run.Progress(False)]
    )
    assert result.transforms["outcome"].startswith("standardize, mean")
    mean, var = result.predict(torch.rand(3, 2, dtype=torch.float64), client="c0")
    assert bool(torch.isfinite(mean).all()) and float(mean.abs().max()) < 1e-98
    empty = ClientData(torch.empty(0, 2, dtype=torch.float64), torch.empty(0, dtype=torch.float64), id="new")
    mean, _ = result.predict(torch.rand(2, 2, dtype=torch.float64), client=empty)  # cold start: no rows
    assert bool(torch.isfinite(mean).all())


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("seed", "zero", r"seed must be an int .*got 'zero'"),
        ("seed", 1.5, r"seed must be an int .*got 1.5"),
        ("callbacks", 5, r"callbacks must be a list of callbacks, .*got int"),
        ("federation", "abc", r"federation must be a fedgp.data.Federation, got str"),
        ("rounds", "10", r"rounds must be an int >= 1, got '10'"),
    ],
)
def test_fit_names_the_argument_of_a_wrong_type(argument, value, message):
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=20, d=1, seed=0)
    arguments = dict(spec=draws.spec, federation=draws.federation, rounds=1)
    arguments[argument] = value
    with pytest.raises((InputError, InputTypeError), match=message):
        fedgp.fit(**arguments)
