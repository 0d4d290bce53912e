"""Federated BO on a real task (issue 53, items 4(b) and 4(c)): C-MAPSS engines tune kernel ridge.

    FEDGP_DATA=/path/to/datasets OMP_NUM_THREADS=1 .venv/bin/python benchmarks/federated_bo_tuning.py \
        regret --owners 10 30 100 --seeds 10 --iterations 10
    ... benchmarks/federated_bo_tuning.py dp --seeds 10 --iterations 20
    ... benchmarks/federated_bo_tuning.py report

Owners (:func:`fedgp.bo.tuning.cmapss_tuning_owners`): each owner is one FD001 engine and tunes
``(log10 α, log10 ℓ/√p)`` of RBF kernel ridge predicting its remaining useful life from its 14
sensors; the black box is ``-log(validation RMSE / sd)``, its optimum a 31 x 31 grid polished by
L-BFGS-B. Evaluations are exact and cheap (about 1 ms), so they are computed when asked; only the
optima are cached (``results/benchmarks/federated_bo_tuning_optima.csv``). For seed s, the team
of K owners is the first K engines of a permutation of the 100 drawn from s: the K = 10 and K = 30
teams are the first owners of the K = 100 team, at the same positions, so their starting points
(3 uniform points each) and every per-owner random draw are the same.

``regret``: methods ``federated`` (FGPR, ARD RBF with a constant mean, 100 initial rounds then 5
warm-started rounds per iteration on the batched engine, qLogEI with 2 restarts from 64 raw
samples, all owners' proposals in one BoTorch call), ``fts`` and ``dp-fts-de`` (M = 100 shared
features, the Landmine privacy setting q = 0.35, S = 22, z = 1), at every K; ``local`` (BoTorch's
``SingleTaskGP`` refitted per owner, the same acquisition) and ``random``, which share nothing, run
once at the largest K: a K-owner prefix of that run has the K-owner run's owners, starting points and
acquisition seeds (only a BoTorch fit's retry, drawing from torch's global stream, could differ), so
its rows are reused for the smaller K. FTS and DP-FTS-DE are given hyper-parameters
fitted (BoTorch ``SingleTaskGP``, maximum a posteriori) to 32 Sobol evaluations of each of 5 FD003
engines (another data set: no owner's data). Rows: mean and median over owners of the simple regret
per (K, seed, method, iteration), seconds per iteration.

``regret --methods ...`` also runs the variants that give federated BO and FTS the same information
(issue 53, 4(b)): ``fts-federated`` (:class:`~fedgp.bo.FederatedFTS`: FTS on the hyper-parameters
the federation learns as ``federated`` does, 100 then 5 rounds per iteration), ``federated-fd003``
(``federated`` started at FTS's FD003 hyper-parameters), ``federated-fd003-fixed`` (held there, only
the constant mean learned), and ``federated`` with other acquisitions, ``federated-qucb`` (batched,
β = 2) and ``federated-ts`` (BoTorch's pathwise Thompson sampling, one owner at a time).

``dp``: the DP-FTS-DE paper's Landmine shape: 29 agents (the first 29 engines of the seed's
permutation), M = 100, q = 0.35, S = 22, z = 1, ``--iterations`` iterations (the paper: 61), against
federated BO under ``ClientDP(FGPR(), rate=0.35)`` with 20 initial rounds and 1 round per iteration,
its noise multiplier calibrated so that its ε after the last iteration equals DP-FTS-DE's (both by
dp-accounting's RDP accountant, δ = 1e-5). Rows carry ε per iteration. ``dp --methods ...``: federated
BO under the loop's budget at that ε (``ClientDP(epsilon=...)``: the loop calibrates the same z),
with the clip C set to the median update norm of the same schedule run without noise on 29 FD003
engines (public data: the choice costs no privacy; ``federated-dp-clip``), started at FTS's FD003
hyper-parameters (``federated-dp-fd003``, C = 0.5), or both (``federated-dp-fd003-clip``).

``report``: results/federated_bo_tuning.md from the CSVs.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

import fedgp
from fedgp.bo import (
    DPFTSDE,
    FTS,
    Acquisition,
    BOLoop,
    FederatedBO,
    FederatedFTS,
    LocalBO,
    Owner,
    RandomSearch,
)
from fedgp.bo.tuning import UNIT_BOX, cmapss_tuning_owners
from fedgp.datasets import load_cmapss
from fedgp.rng import generator
from fedgp.run.privacy import ClientDP, calibrate_noise, epsilon_spent
from fedgp.strategies import FGPR

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "benchmarks"
OPTIMA = OUT / "federated_bo_tuning_optima.csv"
INITIAL = 3
DELTA = 1e-5
ACQ = Acquisition("qlogei", num_restarts=2, raw_samples=64)


#: The spec's names of FTS's given hyper-parameters (the FD003 pilot's).
PILOT_NAMES = (
    "covar_module.base_kernel.lengthscale",
    "covar_module.outputscale",
    "likelihood.noise_covar.noise",
)


def spec(start=None, fixed: bool = False) -> fedgp.GPSpec:
    """The ARD RBF spec with a constant mean; ``start``: the pilot's ``(lengthscale, outputscale,
    noise)`` as its initial values, kept fixed (only the mean learned) with ``fixed``."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    values = {} if start is None else dict(zip(PILOT_NAMES, (torch.tensor([start[0]]), *start[1:])))
    names = PILOT_NAMES if fixed else ()
    return fedgp.GPSpec(kernel=kernel, mean=gpytorch.means.ConstantMean(), initial_values=values, fixed=names)


def order(seed: int) -> list[int]:
    """The seed's permutation of FD001's 100 engines: a K-owner team is its first K."""
    return [int(u) for u in generator(seed, "tuning engines").permutation(np.arange(1, 101))]


def prototypes_of(units) -> dict[int, Owner]:
    """FD001's owners for ``units``; their optima cached in ``OPTIMA`` (computed once, about a
    second each, then read back: the black boxes are deterministic)."""
    frame = load_cmapss("FD001").frame("train")
    cached = pd.read_csv(OPTIMA).set_index("unit")["optimum"].to_dict() if OPTIMA.exists() else {}
    missing = [u for u in units if u not in cached]
    if missing:
        for owner in cmapss_tuning_owners(frame, missing):
            cached[owner.id] = owner.optimum
        OPTIMA.parent.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame(sorted(cached.items()), columns=["unit", "optimum"])
        table.to_csv(OPTIMA, index=False)
    owners = cmapss_tuning_owners(frame, list(units), grid=None)  # the black boxes; optima from the cache
    return {o.id: Owner(o.id, o.objective, UNIT_BOX, optimum=cached[o.id]) for o in owners}


def fresh(prototypes: dict[int, Owner], units: list[int]) -> list[Owner]:
    """New owners (no evaluations) with the prototypes' black boxes and optima."""
    return [Owner(u, prototypes[u].objective, UNIT_BOX, optimum=prototypes[u].optimum) for u in units]


def pilot_hyper_parameters() -> tuple[list[float], float, float]:
    """FTS's given ``(lengthscale (ARD), outputscale, noise)``: medians over 5 FD003 engines of a
    BoTorch ``SingleTaskGP`` fitted to 32 Sobol evaluations of each, in the objective's units."""
    from fedgp.bo.local import local_model

    frame = load_cmapss("FD003").frame("train")
    sobol = torch.quasirandom.SobolEngine(2, scramble=True, seed=0).draw(32).to(torch.float64)
    found = []
    for owner in cmapss_tuning_owners(frame, [1, 2, 3, 4, 5], grid=None):
        y = owner.objective(sobol)
        model = local_model(sobol, y)
        sd2 = float(y.std()) ** 2  # BoTorch's Standardize: the model's units are y's sd
        kernel = model.covar_module
        scale = float(kernel.outputscale) if hasattr(kernel, "outputscale") else 1.0
        base = kernel.base_kernel if hasattr(kernel, "base_kernel") else kernel
        lengthscale = base.lengthscale.detach().flatten().tolist()
        found.append([*lengthscale, scale * sd2, float(model.likelihood.noise) * sd2])
    med = np.median(np.array(found), axis=0)
    return [float(med[0]), float(med[1])], float(med[2]), float(med[3])


def run(team, method, iterations: int, seed: int) -> tuple[pd.DataFrame, float]:
    began = time.perf_counter()
    history = BOLoop(team, method, iterations, initial=INITIAL, seed=seed).run().history
    return history, (time.perf_counter() - began) / iterations


def rows_of(
    history: pd.DataFrame, part: str, owners: int, seed: int, name: str, seconds: float
) -> list[dict]:
    out = []
    for it, group in history.groupby("iteration"):
        row = {
            "part": part, "owners": owners, "seed": seed, "method": name, "iteration": int(it),
            "mean_regret": float(group["regret"].mean()), "median_regret": float(group["regret"].median()),
            "seconds": seconds,
        }  # fmt: skip
        if "epsilon" in group:
            row["epsilon"] = float(group["epsilon"].iloc[0])
        out.append(row)
    return out


def regret(owners: list[int], seeds: list[int], iterations: int, methods: list[str], out: Path) -> list[dict]:
    prototypes = prototypes_of(range(1, 101))
    ls, scale, noise = pilot = pilot_hyper_parameters()
    print(
        f"FTS's hyper-parameters (FD003 pilot): lengthscale {ls}, outputscale {scale:.4g}, noise {noise:.3g}"
    )
    makers = {
        "federated": lambda: FederatedBO(
            spec(), FGPR(), rounds=5, initial_rounds=100, acquisition=ACQ, batch_proposals=True
        ),
        "fts": lambda: FTS(ls, scale, noise),
        # Issue 53, 4(b): the same information for both (FTS learning its hyper-parameters as
        # federated BO does; federated BO started at, or fixed to, FTS's FD003 ones) and other
        # acquisitions for federated BO.
        "fts-federated": lambda: FederatedFTS(spec(), FGPR(), rounds=5, initial_rounds=100),
        "federated-fd003": lambda: FederatedBO(
            spec(pilot), FGPR(), rounds=5, initial_rounds=100, acquisition=ACQ, batch_proposals=True
        ),
        "federated-fd003-fixed": lambda: FederatedBO(
            spec(pilot, fixed=True),
            FGPR(),
            rounds=5,
            initial_rounds=100,
            acquisition=ACQ,
            batch_proposals=True,
        ),  # fmt: skip
        "federated-qucb": lambda: FederatedBO(
            spec(),
            FGPR(),
            rounds=5,
            initial_rounds=100,
            batch_proposals=True,
            acquisition=Acquisition("qucb", num_restarts=2, raw_samples=64),
        ),  # fmt: skip
        "federated-ts": lambda: FederatedBO(
            spec(),
            FGPR(),
            rounds=5,
            initial_rounds=100,
            acquisition=Acquisition("ts", num_restarts=2, raw_samples=64),
        ),  # fmt: skip
        "dp-fts-de": lambda: DPFTSDE(ls, scale, noise),
        "local": lambda: LocalBO(ACQ),
        "random": RandomSearch,
    }
    shared_nothing = ("local", "random")
    rows = []
    for seed in seeds:
        for name in methods:
            sizes = [max(owners)] if name in shared_nothing else owners
            for K in sizes:
                history, seconds = run(fresh(prototypes, order(seed)[:K]), makers[name](), iterations, seed)
                targets = [k for k in owners if k <= K] if name in shared_nothing else [K]
                for k in targets:
                    part = history[history["owner"].isin(order(seed)[:k])]
                    rows += rows_of(part, "regret", k, seed, name, seconds)
                pd.DataFrame(rows).to_csv(out, index=False)  # after every run: a stopped run keeps its rows
                print(
                    f"seed {seed} {name} K={K}: final mean regret {rows[-1]['mean_regret']:.3f} "
                    f"({seconds:.2f} s/it)", flush=True,
                )  # fmt: skip
    return rows


def pilot_update_norms(iterations: int, agents: int = 29, q: float = 0.35) -> np.ndarray:
    """Every participant's update norm (GPyTorch raw space, before clipping) in federated BO's DP
    schedule (20 initial rounds, 1 per iteration) run without noise or clipping on ``agents`` FD003
    engines: public data, so a clip chosen from them costs the owners no privacy."""
    import fedgp.strategies.private as private

    norms, clip_updates = [], private.clip_updates

    def recording(delta, clip):
        out = clip_updates(delta, clip)
        norms.extend(out[1].tolist())
        return out

    frame = load_cmapss("FD003").frame("train")
    team = [
        Owner(o.id, o.objective, UNIT_BOX)
        for o in cmapss_tuning_owners(frame, range(1, agents + 1), grid=None)
    ]
    method = FederatedBO(
        spec(), ClientDP(FGPR(), noise=0.0, clip=1e9, rate=q, delta=DELTA), rounds=1, initial_rounds=20,
        acquisition=ACQ, batch_proposals=True,
    )  # fmt: skip
    private.clip_updates = recording
    try:
        BOLoop(team, method, iterations, initial=INITIAL, seed=0).run()
    finally:
        private.clip_updates = clip_updates
    return np.array(norms)


def dp(
    seeds: list[int],
    iterations: int,
    agents: int = 29,
    methods: list[str] | None = None,
    out: Path | None = None,
) -> list[dict]:
    ls, scale, noise = pilot = pilot_hyper_parameters()
    q, clip, z = 0.35, 22.0, 1.0
    target = epsilon_spent(z, q, iterations + 1, DELTA)  # a release at the start and after each iteration
    initial_rounds, per_iteration = 20, 1
    rounds = initial_rounds + per_iteration * iterations
    z_fed = calibrate_noise(target, DELTA, q, rounds)
    print(f"DP-FTS-DE ε after {iterations} iterations: {target:.3f}; federated BO's z for it: {z_fed:.3f}")
    norms = pilot_update_norms(iterations, agents, q)
    pilot_clip = float(np.median(norms))
    print(
        f"FD003 pilot update norms: median {pilot_clip:.4g}, quartiles {np.quantile(norms, 0.25):.4g}, "
        f"{np.quantile(norms, 0.75):.4g}, 90 % {np.quantile(norms, 0.9):.4g} ({len(norms)} updates)"
    )

    def budgeted(start=None, clip_to: float = 0.5) -> FederatedBO:
        """Federated BO under a loop budget of DP-FTS-DE's ε (the noise calibrated by the loop)."""
        privacy = ClientDP(FGPR(), epsilon=target, rate=q, delta=DELTA, clip=clip_to)
        return FederatedBO(
            spec(start), privacy, rounds=per_iteration, initial_rounds=initial_rounds, acquisition=ACQ,
            batch_proposals=True,
        )  # fmt: skip

    prototypes = prototypes_of(sorted({u for seed in seeds for u in order(seed)[:agents]}))
    rows = []
    for seed in seeds:
        team = order(seed)[:agents]
        makers = {
            # Issue 53, 4(c): the budget over the loop (the same z), with the clip from the public
            # pilot's update norms, with FTS's public FD003 hyper-parameters as the start, and both.
            "federated-dp-clip": lambda: budgeted(clip_to=pilot_clip),
            "federated-dp-fd003": lambda: budgeted(pilot),
            "federated-dp-fd003-clip": lambda: budgeted(pilot, clip_to=pilot_clip),
            "dp-fts-de": lambda: DPFTSDE(ls, scale, noise, q=q, clip=clip, z=z, delta=DELTA),
            "federated-dp": lambda: FederatedBO(
                spec(),
                ClientDP(FGPR(), noise=z_fed, rate=q, delta=DELTA),
                rounds=per_iteration,
                initial_rounds=initial_rounds,
                acquisition=ACQ,
                batch_proposals=True,
            ),  # fmt: skip
            "federated": lambda: FederatedBO(
                spec(),
                FGPR(),
                rounds=per_iteration,
                initial_rounds=initial_rounds,
                acquisition=ACQ,
                batch_proposals=True,
            ),  # fmt: skip
        }
        for name, make in makers.items():
            if methods and name not in methods:
                continue
            history, seconds = run(fresh(prototypes, team), make(), iterations, seed)
            rows += rows_of(history, "dp", agents, seed, name, seconds)
            if out is not None:
                pd.DataFrame(rows).to_csv(out, index=False)  # after every run: a stopped run keeps its rows
            eps = rows[-1].get("epsilon", float("nan"))
            final = rows[-1]["mean_regret"]
            print(f"seed {seed} {name}: final mean regret {final:.3f}, ε {eps:.3f}", flush=True)
    return rows


def hyper(owners: list[int], seeds: list[int], iterations: int) -> list[dict]:
    """What ``federated`` learns from 3 points per owner, and after the last iteration: its shared
    hyper-parameters beside FTS's FD003 ones (issue 53, 4(b))."""
    prototypes, rows = prototypes_of(range(1, 101)), []
    for K in owners:
        for seed in seeds:
            method = FederatedBO(
                spec(), FGPR(), rounds=5, initial_rounds=100, acquisition=ACQ, batch_proposals=True
            )
            loop = BOLoop(fresh(prototypes, order(seed)[:K]), method, iterations, initial=INITIAL, seed=seed)
            loop.start()
            for it in range(iterations + 1):
                if it in (0, iterations):
                    state = {k: v.detach().flatten().tolist() for k, v in method.result.state.items()}
                    ls = state["covar_module.base_kernel.lengthscale"]
                    rows.append({
                        "owners": K, "seed": seed, "iteration": it, "lengthscale_alpha": ls[0],
                        "lengthscale_l": ls[1], "outputscale": state["covar_module.outputscale"][0],
                        "noise": state["likelihood.noise_covar.noise"][0],
                    })  # fmt: skip
                    print(rows[-1], flush=True)
                if it < iterations:
                    loop.step()
            loop.finish()
    return rows


def _final_table(final: pd.DataFrame, by: list[str]) -> str:
    stats = final.groupby(by).agg(
        seeds=("seed", "nunique"), mean_regret=("mean_regret", "mean"),
        median_regret=("median_regret", "mean"), seconds=("seconds", "mean"),
    )  # fmt: skip
    return stats.round(4).to_markdown()


def _wins(final: pd.DataFrame, against: list[str], ours: str = "federated") -> list[str]:
    """Per K: on how many seeds ``ours`` ends with a lower mean (and median) regret than each other."""
    lines = []
    for K, group in final.groupby("owners"):
        for what in ("mean_regret", "median_regret"):
            wide = group.pivot(index="seed", columns="method", values=what)
            if ours not in wide:
                continue
            counts = []
            for other in (o for o in against if o in wide):
                pair = wide[[ours, other]].dropna()  # the seeds both ran: a partial method takes no seed
                counts.append(f"{other} {(pair[ours] < pair[other]).sum()}/{len(pair)}")
            lines.append(f"- K = {K}, {what.replace('_', ' ')}: {ours} lower than " + ", ".join(counts))
    return lines


#: Issue 53, 4(b): federated BO and FTS on the same information, and other acquisitions.
VARIANTS = ["fts-federated", "federated-fd003", "federated-fd003-fixed", "federated-qucb", "federated-ts"]
#: Issue 53, 4(c): federated BO under a loop budget at DP-FTS-DE's ε, clip and start changed.
DP_VARIANTS = ["federated-dp-clip", "federated-dp-fd003", "federated-dp-fd003-clip"]


#: ``regret``'s methods by default (``--methods`` picks others, e.g. the variants of issue 53, 4(b)).
METHODS = ["federated", "fts", "dp-fts-de", "local", "random"]


#: The commands that made the committed CSVs (two regret processes side by side, then the DP run).
COMMANDS = """\
export FEDGP_DATA=/work/shared/datasets OMP_NUM_THREADS=1
B=benchmarks/federated_bo_tuning.py; R=results/benchmarks/federated_bo_tuning_regret
.venv/bin/python $B regret --owners 10 30 100 --seeds 3 --first-seed 0 --iterations 10 --out ${R}_seeds0-2.csv
.venv/bin/python $B regret --owners 10 30 --seeds 7 --first-seed 3 --iterations 10 --out ${R}_seeds3-9.csv
.venv/bin/python $B dp --seeds 10 --iterations 20
# issue 53, 4(b): the same information for federated BO and FTS, other acquisitions (one process each)
V=results/benchmarks/federated_bo_tuning_regret_variants; A="--seeds 10 --iterations 10 --methods"
.venv/bin/python $B regret --owners 10 30 $A fts-federated --out ${V}_fts.csv
.venv/bin/python $B regret --owners 10 30 $A federated-fd003 federated-fd003-fixed --out ${V}_fd003.csv
.venv/bin/python $B regret --owners 10 30 $A federated-qucb --out ${V}_qucb.csv
.venv/bin/python $B regret --owners 10 $A federated-ts --out ${V}_ts.csv
.venv/bin/python $B hyper --owners 10 30 --seeds 3 --iterations 9   # federated_bo_tuning_hyper.csv
# issue 53, 4(c): federated BO under the loop's budget, with the clip and start changed
D=results/benchmarks/federated_bo_tuning_dp_variants
M="federated-dp-clip federated-dp-fd003 federated-dp-fd003-clip"
.venv/bin/python $B dp --seeds 5 --first-seed 0 --iterations 20 --methods $M --out ${D}_seeds0-4.csv
.venv/bin/python $B dp --seeds 5 --first-seed 5 --iterations 20 --methods $M --out ${D}_seeds5-9.csv
.venv/bin/python $B report"""


def report() -> None:
    """results/federated_bo_tuning.md from the CSVs (every ``federated_bo_tuning_regret*.csv``)."""
    parts = sorted(OUT.glob("federated_bo_tuning_regret*.csv"))
    regret = pd.concat([pd.read_csv(p) for p in parts])
    last = regret["iteration"].max()
    final = regret[regret["iteration"] == last]
    lines = [
        "# Federated BO on a real task: C-MAPSS engines tune kernel ridge (issue 53, 4(b), 4(c))", "",
        "Made by `benchmarks/federated_bo_tuning.py` (its docstring: the task, the methods, the seeds);",
        f"from {', '.join(p.name for p in parts)}.",
        "Simple regret in log-RMSE units (0.1: a validation RMSE about 10 % above the engine's best",
        "tuning); `mean_regret`/`median_regret`: over the",
        "owners, then averaged over seeds; `seconds`: per iteration, proposals, evaluations and update",
        "(wall time on the 2-core machine shared with four other jobs, load average 8-12); local BO's",
        "and random search's are those of their run at the seed's largest K (100 for seeds 0-2, else 30).",
        "",
        "```", COMMANDS, "```", "",
        f"## After {last} iterations", "", _final_table(final, ["owners", "method"]), "",
        *_wins(final, ["local", "fts", "dp-fts-de", "random"]), "",
        "### The same information, other acquisitions (issue 53, 4(b))", "",
        "`fts-federated`: FTS on the hyper-parameters the federation learns as federated BO does",
        "(`FederatedFTS`); `federated-fd003`: federated BO started at FTS's FD003 hyper-parameters;",
        "`federated-fd003-fixed`: held there (only the constant mean learned); `federated-qucb`,",
        "`federated-ts`: federated BO with qUCB (β = 2, batched) or Thompson sampling (one owner at a",
        "time; K = 10 only, its cost). Seeds: those each ran (table above).", "",
    ]  # fmt: skip
    for variant in VARIANTS:
        lines += _wins(final[final["owners"] < 100], ["fts", "federated"], variant)
    lines.append("")
    for what in ("mean_regret", "median_regret"):
        curve = regret.groupby(["owners", "method", "iteration"])[what].mean().unstack("iteration")
        lines += [f"## {what.replace('_', ' ').capitalize()} per iteration (mean over seeds)", ""]
        lines += [curve.round(3).to_markdown(), ""]
    dp_parts = sorted(OUT.glob("federated_bo_tuning_dp*.csv"))
    if dp_parts:
        dp_rows = pd.concat([pd.read_csv(p) for p in dp_parts])
        last = dp_rows["iteration"].max()
        final = dp_rows[dp_rows["iteration"] == last]
        eps = dp_rows.groupby(["method", "iteration"])["epsilon"].first().unstack("iteration")
        curve = dp_rows.groupby(["method", "iteration"])["mean_regret"].mean().unstack("iteration")
        lines += [
            f"## DP-FTS-DE's setting: 29 agents, M = 100, q = 0.35, S = 22, z = 1, {last} iterations", "",
            f"From {', '.join(p.name for p in dp_parts)}.", "",
            _final_table(final, ["method"]), "", *_wins(final, ["dp-fts-de"], "federated-dp"),
            *[w for v in DP_VARIANTS for w in _wins(final, ["dp-fts-de", "federated-dp"], v)], "",
            "Mean regret per iteration (mean over seeds):", "", curve.round(3).to_markdown(), "",
            "ε at δ = 1e-5 after each iteration (dp-accounting's RDP accountant):", "",
            eps.dropna(how="all").round(3).to_markdown(), "",
        ]  # fmt: skip
    target = ROOT / "results" / "federated_bo_tuning.md"
    reading = target.read_text().partition("\n## Reading")[2] if target.exists() else ""
    if reading:  # the hand-written reading is kept below the tables
        lines += ["## Reading" + reading.rstrip("\n"), ""]
    target.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["regret", "dp", "hyper", "report"])
    parser.add_argument("--owners", type=int, nargs="+", default=[10, 30, 100])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument(
        "--out", default=None, help="the CSV (default results/benchmarks/federated_bo_tuning_<part>.csv)"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.part == "report":
        return report()
    out = Path(args.out) if args.out else OUT / f"federated_bo_tuning_{args.part}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.part == "regret":
        rows = regret(sorted(args.owners), seeds, args.iterations, args.methods, out)
    elif args.part == "hyper":
        rows = hyper(sorted(args.owners), seeds, args.iterations)
    else:
        rows = dp(seeds, args.iterations, methods=args.methods if args.methods != METHODS else None, out=out)
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
