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
from fedgp.transforms import Standardize, Transforms

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
    """One federated Standardize asked for explicitly has no unit for the spread: its squares
    underflow, and the message says so (the default measures it: the tests below)."""
    explicit = Transforms(outcome=Standardize())
    with pytest.raises(InputError, match="vary too little to measure in float64") as caught:
        fedgp.fit(fedgp.GPSpec(), _federation(1.0, 1e-200), rounds=1, transforms=explicit)
    message = str(caught.value)
    assert "are constant" not in message and "rescale y" in message and "transforms='auto'" in message


def _predictions(y_scale: float, owner_scales=(1.0, 1.0, 1.0)) -> tuple[torch.Tensor, dict]:
    """Every owner's predicted means under the default transforms, for targets times ``y_scale``
    (owner i's also times ``owner_scales[i]``), and what the transforms did."""
    fed = Federation([c.derived(y=c.y * y_scale * s) for c, s in zip(_federation(1.0, 1.0), owner_scales)])
    result = fedgp.fit(fedgp.GPSpec(), fed, rounds=3, seed=2, callbacks=[fedgp.run.Progress(False)])
    X = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    return torch.stack([result.predict(X, client=i)[0] for i in range(3)]), result.transforms


@pytest.mark.parametrize(
    "owner_scales, picked", [((1.0, 1.0, 1.0), "one federated"), ((1.0, 50.0, 0.02), "each owner")]
)
@pytest.mark.parametrize("y_scale", [1e-200, 2.0**-700])
def test_tiny_non_constant_targets_fit_under_the_default_transforms(owner_scales, picked, y_scale):
    """Issue 51: targets times 1e-200 (squares underflow) fit as the unscaled ones do, by one
    federated sd and by each owner's own, and predict y_scale times their predictions."""
    tiny, how = _predictions(y_scale, owner_scales)
    plain, plain_how = _predictions(1.0, owner_scales)
    assert picked in how["note"] and picked in plain_how["note"]
    tolerance = 1e-10 * float(plain.abs().max())  # measured 1e-15 (0 for a power of two)
    assert float((tiny / y_scale - plain).abs().max()) <= tolerance


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_tiny_targets_fit_through_the_scikit_learn_door():
    from fedgp.sklearn import FederatedGPRegressor

    fed = _federation(1.0, 1.0)
    X = torch.cat([c.X for c in fed]).numpy()
    y = torch.cat([c.y for c in fed]).numpy()
    groups = np.repeat([0, 1, 2], 20)
    X_new = np.random.default_rng(3).uniform(size=(5, 2))
    plain = FederatedGPRegressor(rounds=3, seed=1).fit(X, y, groups=groups).predict(X_new, groups=np.zeros(5))
    tiny = FederatedGPRegressor(rounds=3, seed=1).fit(X, y * 1e-200, groups=groups)
    got = tiny.predict(X_new, groups=np.zeros(5))
    np.testing.assert_allclose(got / 1e-200, plain, rtol=0, atol=1e-10 * np.abs(plain).max())


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
