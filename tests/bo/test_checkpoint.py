"""A BO loop stopped and resumed from a BOCheckpoint goes on exactly as the unbroken loop: the same
proposals, evaluations, history and (federated BO) shared state; a folder written for other owners,
a damaged file or a wrong key is refused."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp import GPSpec
from fedgp.bo import DPFTSDE, FTS, BOCheckpoint, BOLoop, FederatedBO, LocalBO, Owner, RandomSearch
from fedgp.bo.checkpoint import LOOP_FILE
from fedgp.bo.synthetic import shared_prior_owners
from fedgp.errors import FileFormatError, InputError
from fedgp.strategies import FGPR

TIMES = ["seconds_propose", "seconds_update"]


def owners():
    """Three owners with noiseless objectives: an objective is the owner's code, given again on
    resume, so it must not depend on how often it was called."""
    return [
        Owner(o.id, o.truth, o.bounds, truth=o.truth, optimum=o.optimum)
        for o in shared_prior_owners(3, dim=1, lengthscale=0.2, seed=4)
    ]


METHODS = {
    "federated": lambda: FederatedBO(GPSpec(), FGPR(), rounds=2, initial_rounds=6, engine="sequential"),
    "local": lambda: LocalBO(),
    "fts": lambda: FTS(lengthscale=0.2, features=30, target_features=40, candidates=64),
    "dp-fts-de": lambda: DPFTSDE(lengthscale=0.2, features=30, target_features=40, candidates=64),
    "random": lambda: RandomSearch(),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_resumed_loop_goes_on_as_the_unbroken_one(name, tmp_path):
    unbroken = BOLoop(owners(), METHODS[name](), 4, seed=2).run()
    BOLoop(owners(), METHODS[name](), 2, seed=2, callbacks=[BOCheckpoint(tmp_path / "run")]).run()
    resumed_loop = BOLoop(owners(), METHODS[name](), 4, seed=2, callbacks=[BOCheckpoint(tmp_path / "run")])
    resumed = resumed_loop.run()
    a, b = unbroken.history.drop(columns=TIMES), resumed.history.drop(columns=TIMES)
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == 5 * 3
    for column in a.columns:
        assert a[column].tolist() == b[column].tolist(), column
    for mine, theirs in zip(unbroken.owners, resumed.owners):
        assert torch.equal(mine.X, theirs.X) and torch.equal(mine.y, theirs.y)
    if name == "federated":
        for key, value in unbroken.method.result.state.items():
            assert torch.equal(resumed.method.result.state[key], value), key


def test_a_folder_written_for_other_owners_or_seed_is_refused(tmp_path):
    BOLoop(owners(), RandomSearch(), 1, seed=2, callbacks=[BOCheckpoint(tmp_path)]).run()
    with pytest.raises(InputError, match="written for owners"):
        BOLoop(owners()[:2], RandomSearch(), 2, seed=2, callbacks=[BOCheckpoint(tmp_path)]).run()
    with pytest.raises(InputError, match="written for seed 2, this loop has 3"):
        BOLoop(owners(), RandomSearch(), 2, seed=3, callbacks=[BOCheckpoint(tmp_path)]).run()
    with pytest.raises(InputError, match="written for method 'random', this loop has 'local'"):
        BOLoop(owners(), LocalBO(), 2, seed=2, callbacks=[BOCheckpoint(tmp_path)]).run()


def test_a_keyed_checkpoint_needs_its_key(tmp_path):
    BOLoop(owners(), RandomSearch(), 1, callbacks=[BOCheckpoint(tmp_path, key="lab secret")]).run()
    for key in (None, "another"):
        with pytest.raises(FileFormatError):
            BOLoop(owners(), RandomSearch(), 2, callbacks=[BOCheckpoint(tmp_path, key=key)]).run()
    BOLoop(owners(), RandomSearch(), 2, callbacks=[BOCheckpoint(tmp_path, key="lab secret")]).run()


def test_a_method_that_keeps_state_of_its_own_must_say_how_to_resume(tmp_path):
    class Counting(RandomSearch):
        name = "random"
        stateless = False

    BOLoop(owners(), RandomSearch(), 1, callbacks=[BOCheckpoint(tmp_path)]).run()
    with pytest.raises(InputError, match="Counting does not resume from a BO checkpoint"):
        BOLoop(owners(), Counting(), 2, callbacks=[BOCheckpoint(tmp_path)]).run()


def test_bad_settings_are_refused():
    with pytest.raises(InputError, match="every"):
        BOCheckpoint("x", every=0)


@settings(max_examples=25, deadline=None)
@given(position=st.integers(0, 10_000), value=st.integers(0, 255))
def test_a_damaged_checkpoint_is_refused_never_misread(tmp_path_factory, position, value):
    folder = tmp_path_factory.mktemp("bo")
    BOLoop(owners(), RandomSearch(), 1, callbacks=[BOCheckpoint(folder)]).run()
    data = bytearray((folder / LOOP_FILE).read_bytes())
    position %= len(data)
    if data[position] == value:
        value = (value + 1) % 256
    data[position] = value
    (folder / LOOP_FILE).write_bytes(bytes(data))
    with pytest.raises((FileFormatError, InputError)):
        BOLoop(owners(), RandomSearch(), 2, callbacks=[BOCheckpoint(folder)]).run()
