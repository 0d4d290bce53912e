"""FGPR Table 1 (Yue & Kontar §5): multi-fidelity, one client per fidelity level; plus two studies.

* :func:`table1` — five test functions × methods, RMSE mean ± std over repeats on the
  standardised HF scale (1,000 uniform test points), with NLL and 95% coverage.
* :func:`hf_sweep` — beyond the paper: HF training size 5…80 on CURRIN and PARK, to show where
  federation helps and where a converged HF-only GP catches up.
* :func:`p1_ablation` — the paper's Fig. 9: CURRIN, HF aggregation weight p₁ from 0.17 to 1
  (:class:`~fedgp.strategies.weighted.WeightedFGPR`).
* :func:`reproduce` — ``fedgp reproduce table1``: all three, CSV and markdown.

Protocol (:class:`Protocol`, the authors' R code, digest §1.4 and §6.12): Adam (reset every
round) with lr 0.01, batch size = the smallest client's size, one local epoch per round,
200 rounds, zero-mean GP with ``ScaleKernel(RBF)``. Two choices the authors' code makes
differently, taken from the digest and documented in ``results/README.md``: **ARD** lengthscales
(their code: one isotropic lengthscale) and **uniform** minibatches (their MF code: nearest-
neighbour batches); both are switches here, and :func:`table1` can run either.

The package, one concern a module: :mod:`~fedgp.experiments.table1.protocol` (settings, methods'
names, seeds, functions), :mod:`~fedgp.experiments.table1.methods` (the methods on one repeat),
:mod:`~fedgp.experiments.table1.jobs` (process pool, cache, rows kept from earlier runs),
:mod:`~fedgp.experiments.table1.studies` (the table, the sweep, the ablations),
:mod:`~fedgp.experiments.table1.report` (beside the paper, markdown) and
:mod:`~fedgp.experiments.table1.reproduction` (the command). The paper's numbers are in
:mod:`fedgp.experiments.paper`.

Long runs resume: with ``FEDGP_CACHE`` set, every finished job is kept in ``$FEDGP_CACHE/table1``;
``reproduce(..., reuse=DIR)`` keeps the per-repeat rows of methods already in DIR's
``table1_runs.csv`` and ``table1_sweep_runs.csv`` and runs only the missing ones.
"""

from fedgp.experiments.paper import PAPER_TABLE1
from fedgp.experiments.table1.jobs import workers
from fedgp.experiments.table1.methods import run_batched, run_once
from fedgp.experiments.table1.protocol import (
    BATCHED_METHODS,
    METHODS,
    QUICK_PROTOCOL,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    SWEEP_METHODS,
    Protocol,
    resolve_function,
)
from fedgp.experiments.table1.report import FEDERATED, compare_with_paper, winners
from fedgp.experiments.table1.reproduction import reproduce
from fedgp.experiments.table1.studies import (
    SWEEP_BATCH,
    hf_sweep,
    p1_ablation,
    protocol_ablation,
    summarise_runs,
    table1,
)
from fedgp.strategies.weighted import WeightedFGPR

__all__ = [
    "PAPER_TABLE1",
    "METHODS",
    "BATCHED_METHODS",
    "SWEEP_METHODS",
    "SWEEP_BATCH",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "FEDERATED",
    "Protocol",
    "QUICK_PROTOCOL",
    "WeightedFGPR",
    "run_once",
    "run_batched",
    "summarise_runs",
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
