"""An owner's own columns beside the federation's core (fedgp.data.owners): split by name, kept row
for row with the core through splits and transforms, refused where they cannot be told apart."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedgp.data import ClientData, Federation
from fedgp.data.owners import OwnerData, split_core
from fedgp.errors import InputError


def _table(n: int, names: list[str]) -> pd.DataFrame:
    """Column j of row i holds 100 i + j: a value says its row and its column."""
    rows = np.arange(n)[:, None] * 100.0 + np.arange(len(names))[None, :]
    return pd.DataFrame(rows, columns=names)


@given(
    n=st.integers(6, 30),
    extra=st.integers(0, 3),
    order=st.randoms(use_true_random=False),
    fraction=st.floats(0.2, 0.6),
    seed=st.integers(0, 10),
)
def test_split_core_puts_the_core_in_order_and_keeps_each_row_whole(n, extra, order, fraction, seed):
    core = ["a", "b", "c"]
    names = core + [f"own{k}" for k in range(extra)]
    order.shuffle(names)
    frame = _table(n, names)
    y = np.sin(np.arange(n, dtype=float))
    owner = split_core(ClientData(frame, y, id="k"), tuple(core))
    assert owner.feature_names == tuple(core)
    assert torch.equal(owner.X, torch.tensor(frame[core].to_numpy().copy()))
    if extra == 0:
        assert type(owner) is ClientData  # an owner without own columns is today's client
        return
    own = [n for n in names if n not in core]
    assert owner.own_names == tuple(own)
    assert torch.equal(owner.own, torch.tensor(frame[own].to_numpy().copy()))
    parted = owner.split(fraction, seed)
    for X, Z, y_part in ((parted.X, parted.own, parted.y), (parted.X_test, parted.own_test, parted.y_test)):
        rows = X[:, 0] // 100  # every column of a point came from the same row
        assert torch.equal(Z // 100, rows[:, None].expand_as(Z))
        assert torch.allclose(y_part, torch.sin(rows))
    assert parted.n + parted.X_test.shape[0] == n


def test_an_owner_keeps_its_own_columns_through_a_federation_and_the_transforms():
    frame = _table(8, ["a", "z"])
    owner = OwnerData(frame[["a"]], np.arange(8.0) ** 2, id=0, own=frame[["z"]])
    fed = Federation([owner, ClientData(frame[["a"]], np.arange(8.0), id=1)])
    assert fed[0].own_names == ("z",) and torch.equal(fed[0].own, owner.own)
    scaled = fed[0].derived(X=fed[0].X / 7.0)
    assert isinstance(scaled, OwnerData) and torch.equal(scaled.own, owner.own)


def test_a_missing_core_column_or_unnamed_columns_are_refused_naming_the_client():
    frame = _table(6, ["a", "z"])
    with pytest.raises(InputError, match=r"client 'k': missing core feature\(s\) \['b'\]"):
        split_core(ClientData(frame, np.arange(6.0), id="k"), ("a", "b"))
    with pytest.raises(InputError, match="client 'k': its columns have no names"):
        split_core(ClientData(frame.to_numpy(), np.arange(6.0), id="k"), ("a",))


def test_own_columns_that_do_not_fit_the_rows_are_refused_naming_the_field():
    frame = _table(6, ["a", "z"])
    with pytest.raises(InputError, match=r"client 'k', own: must have shape \(6, e\)"):
        OwnerData(frame[["a"]], np.arange(6.0), id="k", own=np.ones((5, 1)))
    with pytest.raises(InputError, match="client 'k', own_test"):
        OwnerData(
            frame[["a"]], np.arange(6.0), id="k", own=frame[["z"]], X_test=np.ones((2, 1)), y_test=np.ones(2)
        )
    with pytest.raises(InputError, match="own contains 1 non-finite"):
        OwnerData(frame[["a"]], np.arange(6.0), id="k", own=np.r_[np.ones(5), np.nan][:, None])
