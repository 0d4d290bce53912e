"""One set of defaults (``fedgp.defaults``): every door reads it, and the docs' table is it.

The cross-door fit of one table is ``tests/test_doors.py``; here, the doors' own defaults."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import gpytorch
import pytest
import torch

import fedgp
from fedgp import defaults
from fedgp.cli import build_parser
from fedgp.errors import InputError, InputTypeError

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_table_is_the_defaults_module():
    text = (ROOT / "docs" / "own-data.md").read_text()
    found = re.search(r"<!-- defaults-table: begin[^\n]*-->\n(.*?)<!-- defaults-table: end -->", text, re.S)
    assert found, "docs/own-data.md lost its defaults table markers"
    assert found.group(1) == defaults.markdown_table(), "regenerate with fedgp.defaults.markdown_table()"


def test_python_reads_the_defaults():
    signature = inspect.signature(fedgp.fit).parameters
    python = defaults.for_door("python")
    for name in ("rounds", "engine", "seed", "transforms", "stop"):
        assert signature[name].default == python[name], name
    assert inspect.signature(fedgp.run.Run).parameters["stop"].default is defaults.STOP
    # GPSpec(): the named kernel with one lengthscale per feature, sized where fit meets the data.
    spec = fedgp.GPSpec()
    assert spec.sizes_later and isinstance(spec.mean, gpytorch.means.ZeroMean)
    sized = spec.for_inputs(3)
    base = sized.kernel.base_kernel
    assert isinstance(sized.kernel, gpytorch.kernels.ScaleKernel) and isinstance(
        base, gpytorch.kernels.RBFKernel
    )
    assert base.ard_num_dims == 3 and sized.initial_state()["covar_module.base_kernel.lengthscale"].shape == (
        1,
        3,
    )
    assert sized.for_inputs(5) is sized  # built for 3: the engines' width check speaks for a mismatch


def test_scikit_learn_reads_the_defaults():
    pytest.importorskip("sklearn")
    from fedgp.sklearn import FederatedGPRegressor

    params = FederatedGPRegressor().get_params()
    sklearn = defaults.for_door("sklearn")
    for name in ("kernel", "ard", "mean", "strategy", "rounds", "engine", "seed", "transforms", "stop"):
        assert params[name] == sklearn[name], name


def test_the_command_line_reads_the_defaults():
    args = build_parser().parse_args(["fit", "d.csv", "--target", "y", "--group", "g"])
    cli = defaults.for_door("cli")
    for name in ("kernel", "ard", "mean", "strategy", "rounds", "engine", "seed", "stop", "hide_discrete"):
        assert getattr(args, name) == cli[name], name


def test_the_flower_app_reads_the_defaults():
    pytest.importorskip("flwr")
    from fedgp.flower.app import RUN_CONFIG, AppSettings

    flower = defaults.for_door("flower")
    keys = {
        name: name for name in ("kernel", "ard", "mean", "strategy", "rounds", "seed", "transforms", "stop")
    }
    keys["hide_discrete"] = "hide-discrete"
    for name, key in keys.items():
        assert RUN_CONFIG[key] == flower[name], name
    options = AppSettings({}).fit_options()
    assert options["transforms"].hide_discrete is True and options["stop"] == "auto"
    assert AppSettings({"hide-discrete": False}).fit_options()["transforms"].hide_discrete is False


@pytest.mark.parametrize("name, nu", [("rbf", None), ("matern12", 0.5), ("matern32", 1.5), ("matern52", 2.5)])
def test_gpspec_takes_kernel_names(name, nu):
    """``GPSpec(kernel="matern52")`` raised AttributeError ('str' object has no attribute
    'named_children') at fit; the CLI and scikit-learn took names."""
    spec = fedgp.GPSpec(kernel=name.upper() if nu == 2.5 else name)
    draws = fedgp.synthetic.gp_federation(num_clients=2, n=12, d=2, seed=0)
    result = fedgp.fit(spec, draws.federation, rounds=2, callbacks=[fedgp.run.Progress(False)])
    base = result.spec.kernel.base_kernel
    assert base.ard_num_dims == 2 and getattr(base, "nu", None) == nu
    iso = fedgp.GPSpec(kernel=name, ard=False)
    assert not iso.sizes_later and iso.kernel.base_kernel.ard_num_dims is None


def test_named_modules_keep_initial_values_and_fixed_names_when_sized():
    spec = fedgp.GPSpec(
        mean="constant",
        initial_values={
            "covar_module.base_kernel.lengthscale": [[0.1, 0.2, 0.3]],
            "mean_module.constant": 2.0,
        },
        fixed=["likelihood.noise_covar.noise"],
    )
    sized = spec.for_inputs(3)
    start = sized.initial_state()
    torch.testing.assert_close(start["covar_module.base_kernel.lengthscale"], torch.tensor([[0.1, 0.2, 0.3]],
                               dtype=torch.float64))  # fmt: skip
    assert float(start["mean_module.raw_constant"]) == 2.0
    assert sized.trainable_names == ("mean_module.raw_constant", "covar_module.outputscale",
                                     "covar_module.base_kernel.lengthscale")  # fmt: skip
    with pytest.raises(InputError, match=r"spec.for_inputs\(d\).state"):
        spec.state({"covar_module.base_kernel.lengthscale": [[0.1, 0.2, 0.3]]})


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"kernel": "gauss"}, InputError, "kernel 'gauss': use one of rbf, matern12, matern32, matern52"),
        ({"mean": "quadratic"}, InputError, "mean 'quadratic': use one of constant, zero, linear"),
        ({"kernel": 3}, InputTypeError, "kernel must be a GPyTorch kernel .* or a name, got int"),
        ({"ard": "yes"}, InputTypeError, "ard must be True or False"),
        ({"input_dim": 0}, InputError, "input_dim must be a positive number"),
        ({"initial_values": {"covar_module.lengthscale": 1.0}}, KeyError, "unknown hyper-parameter"),
    ],
)
def test_bad_names_are_refused_where_the_spec_is_made(kwargs, error, match):
    with pytest.raises(error, match=match):
        fedgp.GPSpec(**kwargs)


def test_a_remote_federation_needs_a_width_for_named_modules():
    class Remote(fedgp.engines.base.Engine):  # hosts no local clients (as a Flower grid)
        run = start = ops = None

    with pytest.raises(InputError, match=r"GPSpec\(\.\.\., input_dim=d\)"):
        fedgp.fit(fedgp.GPSpec(), None, engine=Remote.__new__(Remote), rounds=1)
