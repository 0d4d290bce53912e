"""How far a run's training NLL ends above its best window: what ``RISE_TOL`` is sized on (issue 49).

    OMP_NUM_THREADS=1 FEDGP_DATA=../shared/datasets .venv/bin/python benchmarks/stop_rise.py

The convergence benchmark's owner panels (``fedgp.experiments.convergence.federations``: synthetic,
Grunfeld, fertility, C-MAPSS FD001; the last needs the shared data, the middle two the ``bench``
extra) fitted with FGPR's default and ``FGPR.authors()``, ``stop="auto"``, a 400-round budget, the
paper's prior (``paper_spec``) and the default transforms. For each run: the rounds run, how it
ended (``stopped``, ``diverging``), and the rise of the last 20 rounds' mean training NLL above the
best 20-round window's, with two standard errors of that difference
(``fedgp.run.stopping.rise_above_best``). A federated fixed point sits a little above the best
window it passed; a run that climbed and settled (the issue's case) far above it. Writes
results/benchmarks/stop_rise.csv.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd
import torch

import fedgp
from fedgp.experiments.common import paper_spec
from fedgp.experiments.convergence import federations
from fedgp.run.stopping import RISE_TOL, rise_above_best

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "stop_rise.csv"


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for name, federation in federations(["synthetic", "grunfeld", "fertility", "cmapss"]).items():
        for label, strategy in (
            ("default", fedgp.strategies.FGPR()),
            ("authors", fedgp.strategies.FGPR.authors()),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = fedgp.fit(paper_spec(), federation, strategy, rounds=400, stop="auto",
                                   callbacks=[fedgp.run.Progress(False)])  # fmt: skip
            history = result.history
            rise, two_se, best, _ = rise_above_best(history["train_nll"].tolist(), 20) or (math.nan,) * 4
            rows.append({"panel": name, "strategy": label, "rounds": len(history),
                         "stopped": history.attrs["stopped"], "diverging": history.attrs["diverging"],
                         "best_window_nll": best, "rise_above_best": rise, "two_se": two_se,
                         "counts_as_rise": bool(rise > max(RISE_TOL, two_se))})  # fmt: skip
            print(rows[-1], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(OUT, index=False)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
