"""A multi-output result saved and loaded (issue 52, item 1): the file describes the task structure
(T, rank, LMC terms, each IndexKernel) in the same allow-listed JSON as any spec, holds the per-output
transforms, and a loaded result predicts as the fitted one; a malformed task field is refused, naming
the file and the field."""

from __future__ import annotations

import gpytorch
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data.client import Federation
from fedgp.data.outputs import outputs_client
from fedgp.errors import FileFormatError
from fedgp.models import MultiOutputSpec, output_rows
from fedgp.models.spec_io import build_spec, check_round_trip
from tests.export.test_file_bounds import refused, reseal

QUIET = [fedgp.run.Progress(False)]
SPECS = {
    "icm": lambda: MultiOutputSpec(outputs=2, rank=1),
    "independent, a noise per output": lambda: MultiOutputSpec(outputs=2, rank=0, output_noise=True),
    "lmc of two kernels, a shared mean": lambda: MultiOutputSpec(
        [gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel(nu=1.5)],
        gpytorch.means.ConstantMean(),
        outputs=2,
    ),
}


def _owners() -> Federation:
    """3 owners of 2 correlated outputs in different units, each missing some outputs."""
    clients = []
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        X = torch.rand(25, 2, generator=g, dtype=torch.float64)
        f = torch.sin(5 * X[:, 0]) + X[:, 1]
        Y = torch.stack([f, 40 * f + 300], 1) + 0.05 * torch.randn(25, 2, generator=g, dtype=torch.float64)
        Y[k::3, k % 2] = float("nan")
        clients.append(outputs_client(X, Y, id=f"owner-{k}"))
    return Federation(clients)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder, fed, out = tmp_path_factory.mktemp("multi"), _owners(), {}
    for name, make in SPECS.items():
        result = fedgp.fit(make(), fed, rounds=4, engine="sequential", seed=0, callbacks=QUIET)
        out[name] = (result, result.save(folder / f"{len(out)}.fgp"))
    return fed, out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_loaded_multi_output_result_predicts_as_the_fitted_one(saved, name):
    """Same spec (type, T, rank, terms, state), same per-output transforms, and the same predictions
    (mean and variance of y, to 1e-12) for a training owner and for a new one. On the old code
    ``save`` refused every MultiOutputSpec."""
    fed, results = saved
    result, path = results[name]
    loaded = fedgp.load(path)
    assert isinstance(loaded.spec, MultiOutputSpec)
    for attr in ("outputs", "rank", "terms"):
        assert getattr(loaded.spec, attr) == getattr(result.spec, attr)
    assert type(loaded.spec.likelihood) is type(result.spec.likelihood)
    assert loaded.state.allclose(result.state, rtol=0.0, atol=0.0)
    assert torch.equal(loaded.transform.y_scale, result.transform.y_scale)  # one sd per output
    assert loaded.transform.y_scale.shape == (2,)
    rows = output_rows(torch.rand(6, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64), 2)
    owner = fed[1]
    newcomer = outputs_client(owner.X[:8, :-1], torch.randn(8, 2, dtype=torch.float64) + 1.0, id="new")
    for client, asked in ((owner, owner.id), (newcomer, newcomer)):
        mean, var = result.predict(rows, client=asked, observation_noise=True)
        again, var_again = loaded.predict(rows, client=client, observation_noise=True)
        assert torch.allclose(again, mean, rtol=1e-12, atol=1e-12)
        assert torch.allclose(var_again, var, rtol=1e-12, atol=0.0)
        if client is owner:  # in the data's units: the owner's output 1 is 40 f + 300
            assert float(again.reshape(6, 2)[:, 1].mean()) > 200


def test_a_keyed_multi_output_file_needs_its_key(saved, tmp_path):
    fed, results = saved
    result, _ = results["icm"]
    path = result.save(tmp_path / "keyed.fgp", key="secret")
    assert fedgp.load(path, key="secret").state.allclose(result.state, rtol=0.0, atol=0.0)
    with pytest.raises(FileFormatError):
        fedgp.load(path)


def test_the_description_round_trips_for_every_structure():
    """describe -> build gives the same spec: the checked round trip passes (it refused before)."""
    for make in SPECS.values():
        spec = make().for_inputs(3)
        desc = check_round_trip(spec)
        rebuilt = build_spec(desc, dict(spec.initial_state()))
        assert isinstance(rebuilt, MultiOutputSpec) and rebuilt.names == spec.names
        assert rebuilt.initial_state().allclose(spec.initial_state(), rtol=0.0, atol=0.0)


def test_a_task_covariance_the_spec_cannot_rebuild_is_refused_at_save():
    """A changed IndexKernel constraint is not what MultiOutputSpec builds: save refuses it instead of
    writing a file that would load with another constraint."""
    spec = MultiOutputSpec(outputs=2).for_inputs(2)
    spec.task_kernel.register_constraint("raw_var", gpytorch.constraints.GreaterThan(0.5))
    with pytest.raises(fedgp.errors.InputError, match="task_kernels"):
        check_round_trip(spec)


# -- crafted files ---------------------------------------------------------------------------------
def _tasks(h):
    return h["spec"]["multi_output"]


def _outside(low: int, high: int):
    """Values that are no integer in [low, high]: other integers, floats, strings, booleans, null, lists."""
    return st.one_of(
        st.integers(max_value=low - 1),
        st.integers(min_value=high + 1),
        st.floats(allow_nan=True),
        st.text(max_size=4),
        st.booleans(),
        st.none(),
        st.lists(st.integers(0, 3), max_size=2),
    )


def _other_than(value: int):
    """Anything but ``value``: wrong types, and integers that are in range but not the file's."""
    return st.one_of(_outside(1, 3000), st.integers(1, 3000).filter(lambda v: v != value))


LMC, OWN_NOISE = "lmc of two kernels, a shared mean", "independent, a noise per output"
BAD_TERMS = st.one_of(_outside(1, 256), st.integers(3, 256))  # the file's LMC has 2
KERNEL_JUNK = st.one_of(
    st.none(),
    st.integers(),
    st.lists(st.dictionaries(st.sampled_from(["class", "num_tasks", "rank"]), st.integers(0, 3)), max_size=2),
)
# field -> (where it lives in the header, what a forger may put there, which file, the name refused)
CORRUPT = {
    "outputs": (_tasks, "outputs", _other_than(2), "icm", "spec.multi_output.outputs"),
    "rank": (_tasks, "rank", _outside(0, 2), "icm", "spec.multi_output.rank"),
    "terms": (_tasks, "terms", BAD_TERMS, LMC, "spec.multi_output.terms"),
    "task_kernels": (_tasks, "task_kernels", KERNEL_JUNK, "icm", "spec.multi_output.task_kernels"),
    "mean.outputs": (lambda h: h["spec"]["mean"], "outputs", _other_than(2), "icm", "spec.mean.outputs"),
    "likelihood.outputs": (
        lambda h: h["spec"]["likelihood"], "outputs", _other_than(2), OWN_NOISE, "spec.likelihood.outputs"
    ),
}  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_malformed_task_field_is_refused_naming_the_file_and_the_field(saved, tmp_path, data):
    """Any value of a task field that is not the saved structure's is refused at load with a
    FileFormatError naming the file and that field (never a GPyTorch error, never a loaded model)."""
    _, results = saved
    field = data.draw(st.sampled_from(sorted(CORRUPT)), label="field")
    node, key, values, which, named = CORRUPT[field]
    value = data.draw(values, label="value")
    path = reseal(results[which][1], tmp_path / "crafted.fgp", lambda h: node(h).__setitem__(key, value))
    refused(path, named)


def test_a_missing_or_malformed_multi_output_entry_is_refused(saved, tmp_path):
    _, results = saved
    icm = results["icm"][1]
    path = reseal(icm, tmp_path / "a.fgp", lambda h: h["spec"].pop("multi_output"))
    refused(path, "spec.mean is a TaskMean", "no multi_output entry")
    path = reseal(icm, tmp_path / "b.fgp", lambda h: h["spec"].update(multi_output=[2, 1, 1]))
    refused(path, "spec.multi_output must be a JSON object")
    # a consistent-looking rank 2 whose task kernel says rank 1, and whose stored W is (2, 1)
    path = reseal(icm, tmp_path / "c.fgp", lambda h: _tasks(h).update(rank=2))
    refused(path, "spec.multi_output.task_kernels")

    # the output column's input map must leave it alone; the outcome map is one mean and sd per output
    def scaled_column(tensors):
        tensors["transform/x_scale"] = torch.cat([tensors["transform/x_scale"][:-1], torch.tensor([2.0])])

    path = reseal(icm, tmp_path / "d.fgp", tensor_fn=scaled_column)
    refused(path, "must leave the output column", "scale 2")

    def one_sd(tensors):
        for name in ("transform/y_offset", "transform/y_scale"):
            tensors[name] = tensors[name][:1]

    path = reseal(icm, tmp_path / "e.fgp", tensor_fn=one_sd)
    refused(path, "'transform/y_offset'", "expected (2,)")
    own = reseal(
        icm, tmp_path / "f.fgp", lambda h: h["transforms"]["settings"].update({"transform/y_local": True})
    )
    refused(own, "transforms.settings ['transform/y_local'] is set")


def test_a_one_output_spec_may_not_name_the_task_modules(tmp_path):
    """TaskMean and OutputNoise read the output column; a one-output file naming them is refused."""
    draws = fedgp.synthetic.gp_federation(num_clients=2, n=10, d=1, seed=0)
    one = fedgp.fit(draws.spec, draws.federation, rounds=1, engine="sequential", callbacks=QUIET)
    path = one.save(tmp_path / "one.fgp")
    crafted = reseal(
        path,
        tmp_path / "crafted.fgp",
        lambda h: h["spec"].update(likelihood={"class": "OutputNoise", "outputs": 1}),
    )
    refused(crafted, "spec.likelihood is a OutputNoise", "no multi_output entry")
    assert isinstance(fedgp.load(path).spec, fedgp.GPSpec)
