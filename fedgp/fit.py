"""``fedgp.fit``: spec + federation + strategy + engine -> a result that predicts per client.

The round loop lives here, once, for every engine: configure, run the clients' local updates in
the chunks the engine chooses, aggregate, record, checkpoint. Engines only provide
:class:`~fedgp.strategies.base.ClientOps` for chunks of clients; strategies only see states.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from fedgp.data.client import ClientData, Federation
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from fedgp.engines.sequential import SequentialEngine
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import Reply, ServerContext, Strategy, concat_replies, index_reply
from fedgp.strategies.fgpr import FGPR

__all__ = ["fit", "FitResult", "make_engine", "ENGINES"]

ENGINES: dict[str, Any] = {"sequential": SequentialEngine, "batched": BatchedEngine}


def make_engine(name: str, spec: GPSpec, federation: Federation, seed: int, **options):
    try:
        cls = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}") from None
    return cls(spec, federation, seed, **options)


def _run_clients(strategy: Strategy, engine, participants: torch.Tensor, rnd: int, payload: Any) -> Reply:
    """Local updates of the participants (each distinct client once), in participant order."""
    unique, inverse = torch.unique(participants, sorted=True, return_inverse=True)
    parts = [strategy.local_update(ops, payload) for ops in engine.chunks(unique, rnd)]
    return index_reply(concat_replies(parts), inverse)


def _per_client_predictions(
    strategy, server, engine, indices: torch.Tensor
) -> Iterator[tuple[int, Prediction]]:
    for ops in engine.chunks(indices, 0):
        preds = ops.predict(strategy.personal_state(server, ops))
        yield from zip(ops.indices.tolist(), preds)


def evaluate_clients(strategy, server, engine, federation: Federation) -> pd.DataFrame:
    """Per-client test metrics: each client conditions its personal state on its training data."""
    indices = torch.tensor([i for i, c in enumerate(federation) if c.has_test], dtype=torch.long)
    rows = []
    for i, pred in _per_client_predictions(strategy, server, engine, indices):
        y = federation[i].y_test
        rows.append(
            {
                "client": federation[i].id,
                "n_test": len(y),
                "rmse": pred.rmse(y),
                "nll": pred.nll(y),
                "coverage95": pred.coverage(y),
            }
        )
    return pd.DataFrame(rows)


def _summarise(per_client: pd.DataFrame) -> dict[str, float]:
    return {
        "test_rmse_mean": float(per_client["rmse"].mean()),
        "test_rmse_std": float(per_client["rmse"].std(ddof=0)),
        "test_nll_mean": float(per_client["nll"].mean()),
        "test_nll_std": float(per_client["nll"].std(ddof=0)),
    }


@dataclass
class FitResult:
    """The outcome of :func:`fit`: learned server state, history, and per-client prediction."""

    spec: GPSpec
    strategy: Strategy
    federation: Federation
    server_state: Any
    history: pd.DataFrame
    seed: int
    engine: Any

    @property
    def state(self) -> HyperState:
        """The learned (global) hyper-parameters, in constrained units."""
        return self.strategy.global_state(self.server_state)

    def _client(self, client: int | ClientData | Any) -> tuple[int | None, ClientData]:
        if isinstance(client, ClientData):
            return None, client
        if isinstance(client, (int, np.integer)) and not isinstance(client, bool):
            return int(client), self.federation[int(client)]
        index = self.federation.index_of(client)
        return index, self.federation[index]

    def client_state(self, client: int | ClientData | Any) -> HyperState:
        """The state a client conditions on (for FGPR the global state; for IFCA its cluster's)."""
        _, data = self._client(client)
        ops = self.engine_for_prediction().ops_for(data)
        return self.strategy.personal_state(self.server_state, ops).index(0)

    def engine_for_prediction(self) -> SequentialEngine:
        return SequentialEngine(self.spec, self.federation, self.seed)

    def posterior(self, X: Any, client: int | ClientData | Any) -> Prediction:
        """Predictive distribution at ``X`` for ``client`` (an index, an id, or a new ``ClientData``),
        conditioning its personal state on that client's training data only."""
        _, data = self._client(client)
        ops = self.engine_for_prediction().ops_for(data)
        X = torch.as_tensor(np.asarray(X) if not isinstance(X, torch.Tensor) else X, dtype=self.spec.dtype)
        if X.dim() != 2 or X.shape[1] != data.n_features:
            raise ValueError(f"X must have shape (n, {data.n_features}), got {tuple(X.shape)}")
        return ops.predict(self.strategy.personal_state(self.server_state, ops), X)[0]

    def predict(
        self, X: Any, client: int | ClientData | Any, observation_noise: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, variance)`` at ``X`` for ``client``; variance of f, or of y with observation_noise."""
        pred = self.posterior(X, client)
        return pred.mean, pred.variance(observation_noise)

    def evaluate(self) -> pd.DataFrame:
        """Per-client test RMSE, NLL and 95% coverage (clients with a test split)."""
        return evaluate_clients(self.strategy, self.server_state, self.engine, self.federation)


def fit(
    spec: GPSpec,
    federation: Federation,
    strategy: Strategy | None = None,
    rounds: int = 100,
    engine: str = "sequential",
    seed: int = 0,
    *,
    progress: bool | None = None,
    eval_every: int | None = None,
    checkpoint_every: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume_from: str | os.PathLike | None = None,
    engine_options: dict | None = None,
    callback: Callable[[int, Any], None] | None = None,
) -> FitResult:
    """Train ``strategy`` (default :class:`~fedgp.strategies.FGPR`) on ``federation``.

    Args:
        rounds: communication rounds R (total, including rounds restored from a checkpoint).
        engine: ``"sequential"`` (the reference) or ``"batched"`` (all clients' steps as one tensor
            program; same results, much faster for many clients); ``engine_options`` are passed to it.
        seed: master seed; every random draw derives from it, per round and client.
        progress: tqdm bar over rounds; ``None`` shows it only on a terminal.
        eval_every: every how many rounds to compute per-client test metrics (default 1 if the
            federation has test splits, else never). Each evaluation conditions every client.
        checkpoint_every / checkpoint_path: save a checkpoint every N rounds (and at the end).
        resume_from: continue from a checkpoint; the result is bit-identical to an unbroken run.
        callback: called as ``callback(round, server_state)`` after every round (1-based round).
    """
    strategy = FGPR() if strategy is None else strategy
    if not isinstance(federation, Federation):
        raise TypeError(f"federation must be a fedgp.data.Federation, got {type(federation).__name__}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if checkpoint_every is not None and checkpoint_path is None:
        raise ValueError("checkpoint_every needs checkpoint_path")
    if eval_every is None:
        eval_every = 1 if federation.has_test else 0
    runner = make_engine(engine, spec, federation, seed, **(engine_options or {}))
    ctx = ServerContext(spec, federation.sizes, federation.weights, federation.ids, seed)

    if resume_from is not None:
        ckpt = load_checkpoint(resume_from)
        mismatch = [
            name
            for name, ours, theirs in [
                ("seed", seed, ckpt.seed),
                ("strategy", repr(strategy), ckpt.strategy),
                ("spec", spec.names, ckpt.spec),
            ]
            if ours != theirs
        ]
        if mismatch:
            raise ValueError(f"checkpoint {resume_from} was written with a different {', '.join(mismatch)}")
        start, server, history = ckpt.completed_rounds, ckpt.server_state, list(ckpt.history)
    else:
        start, server, history = 0, strategy.initialize(ctx, generator(seed, "init")), []

    def checkpoint(done: int) -> None:
        save_checkpoint(
            checkpoint_path,
            Checkpoint(done, server, history, seed, repr(strategy), spec.names, runner.name),
        )

    bar = tqdm(
        range(start, rounds),
        desc=type(strategy).__name__,
        initial=start,
        total=rounds,
        disable=None if progress is None else not progress,
        leave=False,
    )
    for rnd in bar:
        plan = strategy.configure(rnd, server, ctx, generator(seed, "configure", rnd))
        replies = _run_clients(strategy, runner, plan.participants, rnd, plan.payload)
        server, metrics = strategy.aggregate(rnd, server, plan, replies, ctx)
        row = {"round": rnd + 1, **metrics}
        if eval_every and ((rnd + 1) % eval_every == 0 or rnd + 1 == rounds):
            row.update(_summarise(evaluate_clients(strategy, server, runner, federation)))
        row.update(strategy.describe(server))
        history.append(row)
        if callback is not None:
            callback(rnd + 1, server)
        if "train_nll" in metrics:
            bar.set_postfix(train_nll=f"{metrics['train_nll']:.4f}", refresh=False)
        if checkpoint_every and ((rnd + 1) % checkpoint_every == 0 or rnd + 1 == rounds):
            checkpoint(rnd + 1)
    bar.close()
    return FitResult(spec, strategy, federation, server, pd.DataFrame(history), seed, runner)
