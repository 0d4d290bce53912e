"""Study 5(d) (issue 52): Table 1's multi-fidelity problems with each level's noise and scale personal.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/multifidelity_personal.py run --seeds 5 \
        --functions currin park        (and the others in a second process: one file per function)
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/multifidelity_personal.py report

The levels are the owners (one client per fidelity, each standardised by its own mean and sd, as
Table 1 draws them: :func:`fedgp.synthetic.multifidelity.multifidelity_federation`). Table 1's FGPR
shares one outputscale and one noise across levels; here each level keeps its own
(``FGPR(personal=("scale",))``: the outputscale and noise of the zero-mean RBF model), under Table 1's
paper protocol (``Protocol().fgpr``: Adam restarted every round, lr 0.01, one local epoch, 200
rounds). Methods, each scored on the HF test points as Table 1 scores:

- ``FGPR, personal scale``;
- ``FGPR, personal scale, shrunk``: a first personal fit, the widths the evidence chooses from the
  levels' fits (:func:`fedgp.strategies.shrinkage.evidence_widths`), then the fit with that prior;
- ``FGPR-MLE, personal scale``: the central optimum of the same objective (L-BFGS on the pooled levels,
  each level its own outputscale and noise; :func:`fedgp.experiments.convergence.central_personal_optimum`),
  conditioned on the HF data: where the federated runs would go with no optimiser in the way;
- ``FGPR (rerun)``: Table 1's FGPR again on seed 0 of each function, checking that the committed rows
  (``results/table1_runs.csv``: FGPR, SeparateMLE, FGPR-MLE, AR1) are this code's.

``run`` writes ``results/multifidelity_personal_<function>.csv``; ``report`` writes
``results/multifidelity_personal.md`` beside Table 1's rows of the same seeds.
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import replace
from pathlib import Path

import gpytorch
import pandas as pd
import torch

from fedgp.experiments.common import fit_study
from fedgp.experiments.convergence import central_personal_optimum
from fedgp.experiments.metrics import markdown_table
from fedgp.experiments.table1.methods import scores
from fedgp.experiments.table1.protocol import Protocol
from fedgp.models.multifidelity import rbf_spec
from fedgp.models.posterior import condition
from fedgp.strategies.shrinkage import evidence_widths
from fedgp.synthetic.multifidelity import TABLE1_FUNCTIONS, multifidelity_federation

OUT = Path(__file__).resolve().parents[1] / "results"
MD = OUT / "multifidelity_personal.md"
COMMAND = "OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/multifidelity_personal.py"
PERSONAL, SHRUNK, OPTIMUM = "FGPR, personal scale", "FGPR, personal scale, shrunk", "FGPR-MLE, personal scale"
EXISTING = ("FGPR", "FGPR-MLE", "SeparateMLE", "AR1")
PLAINLY = "\n## Plainly\n"


def _fit(problem, protocol, seed, **options):
    spec = rbf_spec(problem.function.d, protocol.ard)
    fed = problem.federation
    strategy = replace(replace(protocol, batch_size=protocol.batch_for(fed)).fgpr(fed), **options)
    return fit_study(spec, fed, strategy, protocol.rounds, seed, "sequential")


def one_repeat(function: str, seed: int, protocol: Protocol, rerun: bool) -> list[dict]:
    """The study's methods on one repeat of ``function`` (Table 1's data for ``seed``)."""
    problem = multifidelity_federation(function, None, n_test=protocol.n_test, seed=seed)
    rows = []

    def timed(method, make):
        start = time.perf_counter()
        pred, info = make()
        rows.append({**scores(problem, method, pred, time.perf_counter() - start), **info})

    def personal(shrunk: bool):
        result = _fit(problem, protocol, seed, personal=("scale",))
        if not shrunk:
            return result.posterior(problem.X_test, client=0), {}
        names = result.strategy.personal_names(result.spec)
        states = [result.client_state(k) for k in range(len(problem.federation))]
        shrink = evidence_widths(result.spec, states, list(problem.federation), names)
        result = _fit(problem, protocol, seed, personal=("scale",), shrink=shrink)
        widths = "; ".join(f"{name.rsplit('.', 1)[-1]} {w:.3g}" for name, w in shrink.widths)
        return result.posterior(problem.X_test, client=0), {"widths": widths}

    def optimum():
        spec = rbf_spec(problem.function.d, protocol.ard)
        clients = list(problem.federation)
        names = frozenset(
            n for n in spec.for_data(clients).names if n.rsplit(".", 1)[-1] in ("outputscale", "noise")
        )
        states, _ = central_personal_optimum(spec, clients, names, restarts=2, seed=seed)
        hf = problem.hf
        return condition(spec.for_data(clients), states[0], hf.X, hf.y, problem.X_test), {}

    timed(PERSONAL, lambda: personal(False))
    timed(SHRUNK, lambda: personal(True))
    timed(OPTIMUM, optimum)
    if rerun:
        timed("FGPR (rerun)", lambda: (_fit(problem, protocol, seed).posterior(problem.X_test, client=0), {}))
    return [{"function": function, "seed": seed, **row} for row in rows]


def run(seeds: int, functions) -> None:
    """Each function's repeats ``0 .. seeds - 1`` not yet in its file, one file per function."""
    protocol = Protocol()
    for function in functions:
        path = OUT / f"multifidelity_personal_{function}.csv"
        done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["function", "seed"])
        for seed in range(seeds):
            if ((done["function"] == function) & (done["seed"] == seed)).any():
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
                rows = one_repeat(function, seed, protocol, rerun=seed == 0)
            done = pd.concat([done, pd.DataFrame(rows)], ignore_index=True)
            done.to_csv(path, index=False)
            print(function, seed, [(r["method"], round(r["rmse"], 4)) for r in rows], flush=True)


def report() -> str:
    """Per function, over the seeds this study ran: RMSE mean, NLL, coverage, RMSE / SeparateMLE's
    and the repeats below SeparateMLE, for the new methods beside Table 1's rows of the same seeds."""
    files = sorted(OUT.glob("multifidelity_personal_*.csv"))
    new = pd.concat([pd.read_csv(path) for path in files], ignore_index=True)
    old = pd.read_csv(OUT / "table1_runs.csv")
    old = old[old["method"].isin(EXISTING)].merge(new[["function", "seed"]].drop_duplicates())
    rows = pd.concat([old, new[new["method"] != "FGPR (rerun)"]], ignore_index=True)
    separate = rows[rows["method"] == "SeparateMLE"].set_index(["function", "seed"])["rmse"]
    rows = rows.assign(
        ratio=rows["rmse"] / separate.reindex(pd.MultiIndex.from_frame(rows[["function", "seed"]])).to_numpy()
    )
    rows = rows.assign(below=rows["ratio"] < 1)
    table = rows.groupby(["function", "method"], sort=False).agg(
        repeats=("rmse", "count"), rmse=("rmse", "mean"), nll=("nll", "mean"),
        coverage95=("coverage95", "mean"), rmse_over_separate_mle=("ratio", "mean"),
        below_separate_mle=("below", "sum"),
    ).reset_index()  # fmt: skip
    order = {m: i for i, m in enumerate((*EXISTING, PERSONAL, SHRUNK, OPTIMUM))}
    table = table.sort_values(["function", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    rerun = new[new["method"] == "FGPR (rerun)"].merge(
        old[old["method"] == "FGPR"][["function", "seed", "rmse"]],
        on=["function", "seed"],
        suffixes=("", "_table1"),
    )
    rerun = rerun.assign(difference=(rerun["rmse"] - rerun["rmse_table1"]).abs())[
        ["function", "seed", "rmse", "rmse_table1", "difference"]
    ]
    widths = (
        new[new["method"] == SHRUNK].groupby("function")["widths"].agg(lambda s: " / ".join(s.astype(str)))
    )
    seeds = sorted(new["seed"].unique())
    text = (
        "# Study 5(d): multi-fidelity levels as owners, each level's noise and scale personal\n\n"
        f"`{COMMAND} run --seeds {len(seeds)}` (run here as two processes, `--functions currin park branin` "
        f"and `--functions borehole hartmann3`), then `{COMMAND} report` (one thread each). "
        f"Table 1's problems and paper protocol, seeds {seeds[0]}–{seeds[-1]}; Table 1's rows "
        "(`results/table1_runs.csv`) for "
        "the same seeds beside the new ones. 'FGPR, personal scale': each level's outputscale and noise its "
        "own (`FGPR.authors(personal=(\"scale\",))`); 'shrunk': those values shrunk towards the server's by "
        "widths the evidence chooses from a first personal fit (`fedgp.strategies.shrinkage`); "
        "'FGPR-MLE, personal scale': the central optimum of that objective. Ratio: RMSE / SeparateMLE's "
        "per repeat, then averaged; 'below': repeats with a lower RMSE than SeparateMLE.\n\n"
        + markdown_table(table, floatfmt=".3g")
        + "\n\n## Widths the evidence chose (raw units), per seed\n\n"
        + markdown_table(widths.reset_index(), floatfmt=".3g")
        + "\n\n## Table 1's FGPR rerun with this code (seed 0)\n\n"
        + markdown_table(rerun, floatfmt=".3g")
        + "\n"
    )
    kept = MD.read_text().partition(PLAINLY)[2] if MD.exists() else ""
    MD.write_text(text + (PLAINLY + kept if kept else ""))  # the reading, written by hand, is kept
    return text


if __name__ == "__main__":
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["run", "report"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--functions", nargs="+", default=list(TABLE1_FUNCTIONS))
    args = parser.parse_args()
    if args.what == "run":
        run(args.seeds, args.functions)
    else:
        print(report())
