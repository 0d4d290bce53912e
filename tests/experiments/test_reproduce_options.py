"""``fedgp reproduce`` options for held-out settings: parsing, refusal, and that they reach the run."""

import numpy as np
import pandas as pd
import pytest

import fedgp.experiments.table3 as table3
from fedgp.cli import build_parser, main
from fedgp.datasets.sarcos import SARCOS
from fedgp.experiments.table1 import resolve_function
from fedgp.experiments.table3 import Table3Settings
from fedgp.synthetic.multifidelity import MultiFidelityFunction, multifidelity_federation
from tests.datasets.real import require_real_data


# A user's own function with four levels (the extension point): module level, so workers import it.
def _level(shift):
    def f(X):
        return np.sin(8 * X[:, 0]) + shift * X[:, 0] ** 2

    return f


FOUR_LEVELS = MultiFidelityFunction(
    "wavy4", [[0.0, 1.0]], tuple(_level(s) for s in (3.0, 2.0, 1.0, 0.0)), (30, 20, 15, 10)
)


def test_the_options_parse():
    args = build_parser().parse_args(["reproduce", "table2", "--subset", "FD003", "--sensors", "s3", "s4"])
    assert (args.subset, args.sensors, args.outputs, args.partition_seed) == (
        "FD003",
        ["s3", "s4"],
        None,
        None,
    )
    args = build_parser().parse_args(["reproduce", "table3", "--outputs", "2", "4", "--partition-seed", "7"])
    assert (args.outputs, args.partition_seed, args.subset) == ([2, 4], 7, None)
    args = build_parser().parse_args(["reproduce", "table1", "--function", "park", "mod:fn"])
    assert args.function == ["park", "mod:fn"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["table3", "--subset", "FD003"],
            "--subset is not an option of table3; its options are --outputs, --partition-seed",
        ),
        (["table1", "--sensors", "s3"], "--sensors is not an option of table1; its options are --function"),
        (["demo-free", "--outputs", "1"], "unknown experiment"),
        (["failures", "--function", "park"], "failures has no setting options"),
    ],
)
def test_an_option_the_experiment_does_not_take_is_refused(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(["reproduce", *argv, "--quick"])


def test_table2_runs_the_held_out_subset_and_sensors(tmp_path, capsys):
    require_real_data("cmapss/train_FD003.txt", "cmapss/test_FD003.txt", "cmapss/RUL_FD003.txt")
    argv = ["reproduce", "table2", "--quick", "--repeats", "1", "--subset", "FD003", "--sensors", "s3", "T50"]
    assert main([*argv, "--out", str(tmp_path), "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "table2_FD003_s3-s4.csv")  # T50 is s4; the paper's table2.csv stays
    assert set(table["sensor"]) == {"s3", "s4"} and not (tmp_path / "table2.csv").exists()
    md = (tmp_path / "table2_FD003_s3-s4.md").read_text()
    assert "C-MAPSS FD003" in md and "no FD003 numbers" in md
    assert "| s3 | FGPR |" in md and "| — |" in md  # no paper numbers beside another subset's
    details = pd.read_csv(tmp_path / "table2_FD003_s3-s4_details.csv")
    assert set(details["sensor"]) == {"s3", "s4"}
    # Refused input: one line on stderr, exit status 2 (as every fedgp command).
    assert main(["reproduce", "table2", "--quick", "--sensors", "x9", "--out", str(tmp_path)]) == 2
    assert "unknown C-MAPSS sensor 'x9'" in capsys.readouterr().err


def test_table3_partition_seed_is_apart_from_the_training_seed(monkeypatch):
    """The split seed of a task depends on the partition seed only; left out, on the master seed
    (so the committed tables keep their numbers)."""
    seeds = []

    class Seen(Exception):
        pass

    def spy(self, output, partition, num_devices, test_fraction, seed, standardize_y):
        seeds.append(seed)
        raise Seen

    monkeypatch.setattr(SARCOS, "federation", spy)
    monkeypatch.setattr(table3, "_sarcos", lambda root, protocol: SARCOS.__new__(SARCOS))

    def split_seed(seed, partition_seed):
        settings = Table3Settings(partition_seed=partition_seed)
        with pytest.raises(Seen):
            table3._task(settings, seed, 0, "iid", None, "batched", None)
        return seeds[-1]

    assert split_seed(0, 5) == split_seed(1, 5) != split_seed(0, 6)
    assert split_seed(3, None) == split_seed(3, 3) != split_seed(4, None)


def test_table3_runs_the_chosen_outputs(tmp_path, capsys):
    require_real_data("sarcos/sarcos_inv_test.mat")
    argv = ["reproduce", "table3", "--quick", "--repeats", "1", "--outputs", "2", "--partition-seed", "7"]
    assert main([*argv, "--out", str(tmp_path), "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "table3_outputs2_pseed7.csv")
    assert set(table["output"]) == {2} and not (tmp_path / "table3.csv").exists()
    assert (
        "partitions and splits drawn from seed 7; training from seed 0"
        in (tmp_path / "table3_outputs2_pseed7.md").read_text()
    )
    assert main(["reproduce", "table3", "--quick", "--outputs", "8", "--out", str(tmp_path)]) == 2
    assert "outputs: SARCOS has torques 1..7; got [8]" in capsys.readouterr().err


def test_table1_runs_a_users_function_with_four_levels(tmp_path):
    assert FOUR_LEVELS.level_names == ("low", "level1", "level2", "high")
    problem = multifidelity_federation(FOUR_LEVELS, n_test=5, seed=0)
    assert [c.id for c in problem.federation] == ["high", "level2", "level1", "low"]
    name = f"{__name__}:FOUR_LEVELS"
    assert resolve_function(name) is FOUR_LEVELS
    argv = ["reproduce", "table1", "--quick", "--repeats", "1", "--function", name, "forrester"]
    assert main([*argv, "--out", str(tmp_path), "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "table1_wavy4-forrester.csv")
    assert set(table["function"]) == {"wavy4", "forrester"}
    assert {"FGPR", "AR1", "NARGP"} <= set(table["method"]) and table["rmse_mean"].notna().all()
    assert not (tmp_path / "table1.csv").exists() and (tmp_path / "table1_wavy4-forrester.md").exists()


@pytest.mark.parametrize(
    "name, error, message",
    [
        (
            "nosuch",
            ValueError,
            "function 'nosuch': not one of .*forrester.*give your own as module:attribute",
        ),
        ("fedgp.nosuchmodule:f", ValueError, "cannot import it"),
        ("fedgp:fit", TypeError, "is a function, not a fedgp.synthetic.multifidelity.MultiFidelityFunction"),
    ],
)
def test_a_bad_function_is_named(name, error, message):
    with pytest.raises(error, match=message):
        resolve_function(name)


def test_a_function_needs_two_levels():
    with pytest.raises(ValueError, match="one: 2 or more fidelity levels needed, got 1"):
        MultiFidelityFunction("one", [[0.0, 1.0]], (np.sin,), (10,))


def test_caches_written_before_the_partition_seed_still_resume(tmp_path):
    from dataclasses import asdict, replace

    from fedgp.experiments.common import TaskCache

    settings = Table3Settings.quick()
    old = {k: v for k, v in asdict(replace(settings, engine=None)).items() if k != "partition_seed"}
    (tmp_path / "settings.txt").write_text(repr(sorted(old.items())) + " seed=0")  # an older stamp
    TaskCache(tmp_path, settings, 0)  # accepted: an unset partition seed is the run the stamp describes
    with pytest.raises(ValueError, match="holds results of different settings or seed"):
        TaskCache(tmp_path, replace(settings, partition_seed=3), 0)


def test_table1_methods_runs_only_those(tmp_path, capsys):
    argv = ["reproduce", "table1", "--quick", "--repeats", "1", "--function", "forrester"]
    argv += ["--out", str(tmp_path)]
    assert main([*argv, "--methods", "FGPR", "AR1", "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "table1_forrester.csv")
    assert list(table["method"]) == ["FGPR", "AR1"] and table["rmse_mean"].notna().all()
    assert main([*argv, "--methods", "FGPR", "Deep", "--no-progress"]) == 2
    assert "Deep" in capsys.readouterr().err


def test_table1_methods_without_a_sweep_method_skip_the_sweep(tmp_path):
    # NARGP is not one of the sweep's methods: the sweep is not run (rather than all of its own)
    argv = ["reproduce", "table1", "--quick", "--repeats", "1", "--out", str(tmp_path)]
    assert main([*argv, "--methods", "NARGP", "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "table1.csv")
    assert set(table["method"]) == {"NARGP"} and table["rmse_mean"].notna().all()
    assert not (tmp_path / "table1_sweep.csv").exists() and not (tmp_path / "table1_sweep_runs.csv").exists()
    assert "Not run: `--methods` names none of its methods" in (tmp_path / "table1.md").read_text()
