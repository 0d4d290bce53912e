"""What client-level differential privacy costs FGPR, and what it buys: ``fedgp reproduce privacy``.

**Cost.** FGPR with :class:`fedgp.run.ClientDP` (noise calibrated to each ε for the planned
rounds, δ = 1e-5, Poisson rate 0.1, clip 0.3; the noise drawn from the run's seed so that the
numbers reproduce, ``reproducible=True``) against the same FGPR without it (ε = ∞), on

* the README's federation (θ* = outputscale 2, lengthscales 0.3 / 0.5, noise 0.1; d = 2) scaled to
  K = 200 and K = 1,000 clients of 50 training and 20 test points each (the README's clients have
  250: 50 keeps K = 1,000 a few seconds a round), 40 rounds;
* C-MAPSS FD001 (sensor s2, one client per engine unit, K = 100; δ = 1e-4 < 1/K; the data root
  ``FEDGP_DATA``), 40 rounds; skipped, saying so, where the files are absent.

Metrics: the clients' mean test RMSE, NLL and 95 % coverage (each client conditions the learned
θ on its own data: outside the guarantee, measured here), and for the GP draws the mean relative
error of θ against θ*.

**What it buys.** A membership attack on an outlying row: 20 clients of 20 points; in half of the
trials (a fair coin) client 0 holds one extra row whose target is 8 standard deviations off. The
attacker reads a noise variance (which an outlier raises): without DP, either client 0's own reply
after round 1 (what plain FGPR's server receives) or the released θ after 10 rounds (what
aggregation alone hides); with DP (δ = 1e-3, everyone every round, clip 0.3), the released θ
after 10 rounds. It thresholds the value at the median of its shadow trials (the first half) and
guesses on the second half; its accuracy is compared with the bound DP gives any test at (ε, δ):
e^ε / (1 + e^ε) + δ.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.data import ClientData, Federation
from fedgp.datasets import load_cmapss
from fedgp.errors import FedGPError
from fedgp.experiments.common import Report, default_engine, reproduction
from fedgp.experiments.metrics import markdown_table
from fedgp.models import GPSpec
from fedgp.rng import generator
from fedgp.run import ClientDP, Progress, Run, fit
from fedgp.run.exchange import exchange
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

__all__ = ["EPSILONS", "privacy_cost", "membership_attack", "reproduce"]

#: The privacy budgets compared (``inf``: FGPR without DP).
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
THETA = {
    "covar_module.outputscale": 2.0,
    "likelihood.noise_covar.noise": 0.1,
    "covar_module.base_kernel.lengthscale": [[0.3, 0.5]],
}
NOISE = "likelihood.noise_covar.noise"


def _spec(d: int) -> GPSpec:
    return GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d)))


def _privacy(epsilon: float, delta: float, **settings) -> ClientDP | None:
    """The study's FGPR made private: noise drawn from the run's seed (``reproducible``), so that
    the committed numbers come back from the command; the same distribution as a deployment's
    secret noise. ``None`` at ε = inf (FGPR without DP)."""
    if math.isinf(epsilon):
        return None
    return ClientDP(FGPR(), epsilon=epsilon, delta=delta, reproducible=True, **settings)


def _fit(spec, federation, rounds, seed, privacy, transforms):
    strategy = FGPR() if privacy is None else privacy
    return fit(spec, federation, strategy, rounds=rounds, seed=seed, engine=default_engine(),
               transforms=transforms, callbacks=[Progress(False)])  # fmt: skip


def _row(result, **labels) -> dict:
    scores = result.evaluate()
    return {**labels, "test_rmse": float(scores["rmse"].mean()), "test_nll": float(scores["nll"].mean()),
            "coverage95": float(scores["coverage95"].mean())}  # fmt: skip


def _federations(ks, n, n_test, seed, cmapss_root):
    for k in ks:
        draws = gp_federation(num_clients=k, n=n, d=2, theta=THETA, n_test=n_test, seed=seed)
        yield f"gp K={k}", draws.federation, _spec(2), draws.truth, 1e-5
    root = cmapss_root if cmapss_root is not None else os.environ.get("FEDGP_DATA")
    try:
        data = load_cmapss("FD001", root=root)
    except (OSError, FedGPError) as err:
        print(f"privacy: C-MAPSS skipped ({type(err).__name__}: {err})")
        return
    clients = list(data.federation(sensor="s2"))
    rng = np.random.default_rng(seed)
    split = []
    for c in clients:  # a fifth of each unit's cycles held out for the test metrics
        test = rng.random(len(c.y)) < 0.2
        split.append(ClientData(c.X[~test], c.y[~test], id=c.id, X_test=c.X[test], y_test=c.y[test]))
    yield "C-MAPSS FD001 s2", Federation(split), _spec(split[0].X.shape[-1]), None, 1e-4


def privacy_cost(
    seeds=range(1), ks=(200, 1000), epsilons=EPSILONS, rounds: int = 40, n: int = 50, n_test: int = 20,
    rate: float = 0.1, clip: float = 0.3, cmapss_root=None,
) -> pd.DataFrame:  # fmt: skip
    """One row per (federation, seed, ε): test RMSE, NLL, coverage, θ error, the noise multiplier."""
    rows = []
    for seed in seeds:
        for name, federation, spec, truth, delta in _federations(ks, n, n_test, seed, cmapss_root):
            for epsilon in epsilons:
                privacy = _privacy(epsilon, delta, rate=rate, clip=clip)
                transforms = None if truth is not None else "auto"  # θ* is in the draws' units
                result = _fit(spec, federation, rounds, seed, privacy, transforms)
                row = _row(
                    result, federation=name, K=len(federation), seed=seed, epsilon=epsilon, delta=delta
                )
                row["noise_multiplier"] = 0.0 if privacy is None else float(result.strategy.noise)
                row["epsilon_spent"] = float(result.history["epsilon"].iloc[-1]) if privacy else math.inf
                if truth is not None:
                    errors = [float(((result.state[k] - v).abs() / v.abs()).mean()) for k, v in truth.items()]
                    row["theta_error"] = float(np.mean(errors))
                rows.append(row)
    return pd.DataFrame(rows)


def _attack_federation(trial: int, member: bool) -> Federation:
    draws = gp_federation(num_clients=20, n=20, d=2, theta=THETA, seed=10_000 + trial)
    clients = list(draws.federation)
    if member:
        c = clients[0]
        x = torch.rand(1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(trial))
        y_out = c.y.mean() + 8 * c.y.std()
        clients[0] = ClientData(torch.cat([c.X, x]), torch.cat([c.y, y_out.reshape(1)]), id=c.id)
    return Federation(clients)


def membership_attack(trials: int = 200, epsilons=EPSILONS, rounds: int = 10) -> pd.DataFrame:
    """One row per (ε, what the attacker sees): the attack's accuracy on the second half of
    ``trials``, and DP's bound. At ε = ∞ twice: client 0's own reply of round 1 (what the server
    of plain FGPR receives) and the released θ after ``rounds`` (what aggregation alone hides)."""
    rows = []
    coin = np.random.default_rng(0).random(trials) < 0.5
    views = [(e, "released θ") for e in epsilons]
    if math.inf in epsilons:
        views.insert(epsilons.index(math.inf), (math.inf, "client 0's reply"))
    for epsilon, view in views:
        stats = []
        for trial in range(trials):
            federation = _attack_federation(trial, bool(coin[trial]))
            if view == "client 0's reply":
                stats.append(_client_reply_noise(federation, trial))
            else:
                privacy = _privacy(epsilon, 1e-3, rate=1.0, clip=0.3)
                stats.append(float(_fit(_spec(2), federation, rounds, trial, privacy, None).state[NOISE]))
        stats, half = np.asarray(stats), trials // 2
        guess = stats[half:] > np.median(stats[:half])
        accuracy = float((guess == coin[half:]).mean())
        bound = 1.0 if math.isinf(epsilon) else min(1.0, math.exp(epsilon) / (1 + math.exp(epsilon)) + 1e-3)
        rows.append({"epsilon": epsilon, "attacker_sees": view, "trials": trials - half,
                     "attack_accuracy": accuracy, "dp_bound": bound})  # fmt: skip
    return pd.DataFrame(rows)


def _client_reply_noise(federation: Federation, seed: int) -> float:
    """Client 0's trained noise variance after one FGPR round from the initial state: its reply,
    as the server receives it."""
    run = Run(_spec(2), federation, FGPR(), 1, engine="sequential", seed=seed, transforms=None,
              callbacks=[Progress(False)]).start()  # fmt: skip
    plan = run.strategy.configure(0, run.server, run.context, generator(seed, "configure", 0))
    replies = exchange(run.engine, "train", 0, plan, run.roster.ids).replies
    return float(replies.state(run.spec, "state/")[NOISE][0])


def reproduce(
    repeats: int | None, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool | None = None
) -> list[Path]:
    """``fedgp reproduce privacy``: the cost table (3 seeds; 1 with ``quick``) and the membership attack."""
    repeats = repeats or (1 if quick else 3)

    def study():
        if quick:
            cost = privacy_cost(range(seed, seed + repeats), ks=(200,), epsilons=(1.0, math.inf), rounds=10,
                                cmapss_root="")  # fmt: skip
            return cost, membership_attack(trials=16, epsilons=(1.0, math.inf), rounds=5)
        return privacy_cost(range(seed, seed + repeats)), membership_attack()

    def report(results, minutes: float) -> Report:
        cost, attack = results
        metrics = [c for c in ("test_rmse", "test_nll", "coverage95", "theta_error") if c in cost]
        table = cost.groupby(["federation", "epsilon"])[metrics].mean().reset_index()
        text = (
            "# What client-level DP costs FGPR, and what it buys\n\n"
            f"{repeats} seed(s) from {seed}, {minutes:.1f} min, engine {default_engine()}; "
            "ClientDP(epsilon, delta=1e-5 (C-MAPSS 1e-4), rate=0.1, clip=0.3), noise calibrated per ε "
            "(ε = inf: FGPR without DP). Command: `fedgp reproduce privacy --out results`.\n\n"
            "## Cost: the clients' mean test metrics against ε\n\n" + markdown_table(table)
            + "\n\n## What it buys: a membership attack on an outlying row\n\n"
            + markdown_table(attack) + "\n"
        )  # fmt: skip
        return Report({"privacy.csv": cost, "privacy_attack.csv": attack}, {"privacy.md": text})

    return reproduction(out_dir, study, report)
