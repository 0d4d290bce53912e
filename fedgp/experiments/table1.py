"""FGPR Table 1 (Yue & Kontar §5): multi-fidelity, one client per fidelity level; plus two studies.

* :func:`table1` — five test functions × methods, RMSE mean ± std over repeats on the
  standardised HF scale (1,000 uniform test points), with NLL and 95% coverage.
* :func:`hf_sweep` — beyond the paper: HF training size 5…80 on CURRIN and PARK, to show where
  federation helps and where a converged HF-only GP catches up.
* :func:`p1_ablation` — the paper's Fig. 9: CURRIN, HF aggregation weight p₁ from 0.17 to 1.
* :func:`reproduce` — ``fedgp reproduce table1``: all three, CSV and markdown.

Protocol (:class:`Protocol`, the authors' R code, digest §1.4 and §6.12): Adam (reset every
round) with lr 0.01, batch size = the smallest client's size, one local epoch per round,
200 rounds, zero-mean GP with ``ScaleKernel(RBF)``. Two choices the authors' code makes
differently, taken from the digest and documented in ``results/README.md``: **ARD** lengthscales
(their code: one isotropic lengthscale) and **uniform** minibatches (their MF code: nearest-
neighbour batches); both are switches here, and :func:`table1` can run either.

Methods: ``FGPR``; ``FGPR-converged`` (the same FGPR, run until its training NLL stops improving:
``fit(stop=NLLPlateau(patience=100))`` within a budget of 3,000 rounds, :attr:`Protocol.converged`);
``Separate`` (the paper's baseline: the same Adam protocol on the HF client alone, i.e. the number of
steps the HF client takes inside FGPR); ``SeparateMLE`` (converged exact MLE on HF data, L-BFGS with
restarts); ``FGPR-MLE`` (the FGPR objective Σ_k log p(y_k | X_k, θ) maximised to convergence in one
place, then conditioned on HF data: the full-batch optimum of FGPR's objective); ``AR1`` and
``NARGP`` (centralised, :mod:`fedgp.models.multifidelity`); ``MF-DGP`` (the paper's "Deep", Cutajar
et al. 2019, :class:`fedgp.baselines.MFDGP`; centralised; fitted for all repeats of a function at
once as one batched program).

Long runs resume: with ``FEDGP_CACHE`` set, every finished job is kept in ``$FEDGP_CACHE/table1``;
``reproduce(..., reuse=DIR)`` keeps the per-repeat rows of methods already in DIR's
``table1_runs.csv`` and ``table1_sweep_runs.csv`` and runs only the missing ones.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

import fedgp
from fedgp.baselines.mfdgp import MFDGP, Stage
from fedgp.data.client import Federation
from fedgp.data.multifidelity import (
    MF_FUNCTIONS,
    TABLE1_FUNCTIONS,
    MultiFidelityFunction,
    MultiFidelityProblem,
    multifidelity_federation,
)
from fedgp.experiments.verdicts import verdict
from fedgp.models.multifidelity import AR1, NARGP, mle_with_restarts, rbf_spec
from fedgp.models.objective import FactorizationError
from fedgp.models.posterior import Prediction, condition
from fedgp.progress import progress_bar
from fedgp.stopping import ConvergenceWarning, NLLPlateau
from fedgp.strategies.base import RoundPlan
from fedgp.strategies.fgpr import FGPR

__all__ = [
    "PAPER_TABLE1",
    "METHODS",
    "Protocol",
    "WeightedFGPR",
    "run_once",
    "summarise",
    "table1",
    "hf_sweep",
    "p1_ablation",
    "protocol_ablation",
    "compare_with_paper",
    "winners",
    "reproduce",
    "resolve_function",
    "workers",
]

#: Yue & Kontar, Table 1, verbatim: RMSE mean and std over 30 repeats on the standardised HF scale.
PAPER_TABLE1 = pd.DataFrame(
    [
        ("currin", "40/0/200", 0.148, 0.056, 0.301, 0.080, 0.295, 0.052, 0.252, 0.064),
        ("park", "50/0/300", 0.012, 0.002, 0.052, 0.006, 0.035, 0.001, 0.013, 0.001),
        ("branin", "20/40/200", 0.260, 0.065, 0.374, 0.089, 0.335, 0.070, 0.213, 0.085),
        ("hartmann3", "50/100/200", 0.365, 0.074, 0.456, 0.087, 0.412, 0.067, 0.383, 0.092),
        ("borehole", "50/0/200", 0.604, 0.006, 0.633, 0.006, 0.615, 0.005, 0.622, 0.007),
    ],
    columns=[
        "function",
        "sizes",
        "FGPR_mean",
        "FGPR_std",
        "Separate_mean",
        "Separate_std",
        "AR_mean",
        "AR_std",
        "Deep_mean",
        "Deep_std",
    ],
)

#: The methods run for Table 1: FGPR (paper protocol and trained to convergence) and its baselines
#: (Separate per fidelity, MLE variants, AR1, NARGP, MF-DGP).
METHODS: tuple[str, ...] = (
    "FGPR",
    "FGPR-converged",
    "Separate",
    "SeparateMLE",
    "FGPR-MLE",
    "AR1",
    "NARGP",
    "MF-DGP",
)
#: Methods fitted for all repeats of one setting at once (one batched program per setting).
BATCHED_METHODS: tuple[str, ...] = ("MF-DGP",)
#: The per-repeat columns of ``table1_runs.csv``; ``rounds`` (FGPR, FGPR-converged, Separate: rounds
#: run; MF-DGP: Adam steps) and ``converged`` (FGPR-converged: its rule held) are empty for the rest.
RUN_COLUMNS = [
    "function",
    "hf_size",
    "seed",
    "method",
    "rmse",
    "nll",
    "coverage95",
    "seconds",
    "error",
    "rounds",
    "converged",
]
SUMMARY_COLUMNS = ["function", "method", "rmse_mean", "rmse_std", "nll_mean", "coverage95_mean", "repeats"]


@dataclass(frozen=True)
class Protocol:
    """Training settings shared by every method of one table.

    ``batch_size=None`` means the smallest client's size (the authors' code); ``rounds``, ``lr``
    and ``local_epochs`` are FGPR's and Separate's; ``mle_restarts`` is per MLE fit (SeparateMLE,
    FGPR-MLE and each level of AR1 and NARGP); ``nargp_samples`` the Monte Carlo size of NARGP.
    ``converged_*``: FGPR-converged's round budget and rule (:attr:`converged`). ``mfdgp_*``: MF-DGP's
    Adam steps and learning rates per stage (emukit: 5,000 + 15,000 + 15,000 at 3e-3, 1e-3, 1e-3;
    here 1.4 % of that, started at NARGP-style exact fits), Monte Carlo samples in training and
    prediction, and the stride of its lowest layer's inducing inputs (every other LF point: half the
    inducing inputs, and a step several times cheaper than with every point).
    """

    rounds: int = 200
    lr: float = 0.01
    local_epochs: int = 1
    batch_size: int | None = None
    minibatch: str = "uniform"
    ard: bool = True
    mle_restarts: int = 4
    nargp_samples: int = 100
    n_test: int = 1000
    converged_rounds: int = 3000
    converged_patience: int = 100
    converged_min_delta: float = 1e-4
    mfdgp_steps: tuple[int, int, int] = (100, 200, 200)
    mfdgp_lr: tuple[float, float, float] = (0.01, 0.01, 0.003)
    mfdgp_samples: int = 10
    mfdgp_predict_samples: int = 250
    mfdgp_low_stride: int = 2

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.converged_rounds < 1:
            raise ValueError(f"converged_rounds must be >= 1, got {self.converged_rounds}")
        if len(self.mfdgp_steps) != 3 or len(self.mfdgp_lr) != 3:
            raise ValueError("mfdgp_steps and mfdgp_lr: one value for each of the 3 training stages")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.minibatch not in ("uniform", "nearest"):
            raise ValueError(f"minibatch must be 'uniform' or 'nearest', got {self.minibatch!r}")

    @property
    def converged(self) -> NLLPlateau:
        """FGPR-converged's stopping rule.

        The training NLL's plateau, with windows of 100 rounds: under this protocol (Adam at a
        constant lr on minibatches, reset every round) the state keeps moving by about lr each
        round, so a rule on the state's change would not hold; the means of the NLL over 100-round
        windows settle after 250 to 2,600 rounds on Table 1's draws (``rounds`` in
        ``results/table1_runs.csv``)."""
        return NLLPlateau(patience=self.converged_patience, min_delta=self.converged_min_delta)

    def mfdgp(self, seed: int = 0) -> MFDGP:
        """MF-DGP with this protocol's three stages (:func:`fedgp.baselines.mfdgp.emukit_stages`'
        structure, shorter and at a larger lr) and sample counts, on ``FEDGP_DEVICE`` (default the
        CPU; not part of the protocol: a GPU gives the same fits to rounding, and the same cache)."""
        free = ((False, False, False), (True, True, False), (True, True, True))
        stages = [Stage(n, lr, *f) for n, lr, f in zip(self.mfdgp_steps, self.mfdgp_lr, free)]
        return MFDGP(
            stages,
            samples=self.mfdgp_samples,
            predict_samples=self.mfdgp_predict_samples,
            low_inducing_stride=self.mfdgp_low_stride,
            seed=seed,
            device=os.environ.get("FEDGP_DEVICE") or None,
        )

    def batch_for(self, federation: Federation) -> int:
        """The minibatch size for a federation: the protocol's, else the smallest client's size."""
        return int(federation.sizes.min()) if self.batch_size is None else int(self.batch_size)

    def fgpr(self, federation: Federation, hf_weight: float | None = None) -> FGPR:
        """The FGPR strategy of this protocol for a federation (``hf_weight``: the high-fidelity client's
        weight p₁, else by size)."""
        kwargs = dict(
            local_epochs=self.local_epochs,
            batch_size=self.batch_for(federation),
            lr=self.lr,
            optimizer="adam",
            minibatch=self.minibatch,
        )
        if hf_weight is None:
            return FGPR(**kwargs)
        return WeightedFGPR(**kwargs, hf_weight=hf_weight)


@dataclass(frozen=True)
class WeightedFGPR(FGPR):
    """FGPR with the first (HF) client's aggregation weight set to ``hf_weight``.

    The other clients share ``1 - hf_weight`` in proportion to their sizes. This is the paper's
    Fig. 9 ablation; with ``hf_weight = N_1 / N`` it is plain FGPR. Full participation only.
    """

    hf_weight: float = field(default=1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.hf_weight <= 1.0:
            raise ValueError(f"hf_weight must be in [0, 1], got {self.hf_weight}")
        if self.clients_per_round is not None:
            raise ValueError("WeightedFGPR supports full participation only (clients_per_round=None)")

    def configure(self, rnd, server, ctx, rng) -> RoundPlan:
        plan = super().configure(rnd, server, ctx, rng)
        rest = ctx.weights[1:]
        weights = torch.cat(
            [torch.tensor([self.hf_weight], dtype=torch.float64), (1 - self.hf_weight) * rest / rest.sum()]
        )
        return replace(plan, weights=weights[plan.participants])


# -- one repeat ------------------------------------------------------------------------------------


def _row(problem: MultiFidelityProblem, method: str, pred: Prediction, seconds: float, **extra) -> dict:
    y = problem.y_test
    return {
        "method": method,
        "rmse": pred.rmse(y),
        "nll": pred.nll(y),
        "coverage95": pred.coverage(y),
        "seconds": seconds,
        **extra,
    }


def _fit_fgpr(
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
        result = fedgp.fit(
            spec,
            fed,
            replace(protocol, batch_size=batch).fgpr(fed, hf_weight),
            rounds=protocol.converged_rounds if converge else protocol.rounds,
            seed=seed,
            progress=False,
            outcome_transform=None,
            input_transform=None,
            eval_every=0,
            engine="sequential",
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
        return _fit_fgpr(problem, protocol, seed)
    if method == "FGPR-converged":
        return _fit_fgpr(problem, protocol, seed, converge=True)
    if method == "Separate":
        # The HF client alone under FGPR's protocol and batch size: exactly the steps it takes in FGPR.
        return _fit_fgpr(problem, protocol, seed, clients=Federation([hf]))
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
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


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


def _check_methods(methods: Sequence[str]) -> None:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; choose from {METHODS}")


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
    _check_methods(methods)
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
            rows.append({**_row(problem, method, pred, time.perf_counter() - start, **info), "error": ""})
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
        raise ValueError(f"run_batched: method must be one of {BATCHED_METHODS}, got {method!r}")
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
        _frame([{**_row(p, method, pred, seconds, rounds=steps), "error": ""}], p, s)
        for p, pred, s in zip(problems, preds, seeds)
    ]
    return pd.concat(frames, ignore_index=True)


def summarise(runs: pd.DataFrame, by: Sequence[str] = ("function", "method")) -> pd.DataFrame:
    """Mean ± std (ddof = 1) of RMSE over repeats, mean NLL and coverage, number of repeats.

    Failed fits (NaN rows, see :func:`run_once`) are left out, and ``repeats`` counts the others.
    """
    g = runs.groupby(list(by), sort=False)
    out = g.agg(
        rmse_mean=("rmse", "mean"),
        rmse_std=("rmse", lambda s: float(s.std(ddof=1)) if len(s) > 1 else float("nan")),
        nll_mean=("nll", "mean"),
        coverage95_mean=("coverage95", "mean"),
        repeats=("rmse", "count"),
    )
    return out.reset_index()


def _repeat_seeds(seed: int, repeats: int) -> list[int]:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    return [seed * 10_000 + r for r in range(repeats)]


def workers() -> int:
    """Worker processes for the repeats: ``FEDGP_WORKERS`` (default 1).

    Every job draws its data and seeds its training from its own seed, so the numbers do not depend
    on the number of workers or on the order in which jobs finish.
    """
    value = os.environ.get("FEDGP_WORKERS", "1").strip() or "1"
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"FEDGP_WORKERS must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ValueError(f"FEDGP_WORKERS must be a positive integer, got {value!r}")
    return n


def _one_thread() -> None:
    torch.set_num_threads(1)


def _map(fn: Callable, jobs: list[tuple], progress: bool | None, desc: str) -> list:
    """``[fn(*job) for job in jobs]``, in ``workers()`` processes when more than one, in job order."""
    bar = dict(total=len(jobs), desc=desc, progress=progress, leave=True)
    n = min(workers(), len(jobs))
    if n <= 1:
        return [fn(*job) for job in progress_bar(jobs, **bar)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=context, initializer=_one_thread) as pool:
        return list(progress_bar(pool.map(fn, *zip(*jobs)), **bar))


def _job_settings(kind: str, protocol: Protocol) -> dict:
    """The protocol fields a job's rows depend on: MF-DGP's (and the test size) for a batched job,
    every other field for a per-repeat job, so that changing one method's settings reruns only it."""
    fields = asdict(protocol)
    mine = {k: v for k, v in fields.items() if k.startswith("mfdgp_") == (kind == "batched")}
    return {**mine, "n_test": protocol.n_test}


def _cache_path(kind: str, function, key: tuple, protocol: Protocol) -> Path | None:
    """Where ``FEDGP_CACHE`` keeps a finished job (None without it): named by the function, and by
    a hash of the job and the protocol fields it depends on, so another protocol never reads it.
    (A changed formula under the same function name is not seen: use a fresh cache.)"""
    root = os.environ.get("FEDGP_CACHE")
    if not root:
        return None
    fn = resolve_function(function)
    text = repr((kind, fn.name, fn.bounds.tolist(), fn.paper_sizes, key, _job_settings(kind, protocol)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    return Path(root) / "table1" / f"{fn.name}-{kind}-{digest}.csv"


def _cached(kind: str, function, key: tuple, protocol: Protocol, compute: Callable[[], pd.DataFrame]):
    path = _cache_path(kind, function, key, protocol)
    if path is not None and path.exists():
        return pd.read_csv(path, keep_default_na=False, na_values=[""]).reindex(columns=RUN_COLUMNS)
    frame = compute()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(path)  # a job killed while writing leaves no half file behind
    return frame


def _run_job(function, seed, methods, sizes, batch, protocol) -> pd.DataFrame:
    proto = protocol if batch is None else replace(protocol, batch_size=batch)
    return _cached(
        "once",
        function,
        (seed, tuple(methods), sizes, batch),
        proto,
        lambda: run_once(function, seed, methods, proto, sizes),
    )


def _batched_job(function, seeds, method, sizes, batch, protocol) -> pd.DataFrame:
    proto = protocol if batch is None else replace(protocol, batch_size=batch)
    return _cached(
        "batched",
        function,
        (tuple(seeds), method, sizes, batch),
        proto,
        lambda: run_batched(function, seeds, method, proto, sizes),
    )


def _job_key(function, sizes, batch) -> tuple:
    return (resolve_function(function).name, None if sizes is None else tuple(sorted(sizes.items())), batch)


def _reusable(reuse: pd.DataFrame | None, function, sizes, seed: int, methods: Sequence[str]) -> pd.DataFrame:
    """The rows of ``reuse`` for this job: the function, HF size and seed, one of ``methods``."""
    if reuse is None or reuse.empty:
        return pd.DataFrame(columns=RUN_COLUMNS)
    fn = resolve_function(function)
    hf = fn.paper_sizes[-1] if sizes is None or "high" not in sizes else int(sizes["high"])
    rows = reuse[
        (reuse["function"] == fn.name)
        & (reuse["hf_size"] == hf)
        & (reuse["seed"] == seed)
        & reuse["method"].isin(list(methods))
    ]
    return rows.reindex(columns=RUN_COLUMNS)


def _as_flag(value) -> bool | None:
    """A ``converged`` cell as read back from any CSV (True, 1.0, "True") or None when empty."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA or value == "":
        return None
    return str(value).strip().lower() in ("true", "1", "1.0")


def _runs(
    jobs: list[tuple],
    protocol: Protocol,
    progress: bool | None,
    desc: str,
    reuse: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every job's rows: ``jobs`` are ``(function, seed, methods, sizes, batch)``.

    Per-repeat methods run one job per repeat; :data:`BATCHED_METHODS` one job per setting (all its
    seeds at once). Rows of ``reuse`` (earlier per-repeat rows) for a job's method are kept instead
    of running it. The rows come back in job order, methods in each job's order."""
    kept, once, batched = [], [], {}
    for index, (function, seed, methods, sizes, batch) in enumerate(jobs):
        old = _reusable(reuse, function, sizes, seed, methods)
        kept.append(old.assign(_job=index))
        todo = [m for m in methods if m not in set(old["method"])]
        per_repeat = tuple(m for m in todo if m not in BATCHED_METHODS)
        if per_repeat:
            once.append((index, (function, seed, per_repeat, sizes, batch)))
        for m in todo:
            if m in BATCHED_METHODS:
                key = (_job_key(function, sizes, batch), m)
                batched.setdefault(key, (function, sizes, batch, m, []))[4].append((index, seed))
    frames = [k for k in kept if not k.empty]
    results = _map(_run_job, [(*job, protocol) for _, job in once], progress, desc)
    frames += [frame.assign(_job=index) for (index, _), frame in zip(once, results)]
    if batched:
        groups = list(batched.values())
        calls = [
            (f, [s for _, s in members], m, sizes, batch, protocol) for f, sizes, batch, m, members in groups
        ]
        results = _map(_batched_job, calls, progress, f"{desc} ({', '.join(BATCHED_METHODS)})")
        for (_, _, _, _, members), frame in zip(groups, results):
            frames.append(frame.reset_index(drop=True).assign(_job=[index for index, _ in members]))
    if not frames:
        return pd.DataFrame(columns=RUN_COLUMNS)
    runs = pd.concat([f for f in frames if not f.empty], ignore_index=True)
    runs["_method"] = [list(jobs[j][2]).index(m) for j, m in zip(runs["_job"], runs["method"])]
    runs = runs.sort_values(["_job", "_method"], kind="stable").drop(columns=["_job", "_method"])
    runs = runs.reset_index(drop=True).reindex(columns=RUN_COLUMNS)
    # rows of methods without rounds leave NaN in these columns: keep them integers and booleans
    runs["rounds"] = pd.to_numeric(runs["rounds"]).astype("Int64")
    runs["converged"] = runs["converged"].map(_as_flag).astype("boolean")
    return runs


def table1(
    repeats: int = 30,
    seed: int = 0,
    functions: Iterable[str | MultiFidelityFunction] = TABLE1_FUNCTIONS,
    methods: Sequence[str] = METHODS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
    return_runs: bool = False,
    reuse: pd.DataFrame | None = None,
):
    """Table 1: one row per (function, method) with RMSE mean ± std, NLL and 95% coverage.

    Repeat ``r`` draws its data and seeds its training with ``seed * 10000 + r``; every method sees
    the same data in a repeat (paired comparison). With ``return_runs`` also returns the per-repeat
    rows. ``reuse``: earlier per-repeat rows (``table1_runs.csv``) kept instead of rerunning them.
    """
    protocol = Protocol() if protocol is None else protocol
    _check_methods(methods)
    jobs = [(f, s, tuple(methods), None, None) for f in functions for s in _repeat_seeds(seed, repeats)]
    runs = _runs(jobs, protocol, progress, "table1", reuse)
    summary = summarise(runs)[SUMMARY_COLUMNS]
    return (summary, runs) if return_runs else summary


#: The sweep's methods (``methods`` of :func:`hf_sweep`).
SWEEP_METHODS: tuple[str, ...] = ("FGPR", "FGPR-converged", "SeparateMLE", "AR1")
#: The sweep holds the optimiser at Table 1's settings: batch 40 (CURRIN) and 50 (PARK).
SWEEP_BATCH = {"currin": 40, "park": 50}


def hf_sweep(
    hf_sizes: Sequence[int] = (5, 10, 20, 40, 80),
    repeats: int = 30,
    seed: int = 0,
    functions: Sequence[str] = ("currin", "park"),
    methods: Sequence[str] = SWEEP_METHODS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
    return_runs: bool = False,
    reuse: pd.DataFrame | None = None,
):
    """RMSE vs HF training size with the paper's LF size (beyond the paper).

    The batch size is held at Table 1's value for each function (``SWEEP_BATCH``; a client with
    fewer points uses all of them), so only the amount of HF data changes along the sweep. Repeat
    seeds are shared across sizes, so the LF design of a repeat is the same at every HF size.
    ``reuse``: earlier per-repeat rows (``table1_sweep_runs.csv``) kept instead of rerunning them.
    """
    protocol = Protocol() if protocol is None else protocol
    _check_methods(methods)
    jobs = [
        (f, s, tuple(methods), {"high": int(n)}, SWEEP_BATCH.get(f))
        for f in functions
        for n in hf_sizes
        for s in _repeat_seeds(seed, repeats)
    ]
    runs = _runs(jobs, protocol, progress, "HF-size sweep", reuse)
    summary = summarise(runs, ("function", "hf_size", "method"))
    summary = summary[["function", "hf_size", *SUMMARY_COLUMNS[1:]]]
    return (summary, runs) if return_runs else summary


def p1_ablation(
    p1_values: Sequence[float] = (1 / 6, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0),
    repeats: int = 30,
    seed: int = 0,
    protocol: Protocol | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """The paper's Fig. 9: FGPR on CURRIN (40 HF / 200 LF) with the HF weight p₁ forced.

    p₁ = 40/240 ≈ 0.17 is plain FGPR; p₁ = 1 ignores the LF client (= Separate). Returns one row
    per p₁ with RMSE mean and std over repeats, NLL and coverage.
    """
    protocol = Protocol() if protocol is None else protocol
    jobs = [(float(p1), s, protocol) for p1 in p1_values for s in _repeat_seeds(seed, repeats)]
    runs = pd.DataFrame(_map(_p1_job, jobs, progress, "p1 ablation"))
    return summarise(runs, ("p1",))


def _p1_job(p1: float, seed: int, protocol: Protocol) -> dict:
    problem = multifidelity_federation("currin", n_test=protocol.n_test, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        start = time.perf_counter()
        pred, _ = _fit_fgpr(problem, protocol, seed, hf_weight=p1)
    return {"p1": p1, "seed": seed, **_row(problem, "FGPR", pred, time.perf_counter() - start)}


def protocol_ablation(
    repeats: int = 10,
    seed: int = 0,
    functions: Iterable[str] = TABLE1_FUNCTIONS,
    protocol: Protocol | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """FGPR under the two choices where we depart from the authors' code, all four combinations.

    ``minibatch`` ∈ {uniform (ours), nearest (their MF script)} × ``ard`` ∈ {True (ours), False
    (theirs)}; everything else as in ``protocol``. Same seeds as :func:`table1`.
    """
    protocol = Protocol() if protocol is None else protocol
    variants = [(mb, ard) for mb in ("uniform", "nearest") for ard in (True, False)]
    jobs = [
        (f, s, ("FGPR",), None, None, replace(protocol, minibatch=mb, ard=ard))
        for f in functions
        for s in _repeat_seeds(seed, repeats)
        for mb, ard in variants
    ]
    frames = _map(_run_job, jobs, progress, "protocol ablation")
    runs = pd.concat(frames, ignore_index=True)
    runs["minibatch"] = [job[-1].minibatch for job in jobs]
    runs["ard"] = [job[-1].ard for job in jobs]
    return summarise(runs, ("function", "minibatch", "ard"))


# -- reporting -------------------------------------------------------------------------------------


def compare_with_paper(summary: pd.DataFrame) -> pd.DataFrame:
    """Our RMSE beside the paper's, one row per function (``mean ± std`` strings).

    Paper columns: FGPR, Separate, AR, Deep. Ours: every method in ``summary``; ``FGPR-converged``
    is set against the paper's FGPR, ``AR1`` the paper's AR, and ``MF-DGP`` (the paper's Deep) and
    ``NARGP`` (a different nonlinear model) the paper's Deep.
    ``<method> verdict``: :func:`fedgp.experiments.verdicts.verdict` on our mean against the paper's
    (reproduced within the larger std, better/worse beyond it, "different protocol" at a 3× ratio).
    """
    mean = summary.pivot(index="function", columns="method", values="rmse_mean")
    std = summary.pivot(index="function", columns="method", values="rmse_std")
    pairs = [
        ("FGPR", "FGPR"),
        ("FGPR", "FGPR-converged"),
        ("Separate", "Separate"),
        (None, "SeparateMLE"),
        (None, "FGPR-MLE"),
        ("AR", "AR1"),
        ("Deep", "MF-DGP"),
        ("Deep", "NARGP"),
    ]
    rows = []
    for _, paper in PAPER_TABLE1.iterrows():
        f = paper["function"]
        if f not in mean.index:
            continue
        row = {"function": f, "HF/MF/LF": paper["sizes"]}
        for theirs, ours in pairs:
            if theirs is not None and f"paper {theirs}" not in row:
                row[f"paper {theirs}"] = f"{paper[f'{theirs}_mean']:.3f} ± {paper[f'{theirs}_std']:.3f}"
            if ours in mean.columns:
                ran = pd.notna(mean.loc[f, ours])  # a method run on some functions only: "—" elsewhere
                row[f"ours {ours}"] = f"{mean.loc[f, ours]:.3f} ± {std.loc[f, ours]:.3f}" if ran else "—"
        for theirs, ours in pairs:
            if theirs is not None and ours in mean.columns:
                if pd.isna(mean.loc[f, ours]):
                    row[f"{ours} verdict"] = "—"
                    continue
                row[f"{ours} verdict"] = verdict(
                    mean.loc[f, ours], paper[f"{theirs}_mean"], std.loc[f, ours], paper[f"{theirs}_std"]
                )
        rows.append(row)
    return pd.DataFrame(rows)


FEDERATED: tuple[str, ...] = ("FGPR", "FGPR-converged")


def winners(summary: pd.DataFrame) -> pd.DataFrame:
    """For each function: which of FGPR (and FGPR-converged) and each other method has the lower
    mean RMSE."""
    mean = summary.pivot(index="function", columns="method", values="rmse_mean")
    order = [f for f in PAPER_TABLE1["function"] if f in mean.index] + [
        f for f in mean.index if f not in set(PAPER_TABLE1["function"])
    ]
    rows = []
    for f in order:
        row = {"function": f}
        for ours in (m for m in FEDERATED if m in mean.columns):
            for m in mean.columns:
                if m in FEDERATED:
                    continue
                if pd.isna(mean.loc[f, m]):  # a method not run on this function
                    row[f"{ours} vs {m}"] = "—"
                    continue
                row[f"{ours} vs {m}"] = ours if mean.loc[f, ours] < mean.loc[f, m] else m
        row["best"] = mean.loc[f].idxmin()
        rows.append(row)
    return pd.DataFrame(rows)


def _md_table(frame: pd.DataFrame, floatfmt: str = ".4f") -> str:
    """A GitHub markdown table (no optional dependency such as ``tabulate``)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt)
        return str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _paired_wins(runs: pd.DataFrame, by: Sequence[str], baseline: str, ours: str = "FGPR") -> pd.DataFrame:
    """How many repeats ``ours``'s RMSE is below ``baseline``'s (same data, same seed)."""
    keys = [*by, "seed"]
    wide = runs.pivot_table(index=keys, columns="method", values="rmse").reset_index()
    wide["win"] = wide[ours] < wide[baseline]
    return wide.groupby(list(by)).agg(wins=("win", "sum"), repeats=("win", "size")).reset_index()


def _convergence_text(runs: pd.DataFrame) -> str:
    """FGPR-converged's rounds and how many runs met the rule, per function (and HF size)."""
    if "converged" not in runs or "FGPR-converged" not in set(runs["method"]):
        return "no FGPR-converged runs"
    rows = runs[runs["method"] == "FGPR-converged"]
    parts = []
    for (f, n), g in rows.groupby(["function", "hf_size"], sort=False):
        met = int(g["converged"].astype(str).str.lower().eq("true").sum())
        parts.append(
            f"{f} (HF {n}) median {g['rounds'].median():.0f} rounds [{g['rounds'].min():.0f}–"
            f"{g['rounds'].max():.0f}], rule met {met}/{len(g)}"
        )
    return "FGPR-converged: " + "; ".join(parts)


def _markdown(
    summary: pd.DataFrame,
    runs: pd.DataFrame,
    sweep: pd.DataFrame | None,
    sweep_runs: pd.DataFrame | None,
    ablation: pd.DataFrame,
    choices: pd.DataFrame,
    protocol: Protocol,
    header: str,
) -> str:
    lines = [header, ""]
    lines += ["## Table 1: ours beside the paper's (RMSE mean ± std over repeats, standardised HF scale)", ""]
    lines += [_md_table(compare_with_paper(summary)), ""]
    lines += ["Which wins (lower mean RMSE):", "", _md_table(winners(summary)), ""]
    lines += ["## Table 1: every method, with calibration", ""]
    lines += [_md_table(summary), ""]
    methods = set(runs["method"])
    for ours in (m for m in FEDERATED if m in methods):
        for base in ("FGPR", "Separate", "SeparateMLE", "FGPR-MLE", "AR1", "NARGP", "MF-DGP"):
            if base in methods and base != ours and not (ours == "FGPR" and base == "FGPR-MLE"):
                wins = _paired_wins(runs, ["function"], base, ours)
                text = ", ".join(f"{r.function} {r.wins}/{r.repeats}" for r in wins.itertuples())
                lines.append(f"- {ours}'s RMSE below {base}'s (paired, same data): {text}")
    parts = [("Table 1", runs)] + ([] if sweep_runs is None else [("sweep", sweep_runs)])
    for name, frame in parts:
        lines.append(f"- {name}: {_convergence_text(frame)}")
    for name, frame in parts:
        failed = frame[frame["error"].fillna("").astype(str) != ""] if "error" in frame else frame.iloc[:0]
        lines.append(
            f"- Failed fits ({name}): {len(failed)}"
            + "".join(f"\n  - {r.function} {r.method} seed {r.seed}: {r.error}" for r in failed.itertuples())
        )
    lines += ["", "## HF-size sweep (beyond the paper)", ""]
    if sweep is None:
        lines += [f"Not run: `--methods` names none of its methods ({', '.join(SWEEP_METHODS)}).", ""]
    else:
        lines += _sweep_lines(sweep, sweep_runs)
    lines += ["## Fig. 9 ablation: FGPR on CURRIN with the HF weight p₁ forced", ""]
    lines += [_md_table(ablation), ""]
    n = int(choices["repeats"].min())
    lines += [f"## Protocol choices: FGPR with uniform/nearest minibatches × ARD/isotropic ({n} repeats)", ""]
    wide = choices.copy()
    wide["variant"] = choices["minibatch"] + np.where(choices["ard"], " + ARD", " + isotropic")
    lines += [
        _md_table(wide.pivot(index="function", columns="variant", values="rmse_mean").reset_index()),
        "",
    ]
    lines += ["## Protocol", "", "```", repr(protocol), "```", ""]
    return "\n".join(lines)


def _sweep_lines(sweep: pd.DataFrame, sweep_runs: pd.DataFrame) -> list[str]:
    """The sweep's table: RMSE mean ± std per function and HF size, paired wins vs SeparateMLE."""
    table = sweep.pivot(index=["function", "hf_size"], columns="method", values="rmse_mean")
    table_std = sweep.pivot(index=["function", "hf_size"], columns="method", values="rmse_std")
    shown = table.copy().astype(object)
    for c in table.columns:
        shown[c] = [f"{m:.3f} ± {s:.3f}" for m, s in zip(table[c], table_std[c])]
    for ours in (m for m in FEDERATED if m in table.columns):
        if "SeparateMLE" in table.columns:
            wins = _paired_wins(sweep_runs, ["function", "hf_size"], "SeparateMLE", ours).set_index(
                ["function", "hf_size"]
            )
            shown[f"{ours} paired wins vs SeparateMLE"] = [
                f"{w}/{n}" for w, n in zip(wins["wins"], wins["repeats"])
            ]
    return [_md_table(shown.reset_index()), ""]


def resolve_function(name: str | MultiFidelityFunction) -> MultiFidelityFunction:
    """A multi-fidelity function by name (``fedgp.data.multifidelity.MF_FUNCTIONS``) or as
    ``"module:attribute"``: the extension point for your own :class:`MultiFidelityFunction`
    (any box domain, 2 or more levels, lowest fidelity first; defined at module level, so worker
    processes can import it)."""
    if isinstance(name, MultiFidelityFunction):
        return name
    if ":" not in str(name):
        if name not in MF_FUNCTIONS:
            raise ValueError(
                f"function {name!r}: not one of {', '.join(sorted(MF_FUNCTIONS))}; give your own as "
                "module:attribute (a fedgp.data.multifidelity.MultiFidelityFunction)"
            )
        return MF_FUNCTIONS[name]
    module, _, attribute = str(name).partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"function {name!r}: cannot import it ({type(err).__name__}: {err})") from None
    if not isinstance(found, MultiFidelityFunction):
        raise TypeError(
            f"function {name!r} is a {type(found).__name__}, not a fedgp.data.multifidelity."
            "MultiFidelityFunction(name, bounds, levels, paper_sizes)"
        )
    return found


def reproduce(
    repeats: int | None,
    out_dir: Path,
    seed: int = 0,
    quick: bool = False,
    progress: bool | None = None,
    function: Sequence[str | MultiFidelityFunction] | None = None,
    reuse: str | os.PathLike | None = None,
    methods: Sequence[str] | None = None,
) -> list[Path]:
    """``fedgp reproduce table1``: Table 1, the HF-size sweep and the p₁ ablation, CSV + markdown.

    ``methods`` (``--methods FGPR AR1 ...``): only these of :data:`METHODS` in Table 1 and the sweep
    (default all); rows of ``reuse`` for the others are not carried over. A selection without any
    of the sweep's methods (:data:`SWEEP_METHODS`) skips the sweep: no ``table1_sweep*.csv``, and
    ``table1.md`` says so.

    ``reuse`` (``--reuse DIR``): keep the per-repeat rows of DIR's ``table1_runs.csv`` and
    ``table1_sweep_runs.csv`` (``table1_<names>_runs.csv`` with ``function``) for the methods they
    hold, and run only what is missing (e.g. a method added since); the p₁ and protocol ablations
    (FGPR only) are kept from DIR's ``table1_p1.csv`` and ``table1_protocol.csv`` when they have the
    same repeats. The rows are taken as they are: reuse only files written with the same protocol.

    ``function`` (``--function forrester mymodule:myfunction``): Table 1's methods on these
    functions only (:func:`resolve_function`; sizes are each function's ``paper_sizes``), written to
    ``table1_<names>.csv``, ``table1_<names>_runs.csv`` and ``table1_<names>.md``; the paper-specific
    sweep and ablations are not run.

    Writes ``table1.csv``, ``table1_sweep.csv``, ``table1_p1.csv``, ``table1_protocol.csv`` (FGPR under
    the authors' minibatch/kernel choices, at most 10 repeats), the per-repeat rows
    (``table1_runs.csv``, ``table1_sweep_runs.csv``) and ``table1.md``. ``quick`` (CI): 2 repeats,
    CURRIN and BRANIN only, 10 rounds, 100 test points, sweep sizes 10 and 40 on CURRIN,
    p₁ ∈ {1/6, 1}: a smoke test of every code path, not a result.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    # Every GP here is at most a few hundred points: one thread is fastest, and several threads
    # contending on a shared machine made a run several times slower.
    torch.set_num_threads(1)
    try:
        reused = None if reuse is None else Path(reuse)
        if reused is not None and not reused.is_dir():
            raise ValueError(f"reuse: {reused} is not a folder")
        methods = METHODS if methods is None else tuple(methods)
        _check_methods(methods)
        if function is not None:
            return _reproduce_functions(
                [resolve_function(f) for f in function], repeats, out, seed, quick, progress, reused, methods
            )
        return _reproduce(repeats, out, seed, quick, progress, reused, methods)
    finally:
        torch.set_num_threads(threads)


QUICK_PROTOCOL = Protocol(
    rounds=10,
    mle_restarts=1,
    nargp_samples=10,
    n_test=100,
    converged_rounds=40,
    converged_patience=5,
    mfdgp_steps=(10, 10, 10),
    mfdgp_samples=3,
    mfdgp_predict_samples=20,
)


def _read_runs(folder: Path | None, name: str) -> pd.DataFrame | None:
    """Earlier per-repeat rows to reuse (None without a folder or the file)."""
    if folder is None or not (folder / name).exists():
        return None
    runs = pd.read_csv(folder / name)
    missing = {"function", "hf_size", "seed", "method", "rmse", "nll", "coverage95", "seconds"} - set(runs)
    if missing:
        raise ValueError(f"reuse: {folder / name} lacks the columns {sorted(missing)}")
    unknown = sorted(set(runs["method"]) - set(METHODS))
    if unknown:
        raise ValueError(f"reuse: {folder / name} has methods {unknown} that table1 does not know")
    return runs.reindex(columns=RUN_COLUMNS)


def _kept_text(*frames: pd.DataFrame | None, methods: Sequence[str] = METHODS) -> str:
    """The selected methods that ``frames`` (earlier per-repeat rows) hold."""
    held = {m for f in frames if f is not None for m in f["method"] if m in methods}
    return ", ".join(sorted(held, key=METHODS.index)) if held else "none"


def _read_summary(folder: Path | None, name: str, repeats: int, key: str, values) -> pd.DataFrame | None:
    """An earlier ablation summary, when it has the same ``repeats`` and ``key`` values."""
    if folder is None or not (folder / name).exists():
        return None
    frame = pd.read_csv(folder / name)
    if key not in frame or "repeats" not in frame or (frame["repeats"] != repeats).any():
        return None
    if sorted(set(frame[key])) != sorted(set(values)):
        return None
    return frame


def _reproduce_functions(
    functions: list[MultiFidelityFunction],
    repeats,
    out: Path,
    seed: int,
    quick: bool,
    progress,
    reuse: Path | None = None,
    methods: Sequence[str] = METHODS,
) -> list[Path]:
    if not functions:
        raise ValueError("function: name at least one multi-fidelity function")
    protocol = QUICK_PROTOCOL if quick else Protocol()
    repeats = (2 if quick else 30) if repeats is None else repeats
    stem = "table1_" + "-".join(f.name for f in functions)
    summary, runs = table1(
        repeats,
        seed,
        functions=functions,
        methods=methods,
        protocol=protocol,
        progress=progress,
        return_runs=True,
        reuse=_read_runs(reuse, f"{stem}_runs.csv"),
    )
    paths = [out / f"{stem}.csv", out / f"{stem}_runs.csv", out / f"{stem}.md"]
    summary.to_csv(paths[0], index=False)
    runs.to_csv(paths[1], index=False)
    lines = [
        f"# Table 1's methods on {', '.join(repr(f) for f in functions)} ({repeats} repeats, seed {seed}"
        f"{', QUICK MODE' if quick else ''})",
        "",
        "RMSE mean ± std over repeats on the standardised HF scale; sizes per level (lowest first): "
        + "; ".join(f"{f.name} {list(f.paper_sizes)}" for f in functions)
        + ". The paper has no numbers for these settings.",
        "",
        _md_table(summary),
        "",
        "Which wins (lower mean RMSE):",
        "",
        _md_table(winners(summary)),
        "",
        "## Protocol",
        "",
        "```",
        repr(protocol),
        "```",
        "",
    ]
    paths[2].write_text("\n".join(lines))
    return paths


def _reproduce(
    repeats: int | None,
    out: Path,
    seed: int,
    quick: bool,
    progress: bool | None,
    reuse: Path | None = None,
    methods: Sequence[str] = METHODS,
) -> list[Path]:
    if quick:
        protocol = QUICK_PROTOCOL
        repeats = 2 if repeats is None else repeats
        functions: tuple[str, ...] = ("currin", "branin")
        sweep_kw = dict(hf_sizes=(10, 40), functions=("currin",))
        p1_values: tuple[float, ...] = (1 / 6, 1.0)
    else:
        protocol = Protocol()
        repeats = 30 if repeats is None else repeats
        functions = TABLE1_FUNCTIONS
        sweep_kw = {}
        p1_values = (1 / 6, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)
    old_runs, old_sweep = _read_runs(reuse, "table1_runs.csv"), _read_runs(reuse, "table1_sweep_runs.csv")
    if reuse is not None and old_runs is None and old_sweep is None:
        raise ValueError(f"reuse: {reuse} has neither table1_runs.csv nor table1_sweep_runs.csv")
    started = time.perf_counter()
    summary, runs = table1(
        repeats,
        seed,
        functions=functions,
        methods=methods,
        protocol=protocol,
        progress=progress,
        return_runs=True,
        reuse=old_runs,
    )
    sweep_methods = [m for m in SWEEP_METHODS if m in methods]
    sweep = sweep_runs = None  # not run when the selection names none of its methods
    if sweep_methods:
        sweep, sweep_runs = hf_sweep(
            methods=sweep_methods,
            repeats=repeats,
            seed=seed,
            protocol=protocol,
            progress=progress,
            return_runs=True,
            reuse=old_sweep,
            **sweep_kw,
        )
    ablation = _read_summary(reuse, "table1_p1.csv", repeats, "p1", p1_values)
    if ablation is None:
        ablation = p1_ablation(p1_values, repeats=repeats, seed=seed, protocol=protocol, progress=progress)
    choices = _read_summary(reuse, "table1_protocol.csv", min(repeats, 10), "function", functions)
    if choices is None:
        choices = protocol_ablation(
            min(repeats, 10), seed, functions=functions, protocol=protocol, progress=progress
        )
    minutes = (time.perf_counter() - started) / 60
    paths = {
        "table1.csv": summary,
        "table1_sweep.csv": sweep,
        "table1_p1.csv": ablation,
        "table1_protocol.csv": choices,
        "table1_runs.csv": runs,
        "table1_sweep_runs.csv": sweep_runs,
    }
    written = []
    for name, frame in paths.items():
        if frame is None:
            continue
        frame.to_csv(out / name, index=False)
        written.append(out / name)
    kept = (
        ""
        if reuse is None
        else f" Rows kept from `{reuse}` (`--reuse`): "
        f"{_kept_text(old_runs, old_sweep if sweep_methods else None, methods=methods)}."
    )
    header = (
        f"# FGPR Table 1 reproduction ({repeats} repeats, seed {seed}{', QUICK MODE' if quick else ''})\n\n"
        f"Written by `fedgp reproduce table1` in {minutes:.1f} min.{kept} Protocol: {asdict(protocol)}."
    )
    md = out / "table1.md"
    md.write_text(_markdown(summary, runs, sweep, sweep_runs, ablation, choices, protocol, header))
    written.append(md)
    return written
