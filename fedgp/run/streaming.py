"""Owners whose data grow after ``fit``: what ``FitResult.update`` does, and where the rows live.

An owner that adds rows keeps the shared hyper-parameters and its own choice of state (a cluster,
its personal values) as they were, and conditions on all its rows: its posterior's Cholesky factor
grows by the new rows' block (:class:`~fedgp.models.streaming.GrowingPosterior`), O(n²k) instead of
O((n + k)³). Nothing leaves the owner; the server is not asked.

Where the rows live: with the result, as the owner's grown ``ClientData`` (``result.federation``
holds it, so ``fedgp.fit(result.warm_spec(), result.federation, ...)`` continues on every row) and
its grown factor. The engine's copy of the data is the run's and is left as it was: the result
answers the grown owner's ``predict`` and ``evaluate`` itself, from the factor, through the task
kinds' own reply code (:mod:`fedgp.engines.tasks`), so ``posterior``, ``ask``, ``evaluate`` and
``combine=`` read the same posterior. Only in-process engines qualify: a Ray actor's or a Flower
node's owner holds its rows on its own machine, and they are added there.

The data transforms stay as the run learned them. The federation's outcome standardisation and
input box are the shared model's units for every owner: re-learning them from one owner's new rows
would change every other owner's units and the meaning of the learned state. An owner that
standardises its outcome with its own mean and sd (``Standardize(local=True)``) re-derives them
from all its rows, as it would holding them at the start (and as a loaded model does with its
``ClientData``): that map is the owner's alone, and only its whitened residual is solved again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedgp.data.client import ClientData, _as_float_tensor, _check_pair
from fedgp.data.names import align
from fedgp.engines.base import InProcessEngine
from fedgp.errors import InputError
from fedgp.messages import read_state
from fedgp.models import iterative
from fedgp.models.own_features import refuse_own_part
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.models.streaming import GrowingPosterior
from fedgp.transforms import DataTransform

__all__ = ["GrownOwner", "GrownOps", "grow", "with_grown", "warm_spec"]


@dataclass
class GrownOwner:
    """A training owner that added rows: all its rows (the data's units), the posterior conditioned
    on them (the model's), its outcome map, the state it conditions on and its cluster, and the
    server state that state came from (``id``: a replaced server state means a new factor)."""

    data: ClientData
    posterior: GrowingPosterior
    offset: float
    scale: float
    states: HyperState  # batch (1,), as a task kind's answer takes it
    cluster: torch.Tensor  # (1,)
    key: int

    def add(self, X: torch.Tensor, y: torch.Tensor, transform: DataTransform) -> None:
        """Condition on the new rows (the data's units): the factor's block update, then the owner's
        own outcome map re-derived where it standardises with its own (module docstring)."""
        self.posterior.extend(transform.inputs(X), (y - self.offset) / self.scale)
        self.data = self.data.derived(X=torch.cat([self.data.X, X]), y=torch.cat([self.data.y, y]))
        if transform.y_local:
            self.offset, self.scale = transform.outcome_map(self.data.y)
            self.posterior.retarget((self.data.y - self.offset) / self.scale)

    def ops(self, spec: GPSpec, transform: DataTransform) -> GrownOps:
        """The operations a ``predict`` or ``evaluate`` task's answer runs on."""
        return GrownOps(spec, self, transform)


class GrownOps:
    """What :meth:`fedgp.engines.tasks.Predict.answer_under` and ``Evaluate``'s read of a client's
    operations, for a grown owner: its test split in the model's units, and predictions from its
    factor (the states asked for are the ones it was built under)."""

    def __init__(self, spec: GPSpec, owner: GrownOwner, transform: DataTransform) -> None:
        self.spec, self.owner = spec, owner
        data, test = owner.data, {}
        if data.X_test is not None:
            test = {
                "X_test": transform.inputs(data.X_test),
                "y_test": (data.y_test - owner.offset) / owner.scale,
            }
        self.clients = (data.derived(**test),)

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """The owner's posterior at ``X_new`` (the model's units; default its test inputs), one
        prediction, from its grown factor."""
        X_new = self.clients[0].X_test if X_new is None else X_new
        if X_new is None:
            raise InputError(f"client {self.owner.data.id!r} has no test split and no inputs were given")
        return [self.owner.posterior.predict(X_new, full_cov)]


def checked_rows(result: Any, position: int, X: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The new rows as float64 tensors in the model's column order, refused (naming the owner and
    the field) when misnamed, misshapen, empty or not finite."""
    cid = result.roster.ids[position]
    where = f"update for client {cid!r}"
    if result.feature_names is not None:  # a DataFrame's named columns are matched by name
        X = align(X, result.feature_names, where)
    X, y = _as_float_tensor(X, cid, "X_new"), _as_float_tensor(y, cid, "y_new")
    _check_pair(X, y, cid, "X_new", "y_new")
    if X.shape[0] == 0:
        raise InputError(f"{where}: X_new has no rows")
    width = int(result.roster.dims[position])
    if X.shape[1] != width:
        raise InputError(
            f"{where}: X_new has {X.shape[1]} input columns, but the client's model takes {width}: give the "
            f"new rows the same {width} columns, in the same order, as its training data"
        )
    return X, y


def check_updatable(result: Any, client: Any) -> int:
    """The training position of the owner ``client`` that may add rows here, or a clear refusal."""
    if result.engine is None:
        raise InputError(
            f"update (client {client!r}): this result was loaded from a file and holds no client data; "
            "predict for the owner's ClientData with all its rows instead: "
            "result.predict(X, client=ClientData(X_all, y_all))"
        )
    where = result._position(client)
    if isinstance(where, ClientData):
        raise InputError(
            f"update: client {where.id!r} is not one of the {len(result.roster.ids)} owners trained on; a "
            "new owner is conditioned on the ClientData it is given, so pass one with all its rows to "
            "predict instead"
        )
    cid = result.roster.ids[where]
    engine = result.engine
    if not isinstance(engine, InProcessEngine) or result.federation is None:
        name = getattr(engine, "name", type(engine).__name__)
        raise InputError(
            f"update (client {cid!r}): the {name!r} engine hosts its owners' data in their own processes "
            "(Ray actors, Flower nodes), so an owner adds rows where it is hosted: append them to its data "
            "there and fit again. update serves the owners of an in-process engine (sequential, batched)"
        )
    spec = result.spec
    refuse_own_part(spec, result.federation[where], "update")
    if spec.variational or not spec.conjugate:
        raise InputError(
            f"update (client {cid!r}): the spec is variational ({type(spec).__name__}); a growing "
            "Cholesky factor is exact GP conditioning. Fit again on the owner's grown data"
        )
    if spec.fixed_noise:
        raise InputError(
            f"update (client {cid!r}): the likelihood takes known per-point noise, which new rows would "
            "need too; update does not take noise yet: fit again on the owner's grown data"
        )
    return where


def grow(result: Any, client: Any, X: Any, y: Any) -> tuple[int, GrownOwner]:
    """Add rows ``(X, y)`` to the training owner ``client`` of ``result``: its position and its grown
    state (the caller keeps it)."""
    position = check_updatable(result, client)
    X, y = checked_rows(result, position, X, y)
    owner = current_owner(result, position)
    total = owner.posterior.n + X.shape[0]
    if total > iterative.ITERATIVE_CLIENT_ROWS:
        raise InputError(
            f"update for client {result.roster.ids[position]!r}: {total} rows would exceed the "
            f"{iterative.ITERATIVE_CLIENT_ROWS} up to which an owner's posterior is one dense factor; "
            "fit again (above it fedgp conditions by conjugate gradients)"
        )
    owner.add(X, y, result.transform)
    return position, owner


def current_owner(result: Any, position: int) -> GrownOwner:
    """The owner at ``position`` as it stands: its kept state when built under the result's server
    state, else a new factor from all its rows (the rows it was trained on, the first time)."""
    owner = result._grown.get(position)
    key = id(result.server_state)
    if owner is not None and owner.key == key:
        return owner
    data = result.federation[position] if owner is None else owner.data
    reply = result._engine_answer("personal", position)  # the owner's own choice, asked as always
    states = read_state({k: v.unsqueeze(0) for k, v in reply.items()}, result.spec, "state/")
    transform = result.transform
    offset, scale = transform.outcome_map(data.y)
    posterior = GrowingPosterior(
        result.spec, states.index(0), transform.inputs(data.X), (data.y - offset) / scale, data.id
    )
    return GrownOwner(data, posterior, offset, scale, states, reply["cluster"].reshape(1), key)


def with_grown(
    session: Any, kind: str, outcome: Any, X: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """``outcome``'s individual replies with the rows of the owners that added rows after ``fit``
    answered from their grown factors (``session``: a :class:`~fedgp.run.FitResult`; a
    :class:`~fedgp.run.Run`'s owners never do, and its replies come back as they are)."""
    grown = getattr(session, "_grown", None)
    individual = dict(outcome.individual)
    if not grown:
        return individual
    for row, position in enumerate(outcome.clients.tolist()):
        if position in grown:
            for name, value in session._ask_grown(kind, position, X, False).items():
                if individual[name] is outcome.individual[name]:
                    individual[name] = individual[name].clone()
                individual[name][row] = value
    return individual


def warm_spec(spec: GPSpec, state: HyperState) -> GPSpec:
    """``spec`` with ``state`` as its initial values: the same modules, fixed names, dtype and prior
    weight, to continue training from a learned state."""
    if state.batch_shape:
        raise InputError(
            f"warm_spec: the strategy holds {tuple(state.batch_shape)} states (clusters); a spec starts "
            "from one. Warm-start a clustered run with its strategy's own initial states"
        )
    model = spec.build()
    spec.load(model, state)
    fixed = [p.name for p in spec.params if not p.trainable]
    return GPSpec(
        model.covar_module, model.mean_module, model.likelihood,
        fixed=fixed, dtype=spec.dtype, prior_weight=spec.prior_weight,
    )  # fmt: skip
