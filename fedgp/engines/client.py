"""The client side of the protocol: what a client does with a task, the same for every engine.

An engine builds :class:`~fedgp.strategies.base.ClientOps` for the clients it hosts (one, a chunk,
or a silo) and calls :func:`handle` with the task it received; the tensors returned are the reply
record. Registration (``hello``), training (the strategy's ``local_update``), evaluation and
prediction (through the strategy's ``personal_state``) are the only things a client ever does.
"""

from __future__ import annotations

import torch

from fedgp.attacks.labels import flipped_ops
from fedgp.errors import InputError, SimulatedFailure
from fedgp.messages import Task, state_tensors
from fedgp.models.posterior import prediction_metrics
from fedgp.rng import client_uniform
from fedgp.strategies.base import ClientOps, Strategy
from fedgp.transforms import DataTransform, client_summaries

__all__ = ["handle"]


def _simulated_failures(ops: ClientOps, task: Task) -> None:
    p = float(task.options.get("simulate_failures", 0.0))
    if p <= 0:
        return
    # A function of (seed, round, client key) only: the same clients fail whatever the engine.
    u = client_uniform(ops.seed, "simulated failure", task.round, ops.indices, ())
    failing = ops.indices[u < p]
    if len(failing):
        raise SimulatedFailure(f"simulated failure (p = {p:g})", failing.tolist())


def handle(
    strategy: Strategy,
    ops: ClientOps,
    task: Task,
    units: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Carry out ``task`` on the clients of ``ops``; the reply tensors, one row per client.

    ``ops`` work on the data in the units of the task's transform (:mod:`fedgp.transforms`);
    ``units`` are the clients' outcome ``(offsets, scales)`` under it, with which predictions and
    test metrics go back to the original units (default: the data are untransformed)."""
    if task.kind == "hello":
        n_test = [0 if c.X_test is None else c.X_test.shape[0] for c in ops.clients]
        return {
            "n": ops.sizes.to(torch.long),
            "n_test": torch.tensor(n_test, dtype=torch.long),
            "d": torch.tensor([c.n_features for c in ops.clients], dtype=torch.long),
        }
    if task.kind == "summarise":
        return client_summaries(
            ops.clients,
            task.setting("stage", "mean"),
            task.setting("bounds", False),
            task.setting("center", 0.0),
            task.setting("scales", False),
            task.setting("hide_discrete", False),
        )
    if task.kind == "train":
        _simulated_failures(ops, task)
        return strategy.local_update(flipped_ops(ops, task), task)  # LabelFlip's clients see −y
    offset, scale = (torch.zeros(len(ops.clients)), torch.ones(len(ops.clients))) if units is None else units
    offset, scale = offset.to(torch.float64), scale.to(torch.float64)
    states, cluster = strategy.personal_state(ops, task)
    if task.kind == "personal":
        return {**state_tensors(states, "state/"), "cluster": cluster}
    if task.kind == "evaluate":
        targets = [c.y_test for c in ops.clients]
        if ops.spec.variational:
            out = ops.spec.test_metrics(ops.predict(states), targets, states)
        else:
            out = prediction_metrics(ops.predict(states), targets)
        # In the original units: RMSE scales with sd, the density's log by −log sd; coverage is unchanged.
        # (A non-Gaussian likelihood's targets are never transformed: its scale is 1.)
        out["rmse"] = out["rmse"] * scale
        out["nll"] = out["nll"] + scale.log()
        out["n_test"] = torch.tensor([len(c.y_test) for c in ops.clients], dtype=torch.long)
        out["cluster"] = cluster.to(torch.long)
        return out
    if task.kind == "predict":
        transform = DataTransform.from_parts(task.shared.tensors, task.shared.settings)
        full_cov = bool(task.setting("full_cov", False))
        X = transform.inputs(task.tensor("X")).to(ops.spec.dtype)
        predictions = ops.predict(states, X, full_cov)
        # Back to the original units: y = offset + scale * y', so variances and covariances scale by scale².
        column, square = scale.unsqueeze(1), (scale * scale).unsqueeze(1)
        out = {
            "mean": torch.stack([p.mean for p in predictions]).to(torch.float64) * column
            + offset.unsqueeze(1),
            "variance_f": torch.stack([p.variance_f for p in predictions]).to(torch.float64) * square,
            "variance_y": torch.stack([p.variance_y for p in predictions]).to(torch.float64) * square,
        }
        if predictions and predictions[0].latent_mean is not None:  # a non-Gaussian likelihood's
            out["mean_f"] = torch.stack([p.latent_mean for p in predictions]).to(torch.float64)
        if full_cov:
            covariance = torch.stack([p.covariance_f for p in predictions]).to(torch.float64)
            out["covariance_f"] = covariance * square.unsqueeze(-1)
        return out
    raise InputError(f"unknown task kind {task.kind!r}")
