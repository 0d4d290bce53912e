"""Table 1's protocol: the training settings every method shares, the methods' names, the columns of
the per-repeat rows, the repeats' seeds, and the functions a run may name."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from fedgp.baselines.mfdgp import MFDGP, Stage
from fedgp.data.client import Federation
from fedgp.errors import InputError, InputTypeError
from fedgp.run.stopping import NLLPlateau
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.weighted import WeightedFGPR
from fedgp.synthetic.multifidelity import MF_FUNCTIONS, MultiFidelityFunction

__all__ = [
    "METHODS",
    "BATCHED_METHODS",
    "SWEEP_METHODS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "Protocol",
    "QUICK_PROTOCOL",
    "check_methods",
    "repeat_seeds",
    "resolve_function",
]

#: The methods run for Table 1: FGPR (paper protocol and trained to convergence) and its baselines
#: (Separate per fidelity, MLE variants, AR1, NARGP, MF-DGP).
METHODS: tuple[str, ...] = (
    "FGPR",
    "FGPR-converged",
    "Separate",
    "SeparateMLE",
    "FGPR-MLE",
    "AR1",
    "NARGP",
    "MF-DGP",
)
#: Methods fitted for all repeats of one setting at once (one batched program per setting).
BATCHED_METHODS: tuple[str, ...] = ("MF-DGP",)
#: The HF-size sweep's methods (``methods`` of :func:`~fedgp.experiments.table1.hf_sweep`).
SWEEP_METHODS: tuple[str, ...] = ("FGPR", "FGPR-converged", "SeparateMLE", "AR1")
#: The per-repeat columns of ``table1_runs.csv``; ``rounds`` (FGPR, FGPR-converged, Separate: rounds
#: run; MF-DGP: Adam steps) and ``converged`` (FGPR-converged: its rule held) are empty for the rest.
RUN_COLUMNS = [
    "function",
    "hf_size",
    "seed",
    "method",
    "rmse",
    "nll",
    "coverage95",
    "seconds",
    "error",
    "rounds",
    "converged",
]
#: The columns of Table 1's summary: one row per function and method, over the repeats.
SUMMARY_COLUMNS = ["function", "method", "rmse_mean", "rmse_std", "nll_mean", "coverage95_mean", "repeats"]


@dataclass(frozen=True)
class Protocol:
    """Training settings shared by every method of one table.

    ``batch_size=None`` means the smallest client's size (the authors' code); ``rounds``, ``lr``
    and ``local_epochs`` are FGPR's and Separate's; ``mle_restarts`` is per MLE fit (SeparateMLE,
    FGPR-MLE and each level of AR1 and NARGP); ``nargp_samples`` the Monte Carlo size of NARGP.
    ``converged_*``: FGPR-converged's round budget and rule (:attr:`converged`). ``mfdgp_*``: MF-DGP's
    Adam steps and learning rates per stage (emukit: 5,000 + 15,000 + 15,000 at 3e-3, 1e-3, 1e-3;
    here 1.4 % of that, started at NARGP-style exact fits), Monte Carlo samples in training and
    prediction, and the stride of its lowest layer's inducing inputs (every other LF point: half the
    inducing inputs, and a step several times cheaper than with every point).
    """

    rounds: int = 200
    lr: float = 0.01
    local_epochs: int = 1
    batch_size: int | None = None
    minibatch: str = "uniform"
    ard: bool = True
    mle_restarts: int = 4
    nargp_samples: int = 100
    n_test: int = 1000
    converged_rounds: int = 3000
    converged_patience: int = 100
    converged_min_delta: float = 1e-4
    mfdgp_steps: tuple[int, int, int] = (100, 200, 200)
    mfdgp_lr: tuple[float, float, float] = (0.01, 0.01, 0.003)
    mfdgp_samples: int = 10
    mfdgp_predict_samples: int = 250
    mfdgp_low_stride: int = 2

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise InputError(f"rounds must be >= 1, got {self.rounds}")
        if self.converged_rounds < 1:
            raise InputError(f"converged_rounds must be >= 1, got {self.converged_rounds}")
        if len(self.mfdgp_steps) != 3 or len(self.mfdgp_lr) != 3:
            raise InputError("mfdgp_steps and mfdgp_lr: one value for each of the 3 training stages")
        if not self.lr > 0:
            raise InputError(f"lr must be > 0, got {self.lr}")
        if self.minibatch not in ("uniform", "nearest"):
            raise InputError(f"minibatch must be 'uniform' or 'nearest', got {self.minibatch!r}")

    @property
    def converged(self) -> NLLPlateau:
        """FGPR-converged's stopping rule.

        The training NLL's plateau, with windows of 100 rounds: under this protocol (Adam at a
        constant lr on minibatches, reset every round) the state keeps moving by about lr each
        round, so a rule on the state's change would not hold; the means of the NLL over 100-round
        windows settle after 250 to 2,600 rounds on Table 1's draws (``rounds`` in
        ``results/table1_runs.csv``). ``state_tol=None, stop_on_rise=True``: the rule Table 1's
        results were made with ("no longer improving"); the default ``NLLPlateau`` also waits for
        the state to settle and never takes a rise for a plateau."""
        return NLLPlateau(
            patience=self.converged_patience,
            min_delta=self.converged_min_delta,
            state_tol=None,
            stop_on_rise=True,
        )

    def mfdgp(self, seed: int = 0) -> MFDGP:
        """MF-DGP with this protocol's three stages (:func:`fedgp.baselines.mfdgp.emukit_stages`'
        structure, shorter and at a larger lr) and sample counts, on ``FEDGP_DEVICE`` (default the
        CPU; not part of the protocol: a GPU gives the same fits to rounding, and the same cache)."""
        free = ((False, False, False), (True, True, False), (True, True, True))
        stages = [Stage(n, lr, *f) for n, lr, f in zip(self.mfdgp_steps, self.mfdgp_lr, free)]
        return MFDGP(
            stages,
            samples=self.mfdgp_samples,
            predict_samples=self.mfdgp_predict_samples,
            low_inducing_stride=self.mfdgp_low_stride,
            seed=seed,
            device=os.environ.get("FEDGP_DEVICE") or None,
        )

    def batch_for(self, federation: Federation) -> int:
        """The minibatch size for a federation: the protocol's, else the smallest client's size."""
        return int(federation.sizes.min()) if self.batch_size is None else int(self.batch_size)

    def fgpr(self, federation: Federation, hf_weight: float | None = None) -> FGPR:
        """The FGPR strategy of this protocol for a federation (``hf_weight``: the high-fidelity client's
        weight p₁, :class:`~fedgp.strategies.weighted.WeightedFGPR`; else by size)."""
        kwargs = dict(
            local_epochs=self.local_epochs,
            batch_size=self.batch_for(federation),
            lr=self.lr,
            minibatch=self.minibatch,
        )
        if hf_weight is None:
            return FGPR.authors(**kwargs)
        return WeightedFGPR.authors(**kwargs, hf_weight=hf_weight)


#: ``fedgp reproduce table1 --quick`` (CI): every code path in seconds, not a result.
QUICK_PROTOCOL = Protocol(
    rounds=10,
    mle_restarts=1,
    nargp_samples=10,
    n_test=100,
    converged_rounds=40,
    converged_patience=5,
    mfdgp_steps=(10, 10, 10),
    mfdgp_samples=3,
    mfdgp_predict_samples=20,
)


def check_methods(methods: Sequence[str]) -> None:
    """Refuse a method Table 1 does not know, naming the known ones."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InputError(f"methods: unknown {unknown}; choose from {METHODS}")


def repeat_seeds(seed: int, repeats: int) -> list[int]:
    """Repeat ``r``'s seed, ``seed * 10000 + r``: it draws the repeat's data and seeds its training."""
    if repeats < 1:
        raise InputError(f"repeats must be >= 1, got {repeats}")
    return [seed * 10_000 + r for r in range(repeats)]


def resolve_function(name: str | MultiFidelityFunction) -> MultiFidelityFunction:
    """A multi-fidelity function by name (``fedgp.synthetic.multifidelity.MF_FUNCTIONS``) or as
    ``"module:attribute"``: the extension point for your own :class:`MultiFidelityFunction`
    (any box domain, 2 or more levels, lowest fidelity first; defined at module level, so worker
    processes can import it)."""
    if isinstance(name, MultiFidelityFunction):
        return name
    if ":" not in str(name):
        if name not in MF_FUNCTIONS:
            raise InputError(
                f"function {name!r}: not one of {', '.join(sorted(MF_FUNCTIONS))}; give your own as "
                "module:attribute (a fedgp.synthetic.multifidelity.MultiFidelityFunction)"
            )
        return MF_FUNCTIONS[name]
    module, _, attribute = str(name).partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise InputError(f"function {name!r}: cannot import it ({type(err).__name__}: {err})") from None
    if not isinstance(found, MultiFidelityFunction):
        raise InputTypeError(
            f"function {name!r} is a {type(found).__name__}, not a fedgp.synthetic.multifidelity."
            "MultiFidelityFunction(name, bounds, levels, paper_sizes)"
        )
    return found
