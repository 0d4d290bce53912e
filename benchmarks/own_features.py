"""Owners with features of their own (issue 52, item 4): an additive own kernel against the core alone.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/own_features.py

Six owners of the core (x1, x2) (:func:`fedgp.synthetic.own_feature_owners`): two record only the
core, two record a z that drives their response (sin 2z), two a z that is noise. Each split seed
0, 1, 2 is fitted three times under FGPR(local_steps=5), 30 rounds, on the sequential engine: with
:class:`fedgp.models.OwnFeaturesSpec` (each owner's z in its own additive kernel), with every owner's
z dropped (the core alone), and with z dropped at the noise owners only (their rows then compare an
owner with and without its noise column in one federation). Writes
``results/benchmarks/own_features.csv`` (one row per owner, seed and model) and
``results/benchmarks/own_features.png`` (test RMSE by kind of owner), and prints the mean test RMSE,
NLL and coverage per kind and model.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import fedgp  # noqa: E402
from fedgp.data import ClientData, Federation  # noqa: E402
from fedgp.models import OwnFeaturesSpec  # noqa: E402
from fedgp.strategies import FGPR  # noqa: E402
from fedgp.synthetic import OWN_CORE, own_feature_owners  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
KINDS = ("none", "signal", "noise", "none", "signal", "noise")
QUIET = [fedgp.run.Progress(False), fedgp.run.Evaluate(every=0)]


def _core_only(client: ClientData) -> ClientData:
    """``client`` with its own columns dropped."""
    return ClientData(
        client.X,
        client.y,
        id=client.id,
        feature_names=client.feature_names,
        X_test=client.X_test,
        y_test=client.y_test,
    )


def _scores(result, model: str, seed: int) -> pd.DataFrame:
    frame = result.evaluate()[["client", "rmse", "nll", "coverage95"]]
    kinds = dict(zip([f"o{i}" for i in range(len(KINDS))], KINDS))
    return frame.assign(kind=frame["client"].map(kinds), model=model, seed=seed)


def main() -> pd.DataFrame:
    torch.set_num_threads(1)
    spec, rows = OwnFeaturesSpec(OWN_CORE), []
    for seed in (0, 1, 2):
        fed = spec.federation(own_feature_owners(KINDS, n=40, seed=seed))
        core = Federation([_core_only(c) for c in fed])
        quiet = Federation([_core_only(c) if KINDS[i] == "noise" else c for i, c in enumerate(fed)])
        models = (("own kernel", fed), ("core only", core), ("noise owners' z dropped", quiet))
        for model, federation in models:
            result = fedgp.fit(
                spec,
                federation,
                FGPR(local_steps=5),
                rounds=30,
                engine="sequential",
                seed=seed,
                callbacks=QUIET,
            )
            rows.append(_scores(result, model, seed))
    table = pd.concat(rows, ignore_index=True)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "own_features.csv", index=False)
    means = table.groupby(["kind", "model"])[["rmse", "nll", "coverage95"]].mean().unstack("model")
    print(means.round(3).to_string())
    fig, ax = plt.subplots(figsize=(5, 3))
    means["rmse"][["core only", "noise owners' z dropped", "own kernel"]].plot.bar(ax=ax, rot=0)
    ax.set_ylabel("test RMSE (mean of 3 seeds)")
    ax.set_xlabel("the owner's own column z")
    ax.set_title("An own kernel against the core alone")
    fig.tight_layout()
    fig.savefig(OUT / "own_features.png", dpi=120)
    return table


if __name__ == "__main__":
    main()
