"""GP reference points for federated GP regression: each client alone, and all data pooled.

* :class:`LocalGP` — every client fits its own exact GP by type-II maximum likelihood on its own
  data and predicts from it: no federation at all. What FGPR adds is the difference between this
  and FGPR's shared prior conditioned on the same data.
* :class:`CentralGP` — the clients' training data pooled in one place (in original units) and one
  exact GP conditioned on all of it: the ceiling for the same model when privacy is no concern.

Both fit by L-BFGS (:func:`fedgp.models.maximize_likelihood`). L-BFGS's line search can step into a
region where the covariance is NaN (seen on SARCOS, whose torques are almost noise-free); such a
fit is then redone with Adam from the same start and counted in ``fallbacks_``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.baselines._common import check_federation, client_position
from fedgp.data.client import ClientData, Federation
from fedgp.errors import NotFittedError
from fedgp.models.mle import MLEFit, adam, lbfgs, maximize_likelihood
from fedgp.models.posterior import Prediction, condition
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator

__all__ = ["LocalGP", "CentralGP", "client_metrics"]


def _fit(spec: GPSpec, datasets: Sequence[tuple[torch.Tensor, torch.Tensor]], max_iter: int) -> MLEFit:
    """L-BFGS from the spec's initial state; if it fails, full-batch Adam from the same start
    (``fit.attempt == 1``: a fallback)."""
    start = spec.to_raw(spec.initial_state())
    attempts = [(start, partial(lbfgs, max_iter=max_iter)), (start, partial(adam, steps=300, lr=0.05))]
    return maximize_likelihood(spec, datasets, attempts, first_success=True)


def client_metrics(pred: Prediction, y: torch.Tensor) -> dict[str, float]:
    """Test RMSE, NLL and 95 % coverage of one client's prediction against its targets ``y``."""
    return {"rmse": pred.rmse(y), "nll": pred.nll(y), "coverage95": pred.coverage(y)}


@dataclass
class LocalGP:
    """One exact GP per client, hyper-parameters by type-II ML on that client's data only.

    ``fit(federation)`` fits every client; ``fit_client(client)`` fits one (e.g. a new C-MAPSS
    engine's observed half); ``predict(X, client)`` conditions a client on its own data (a new
    ``ClientData`` is fitted on the fly). ``max_iter`` bounds L-BFGS iterations per client.
    """

    spec: GPSpec
    max_iter: int = 100
    states_: list[HyperState] | None = field(default=None, init=False, repr=False)
    federation_: Federation | None = field(default=None, init=False, repr=False)
    fallbacks_: int = field(default=0, init=False)

    def fit_client(self, client: ClientData) -> HyperState:
        """Maximise one client's own marginal likelihood; the learned state."""
        fit = _fit(self.spec, [(client.X, client.y)], self.max_iter)
        self.fallbacks_ += int(fit.attempt > 0)
        return fit.state

    def fit(self, federation: Federation) -> LocalGP:
        """Fit an exact GP on each client's data alone; returns ``self``."""
        check_federation(federation, "LocalGP")
        self.fallbacks_ = 0
        self.federation_ = federation
        self.states_ = [self.fit_client(c) for c in federation]
        return self

    def predict(self, X: Any, client: int | ClientData | Any, state: HyperState | None = None) -> Prediction:
        """``client`` conditioned on its own data under its own hyper-parameters (or ``state``).

        ``client``: a position or an id in the fitted federation, one of its ``ClientData``, or a new
        ``ClientData`` (fitted on its own data now, also before any ``fit``: e.g. a new C-MAPSS
        engine's observed half)."""
        position = client_position(self.federation_, client, "LocalGP")
        if position is None:
            data = client
            state = self.fit_client(data) if state is None else state
        else:
            data = self.federation_[position]
            state = self.states_[position] if state is None else state
        X = torch.as_tensor(X, dtype=self.spec.dtype)
        return condition(self.spec, state, data.X, data.y, X, data.id)

    def evaluate(self, federation: Federation) -> pd.DataFrame:
        """Per-client test RMSE, NLL and 95% coverage of the clients with a test split (fits first
        if needed)."""
        if self.states_ is None or len(self.states_) != len(federation):
            self.fit(federation)
        rows = []
        for c, state in zip(federation, self.states_):
            if not c.has_test:
                continue
            pred = condition(self.spec, state, c.X, c.y, c.X_test, c.id)
            rows.append({"client": c.id, "n_test": len(c.y_test), **client_metrics(pred, c.y_test)})
        return pd.DataFrame(rows)


@dataclass
class CentralGP:
    """All clients' training rows pooled; one exact GP fitted and conditioned on all of them.

    Targets are pooled in original units (``y * y_std + y_mean`` from each client's metadata, when
    present) and standardised once; predictions are mapped back to each client's own scale so
    they are scored exactly like the federated methods. Hyper-parameters are fitted by ML on a
    random ``hyper_subset`` of the pooled rows (exact ML on all rows is cubic in their number);
    prediction conditions on every pooled row.
    """

    spec: GPSpec
    hyper_subset: int | None = 1000
    max_iter: int = 100
    seed: int = 0
    state_: HyperState | None = field(default=None, init=False, repr=False)
    federation_: Federation | None = field(default=None, init=False, repr=False)
    fell_back_: bool = field(default=False, init=False)

    @staticmethod
    def _scale(client: ClientData) -> tuple[float, float]:
        return float(client.metadata.get("y_mean", 0.0)), float(client.metadata.get("y_std", 1.0))

    def fit(self, federation: Federation) -> CentralGP:
        """Fit one exact GP on every client's data pooled (the reference a federation cannot beat);
        returns ``self``."""
        check_federation(federation, "CentralGP")
        self.federation_ = federation
        X = torch.cat([c.X for c in federation])
        y = torch.cat([c.y * self._scale(c)[1] + self._scale(c)[0] for c in federation])
        self.mean_, self.std_ = float(y.mean()), float(y.std(unbiased=False))
        self.X_, self.y_ = X, (y - self.mean_) / self.std_
        rows = np.arange(len(X))
        if self.hyper_subset is not None and self.hyper_subset < len(X):
            rows = np.sort(
                generator(self.seed, "central-subset").choice(len(X), self.hyper_subset, replace=False)
            )
        idx = torch.from_numpy(rows)
        fit = _fit(self.spec, [(self.X_[idx], self.y_[idx])], self.max_iter)
        self.state_, self.fell_back_ = fit.state, fit.attempt > 0
        return self

    def predict_pooled(self, X: torch.Tensor) -> Prediction:
        """Posterior at ``X`` on the pooled standardised scale."""
        if self.state_ is None:
            raise NotFittedError("CentralGP is not fitted yet; call fit(federation)")
        return condition(self.spec, self.state_, self.X_, self.y_, torch.as_tensor(X, dtype=self.spec.dtype))

    def predict(self, X: Any, client: int | ClientData | Any) -> Prediction:
        """The pooled posterior at ``X`` on ``client``'s scale (its ``y_mean``/``y_std``): a position or
        an id in the fitted federation, or any ``ClientData``."""
        position = client_position(self.federation_, client, "CentralGP")
        data = client if position is None else self.federation_[position]
        return self._to_client(self.predict_pooled(X), data)

    def _to_client(self, pred: Prediction, client: ClientData) -> Prediction:
        m, s = self._scale(client)
        a = self.std_ / s
        return Prediction(
            (pred.mean * self.std_ + self.mean_ - m) / s, pred.variance_f * a**2, pred.variance_y * a**2
        )

    def evaluate(self, federation: Federation) -> pd.DataFrame:
        """Per-client test metrics; all clients' test inputs are predicted in one conditioning."""
        if self.state_ is None:
            self.fit(federation)
        scored = [c for c in federation if c.has_test]
        pooled = self.predict_pooled(torch.cat([c.X_test for c in scored]))
        rows, start = [], 0
        for c in scored:
            stop = start + len(c.y_test)
            part = Prediction(
                pooled.mean[start:stop], pooled.variance_f[start:stop], pooled.variance_y[start:stop]
            )
            pred = self._to_client(part, c)
            rows.append({"client": c.id, "n_test": len(c.y_test), **client_metrics(pred, c.y_test)})
            start = stop
        return pd.DataFrame(rows)
