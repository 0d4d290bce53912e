"""Su, Xu & Yang (Appendix C): mixed linear regression, two-phase vs FedAvg, one-shot, IFCA and oracle.

Each cluster is a noise-only GP — ``LinearMean(100, bias=False)``, ``ZeroKernel``, noise fixed at
σ² = 0.04 — so the GP's per-point NLL is the paper's squared loss over 2σ², and steps given in
squared-loss units (η) are exactly the paper's. Settings C.1–C.3 (k = 3, d = 100, σ = 0.2; 200 × 50
points, or 900 × 10 + 20 × 50 with cluster shares 1/3 each or 0.2/0.3/0.5), θ*_j ~ (2/√d) N(0, I),
client labels i.i.d.

Methods (all Phase-2 style: hard assignment by local loss, FedAvg with s = 5 local full-batch
steps of η = 0.05, global n_i/N aggregation, 400 rounds):

* ``two_phase`` — Phase 1 (:class:`~fedgp.strategies.MomentDescentInit`: 10 anchors drawn from
  the data-rich clients, 5 iterations, U-statistic moments, direct SVD, first-moment sign fix,
  ϵ = 0.1 with the true Δ, threshold merge) from θ_0 ~ (2/√d) N(0, I), then Phase 2;
* ``fedavg`` — one model (k = 1) from a random start;
* ``one_shot`` — local minimum-norm least squares, k-means (k-means++, 10 restarts), labels fixed,
  FedAvg within each cluster (cluster-normalised averaging: the fastest variant, so the comparison
  is conservative);
* ``ifca`` — Phase 2 from θ_j ~ (2/√d) N(0, I) i.i.d.;
* ``oracle`` — Phase 2 from the true θ*.

The left panels' sweep reruns Phase 2 with s ∈ {1, 10} and FedProx from the *same* Phase-1
output (Phase 1 does not depend on s, so this equals rerunning the whole algorithm).

Error: ``d(θ, θ*) = min_π max_j ‖θ_π(j) − θ*_j‖`` (eq. 6; for FedAvg ``max_j ‖θ − θ*_j‖``). During
Phase 1 the curve shows the anchors merged at each iteration (``error``) and the worst anchor
(``anchor_error``); x = Phase-1 iteration 1..5, then 5 + Phase-2 round (the paper's axis).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.errors import InputError
from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table, max_matched_error
from fedgp.models import GPSpec, ZeroKernel
from fedgp.models.linear import linear_model
from fedgp.strategies import clustered as C
from fedgp.strategies.clustered.moment_descent import MomentDescentInit, merge_anchors
from fedgp.synthetic import su_xu_yang_setting

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "METHODS",
    "SETTINGS",
    "linear_spec",
    "run_setting",
    "mixed_regression",
    "summarize",
    "curve_summary",
    "phase1_study",
    "plot_setting",
    "reproduce",
]

#: The compared methods (two-phase, FedAvg, one-shot, IFCA, the oracle with true labels).
METHODS = ("two_phase", "fedavg", "one_shot", "ifca", "oracle")
#: Su, Xu & Yang's Appendix C settings.
SETTINGS = ("C1", "C2", "C3")
SWEEP = ("two_phase_s1", "two_phase_s10", "two_phase_fedprox")
NOISE = 0.2
WEIGHTS = "mean_module.weights"


def linear_spec(d: int, noise_var: float) -> GPSpec:
    """Linear regression as a GP: ``LinearMean(d, bias=False)``, ``ZeroKernel``, fixed noise σ²."""
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=False),
        initial_values={"likelihood.noise_covar.noise": noise_var},
        fixed=["likelihood.noise_covar.noise"],
    )


def separation(thetas: torch.Tensor) -> float:
    D = torch.cdist(thetas, thetas)
    return float(D[D > 0].min())


def _states(spec: GPSpec, thetas: torch.Tensor):
    """Cluster states (k,) with the given regressors."""
    base = spec.initial_state().expand(len(thetas)).clone()
    return linear_model(spec).with_vector(base, thetas)


def _strategy(method, k, d, spec, truth, eta, s, delta, phase1_centres=None):
    units = "squared_loss"
    random = C.RandomInit(kind="normal", scale=2 / np.sqrt(d), center="zero")
    if method == "two_phase":
        phase1 = MomentDescentInit(theta0_scale=2 / np.sqrt(d), delta=delta, eps=0.1)
        return C.two_phase(k, lr=eta, local_steps=s, units=units, phase1=phase1)
    if method in SWEEP:
        solver = (
            C.ProximalSolve(lr=eta, units=units)
            if method.endswith("fedprox")
            else C.GradientDescent(lr=eta, steps=int(method.rsplit("_s", 1)[1]), units=units)
        )
        return C.ifca(k, initializer=C.GivenInit(phase1_centres), solver=solver)
    if method == "fedavg":
        return C.fedavg(lr=eta, local_steps=s, units=units, initializer=random)
    if method == "one_shot":
        return C.one_shot(k, lr=eta, local_steps=s, units=units)
    if method == "ifca":
        return C.ifca(k, lr=eta, local_steps=s, units=units, initializer=random)
    if method == "oracle":
        return C.oracle(_states(spec, truth), lr=eta, local_steps=s, units=units)
    raise InputError(f"unknown method {method!r}; known: {METHODS + SWEEP}")


def _run(method, data, spec, seed, rounds, eta, s, delta, engine, progress, phase1_centres=None):
    truth, k, d = data.thetas, len(data.thetas), data.thetas.shape[1]
    strategy = _strategy(method, k, d, spec, truth, eta, s, delta, phase1_centres)
    rows, captured = [], {}

    def track(run):
        server = run.server
        if server.initialising:
            return
        if server.phase_round == 0:
            captured["centres"] = server.states.index(0).clone()
            return
        if server.phase_round > rounds:
            return
        W = server.states[WEIGHTS][server.best, :, :, 0]
        rows.append({"phase": "phase2", "round": server.phase_round, "error": max_matched_error(W, truth)})

    start = time.perf_counter()
    result = fit_study(
        spec,
        data.federation,
        strategy,
        strategy.init_rounds + rounds,
        seed,
        engine,
        progress,
        callbacks=[track],
    )
    seconds = time.perf_counter() - start
    curve = pd.DataFrame(rows)
    log = result.server_state.init_log
    offset = 0
    if log is not None and hasattr(log, "trace"):  # Phase 1: anchors merged at every iteration
        labels = data.labels[log.anchors]
        p1 = []
        for t, theta in enumerate(log.trace[1:], start=1):
            centres, _ = merge_anchors(theta, k, delta, "threshold")
            worst = float((theta - truth[labels]).norm(dim=1).max())
            p1.append(
                {
                    "phase": "phase1",
                    "round": t,
                    "error": max_matched_error(centres, truth),
                    "anchor_error": worst,
                }
            )
        offset = len(p1)
        curve = pd.concat([pd.DataFrame(p1), curve], ignore_index=True)
    curve["x"] = np.where(curve["phase"] == "phase1", curve["round"], curve["round"] + offset)
    final = float(curve.loc[(curve["phase"] == "phase2") & (curve["round"] == rounds), "error"].iloc[0])
    refills = int((result.history["stage"] == "refill").sum()) if "stage" in result.history else 0
    return curve, final, captured.get("centres"), seconds, refills


def run_setting(
    setting: str,
    seed: int = 0,
    rounds: int = 400,
    eta: float = 0.05,
    local_steps: int = 5,
    methods: Sequence[str] = METHODS,
    sweep: bool = True,
    engine: str | None = None,
    progress: bool | None = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One setting and seed: returns (finals: one row per method, curves: error per round)."""
    data = su_xu_yang_setting(setting, seed)
    spec = linear_spec(data.thetas.shape[1], NOISE**2)
    delta = separation(data.thetas)
    finals, curves, centres = [], [], None
    todo = list(methods)
    if sweep and "two_phase" not in todo:
        todo.insert(0, "two_phase")
    for method in todo + (list(SWEEP) if sweep else []):
        curve, final, c, seconds, refills = _run(
            method, data, spec, seed, rounds, eta, local_steps, delta, engine, progress, centres
        )
        if method == "two_phase":
            centres = c
        curve.insert(0, "method", method)
        curves.append(curve)
        if method in methods or method in SWEEP:
            finals.append({"method": method, "final_error": final, "seconds": seconds, "refills": refills})
    finals = pd.DataFrame(finals)
    oracle = finals.loc[finals["method"] == "oracle", "final_error"]
    finals["oracle_error"] = float(oracle.iloc[0]) if len(oracle) else np.nan
    finals.insert(0, "seed", seed)
    finals.insert(0, "setting", setting)
    curves = pd.concat(curves, ignore_index=True)
    curves.insert(0, "seed", seed)
    curves.insert(0, "setting", setting)
    finals["delta"] = delta
    return finals, curves


def phase1_study(
    setting: str = "C1",
    seeds: Iterable[int] = range(10),
    sign_fixes: Sequence[str] = ("first_moment", "none"),
    iterations: int = 5,
    engine: str | None = None,
) -> pd.DataFrame:
    """Phase 1 alone (no refill): per seed, sign fix and iteration, the error of the anchors merged
    by the Δ/2 threshold, ``d(θ̂, θ*)/Δ``, and of the worst anchor, ``max_i ‖θ_i − θ*_{z_i}‖/Δ``."""
    rows = []
    for seed in seeds:
        data = su_xu_yang_setting(setting, seed)
        d, k = data.thetas.shape[1], len(data.thetas)
        spec = linear_spec(d, NOISE**2)
        delta = separation(data.thetas)
        for fix in sign_fixes:
            phase1 = MomentDescentInit(
                iterations=iterations, theta0_scale=2 / np.sqrt(d), delta=delta, sign_fix=fix, refill=False
            )
            strategy = C.two_phase(k, phase1=phase1)
            result = fit_study(spec, data.federation, strategy, strategy.init_rounds, seed, engine)
            log = result.server_state.init_log
            labels = data.labels[log.anchors]
            for t, theta in enumerate(log.trace[1:], start=1):
                centres, _ = merge_anchors(theta, k, delta, "threshold")
                rows.append(
                    {
                        "setting": setting,
                        "seed": seed,
                        "sign_fix": fix,
                        "iteration": t,
                        "merged_error_over_delta": max_matched_error(centres, data.thetas) / delta,
                        "worst_anchor_over_delta": float((theta - data.thetas[labels]).norm(dim=1).max())
                        / delta,
                        "groups": len(centres),
                    }
                )
    return pd.DataFrame(rows)


def mixed_regression(
    seeds: Iterable[int] = range(10),
    settings: Sequence[str] = SETTINGS,
    rounds: int = 400,
    sweep: bool = True,
    engine: str | None = None,
    progress: bool | None = False,
    **options,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All settings × seeds: (finals, curves), concatenated."""
    finals, curves = [], []
    for setting in settings:
        for seed in seeds:
            f, c = run_setting(
                setting, seed, rounds, sweep=sweep, engine=engine, progress=progress, **options
            )
            finals.append(f)
            curves.append(c)
    return pd.concat(finals, ignore_index=True), pd.concat(curves, ignore_index=True)


def summarize(finals: pd.DataFrame, factor: float = 1.2) -> pd.DataFrame:
    """Per setting and method: median and range of the final error, and in how many seeds it is
    within ``factor`` × the oracle's final error (same seed)."""
    f = finals.assign(within=finals["final_error"] <= factor * finals["oracle_error"])
    return (
        f.groupby(["setting", "method"], sort=False)
        .agg(
            seeds=("seed", "nunique"),
            median_error=("final_error", "median"),
            min_error=("final_error", "min"),
            max_error=("final_error", "max"),
            median_oracle=("oracle_error", "median"),
            within_1_2x_oracle=("within", "sum"),
        )
        .reset_index()
    )


def curve_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """Median and quartiles of the error over seeds, per setting, method and x."""
    g = curves.groupby(["setting", "method", "phase", "x"], sort=False)["error"]
    return pd.DataFrame(
        {"median": g.median(), "q25": g.quantile(0.25), "q75": g.quantile(0.75), "seeds": g.count()}
    ).reset_index()


def plot_setting(summary: pd.DataFrame, setting: str, axes=None) -> Sequence[Axes] | np.ndarray:
    """The paper's two panels for one setting from :func:`curve_summary`'s table: left, two-phase with
    s ∈ {1, 5, 10} and FedProx; right, two-phase against the baselines. Median over seeds with the
    interquartile band."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    summary = summary[summary["setting"] == setting]
    panels = [
        (axes[0], ["two_phase_s1", "two_phase", "two_phase_s10", "two_phase_fedprox"]),
        (axes[1], list(METHODS)),
    ]
    names = {
        "two_phase": "two-phase (s=5)",
        "two_phase_s1": "two-phase (s=1)",
        "two_phase_s10": "two-phase (s=10)",
        "two_phase_fedprox": "two-phase (FedProx)",
    }
    for ax, methods in panels:
        for method in methods:
            sub = summary[summary["method"] == method]
            if method != "two_phase" and method.startswith("two_phase"):
                first = summary[(summary["method"] == "two_phase") & (summary["phase"] == "phase1")]
                sub = pd.concat([first, sub])
            if sub.empty:
                continue
            (line,) = ax.semilogy(sub["x"], sub["median"], label=names.get(method, method))
            ax.fill_between(sub["x"], sub["q25"], sub["q75"], color=line.get_color(), alpha=0.15, lw=0)
        ax.axvline(5.5, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("global iteration (1-5: Phase 1)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel(r"$d(\theta, \theta^*)$")
    axes[0].set_title(f"{setting}: two-phase, local steps")
    axes[1].set_title(f"{setting}: against baselines")
    return axes


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce mixed-regression``: CSVs of final errors and curves, and a markdown summary."""
    repeats = repeats or (2 if quick else 10)
    rounds = 60 if quick else 400
    seeds = range(seed, seed + repeats)

    def study():
        finals, curves = mixed_regression(seeds, rounds=rounds, progress=progress)
        return finals, curves, phase1_study("C1", seeds)

    def report(ran, minutes: float) -> Report:
        finals, curves, phase1 = ran
        last = phase1[phase1["iteration"] == phase1["iteration"].max()]
        below = last.groupby("sign_fix")["merged_error_over_delta"].apply(lambda v: int((v < 0.5).sum()))
        text = (
            "# Su, Xu & Yang, Appendix C: mixed linear regression\n\n"
            f"{repeats} seeds from {seed}, {rounds} Phase-2 rounds, engine {default_engine()}, "
            f"{minutes:.1f} min.\n\n" + markdown_table(summarize(finals)) + "\n\n"
            "Phase 1 alone on C1 (5 iterations): seeds with d(θ̂, θ*) < 0.5 Δ, by sign fix: "
            + ", ".join(f"{fix}: {count}/{repeats}" for fix, count in below.items())
            + "\n"
        )
        tables = {
            "mixed_regression.csv": finals[finals["method"].isin(METHODS)][
                ["setting", "method", "seed", "final_error", "oracle_error"]
            ],
            "mixed_regression_sweep.csv": finals[finals["method"].isin(SWEEP + ("two_phase",))],
            "mixed_regression_curves.csv": curve_summary(curves),
            "mixed_regression_phase1.csv": phase1,
        }
        return Report(tables, {"mixed_regression.md": text})

    return reproduction(out_dir, study, report)
