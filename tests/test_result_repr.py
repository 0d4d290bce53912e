"""``FitResult``'s repr: one short line a notebook can show, not its history's DataFrame."""

import fedgp
from fedgp.run import Progress


def test_a_results_repr_is_one_short_line(tmp_path):
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=10, d=1, seed=0)
    result = fedgp.fit(draws.spec, draws.federation, rounds=30, stop="auto", callbacks=[Progress(False)])
    text = repr(result)
    assert text.startswith("FitResult(FGPR, rounds=") and "\n" not in text and len(text) < 200
    assert "engine=" in text and "clients=3" in text and "train_nll=" in text
    if result.history.attrs.get("stop_reason"):
        assert "stopped=" in text
    result.save(tmp_path / "model.fedgp")
    loaded = repr(fedgp.load(tmp_path / "model.fedgp"))  # no engine: it is not named
    assert loaded.startswith("FitResult(FGPR, rounds=") and "engine=" not in loaded
