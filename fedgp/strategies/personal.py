"""Personal hyper-parameters: which of a spec's hyper-parameters each owner keeps for itself.

A strategy's ``personal`` setting names them as a state names them (``"likelihood.noise_covar.noise"``),
as GPyTorch's ``state_dict`` does (``"likelihood.noise_covar.raw_noise"``), or by an alias:
``"noise"``, ``"outputscale"``, ``"lengthscale"`` (every hyper-parameter of that last name) and
``"mean"`` (every hyper-parameter of the mean module, e.g. a constant mean's offset) and ``"scale"``
(what carries an owner's units: the outputscale, the noise and the mean's hyper-parameters, those
the spec has; :mod:`fedgp.experiments.owner_scale`). An owner trains
its personal values on its own likelihood with the shared ones, keeps them
(:mod:`fedgp.strategies.memory`) and conditions on them; they are never in a reply.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.memory import ClientMemory

__all__ = ["ALIASES", "as_names", "keep", "personal_names", "with_kept"]

#: The aliases a ``personal`` setting may use, and what each names.
ALIASES = {
    "noise": "the likelihood's noise",
    "outputscale": "every kernel's outputscale",
    "lengthscale": "every kernel's lengthscale",
    "mean": "every hyper-parameter of the mean module",
    "scale": "an owner's units: its outputscale, noise and mean hyper-parameters (those the spec has)",
}

#: What ``"scale"`` stands for: the hyper-parameters an owner's units move (measuring y as m + c·y
#: moves the mean by m and c, the outputscale and the noise by c²).
SCALE = ("outputscale", "noise", "mean")


def as_names(names, who: str) -> tuple[str, ...]:
    """``names`` as a tuple of strings (the setting as given; resolved against a spec later)."""
    if isinstance(names, str):
        raise InputTypeError(f"{who}: personal must be a tuple of names, e.g. ({names!r},), not a string")
    names = tuple(names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InputTypeError(f"{who}: personal names must be strings, got {bad!r}")
    return names


def _matches(spec: GPSpec, name: str) -> list[str]:
    found = []
    for p in spec.params:
        last = p.name.rsplit(".", 1)[-1]
        if (
            name in (p.name, p.raw_name)
            or (name == "mean" and p.name.startswith("mean_module."))
            or (name in ("noise", "outputscale", "lengthscale") and last == name)
        ):
            found.append(p.name)
    return found


def personal_names(spec: GPSpec, names: Iterable[str], who: str) -> frozenset[str]:
    """The state names of ``spec`` that ``names`` declare personal; an unknown name is refused,
    listing the spec's names and the aliases."""
    out: set[str] = set()
    for name in names:
        found = _expanded(spec, name)
        if not found:
            known = ", ".join(repr(p.name) for p in spec.params)
            raise InputError(
                f"{who}: personal={name!r} names no hyper-parameter of this spec; its hyper-parameters "
                f"are {known} (or their raw names), and the aliases {', '.join(map(repr, ALIASES))}"
            )
        out.update(found)
    return frozenset(out)


def _expanded(spec: GPSpec, name: str) -> list[str]:
    """``name``'s state names; ``"scale"``: those of :data:`SCALE` the spec has (at least one)."""
    if name != "scale":
        return _matches(spec, name)
    return [found for alias in SCALE for found in _matches(spec, alias)]


def with_kept(states: HyperState, names: frozenset[str], memory: ClientMemory) -> HyperState:
    """``states`` (one row per client) with each client's kept values of ``names`` where it keeps
    them (a client that keeps none yet starts from the row it was given)."""
    if not names:
        return states
    values = {k: memory.get(k, v) if k in names else v for k, v in states.items()}
    return HyperState(values, states.event_shapes)


def keep(states: HyperState, names: frozenset[str], memory: ClientMemory) -> None:
    """Stage each client's values of ``names`` in ``states`` to be kept."""
    for name in sorted(names):
        memory.put(name, states[name].to(torch.float64))
