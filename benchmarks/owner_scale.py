"""Owners' scale as a model, not a switch (issue 52, item 3 and study 5(c)).

    OMP_NUM_THREADS=1 FEDGP_DATA=../shared/datasets .venv/bin/python benchmarks/owner_scale.py gains
    ... benchmarks/owner_scale.py synthetic grunfeld fertility cmapss   (one or more, each under 10 min)
    ... benchmarks/owner_scale.py --table                               (the .md from the CSVs)
    ... benchmarks/owner_scale.py --lengthscales                        (owner_scale_lengthscales.csv)
    ... benchmarks/owner_scale.py --shrunk gains synthetic grunfeld fertility cmapss
        (only the shrunk scale model: owner_scale_<federation>_shrunk.csv, beside the others' rows)

``gains`` is study 5(c): 12 owners of one GP draw in four groups, gains 1 and 10 by noise sd 0.05
and 0.5, with offsets (:func:`fedgp.experiments.owner_scale.gain_owners`). The others are the
developers' heterogeneous benchmark's federations (:mod:`fedgp.experiments.convergence`). Each for
split seeds 0, 1, 2, every candidate of :data:`~fedgp.experiments.owner_scale.CANDIDATES` (FGPR's
defaults, 100 rounds), each owner's test RMSE, NLL and 95 % coverage in the data's units, learned
and at the central optimum of the same objective. Writes ``results/owner_scale_<federation>.csv``
(one row per owner) and, with ``--table``, ``results/owner_scale.md``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

from fedgp.experiments.convergence import FEDERATIONS
from fedgp.experiments.metrics import markdown_table
from fedgp.experiments.owner_scale import CANDIDATES, gain_owners, group_of, scale_spec, scale_study
from fedgp.run import Evaluate, Progress, fit
from fedgp.strategies import FGPR

OUT = Path(__file__).resolve().parents[1] / "results"
SOURCES = {"gains": lambda seed: gain_owners(population=0, split=seed), **FEDERATIONS}
SEEDS = (0, 1, 2)
COMMAND = "OMP_NUM_THREADS=1 FEDGP_DATA=../shared/datasets .venv/bin/python benchmarks/owner_scale.py"
MODEL = "own sd, personal scale"
SHRUNK = "own sd, personal scale, shrunk"
LENGTHSCALE = "covar_module.base_kernel.lengthscale"


#: The heterogeneous benchmark's federations: the candidates that decide the acceptance lines, the
#: central optima from 2 starts (the shared CPUs' budget).
KEPT = ("auto (fit's default)", "one federated sd", "each owner's own sd", "own sd, personal noise", MODEL)
BENCHMARK = {label: CANDIDATES[label] for label in (*KEPT, "owners alone")}


def run(name: str, shrunk: bool = False) -> None:
    """Every candidate (``owner_scale_<name>.csv``), or with ``shrunk`` only the shrunk scale model
    (``owner_scale_<name>_shrunk.csv``: the other candidates' code is unchanged by shrinkage)."""
    started = time.perf_counter()
    options = {} if name == "gains" else {"candidates": BENCHMARK, "restarts": 2}
    if shrunk:
        options = {"candidates": {SHRUNK: CANDIDATES[SHRUNK]}}
    frame = scale_study(
        {name: SOURCES[name]}, seeds=SEEDS, log=lambda line: print(line, flush=True), **options
    )
    frame["minutes"] = (time.perf_counter() - started) / 60
    frame.to_csv(OUT / f"owner_scale_{name}{'_shrunk' if shrunk else ''}.csv", index=False)
    print(f"{name}: {frame['minutes'].iloc[0]:.1f} min", flush=True)


def per_candidate(frame: pd.DataFrame) -> pd.DataFrame:
    """Per federation and candidate, learned: the test NLL, RMSE and coverage averaged over owners,
    then over split seeds; the worst seed's NLL; the NLL at the central optimum; the gap."""
    learned = frame[~frame["at_optimum"] | (frame["candidate"] == "owners alone")]
    by_seed = learned.groupby(["federation", "candidate", "seed"], sort=False)[
        ["nll", "rmse", "coverage95"]
    ].mean()
    optimum = (
        frame[frame["at_optimum"]].groupby(["federation", "candidate", "seed"], sort=False)["nll"].mean()
    )
    by_seed["nll at optimum"] = optimum
    by_seed["gap/owner"] = frame.groupby(["federation", "candidate", "seed"], sort=False)[
        "gap_per_owner"
    ].first()
    grouped = by_seed.groupby(level=[0, 1], sort=False)
    table = grouped.mean()
    table["nll worst seed"] = grouped["nll"].max()
    outcome = frame.groupby(["federation", "candidate"], sort=False)["outcome"].agg(
        lambda s: " / ".join(sorted(set(s)))
    )
    table["outcome per seed"] = outcome
    return table.reset_index()


def acceptance(frame: pd.DataFrame) -> pd.DataFrame:
    """Per federation and split seed: each candidate's mean test NLL minus the better and the worse of
    "one federated sd" and "each owner's own sd" (the acceptance line: ≤ 0.05 against both)."""
    learned = frame[~frame["at_optimum"]]
    nll = learned.groupby(["federation", "seed", "candidate"], sort=False)["nll"].mean().unstack("candidate")
    best = nll[["one federated sd", "each owner's own sd"]].min(axis=1)
    worst = nll[["one federated sd", "each owner's own sd"]].max(axis=1)
    rows = []
    for candidate in ("auto (fit's default)", MODEL, SHRUNK, "own sd, personal noise"):
        if candidate not in nll:
            continue
        rows.append(pd.DataFrame({"candidate": candidate, "minus the better": nll[candidate] - best,
                                  "minus the worse": nll[candidate] - worst}))  # fmt: skip
    return pd.concat(rows).reset_index()


def coverage_groups(frame: pd.DataFrame) -> pd.DataFrame:
    """Study 5(c): mean 95 % coverage per owner group, over owners and split seeds, learned."""
    gains = frame[
        (frame["federation"] == "gains") & (~frame["at_optimum"] | (frame["candidate"] == "owners alone"))
    ]
    gains = gains.assign(group=gains["client"].map(group_of))
    table = gains.groupby(["candidate", "group"], sort=False)[["coverage95", "nll", "rmse"]].mean()
    table["coverage worst seed"] = (
        gains.groupby(["candidate", "group", "seed"], sort=False)["coverage95"]
        .mean()
        .groupby(level=[0, 1])
        .min()
    )
    return table.reset_index()


def lengthscales() -> pd.DataFrame:
    """The learned shared lengthscale per split seed of Grunfeld and fertility, under ``"auto"`` (and
    which outcome it picked) and under the scale model: does a split seed move the model?"""
    rows = []
    for name in ("grunfeld", "fertility"):
        for seed in SEEDS:
            federation = SOURCES[name](seed)
            for label in ("auto (fit's default)", MODEL):
                candidate = CANDIDATES[label]
                strategy = FGPR(personal=candidate.personal)
                quiet = [Progress(False), Evaluate(every=0)]
                result = fit(scale_spec(), federation, strategy, rounds=100, seed=seed,
                             transforms=candidate.transforms, callbacks=quiet)  # fmt: skip
                rows.append({"federation": name, "seed": seed, "candidate": label,
                             "outcome": result.transforms["outcome"],
                             "lengthscale": float(result.state[LENGTHSCALE])})  # fmt: skip
    return pd.DataFrame(rows)


def widths(frame: pd.DataFrame) -> pd.DataFrame:
    """The widths the evidence chose for the shrunk scale model, per federation and split seed."""
    shrunk = frame[frame["candidate"] == SHRUNK]
    return shrunk.groupby(["federation", "seed"], sort=False)["widths"].first().reset_index()


def table() -> None:
    files = sorted(OUT.glob("owner_scale_*.csv"))
    frames = [pd.read_csv(path).assign(shrunk_run=path.stem.endswith("_shrunk")) for path in files]
    frame = pd.concat([f for f in frames if "at_optimum" in f], ignore_index=True)  # not the lengthscales
    minutes = frame.groupby(["federation", "shrunk_run"])["minutes"].first()
    timing, timing_shrunk = (
        ", ".join(f"{name} {value:.1f} min" for (name, shrunk), value in minutes.items() if shrunk == which)
        for which in (False, True)
    )
    text = (
        "# Owners' scale as a model, not a switch (issue 52, item 3; study 5(c))\n\n"
        f"`{COMMAND} <federation>` for each federation ({timing}; one thread), then `... --table`. "
        f"Split seeds {list(SEEDS)}, FGPR's defaults, 100 rounds, `ScaleKernel(RBFKernel())` with a "
        "`ConstantMean`; test metrics per owner in the data's units, averaged over owners (then seeds). "
        "`gains` is study 5(c); the others are the developers' heterogeneous benchmark's federations. "
        f"'{MODEL}': each owner standardised by its own mean and sd, then its outputscale, noise and "
        "mean offset its personal hyper-parameters (`FGPR(personal=(\"scale\",))`). 'nll at optimum': "
        "the same objective's central optimum (L-BFGS on the pooled data, 3 starts on gains, 2 on the "
        "others, where 'federated sd, personal noise' is left out); 'gap/owner': "
        "its summed log marginal likelihood minus the run's, per owner (nats).\n\n"
        f"'{SHRUNK}' (added later, the other rows unchanged): `{COMMAND} --shrunk <federation>` "
        f"({timing_shrunk}, on a machine shared by about 9 jobs), rows in "
        "`owner_scale_<federation>_shrunk.csv`. "
        "The scale model fitted once, then each personal hyper-parameter's width chosen by the evidence of "
        "the owners' fits (`fedgp.strategies.shrinkage.evidence_widths`: each owner's value and Laplace "
        "variance, the width maximising the likelihood of `φ̂_k ~ N(c, w² + s_k²)`, from summed "
        "statistics), and the model fitted again with each owner's raw value `c + δ_k`, `δ_k ~ N(0, w²)`, "
        '`c` the server\'s shared value (`FGPR(personal=("scale",), shrink=...)`). Its objective has the '
        "prior, so no central optimum is given for it.\n\n"
        "## Per candidate\n\n"
        + markdown_table(per_candidate(frame), floatfmt=".3g")
        + "\n\n## Acceptance: test NLL minus the better / the worse of one federated sd and each "
        "owner's sd\n\n"
        + markdown_table(acceptance(frame), floatfmt=".3g")
        + "\n\n## The widths the evidence chose (raw units; 0: shared)\n\n"
        + markdown_table(widths(frame), floatfmt=".3g")
        + "\n\n## Study 5(c): per owner group (gains 1, 10 by noise sd 0.05, 0.5)\n\n"
        + markdown_table(coverage_groups(frame), floatfmt=".3g")
        + "\n"
    )
    (OUT / "owner_scale.md").write_text(text)
    print(text)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if "--table" in sys.argv:
        table()
    elif "--shrunk" in sys.argv:
        for name in sys.argv[1:]:
            if name != "--shrunk":
                run(name, shrunk=True)
    elif "--lengthscales" in sys.argv:
        frame = lengthscales()
        frame.to_csv(OUT / "owner_scale_lengthscales.csv", index=False)
        print(frame.to_string())
    else:
        for name in sys.argv[1:]:
            run(name)
