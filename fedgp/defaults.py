"""fedgp's defaults, decided once: what every door does when you say nothing.

The doors are the Python API (``fedgp.GPSpec``, ``fedgp.fit``), the scikit-learn estimator
(``fedgp.sklearn.FederatedGPRegressor``), the command line (``fedgp fit``) and fedgp's Flower app
(``fedgp flower new``; its run config). Each reads its defaults here, so the same table through
two doors gives the same model; where a door must differ, :data:`DEFAULTS` says which, to what,
and why, and the docs' table "What each door does by default" (docs/own-data.md) is this table
(a test compares them). Nothing here imports torch: ``fedgp --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DOORS", "Default", "DEFAULTS", "for_door", "KERNEL", "ARD", "MEAN", "STRATEGY", "ROUNDS",
           "ENGINE", "SEED", "TRANSFORMS", "STOP", "value"]  # fmt: skip

#: The doors, as the table names them.
DOORS = ("python", "sklearn", "cli", "flower")

#: The kernel, by name, inside a ``ScaleKernel`` (its outputscale is learned too).
KERNEL = "rbf"
#: One lengthscale per input feature (automatic relevance determination), as BoTorch's
#: ``SingleTaskGP``: features in different units and of different relevance get their own.
ARD = True
#: The mean function, by name: zero, as in the FGPR paper. The default transforms standardise the
#: targets, so zero is the federation's mean (each owner's own, when their scales differ); a
#: constant mean would add a parameter that standardised data hold near zero. Pass ``"constant"``
#: (or ``"linear"``) where the data are not standardised.
MEAN = "zero"
#: The strategy, by name: FGPR with its own defaults (``fedgp.strategies.FGPR()``).
STRATEGY = "fgpr"
#: The round budget.
ROUNDS = 100
#: The engine: the batched one where its tensor path reproduces GPyTorch for the spec, else the
#: sequential one.
ENGINE = "auto"
#: The master seed.
SEED = 0
#: The data transforms: the outcome standardised and the inputs mapped to the unit cube, from
#: federated sums (``fedgp.transforms.Transforms``).
TRANSFORMS = "auto"
#: The stopping rule of ``fedgp.fit``: none, every round of the budget runs (the doors that hand
#: back a finished model stop at convergence: :data:`DEFAULTS` says which and why).
STOP = None


@dataclass(frozen=True)
class Default:
    """One default: its ``value``, what it means, the doors where it differs (``door -> value``)
    and why they do."""

    name: str
    value: Any
    meaning: str
    differs: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    #: How each door (in the order of :data:`DOORS`) names it; "" where a door cannot set it.
    spelled: tuple[str, ...] = ("", "", "", "")

    def at(self, door: str) -> Any:
        """The value at ``door``."""
        if door not in DOORS:
            raise KeyError(f"no door {door!r}; the doors are {', '.join(DOORS)}")
        return self.differs.get(door, self.value)


#: Every default, in the order of the docs' table.
DEFAULTS: tuple[Default, ...] = (
    Default("kernel", KERNEL, "ScaleKernel(RBFKernel) on the inputs",
            spelled=("GPSpec(kernel=)", "kernel=", "--kernel", "kernel")),
    Default("ard", ARD, "one lengthscale per input feature",
            spelled=("GPSpec(ard=)", "ard=", "--ard / --no-ard", "ard")),
    Default("mean", MEAN, "zero (ZeroMean): the standardised targets' mean",
            spelled=("GPSpec(mean=)", "mean=", "--mean", "mean")),
    Default("likelihood", "gaussian", "Gaussian noise, learned (GaussianLikelihood, noise >= 1e-4)",
            spelled=("GPSpec(likelihood=)", "", "", "model")),
    Default("strategy", STRATEGY, "FGPR with its own defaults",
            spelled=("fit(strategy=)", "strategy=", "--strategy", "strategy")),
    Default("rounds", ROUNDS, "the round budget", spelled=("fit(rounds=)", "rounds=", "--rounds", "rounds")),
    Default("engine", ENGINE, "the batched engine where it reproduces GPyTorch, else the sequential one",
            spelled=("fit(engine=)", "engine=", "--engine", "")),
    Default("seed", SEED, "the master seed of every random draw",
            spelled=("fit(seed=)", "seed=", "--seed", "seed")),
    Default("transforms", TRANSFORMS, "targets standardised, inputs to the unit cube, from federated sums",
            spelled=("fit(transforms=)", "transforms=", "", "transforms")),
    Default(
        "hide_discrete",
        False,
        "integer-valued features' box ends as they are (a widened grid point)",
        {"flower": True},
        "a deployment's server is another party: each node moves its integer features' box ends out "
        "by 0 to 3 grid steps of at least 1, so the server reads a node's extreme value for 1 end in 4 "
        "(the privacy guide has the measurement), not every time; in one process there is no one to "
        "hide them from",
        ("Transforms(hide_discrete=)", "transforms=", "--hide-discrete", "hide-discrete"),
    ),
    Default(
        "stop",
        STOP,
        "run every round of the budget",
        {"sklearn": "auto", "cli": "auto", "flower": "auto"},
        "fedgp.fit is the laboratory: the papers' protocols run a fixed number of rounds and a run "
        "resumes with more; the doors that hand back a finished model stop where training has "
        "converged (as scikit-learn's estimators stop at tol within max_iter) and warn when the budget "
        "runs out first",
        ("fit(stop=)", "stop=", "--stop", "stop"),
    ),
)  # fmt: skip


def markdown_table() -> str:
    """The docs' table "What each door does by default" (docs/own-data.md holds this text)."""

    def cell(d: Default, door: str) -> str:
        value = d.at(door)
        shown = "none" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
        spelled = d.spelled[DOORS.index(door)]
        return f"{shown} (`{spelled}`)" if spelled else f"{shown} (not settable)"

    head = "| default | meaning | Python | scikit-learn | CLI | Flower app (run config) |"
    lines = [head, "|" + "---|" * 6]
    for d in DEFAULTS:
        lines.append(f"| {d.name} | {d.meaning} | " + " | ".join(cell(d, door) for door in DOORS) + " |")
    notes = [f"* **{d.name}** differs where it does because {d.why}." for d in DEFAULTS if d.differs]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def _by_name() -> dict[str, Default]:
    return {d.name: d for d in DEFAULTS}


def for_door(door: str) -> dict[str, Any]:
    """Every default's value at ``door`` (one of :data:`DOORS`)."""
    return {d.name: d.at(door) for d in DEFAULTS}


def value(name: str, door: str) -> Any:
    """Default ``name``'s value at ``door``."""
    return _by_name()[name].at(door)
