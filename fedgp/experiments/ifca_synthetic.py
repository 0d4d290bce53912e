"""IFCA's synthetic experiment (Ghosh et al. 2020, §6.1, Fig. 3): success probability of IFCA on
mixed linear regression against the separation scale R and against the data size m·n.

IFCA here is the clustered GP with a linear mean, the zero kernel and a fixed noise σ²_GP: option I
(gradient averaging, ``θ_j ← θ_j − (γ/m) Σ_{i∈S_j} ∇F_i``), every client every round, Bernoulli(½)
initialisation with 10 restarts, 300 rounds. The per-point NLL is ``MSE/(2σ²_GP) + const``, so the
GP step ``2σ²_GP γ`` reproduces the paper's MSE step γ exactly for any σ²_GP (a test in
tests/strategies/test_ifca.py checks this iterate for iterate); we use σ²_GP = 1.

The authors' protocol (digest §4.2): θ*_j = R · Bernoulli(½)^d (their code's coordinate scaling,
which produced the figure), x ~ N(0, I_d), y = ⟨x, θ*⟩ + σ ε, clusters in contiguous blocks. A trial
succeeds when the best of (10 initialisations × the step sizes γ ∈ {0.01, 0.1, 1} for k = 2,
{0.5, 1, 2} for k = 4) ends with ``dist ≤ 0.6σ + 0.001``, ``dist = (1/k) Σ_j ‖θ̂_π(j) − θ*_j‖``
(Hungarian matching; the code's nearest-truth variant is reported too).

**Step sizes.** The full run sweeps γ ∈ {0.1, 1} for k = 2 (γ = 0.01 never came within 1.0 of θ*
in 300 rounds in a 60-trial pilot, so leaving it out changes no best-over-step-sizes result) and the
authors' {0.5, 1, 2} for k = 4.

**Reduced scale.** The paper uses d = 1000 and (m, n) = (100, 100) for k = 2, (400, 100) for k = 4,
40 trials — days of CPU, as its authors note. We keep the ratios n/d = 0.1 and (m/k)·n/d = 5 with
d = 100, n = 10, and fewer trials; the location of the transition in R therefore differs from the
paper's (the separation ‖θ*_1 − θ*_2‖ ≈ R √(d/2) shrinks with d), the shape is what is compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedgp.experiments.common import Report, default_engine, fit_study, reproduction
from fedgp.experiments.metrics import markdown_table, mean_matched_error, nearest_truth_error
from fedgp.experiments.mixed_regression import linear_spec
from fedgp.strategies import clustered as C
from fedgp.synthetic import mixed_linear_regression

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "LEARNING_RATES",
    "RS",
    "ifca_strategy",
    "trial",
    "success_vs_separation",
    "success_vs_size",
    "success_table",
    "plot_success",
    "reproduce",
]

#: Separation scales of the reduced-scale runs: the transition at d = 100 lies between 0.05 and 0.25.
RS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.5)
#: The authors' step-size sweeps (MSE units).
LEARNING_RATES = {2: (0.01, 0.1, 1.0), 4: (0.5, 1.0, 2.0)}
WEIGHTS = "mean_module.weights"


def ifca_strategy(k: int, lr: float, inits: int = 10) -> C.ClusteredGP:
    """IFCA option I with Bernoulli(½) restarts; ``lr`` is the paper's γ on the MSE (no ½)."""
    return C.ClusteredGP(
        k,
        C.RandomInit(kind="bernoulli", scale=1.0),
        C.HardAssigner(),
        C.GradientSolver(),
        C.GradientStep(2 * lr, "total", units="squared_loss"),  # 2σ²_GP γ
        restarts=inits,
    )


def trial(
    k: int,
    d: int,
    m: int,
    n: int,
    sigma: float,
    r: float,
    seed: int,
    lrs: Sequence[float] | None = None,
    inits: int = 10,
    rounds: int = 300,
    engine: str | None = None,
) -> dict:
    """One trial: data drawn with ``seed``; IFCA from the same ``inits`` initialisations for every step
    size. Returns the best distances over initialisations × step sizes and the success flags."""
    lrs = LEARNING_RATES.get(k, (0.1,)) if lrs is None else lrs
    data = mixed_linear_regression(
        k=k, d=d, m=m, n=n, noise=sigma, separation=r, scale="coordinate", seed=seed
    )
    spec = linear_spec(d, 1.0)
    best, best_nearest, per_lr = np.inf, np.inf, {}
    for lr in lrs:
        result = fit_study(spec, data.federation, ifca_strategy(k, lr, inits), rounds, seed, engine)
        W = result.server_state.states[WEIGHTS][..., 0]  # (inits, k, d)
        dist = [mean_matched_error(W[i], data.thetas) for i in range(len(W))]
        nearest = [nearest_truth_error(W[i], data.thetas) for i in range(len(W))]
        per_lr[lr] = min(dist)
        best, best_nearest = min(best, min(dist)), min(best_nearest, min(nearest))
    threshold = 0.6 * sigma + 1e-3
    return {
        "k": k,
        "d": d,
        "m": m,
        "n": n,
        "sigma": sigma,
        "R": r,
        "seed": seed,
        "best_dist": best,
        "best_dist_nearest": best_nearest,
        "success": best <= threshold,
        "success_nearest": best_nearest <= threshold,
        **{f"best_dist_lr{lr:g}": v for lr, v in per_lr.items()},
    }


def success_vs_separation(
    k: int = 2,
    d: int = 100,
    m: int | None = None,
    n: int = 10,
    sigmas: Sequence[float] = (0.0, 0.1, 0.2, 0.4),
    rs: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 1.0),
    trials: Iterable[int] = range(20),
    **options,
) -> pd.DataFrame:
    """Fig. 3(a)/(b): one row per (σ, R, trial).

    ``m`` defaults to the paper's: 100 for k = 2, 400 for k = 4.
    """
    m = {2: 100, 4: 400}.get(k, 50 * k) if m is None else m
    rows = [trial(k, d, m, n, s, r, t, **options) for s in sigmas for r in rs for t in trials]
    return pd.DataFrame(rows)


def success_vs_size(
    k: int = 2,
    d: int = 100,
    ms: Sequence[int] = (50, 100, 200, 400),
    ns: Sequence[int] = (5, 10, 20),
    sigma: float = 0.1,
    r: float = 0.1,
    trials: Iterable[int] = range(10),
    **options,
) -> pd.DataFrame:
    """Fig. 3(c)/(d): one row per (m, n, trial)."""
    rows = [trial(k, d, m, n, sigma, r, t, **options) for n in ns for m in ms for t in trials]
    return pd.DataFrame(rows)


def success_table(rows: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Success probability (and its standard error) per grid point."""
    g = rows.groupby(list(by), sort=True)
    out = g.agg(
        trials=("success", "size"), success=("success", "mean"), success_nearest=("success_nearest", "mean")
    )
    out["stderr"] = np.sqrt(out["success"] * (1 - out["success"]) / out["trials"])
    return out.reset_index()


def plot_success(
    table: pd.DataFrame, x: str, curve: str, ax=None, title: str = "", xscale: str = "log"
) -> Axes:
    """Success probability against ``x``, one line per value of ``curve``, with ticks at the values
    of ``x`` that were run, labelled plainly (a log axis's own minor labels, 2×10⁻¹, 3×10⁻¹, ...,
    overlap within a decade)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    ax = plt.gca() if ax is None else ax
    for value, sub in table.groupby(curve):
        ax.errorbar(
            sub[x], sub["success"], yerr=sub["stderr"], marker="o", capsize=2, label=f"{curve}={value:g}"
        )
    ax.set_xscale(xscale)
    ticks = np.sort(table[x].unique())
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(f"{x} (log scale)" if xscale == "log" else x)
    ax.set_ylabel("success probability")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return ax


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce ifca-synthetic``: Fig. 3(a)–(c) at reduced scale (see the module docstring)."""

    def study():
        if quick:
            trials = range(seed, seed + (repeats or 2))
            small = dict(rounds=60, inits=4)
            return (
                success_vs_separation(2, sigmas=(0.1,), rs=(0.1, 0.5), trials=trials, **small),
                success_vs_separation(4, sigmas=(0.1,), rs=(0.5,), trials=trials, **small),
                success_vs_size(2, ms=(50, 100), ns=(10,), trials=trials, **small),
            )
        # γ = 0.01 never came within 1.0 of θ* in 300 rounds in a 60-trial pilot (k = 2), so the
        # k = 2 sweeps use γ ∈ {0.1, 1}; the best over step sizes is unchanged, the time is 2/3.
        k2 = dict(lrs=(0.1, 1.0))
        return (
            success_vs_separation(
                2, sigmas=(0.0, 0.1, 0.4), rs=RS, trials=range(seed, seed + (repeats or 15)), **k2
            ),
            success_vs_separation(4, sigmas=(0.1,), rs=RS[1:], trials=range(seed, seed + (repeats or 8))),
            success_vs_size(2, sigma=0.1, r=0.1, trials=range(seed, seed + (repeats or 8)), **k2),
        )

    def report(panels, minutes: float) -> Report:
        a, b, c = panels
        rows = pd.concat([a.assign(panel="a"), b.assign(panel="b"), c.assign(panel="c")], ignore_index=True)
        text = [
            "# IFCA synthetic (Ghosh et al. Fig. 3), reduced scale: d = 100, n = 10\n",
            f"{minutes:.1f} min, engine {default_engine()}.\n",
            "## (a) k = 2, m = 100: success probability against R\n",
            markdown_table(success_table(a, ["sigma", "R"])),
            "\n## (b) k = 4, m = 400: success probability against R\n",
            markdown_table(success_table(b, ["sigma", "R"])),
            "\n## (c) k = 2, σ = 0.1, R = 0.1: success probability against m, n\n",
            markdown_table(success_table(c, ["n", "m"])),
            "",
        ]
        return Report({"ifca_synthetic.csv": rows}, {"ifca_synthetic.md": "\n".join(text)})

    return reproduction(out_dir, study, report)
