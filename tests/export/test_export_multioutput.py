"""``to_gpytorch`` of a multi-output result (issue 52, item 1): GPyTorch's Hadamard multitask ExactGP in
the data's units predicts what fedgp predicts; ``to_botorch`` refuses, saying why."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import fedgp
from fedgp.data.outputs import outputs_client
from fedgp.errors import InputTypeError
from fedgp.models import output_rows
from fedgp.transforms import Transforms
from tests.export.test_saved_multioutput import SPECS
from tests.models.test_multioutput import _correlated_owners

QUIET = [fedgp.run.Progress(False)]


@pytest.fixture(scope="module")
def fed():
    """The owners in other units (inputs in [3, 13]), output 1 scaled by 50 and shifted by -20: the
    export must carry the input map and each output's own mean and sd."""
    clients = []
    for c in _correlated_owners(lower=3.0, width=10.0):
        y = c.y.clone()
        y[c.X[:, -1] == 1] = 50 * y[c.X[:, -1] == 1] - 20
        clients.append(type(c)(c.X, y, id=c.id))
    return fedgp.data.Federation(clients)


def _agree(model, result, client, rows):
    """The exported model's f and y at ``rows`` against fedgp's posterior, to 1e-10 (relative)."""
    ours = result.posterior(rows, client=client)
    with torch.no_grad():
        f = model(rows)
        y = model.likelihood(f, rows)
    scale = float(ours.mean.abs().max())
    assert torch.allclose(f.mean, ours.mean, rtol=0.0, atol=1e-10 * scale)
    assert torch.allclose(f.variance, ours.variance_f, rtol=1e-10, atol=1e-12)
    assert torch.allclose(y.variance, ours.variance_y, rtol=1e-10, atol=0.0)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_to_gpytorch_is_gpytorchs_hadamard_model_and_predicts_as_fedgp(fed, name, tmp_path):
    """For a training owner, a new owner, and from a saved and loaded result. On the old code
    to_gpytorch refused every MultiOutputSpec."""
    result = fedgp.fit(SPECS[name](), fed, rounds=5, engine="sequential", seed=0, callbacks=QUIET)
    rows = output_rows(
        3 + 10 * torch.rand(7, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64), 2
    )
    model = result.to_gpytorch(1)
    assert isinstance(model, gpytorch.models.ExactGP) and not model.training
    assert isinstance(model.likelihood, gpytorch.likelihoods.HadamardGaussianLikelihood)
    _agree(model, result, 1, rows)
    g = torch.Generator().manual_seed(5)
    X_new = 3 + 10 * torch.rand(12, 1, generator=g, dtype=torch.float64)
    Y_new = torch.stack([torch.sin(X_new[:, 0]), 50 * torch.cos(X_new[:, 0])], 1)
    Y_new[::2, 1] = float("nan")
    newcomer = outputs_client(X_new, Y_new, id="new")
    _agree(result.to_gpytorch(newcomer), result, newcomer, rows)
    loaded = fedgp.load(result.save(tmp_path / "m.fgp"))
    _agree(loaded.to_gpytorch(newcomer), result, newcomer, rows)


def test_to_gpytorch_without_transforms(fed):
    result = fedgp.fit(
        SPECS["icm"](),
        fed,
        rounds=3,
        engine="sequential",
        seed=0,
        callbacks=QUIET,
        transforms=Transforms(None, None),
    )
    rows = output_rows(torch.linspace(3, 13, 5, dtype=torch.float64)[:, None], 2)
    _agree(result.to_gpytorch(0), result, 0, rows)


def test_to_botorch_refuses_a_multi_output_result_saying_why(fed):
    pytest.importorskip("botorch")
    result = fedgp.fit(SPECS["icm"](), fed, rounds=1, engine="sequential", seed=0, callbacks=QUIET)
    with pytest.raises(InputTypeError, match="PositiveIndexKernel"):
        result.to_botorch(0)
