"""Table 2 of Yue & Kontar: NASA C-MAPSS, new engines personalised with no further training.

Protocol (paper §6, decisions from the digest §6.18):

* FD001 training file (100 run-to-failure engines); sensors s2 (T24) and s7 (P30), each on its own.
* ``x = cycle / 100`` for every engine (one shared time axis); ``y`` standardised per engine.
* Each repeat: a random 60/40 split of the engines. FGPR is trained on the 60 (one client per
  engine). Each of the 40 test engines conditions the final global state on a random half of its
  own series and predicts the other half, with no training. Metric: per-engine RMSE of that half;
  its mean and its std across the 40 engines (both ×10, as in the paper), averaged over repeats.
* Baselines trained by FedAvg on the same 60 engines, predicting each test half from the global
  model (no personalisation, as in the paper): a polynomial (degree chosen on 12 validation engines
  held out of the 60) and a 2-hidden-layer MLP. ``LocalGP`` fits a GP to each test engine's observed
  half alone (no federation), which shows what the shared prior adds.
* Beyond the paper: NLL and 95% coverage of every method. The point predictors get a Gaussian
  predictive with their residual variance on the validation engines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from fedgp.baselines import FedAvgMLP, FedAvgPolynomial, LocalGP, select_degree
from fedgp.baselines.gp import client_metrics
from fedgp.data import ClientData
from fedgp.datasets import load_cmapss
from fedgp.datasets.cmapss import _sensor_column
from fedgp.errors import InputError
from fedgp.experiments import summaries
from fedgp.experiments.common import Report, TaskCache, cache_folder, default_engine, fit_study, reproduction
from fedgp.experiments.paper import PAPER_TABLE2
from fedgp.rng import generator
from fedgp.run.progress import progress_bar
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_spec

__all__ = [
    "Table2Settings",
    "Table2Run",
    "PAPER_TABLE2",
    "METHODS",
    "run_table2",
    "summary_table",
    "comparison_table",
    "reproduce",
    "default_engine",
    "fgpr_repeat",
]

#: The methods run for Table 2 (the paper's three, plus LocalGP).
METHODS = ("FGPR", "Polynomial", "Neural", "LocalGP")

CSV_COLUMNS = ["sensor", "method", "rmse_mean_x10", "rmse_std_x10", "nll_mean", "coverage95_mean", "repeats"]

TABLE = summaries.PaperTable(
    keys=("sensor", "method"),
    count="engines",
    categories={"method": METHODS},
    sort_by=("sensor", "method"),
    columns=tuple(CSV_COLUMNS),
    paper=PAPER_TABLE2,
    paper_on=("sensor", "method"),
)


@dataclass(frozen=True)
class Table2Settings:
    """Everything that defines a Table 2 run (the paper gives no FGPR or network settings)."""

    subset: str = "FD001"
    sensors: tuple[str, ...] = ("s2", "s7")
    train_engines: int = 60
    validation_engines: int = 12
    x_scale: float = 100.0
    kernel: str = "rbf"
    rounds: int = 50
    fgpr: FGPR = field(default_factory=lambda: FGPR.authors(local_steps=5, batch_size=32, lr=0.05))
    engine: str | None = None
    degrees: tuple[int, ...] = tuple(range(1, 21))
    poly: dict = field(default_factory=lambda: {"rounds": 300, "local_steps": 10, "lr": 0.3})
    neural: dict = field(
        default_factory=lambda: {
            "hidden": (32, 32),
            "activation": "tanh",
            "rounds": 200,
            "local_steps": 5,
            "batch_size": 32,
            "lr": 0.01,
        }
    )
    local_max_iter: int = 100
    standardize_test: str = "engine"

    def __post_init__(self) -> None:
        if self.standardize_test not in ("engine", "observed"):
            raise InputError("standardize_test must be 'engine' (paper) or 'observed' (leak-free)")

    @classmethod
    def quick(cls) -> Table2Settings:
        """A few rounds and degrees: every code path, not the paper's numbers (CI, notebooks); the
        run time of ``fedgp reproduce table2 --quick`` is in ``fedgp reproduce --help``."""
        return cls(
            rounds=5,
            degrees=(2, 10),
            poly={"rounds": 60, "local_steps": 10, "lr": 0.3},
            neural={
                "hidden": (32, 32),
                "activation": "tanh",
                "rounds": 20,
                "local_steps": 5,
                "batch_size": 32,
                "lr": 0.01,
            },
            local_max_iter=30,
        )


class Table2Run(summaries.TableRun):
    """Results of :func:`run_table2`.

    ``rows``: one per (repeat, sensor, method, test engine) with rmse, nll, coverage95;
    ``per_repeat``: per (repeat, sensor, method) the mean and std across engines; ``details``: per
    (repeat, sensor) the chosen polynomial degree, the FGPR state and the validation variances.
    """

    table = TABLE


summary_table = TABLE.summary
comparison_table = TABLE.comparison


def _test_client(client: ClientData, seed: int, repeat: int, how: str) -> ClientData:
    """A test engine split into an observed half (``X, y``) and a predicted half (``X_test, y_test``).

    The halves are a function of (seed, repeat, unit) only: every method and sensor sees the same.
    ``how="observed"`` re-standardises both halves with the observed half's mean and std (leak-free);
    the default keeps the whole-series standardisation of the paper.
    """
    half = client.split(0.5, generator(seed, "table2-half", repeat, client.metadata["unit"]))
    if how == "observed":
        m0, s0 = client.metadata["y_mean"], client.metadata["y_std"]
        obs, pred = half.y * s0 + m0, half.y_test * s0 + m0
        m, s = float(obs.mean()), float(obs.std(unbiased=False))
        half = ClientData(
            half.X,
            (obs - m) / s,
            id=half.id,
            X_test=half.X_test,
            y_test=(pred - m) / s,
            metadata={**half.metadata, "y_mean": m, "y_std": s},
        )
    return half


def _split(cm, settings: Table2Settings, seed: int, repeat: int):
    """(train, test, validation, fit) engine units and the FGPR seed of one repeat."""
    units = np.array(cm.units("train"))
    perm = generator(seed, "table2-engines", repeat).permutation(units)
    train_units = np.sort(perm[: settings.train_engines])
    test_units = np.sort(perm[settings.train_engines :])
    val_units = np.sort(
        generator(seed, "table2-validation", repeat).choice(
            train_units, settings.validation_engines, replace=False
        )
    )
    fit_units = np.setdiff1d(train_units, val_units)
    fit_seed = int(generator(seed, "table2-fit", repeat).integers(2**31 - 1))
    return train_units, test_units, val_units, fit_units, fit_seed


def _test_clients(cm, settings: Table2Settings, sensor: str, units, seed: int, repeat: int) -> list:
    return [
        _test_client(c, seed, repeat, settings.standardize_test)
        for c in cm.federation(sensor, units=units, x_scale=settings.x_scale)
    ]


def _fit_fgpr(cm, settings: Table2Settings, sensor: str, units, fit_seed: int, engine: str):
    spec = gp_spec(1, settings.kernel, ard=False)
    train = cm.federation(sensor, units=units, x_scale=settings.x_scale)
    return fit_study(spec, train, settings.fgpr, settings.rounds, fit_seed, engine)


def fgpr_repeat(
    settings: Table2Settings, seed: int = 0, repeat: int = 0, root=None, engine: str | None = None
) -> dict:
    """FGPR alone for one repeat: ``{sensor: (learned state, per-test-engine RMSE)}`` (pinned by the
    tests, so a refactor of the round protocol cannot move Table 2)."""
    cm = load_cmapss(settings.subset, root=root)
    train_units, test_units, _, _, fit_seed = _split(cm, settings, seed, repeat)
    out = {}
    for sensor in settings.sensors:
        result = _fit_fgpr(cm, settings, sensor, train_units, fit_seed, engine or default_engine())
        tests = _test_clients(cm, settings, sensor, test_units, seed, repeat)
        out[sensor] = (result.state, [result.posterior(c.X_test, c).rmse(c.y_test) for c in tests])
    return out


def _one_repeat(cm, settings: Table2Settings, seed: int, repeat: int, engine: str) -> tuple[list, list]:
    train_units, test_units, val_units, fit_units, fit_seed = _split(cm, settings, seed, repeat)
    spec = gp_spec(1, settings.kernel, ard=False)
    records, details = [], []
    for sensor in settings.sensors:
        train = cm.federation(sensor, units=train_units, x_scale=settings.x_scale)
        fit_fed = cm.federation(sensor, units=fit_units, x_scale=settings.x_scale)
        val_fed = cm.federation(sensor, units=val_units, x_scale=settings.x_scale)
        tests = _test_clients(cm, settings, sensor, test_units, seed, repeat)

        result = _fit_fgpr(cm, settings, sensor, train_units, fit_seed, engine)
        degree, degree_table = select_degree(fit_fed, val_fed, settings.degrees, **settings.poly)
        poly_var = float(degree_table.set_index("degree").loc[degree, "val_mse"])
        poly = FedAvgPolynomial(degree=degree, noise_variance=poly_var, **settings.poly).fit(train)
        # the network's residual variance, from a network trained without the validation engines
        neural_var = FedAvgMLP(seed=fit_seed, **settings.neural).fit(fit_fed).mse(val_fed)
        neural = FedAvgMLP(seed=fit_seed, noise_variance=neural_var, **settings.neural).fit(train)
        local = LocalGP(spec, max_iter=settings.local_max_iter)

        for c in tests:
            predictions = {
                "FGPR": result.posterior(c.X_test, c),
                "Polynomial": poly.predict(c.X_test, c),
                "Neural": neural.predict(c.X_test, c),
                "LocalGP": local.predict(c.X_test, c),
            }
            for method, pred in predictions.items():
                records.append(
                    {
                        "repeat": repeat,
                        "sensor": sensor,
                        "method": method,
                        "unit": c.id,
                        "n_observed": c.n,
                        "n_predicted": len(c.y_test),
                        **client_metrics(pred, c.y_test),
                    }
                )
        details.append(
            {
                "repeat": repeat,
                "sensor": sensor,
                "poly_degree": degree,
                "poly_val_mse": poly_var,
                "neural_val_mse": neural_var,
                "localgp_fallbacks": local.fallbacks_,
                "engine": engine,
                **{f"fgpr.{k}": float(np.ravel(v)[0]) for k, v in result.state.to_dict().items()},
            }
        )
    return records, details


def run_table2(
    repeats: int = 30,
    seed: int = 0,
    settings: Table2Settings | None = None,
    root: str | os.PathLike | None = None,
    progress: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Table2Run:
    """Run the Table 2 protocol ``repeats`` times (see the module docstring).

    ``cache_dir``: each finished repeat is saved there and reused by a later call with the same
    settings, so a long run can be interrupted and resumed.
    """
    settings = Table2Settings() if settings is None else settings
    engine = settings.engine or default_engine()
    cm = load_cmapss(settings.subset, root=root)
    cache = TaskCache(cache_dir, settings, seed)
    records, details = [], []
    for repeat in progress_bar(range(repeats), desc="Table 2 repeats", progress=progress, leave=True):
        frames = cache.load(f"repeat{repeat}")
        if frames is None:
            frames = tuple(pd.DataFrame(part) for part in _one_repeat(cm, settings, seed, repeat, engine))
            cache.save(f"repeat{repeat}", frames)
        records.append(frames[0])
        details.append(frames[1])
    per_engine = pd.concat(records, ignore_index=True)
    per_engine["sensor"] = per_engine["sensor"].astype(str)
    return Table2Run(per_engine, pd.concat(details, ignore_index=True), settings)


def reproduce(
    repeats: int | None,
    out_dir: Path,
    seed: int = 0,
    quick: bool = False,
    progress: bool | None = None,
    subset: str | None = None,
    sensors: Sequence[str] | None = None,
) -> list[Path]:
    """``fedgp reproduce table2``: writes table2.csv, table2_per_repeat.csv, table2_details.csv and
    table2.md (ours beside the paper's) into ``out_dir``. With ``FEDGP_CACHE`` set, finished repeats
    are kept in ``$FEDGP_CACHE/table2`` and an interrupted run resumes from them.

    ``subset`` / ``sensors`` (``--subset FD003 --sensors s3 s4``): a held-out setting instead of the
    paper's FD001 with s2 and s7; its files are named ``table2_<subset>_<sensors>*`` (so the paper's
    are never overwritten), and the paper's numbers are shown only for FD001."""
    settings = Table2Settings.quick() if quick else Table2Settings()
    held_out = subset is not None or sensors is not None
    if subset is not None:
        settings = replace(settings, subset=str(subset).upper())
    if sensors is not None:
        if not sensors:
            raise InputError("sensors: give at least one C-MAPSS sensor, e.g. s3 s4")
        settings = replace(settings, sensors=tuple(_sensor_column(s) for s in sensors))
    name = f"table2_{settings.subset}_{'-'.join(settings.sensors)}" if held_out else "table2"
    repeats = (2 if quick else 30) if repeats is None else repeats

    def study() -> Table2Run:
        run = run_table2(repeats, seed, settings, progress=progress, cache_dir=cache_folder(name, quick))
        if settings.subset != "FD001":  # the paper reports FD001 only
            run.table = replace(TABLE, paper=PAPER_TABLE2.iloc[:0])
        return run

    def report(run: Table2Run, minutes: float) -> Report:
        test_engines = int(run.per_repeat["engines"].iloc[0])
        header = (
            f"# Table 2 (NASA C-MAPSS {settings.subset}) — {repeats} repeats"
            f"{' (quick mode)' if quick else ''}\n\n"
            "Mean over repeats (std over repeats in brackets) of the averaged per-engine RMSE ×10 and of "
            f"the std of the per-engine RMSE ×10 across the {test_engines} test engines; NLL and 95% "
            "coverage of the predicted half. Paper: Yue & Kontar, Table 2 (FGPR, Polynomial, Neural; "
            "LocalGP is ours)"
            + ("" if settings.subset == "FD001" else f"; the paper has no {settings.subset} numbers")
            + ".\n\n"
        )
        return run.report(name, header)

    # torch's default threads: the committed Table 2 was computed so
    return reproduction(out_dir, study, report, one_thread=False)
