"""Paper reproductions the CLI can run: ``fedgp reproduce NAME``.

Each entry maps a name to ``"module:function"``; the function has the signature
``reproduce(repeats: int | None, out_dir: pathlib.Path, seed: int, quick: bool, progress: bool | None)
-> list[pathlib.Path]`` (the files it wrote: CSV and markdown at least), plus the keyword options the
CLI finds in its signature (``--function``, ``--subset``, ...). Each supplies only what its experiment
runs and writes; :func:`fedgp.experiments.common.reproduction` does the rest (the folder, the timing,
the files). Modules are imported only when their reproduction is asked for, so one heavy experiment
never slows the others' start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["REPRODUCTIONS", "DESCRIPTIONS", "QUICK_RUNTIMES", "quick_runtime", "get_reproduction"]

#: ``fedgp reproduce NAME`` -> ``"module:function"`` of its ``reproduce`` function.
REPRODUCTIONS: dict[str, str] = {
    "mixed-regression": "fedgp.experiments.mixed_regression:reproduce",
    "two-phase-unbalanced": "fedgp.experiments.two_phase_unbalanced:reproduce",
    "ifca-synthetic": "fedgp.experiments.ifca_synthetic:reproduce",
    "clustered-gp": "fedgp.experiments.clustered_gp:reproduce",
    "table1": "fedgp.experiments.table1:reproduce",
    "table2": "fedgp.experiments.table2:reproduce",
    "table3": "fedgp.experiments.table3:reproduce",
    "failures": "fedgp.experiments.failures:reproduce",
    "werner-synthetic": "fedgp.experiments.werner_synthetic:reproduce",
    "werner-gp": "fedgp.experiments.werner_gp:reproduce",
    "robust-fgpr": "fedgp.experiments.robust_fgpr:reproduce",
    "own-data": "fedgp.experiments.own_data:reproduce",
    "prior-map": "fedgp.experiments.prior_map:reproduce",
    "botorch-loop": "fedgp.experiments.botorch_loop:reproduce",
    "verdicts": "fedgp.experiments.verdicts:reproduce",
    "privacy": "fedgp.experiments.privacy:reproduce",
}


#: One line each for ``fedgp reproduce --help``.
DESCRIPTIONS: dict[str, str] = {
    "mixed-regression": "Su, Xu & Yang: two-phase mixed linear regression vs FedAvg, IFCA, one-shot, oracle",
    "two-phase-unbalanced": "two-phase on clusters holding 4-50 % of the data, trained to convergence",
    "ifca-synthetic": "Ghosh et al. Fig. 3: IFCA's success probability vs separation and data size",
    "clustered-gp": "clustered FGPR on mixed GP populations, and the clustered model's kernel variants",
    "table1": "Yue & Kontar Table 1: multi-fidelity FGPR vs AR1, NARGP, ...; HF-size sweep; p1 ablation",
    "table2": "Yue & Kontar Table 2: C-MAPSS remaining life (needs the C-MAPSS files, FEDGP_DATA)",
    "table3": "Yue & Kontar Table 3: SARCOS inverse dynamics, 25 devices (needs SARCOS, FEDGP_DATA)",
    "failures": "the README's FGPR example with 20 % of client updates failing, on both engines",
    "werner-synthetic": "Werner et al.'s synthetic linear regression, DX(4, 16, 9, 10)",
    "werner-gp": "Federated-Clustering on clustered GP clients, with and without Byzantine clients",
    "robust-fgpr": "every attack against every robust aggregator on FGPR",
    "own-data": "a user's own data (scikit-learn's diabetes set): what the default transforms change",
    "prior-map": "which prior weight makes FedAvg find the global MAP",
    "botorch-loop": "BoTorch qLogEI on a new client with the federated prior vs its own fit",
    "verdicts": "the verdict table of results/README.md from the CSVs in --out (run with --out results)",
    "privacy": "FGPR with client-level DP: test metrics against ε (K = 200, 1000; C-MAPSS); an attack",
}

#: ``--quick`` run times measured by ``benchmarks/cli_quick_times.py`` (a fresh process each,
#: imports included; ``results/benchmarks/cli_quick_times.csv``, which a test holds these to):
#: name -> (CPU minutes, wall minutes, the higher 1-minute load average before/after). Measured on
#: a 2-vCPU VM shared with other jobs, with OMP_NUM_THREADS=1: on a quiet machine expect the wall
#: time near the CPU time (each run computes on one core), on a loaded one longer.
QUICK_RUNTIMES: dict[str, tuple[float, float, float]] = {
    "mixed-regression": (1.7, 3.6, 5.4),
    "two-phase-unbalanced": (0.3, 0.3, 2.7),
    "ifca-synthetic": (0.3, 1.2, 5.6),
    "clustered-gp": (0.4, 1.2, 5.9),
    "table1": (0.6, 0.7, 2.6),
    "table2": (3.9, 12.1, 6.1),
    "table3": (2.5, 7.3, 7.1),
    "failures": (0.4, 1.7, 7.8),
    "werner-synthetic": (0.1, 0.7, 8.1),
    "werner-gp": (3.9, 13.6, 8.1),
    "robust-fgpr": (1.2, 3.2, 8.1),
    "own-data": (0.5, 1.4, 10.2),
    "prior-map": (0.5, 1.6, 10.2),
    "botorch-loop": (0.4, 1.3, 9.4),
    "verdicts": (0.1, 0.2, 9.5),
    "privacy": (0.3, 0.3, 1.0),
    "demo": (0.2, 0.7, 9.7),
}


def quick_runtime(name: str) -> str:
    """``--quick: 1.7 min CPU, 3.6 min wall (load 5.4; shared 2-vCPU VM)`` for ``--help``."""
    if name not in QUICK_RUNTIMES:  # a new experiment: tests/test_cli.py asks for its measurement
        return "--quick: not measured yet (benchmarks/cli_quick_times.py --only NAME)"
    cpu, wall, load = QUICK_RUNTIMES[name]
    return f"--quick: {cpu:g} min CPU, {wall:g} min wall (load {load:g}; shared 2-vCPU VM)"


def get_reproduction(name: str) -> Callable:
    """The ``reproduce`` function registered under ``name`` (imported only now); an unknown name exits with
    the list of known ones."""
    try:
        target = REPRODUCTIONS[name]
    except KeyError:
        known = ", ".join(sorted(REPRODUCTIONS)) or "none yet"
        raise SystemExit(f"fedgp reproduce: unknown experiment {name!r}; available: {known}") from None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)
