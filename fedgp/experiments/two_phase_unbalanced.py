"""Two-phase (Su, Xu & Yang) on unbalanced clusters, trained to convergence (beyond the paper).

Setting (:data:`SETTING`): k = 4 clusters holding 4 %, 16 %, 30 % and 50 % of the data, d = 50,
σ = 0.2, θ*_j ~ (2/√d) N(0, I) as in the paper's Appendix C, 200 clients with Pareto sizes
(shape 1.5, 10 to 200 points), each client joining the cluster furthest below its data share
(:func:`fedgp.synthetic.gaussian_mixed_regression`, ``labels="data_shares"``).

Phase 2 with the paper's aggregation moves cluster j by ``N_j/N`` of its members' average change,
so Theorem 2's rate is set by the smallest share ρ: the 4 % cluster converges about 12× slower
than the 50 % one. Methods, each run until :data:`STOP` holds for every cluster (``fit(stop=...)``)
within a budget of :data:`BUDGET` Phase-2 rounds:

* ``two_phase`` — the paper's (Phase 1 moment descent, Phase 2 with ``weighting="global"``);
* ``two_phase_cluster`` — the same Phase 1, Phase 2 with ``weighting="cluster"`` (each cluster
  averaged over its own members, :mod:`fedgp.strategies.clustered.presets`);
* ``oracle``, ``oracle_cluster`` — Phase 2 started at the true θ* (infeasible; the reference,
  :func:`run_seed`).

Recorded: every cluster's error ``‖θ̂_π(j) − θ*_j‖`` (π the minimum-sum matching) at every round
(kept at rounds 1–100, then every 10th, and the last), the round at which each cluster first comes
within 1.2× of the converged oracle's error for it, the error at the paper's 400 rounds, and where
and why each run stopped.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

from fedgp.data import skewed_sizes
from fedgp.errors import ConvergenceWarning
from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.experiments.mixed_regression import NOISE, WEIGHTS, linear_spec, separation
from fedgp.run.stopping import StateChange
from fedgp.strategies import clustered as C
from fedgp.strategies.clustered.moment_descent import MomentDescentInit
from fedgp.synthetic import gaussian_mixed_regression
from fedgp.synthetic.draws import MixedRegression

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "SETTING",
    "METHODS",
    "STOP",
    "BUDGET",
    "unbalanced_setting",
    "matched_errors",
    "run_seed",
    "study",
    "summarize",
    "plot_clusters",
    "reproduce",
]

#: The held-out-style setting: cluster data shares, dimension, and the Pareto client sizes.
SETTING = {
    "k": 4,
    "d": 50,
    "shares": (0.04, 0.16, 0.30, 0.50),
    "clients": 200,
    "min_size": 10,
    "max_size": 200,
    "pareto_shape": 1.5,
}
#: The runs of one seed: the paper's and the within-cluster weighting, each from Phase 1 and from θ*.
METHODS = ("two_phase", "two_phase_cluster", "oracle", "oracle_cluster")
#: Every cluster's state changed by less than 1e-7 (relative) over 20 rounds. ``stop="auto"`` also
#: stops at a plateau of the training NLL, which the large clusters dominate: it would end a run
#: while the 4 % cluster still moves.
STOP = StateChange(tol=1e-7, window=20)
#: Phase-2 round budget of every run (the rule held well before it in all five seeds).
BUDGET = 10_000
ETA, LOCAL_STEPS, WITHIN = 0.05, 5, 1.2


def unbalanced_setting(seed: int = 0, **changes) -> MixedRegression:
    """The study's federation for ``seed`` (:data:`SETTING`, with ``changes`` applied)."""
    cfg = {**SETTING, **changes}
    sizes = skewed_sizes(
        cfg["clients"],
        cfg["min_size"],
        cfg["max_size"],
        "pareto",
        seed=seed,
        pareto_shape=cfg["pareto_shape"],
    )
    return gaussian_mixed_regression(
        k=cfg["k"],
        d=cfg["d"],
        sizes=sizes,
        shares=cfg["shares"],
        noise=NOISE,
        labels="data_shares",
        seed=seed,
    )


def matched_errors(estimates, truths) -> np.ndarray:
    """``‖θ̂_π(j) − θ*_j‖`` for every true cluster j, π the minimum-sum (Hungarian) matching."""
    est, tru = np.asarray(estimates, dtype=float), np.asarray(truths, dtype=float)
    D = np.linalg.norm(est[:, None, :] - tru[None, :, :], axis=-1)
    rows, cols = linear_sum_assignment(D)
    out = np.empty(tru.shape[0])
    out[cols] = D[rows, cols]
    return out


def _strategy(method: str, data: MixedRegression, spec):
    k, d = data.thetas.shape
    weighting = "cluster" if method.endswith("_cluster") else "global"
    if method.startswith("oracle"):
        base = spec.initial_state().expand(k).clone()
        from fedgp.models.linear import linear_model

        truth = linear_model(spec).with_vector(base, data.thetas)
        return C.oracle(truth, lr=ETA, local_steps=LOCAL_STEPS, weighting=weighting)
    phase1 = MomentDescentInit(theta0_scale=2 / np.sqrt(d), delta=separation(data.thetas), eps=0.1)
    return C.two_phase(
        k, lr=ETA, local_steps=LOCAL_STEPS, units="squared_loss", phase1=phase1, weighting=weighting
    )


def _kept(rnd: int) -> bool:
    return rnd <= 100 or rnd % 10 == 0


def run_method(method: str, data: MixedRegression, seed: int, budget: int = BUDGET, engine=None, stop=STOP):
    """One method on one federation: (per-cluster curve rows, run summary)."""
    spec = linear_spec(data.thetas.shape[1], NOISE**2)
    strategy = _strategy(method, data, spec)
    truth = data.thetas.numpy()
    rows: list[dict] = []
    last: dict = {}

    def track(run):
        server = run.server
        if server.initialising or server.phase_round == 0:
            return
        errors = matched_errors(server.states[WEIGHTS][server.best, :, :, 0].numpy(), truth)
        last.update(round=server.phase_round, errors=errors)
        if _kept(server.phase_round):
            rows.extend(
                {"round": server.phase_round, "cluster": j, "error": float(e)} for j, e in enumerate(errors)
            )

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # recorded below as stopped = False
        warnings.filterwarnings("ignore", message="Phase 1 merged")  # counted in the refills column
        result = fit_study(
            spec,
            data.federation,
            strategy,
            strategy.init_rounds + budget,
            seed,
            engine,
            callbacks=[track],
            stop=stop,
        )
    seconds = time.perf_counter() - start
    if not _kept(last["round"]):
        rows.extend(
            {"round": last["round"], "cluster": j, "error": float(e)} for j, e in enumerate(last["errors"])
        )
    history = result.history
    refills = int((history["stage"] == "refill").sum()) if "stage" in history else 0
    summary = {
        "rounds": last["round"],
        "stopped": bool(history.attrs["stopped"]),
        "stop_reason": history.attrs["stop_reason"],
        "seconds": seconds,
        "refills": refills,
    }
    return pd.DataFrame(rows), summary


def run_seed(
    seed: int, methods: Sequence[str] = METHODS, budget: int = BUDGET, engine=None, **changes
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every method on the federation of ``seed``: (curves, finals); finals have one row per method
    and cluster, with the converged oracle's error for that cluster beside it (``oracle_cluster``'s
    when it ran, else ``oracle``'s: both weightings have the same fixed point, and the first gets
    there in a tenth of the rounds)."""
    data = unbalanced_setting(seed, **changes)
    sizes = np.array([c.n for c in data.federation])
    labels = data.labels.numpy()
    shares = np.array([sizes[labels == j].sum() for j in range(data.thetas.shape[0])]) / sizes.sum()
    curves, finals = [], []
    for method in methods:
        curve, summary = run_method(method, data, seed, budget, engine)
        curve.insert(0, "method", method)
        curves.append(curve)
        end = curve[curve["round"] == curve["round"].max()].set_index("cluster")["error"]
        at400 = curve[curve["round"] == 400].set_index("cluster")["error"]
        for j in range(len(shares)):
            finals.append(
                {
                    "method": method,
                    "cluster": j,
                    "data_share": shares[j],
                    "final_error": float(end[j]),
                    "error_at_400": float(at400[j]) if j in at400.index else float(end[j]),
                    **summary,
                }
            )
    curves = pd.concat(curves, ignore_index=True)
    finals = pd.DataFrame(finals)
    reference = "oracle_cluster" if "oracle_cluster" in methods else "oracle"
    oracle = finals[finals["method"] == reference].set_index("cluster")["final_error"]
    finals["oracle_error"] = finals["cluster"].map(oracle) if len(oracle) else np.nan
    reach = []
    for row in finals.itertuples():
        c = curves[(curves["method"] == row.method) & (curves["cluster"] == row.cluster)]
        inside = c[c["error"] <= WITHIN * row.oracle_error]
        # the first kept round inside the band from which the curve stays inside it
        outside = c[c["error"] > WITHIN * row.oracle_error]["round"]
        after = inside[inside["round"] > (outside.max() if len(outside) else 0)]
        reach.append(int(after["round"].min()) if len(after) else np.nan)
    finals["rounds_to_oracle"] = reach
    for frame in (curves, finals):
        frame.insert(0, "seed", seed)
    return curves, finals


def study(
    seeds: Iterable[int] = range(5), methods: Sequence[str] = METHODS, budget: int = BUDGET, engine=None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`run_seed` over ``seeds``, concatenated."""
    parts = [run_seed(s, methods, budget, engine) for s in seeds]
    return pd.concat([p[0] for p in parts], ignore_index=True), pd.concat(
        [p[1] for p in parts], ignore_index=True
    )


def summarize(finals: pd.DataFrame) -> pd.DataFrame:
    """Per method and cluster: data share, median rounds to come within 1.2× of the oracle, how
    many seeds are within 1.2× of it at 400 rounds and at the stop, median final/oracle ratio,
    stopping rounds and how many runs met the rule."""
    f = finals.assign(
        within_at_400=finals["error_at_400"] <= WITHIN * finals["oracle_error"],
        within_at_stop=finals["final_error"] <= WITHIN * finals["oracle_error"],
        ratio=finals["final_error"] / finals["oracle_error"],
    )
    return (
        f.groupby(["method", "cluster"], sort=False)
        .agg(
            seeds=("seed", "nunique"),
            data_share=("data_share", "median"),
            median_rounds_to_oracle=("rounds_to_oracle", "median"),
            max_rounds_to_oracle=("rounds_to_oracle", "max"),
            within_1_2x_at_400=("within_at_400", "sum"),
            within_1_2x_at_stop=("within_at_stop", "sum"),
            median_final_over_oracle=("ratio", "median"),
            median_stop_round=("rounds", "median"),
            max_stop_round=("rounds", "max"),
            rule_met=("stopped", "sum"),
        )
        .reset_index()
    )


def plot_clusters(curves: pd.DataFrame, finals: pd.DataFrame, axes=None) -> Sequence[Axes] | np.ndarray:
    """One panel per cluster: the error per round (median over seeds, interquartile band) of each
    method, on log-log axes, and the converged oracle's median error (dashed)."""
    import matplotlib.pyplot as plt

    k = int(curves["cluster"].max()) + 1
    if axes is None:
        _, axes = plt.subplots(1, k, figsize=(3.3 * k, 3.2), sharey=True)
    styles = {
        "two_phase": ("C0", "-", "two-phase (paper: n_i/N)"),
        "two_phase_cluster": ("C3", "-", "two-phase (n_i/N_j)"),
        "oracle": ("C0", ":", "oracle (n_i/N)"),
        "oracle_cluster": ("C3", ":", "oracle (n_i/N_j)"),
    }
    for j, ax in enumerate(np.ravel(axes)):
        for method, (color, ls, label) in styles.items():
            sub = curves[(curves["method"] == method) & (curves["cluster"] == j)]
            if sub.empty:
                continue
            g = sub.groupby("round")["error"]
            x = g.median().index
            ax.loglog(x, g.median(), color=color, ls=ls, label=label, lw=1.4)
            ax.fill_between(x, g.quantile(0.25), g.quantile(0.75), color=color, alpha=0.12, lw=0)
        share = finals.loc[finals["cluster"] == j, "data_share"].median()
        floor = finals.loc[finals["cluster"] == j, "oracle_error"].median()
        ax.axhline(floor, color="k", lw=0.8, ls="--", label="converged oracle")
        ax.axvline(400, color="grey", lw=0.6, ls="-.", label="paper's 400 rounds")
        ax.set_title(f"cluster {j}: {100 * share:.1f} % of the data")
        ax.set_xlabel("Phase-2 round")
    np.ravel(axes)[0].set_ylabel(r"$\|\hat\theta_{\pi(j)} - \theta^*_j\|$")
    np.ravel(axes)[-1].legend(fontsize=7, loc="upper right")
    return axes


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce two-phase-unbalanced``: per-cluster curves and finals (CSV) and a summary."""
    repeats = repeats or (2 if quick else 5)
    budget = 300 if quick else BUDGET
    changes = {"clients": 60, "d": 10} if quick else {}

    def study():
        parts = [run_seed(s, METHODS, budget, None, **changes) for s in range(seed, seed + repeats)]
        curves = pd.concat([p[0] for p in parts], ignore_index=True)
        return pd.concat([p[1] for p in parts], ignore_index=True), curves

    def report(ran, minutes: float) -> Report:
        finals, curves = ran
        text = (
            "# Two-phase on unbalanced clusters, trained to convergence"
            f"{' (QUICK MODE)' if quick else ''}\n\n"
            f"Written by `fedgp reproduce two-phase-unbalanced` in {minutes:.1f} min: {repeats} seeds from "
            f"{seed}, setting { ({**SETTING, **changes}) }, η = {ETA}, s = {LOCAL_STEPS}, stop = {STOP!r} "
            f"within {budget} Phase-2 rounds, engine {default_engine()}.\n\n"
            "Per method and cluster (rounds to oracle: the first round from which the cluster's error "
            f"stays within {WITHIN}× the converged oracle's; medians over seeds):\n\n"
            + markdown_table(summarize(finals))
            + "\n"
        )
        tables = {"two_phase_unbalanced.csv": finals, "two_phase_unbalanced_curves.csv": curves}
        return Report(tables, {"two_phase_unbalanced.md": text})

    return reproduction(out_dir, study, report)
