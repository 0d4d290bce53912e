"""Table 1's methods on one repeat: fit each on the repeat's data and score it on the HF test points.

``FGPR``; ``FGPR-converged`` (the same FGPR, run until its training NLL stops improving:
``fit(stop=NLLPlateau(patience=100))`` within a budget of 3,000 rounds, :attr:`Protocol.converged`);
``Separate`` (the paper's baseline: the same Adam protocol on the HF client alone, i.e. the number of
steps the HF client takes inside FGPR); ``SeparateMLE`` (converged exact MLE on HF data, L-BFGS with
restarts); ``FGPR-MLE`` (the FGPR objective Σ_k log p(y_k | X_k, θ) maximised to convergence in one
place, then conditioned on HF data: the full-batch optimum of FGPR's objective); ``AR1`` and
``NARGP`` (centralised, :mod:`fedgp.models.multifidelity`); ``MF-DGP`` (the paper's "Deep", Cutajar
et al. 2019, :class:`fedgp.baselines.MFDGP`; centralised; fitted for all repeats of a function at
once as one batched program, :func:`run_batched`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import gpytorch
import pandas as pd

from fedgp.data.client import Federation
from fedgp.errors import ConvergenceWarning, FactorizationError, InputError
from fedgp.experiments.common import fit_study
from fedgp.experiments.table1.protocol import (
    BATCHED_METHODS,
    METHODS,
    RUN_COLUMNS,
    Protocol,
    check_methods,
)
from fedgp.models.multifidelity import AR1, NARGP, mle_with_restarts, rbf_spec
from fedgp.models.posterior import Prediction, condition
from fedgp.synthetic.multifidelity import (
    MultiFidelityFunction,
    MultiFidelityProblem,
    multifidelity_federation,
)

__all__ = ["run_once", "run_batched", "fit_fgpr", "scores"]


def scores(problem: MultiFidelityProblem, method: str, pred: Prediction, seconds: float, **extra) -> dict:
    """One method's row: RMSE, NLL and 95 % coverage at the HF test points, and its fitting time."""
    y = problem.y_test
    return {
        "method": method,
        "rmse": pred.rmse(y),
        "nll": pred.nll(y),
        "coverage95": pred.coverage(y),
        "seconds": seconds,
        **extra,
    }


def fit_fgpr(
    problem: MultiFidelityProblem,
    protocol: Protocol,
    seed: int,
    hf_weight: float | None = None,
    clients: Federation | None = None,
    converge: bool = False,
) -> tuple[Prediction, dict]:
    """FGPR (or, with ``clients``, FGPR on those clients only) under ``protocol``: the prediction at
    the HF test points and ``{"rounds", "converged"}``. ``converge``: the round budget is
    ``protocol.converged_rounds`` and the run stops at :attr:`Protocol.converged`; a run that spends
    the budget is recorded (``converged`` False), its ConvergenceWarning silenced."""
    spec = rbf_spec(problem.function.d, protocol.ard)
    fed = problem.federation if clients is None else clients
    batch = protocol.batch_for(problem.federation)  # Separate keeps FGPR's batch size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        result = fit_study(
            spec,
            fed,
            replace(protocol, batch_size=batch).fgpr(fed, hf_weight),
            protocol.converged_rounds if converge else protocol.rounds,
            seed,
            "sequential",
            stop=protocol.converged if converge else None,
        )
    info = {"rounds": len(result.history)}
    if converge:
        info["converged"] = bool(result.history.attrs["stopped"])
    return result.posterior(problem.X_test, client=0), info


def _predict(
    problem: MultiFidelityProblem, method: str, protocol: Protocol, seed: int
) -> tuple[Prediction, dict]:
    d, hf = problem.function.d, problem.hf
    if method == "FGPR":
        return fit_fgpr(problem, protocol, seed)
    if method == "FGPR-converged":
        return fit_fgpr(problem, protocol, seed, converge=True)
    if method == "Separate":
        # The HF client alone under FGPR's protocol and batch size: exactly the steps it takes in FGPR.
        return fit_fgpr(problem, protocol, seed, clients=Federation([hf]))
    if method in ("SeparateMLE", "FGPR-MLE"):
        spec = rbf_spec(d, protocol.ard)
        data = [(hf.X, hf.y)] if method == "SeparateMLE" else [(c.X, c.y) for c in problem.federation]
        state, _ = mle_with_restarts(spec, data, restarts=protocol.mle_restarts, seed=seed)
        return condition(spec, state, hf.X, hf.y, problem.X_test), {}
    if method == "AR1":
        model = AR1(ard=protocol.ard, restarts=protocol.mle_restarts, seed=seed)
        return model.fit(problem.levels).predict(problem.X_test), {}
    if method == "NARGP":
        model = NARGP(
            ard=protocol.ard, restarts=protocol.mle_restarts, samples=protocol.nargp_samples, seed=seed
        )
        return model.fit(problem.levels).predict(problem.X_test), {}
    if method == "MF-DGP":
        model = protocol.mfdgp(seed).fit(problem.levels)
        return model.predict(problem.X_test), {"rounds": sum(s.iterations for s in model.stages)}
    raise InputError(f"method must be one of {METHODS}, got {method!r}")


def _failed(method: str, err: Exception) -> dict:
    # A fit that cannot be factorised or optimised is recorded (and counted in the markdown), not
    # allowed to end a two-hour run; summaries skip it.
    nan = float("nan")
    return {
        "method": method,
        "rmse": nan,
        "nll": nan,
        "coverage95": nan,
        "seconds": nan,
        "error": f"{type(err).__name__}: {str(err)[:200]}",
    }


def _frame(rows: list[dict], problem: MultiFidelityProblem, seed: int) -> pd.DataFrame:
    out = pd.DataFrame(rows)
    out.insert(0, "seed", seed)
    out.insert(0, "hf_size", problem.hf.n)
    out.insert(0, "function", problem.function.name)
    return out.reindex(columns=RUN_COLUMNS)


def run_once(
    function: str | MultiFidelityFunction,
    seed: int,
    methods: Sequence[str] = METHODS,
    protocol: Protocol | None = None,
    sizes: dict[str, int] | None = None,
) -> pd.DataFrame:
    """One repeat: draw the data with ``seed``, fit every method, score on the HF test set.

    Returns one row per method (:data:`RUN_COLUMNS`): rmse, nll (mean negative log predictive
    density of the standardised HF values, using the predictive variance of y) and coverage95
    (fraction of test values inside the central 95% predictive interval), the fitting time in
    seconds, and for the FGPR runs the rounds run (and whether FGPR-converged's rule held).
    """
    protocol = Protocol() if protocol is None else protocol
    check_methods(methods)
    problem = multifidelity_federation(function, sizes, n_test=protocol.n_test, seed=seed)
    rows = []
    with warnings.catch_warnings():
        # GPyTorch rounds tiny negative predictive variances up to 1e-10 and says so; harmless here.
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        for method in methods:
            start = time.perf_counter()
            try:
                pred, info = _predict(problem, method, protocol, seed)
            except (RuntimeError, FactorizationError) as err:
                rows.append(_failed(method, err))
                continue
            rows.append({**scores(problem, method, pred, time.perf_counter() - start, **info), "error": ""})
    return _frame(rows, problem, seed)


def run_batched(
    function: str | MultiFidelityFunction,
    seeds: Sequence[int],
    method: str = "MF-DGP",
    protocol: Protocol | None = None,
    sizes: dict[str, int] | None = None,
) -> pd.DataFrame:
    """:func:`run_once`'s rows for a :data:`BATCHED_METHODS` method, all ``seeds`` fitted at once.

    Each repeat draws its data from its own seed as in :func:`run_once` and keeps its own
    parameters and Monte Carlo draws (:meth:`fedgp.baselines.MFDGP.fit_batch`), so its numbers do
    not depend on which other repeats share the batch. ``seconds`` is the batch's time divided by
    the number of repeats."""
    protocol = Protocol() if protocol is None else protocol
    if method not in BATCHED_METHODS:
        raise InputError(f"run_batched: method must be one of {BATCHED_METHODS}, got {method!r}")
    problems = [multifidelity_federation(function, sizes, n_test=protocol.n_test, seed=s) for s in seeds]
    start = time.perf_counter()
    model = protocol.mfdgp(seeds[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
            model.fit_batch([p.levels for p in problems], seeds=list(seeds))
            preds = model.predict_batch([p.X_test for p in problems])
    except (RuntimeError, FactorizationError) as err:
        return pd.concat([_frame([_failed(method, err)], p, s) for p, s in zip(problems, seeds)])
    seconds = (time.perf_counter() - start) / len(problems)
    steps = sum(stage.iterations for stage in model.stages)
    frames = [
        _frame([{**scores(p, method, pred, seconds, rounds=steps), "error": ""}], p, s)
        for p, pred, s in zip(problems, preds, seeds)
    ]
    return pd.concat(frames, ignore_index=True)
