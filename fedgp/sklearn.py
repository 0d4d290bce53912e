"""A scikit-learn regressor over :func:`fedgp.fit`: ``fit(X, y, groups=owner)``, ``predict(X, groups=...)``.

The rows of ``X`` and ``y`` are pooled here only for convenience: ``groups`` says which owner holds
each row, every owner is one client of a :class:`~fedgp.data.Federation`, and training runs the
federated strategy (FGPR by default) exactly as :func:`fedgp.fit` does on that federation (the
tests check the predictions agree to 1e-10). A row is predicted by its owner's posterior: the
shared prior conditioned on that owner's training rows only.

Conventions (scikit-learn's): the constructor stores its parameters and checks nothing;
``fit`` learns ``result_`` (the :class:`~fedgp.FitResult`), ``groups_`` (the owners, in order of
first appearance), ``history_``, ``n_features_in_`` and, for a DataFrame, ``feature_names_in_``
(which the federation and ``result_.feature_names`` record too);
``score`` is R² (of the personalised predictions, with the same ``groups``); ``get_params``,
``set_params`` and ``clone`` work. With scikit-learn's metadata routing enabled,
``set_fit_request(groups=True)`` routes ``groups`` through pipelines and ``cross_validate``.

Choices where scikit-learn has no convention:

* ``groups=None`` at ``fit``: all rows belong to one owner (a single client, so FGPR's rounds
  train one GP on all the rows). At ``predict``, ``groups=None`` means that owner when the
  model was fitted on one; with several owners it is a ``ValueError`` (a row's owner decides its
  prediction, so it cannot be guessed).
* ``predict`` given a DataFrame matches its columns to ``feature_names_in_`` by name: columns in
  another order are put back in the fitted order (where scikit-learn's own estimators refuse a new
  order), and missing or extra columns are a ``ValueError`` naming them. An unnamed array is read
  in the fitted order.
* An owner at ``predict`` that was not seen at ``fit`` has no training rows, so no personalised
  prediction exists for it. ``unknown_groups="warn"`` (default) gives it the cold-start prediction
  fedgp gives a new client without data (the learned prior predictive; for clustered strategies,
  the cluster with the most training points) and warns (:class:`~fedgp.errors.FallbackWarning`),
  naming the owners: a label that differs from fit's (``"A"`` for ``"a"``) would otherwise be
  predicted from the prior without a word. Choosing the fallback explicitly is the informed choice
  and stays quiet: ``"prior"`` (the same prediction), ``"rbcm"``, ``"bcm"``, ``"gpoe"`` or ``"poe"``
  (every fitted owner's posterior combined by that rule, ``FitResult.posterior(X, combine=...)``);
  ``"error"`` is a ``ValueError`` naming them.
* ``predict(..., return_std=True)`` returns the standard deviation of a new observation
  (the latent function's variance plus the learned noise), as scikit-learn's
  ``GaussianProcessRegressor`` does with a ``WhiteKernel``; the latent one is
  ``result_.posterior(X, client).variance_f``.
* An owner needs at least 2 rows, and an owner's targets must not all be equal (its marginal
  likelihood would carry no information): both are ``ValueError`` naming the owner.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from fedgp.errors import FallbackWarning, FedGPWarning, InputError, missing_extra

try:
    from sklearn.base import BaseEstimator, RegressorMixin
    from sklearn.metrics import r2_score
    from sklearn.utils.validation import check_consistent_length, check_is_fitted, validate_data
except ModuleNotFoundError as err:  # one line naming the extra, in every door
    raise missing_extra("sklearn", "fedgp.sklearn", err.name) from err

from fedgp import defaults
from fedgp.data.client import MIN_TRAINING_POINTS, ClientData, Federation
from fedgp.data.names import frame_names, order_of
from fedgp.data.table import rows_by_owner
from fedgp.models.experts import RULES
from fedgp.presets import make_spec, make_strategy
from fedgp.run import ClientDP, Progress, fit

__all__ = ["FederatedGPRegressor"]

#: The estimator's stopping default (:mod:`fedgp.defaults`): until converged, within ``rounds``.
_STOP = defaults.value("stop", "sklearn")


class FederatedGPRegressor(RegressorMixin, BaseEstimator):
    """Federated GP regression with one client per owner, as a scikit-learn regressor.

    Every default is fedgp's (:mod:`fedgp.defaults`, the same in every door), except ``stop``:
    like scikit-learn's iterative estimators, it trains until converged within its budget.

    Parameters
    ----------
    kernel : str or gpytorch.kernels.Kernel, default "rbf"
        ``"rbf"``, ``"matern12"``, ``"matern32"`` or ``"matern52"`` (inside a ``ScaleKernel``), or
        any GPyTorch kernel (copied, never changed).
    mean : str or gpytorch.means.Mean, default "zero"
        ``"zero"``, ``"constant"``, ``"linear"`` or any GPyTorch mean.
    ard : bool, default True
        One lengthscale per feature for a kernel given by name.
    strategy : str, fedgp.strategies.Strategy or fedgp.run.ClientDP, default "fgpr"
        ``"fgpr"``, ``"ifca"``, a strategy instance (e.g. ``FGPR(lr=0.1)``) or one made private
        (``ClientDP(FGPR(), epsilon=4.0)``: client-level differential privacy, as ``fedgp.fit``).
    rounds : int, default 100
        Communication rounds (the budget when ``stop`` is given).
    engine : str or fedgp.engines config, default "auto"
        ``fedgp.fit``'s engine (e.g. ``fedgp.engines.Batched(device="cuda")``).
    seed : int, default 0
        Master seed of every random draw.
    stop : None, "auto" or a fedgp.run stopping rule, default "auto"
        ``fedgp.fit``'s ``stop``: by default the run ends where training has converged, with a
        ``fedgp.ConvergenceWarning`` when ``rounds`` runs out first (as scikit-learn's estimators stop
        at ``tol`` within ``max_iter``); ``None`` runs every round.
    transforms : "auto", None or fedgp.transforms.Transforms, default "auto"
        ``fedgp.fit``'s data transforms (federated standardisation of y, inputs to the unit cube);
        predictions are in the original units either way.
    faults : fedgp.run.Faults or None, default None
        ``fedgp.fit``'s failure tolerance and simulated faults.
    unknown_groups : {"warn", "prior", "rbcm", "bcm", "gpoe", "poe", "error"}, default "warn"
        What ``predict`` does for an owner not seen at ``fit``: ``"warn"`` the prior with a
        ``FallbackWarning``, the others as chosen, quietly (see the module docstring).
    callbacks : tuple, default ()
        ``fedgp.fit``'s callbacks; without a ``fedgp.run.Progress`` among them, none is shown.
    """

    def __init__(
        self,
        kernel: Any = defaults.KERNEL,
        mean: Any = defaults.MEAN,
        ard: bool = defaults.ARD,
        strategy: Any = defaults.STRATEGY,
        rounds: int = defaults.ROUNDS,
        engine: str = defaults.ENGINE,
        seed: int = defaults.SEED,
        stop: Any = _STOP,
        transforms: Any = defaults.TRANSFORMS,
        faults: Any = None,
        unknown_groups: str = "warn",
        callbacks: tuple = (),
    ) -> None:
        self.kernel = kernel
        self.mean = mean
        self.ard = ard
        self.strategy = strategy
        self.rounds = rounds
        self.engine = engine
        self.seed = seed
        self.stop = stop
        self.transforms = transforms
        self.faults = faults
        self.unknown_groups = unknown_groups
        self.callbacks = callbacks

    # With metadata routing on, fit, predict and score ask for ``groups`` by default: routing
    # them (cross_val_score(..., params={"groups": owners})) needs no set_*_request call.
    __metadata_request__fit = {"groups": True}
    __metadata_request__predict = {"groups": True}
    __metadata_request__score = {"groups": True}

    def fit(self, X: Any, y: Any, groups: Any = None) -> FederatedGPRegressor:
        """Train on the owners' rows: ``groups[i]`` is the owner of row ``i`` (``None``: one owner,
        with a warning: inside scikit-learn's cross-validation that is usually ``groups`` that went
        to the splitter only)."""
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True, ensure_min_samples=2)
        if groups is None:
            warnings.warn(
                "FederatedGPRegressor.fit(groups=None): every row is one owner, so this fits one "
                "centralised GP, not a federation. In cross_val_score, GridSearchCV or a pipeline, "
                "scikit-learn gives groups only to the splitter unless metadata routing is on: "
                "sklearn.set_config(enable_metadata_routing=True), then params={'groups': owners}. "
                "Pass groups=np.zeros(len(y)) to mean one owner",
                FedGPWarning,
                stacklevel=2,
            )
            groups = np.zeros(len(y), dtype=np.int64)
        check_consistent_length(X, groups)
        owners = _owners(groups)
        for owner, rows in owners.items():
            if len(rows) < MIN_TRAINING_POINTS:
                raise InputError(
                    f"groups: owner {owner!r} has {len(rows)} row (row {int(rows[0])}); training needs "
                    f"at least {MIN_TRAINING_POINTS} per owner. Leave it out of fit; predict gives it the "
                    "shared prior (unknown_groups='prior')"
                )
        names = getattr(self, "feature_names_in_", None)  # validate_data's, for a DataFrame
        names = None if names is None else [str(n) for n in names]
        federation = Federation.from_partition(
            X, y, list(owners.values()), ids=list(owners), feature_names=names
        )
        callbacks = list(self.callbacks)
        if not any(isinstance(c, Progress) for c in callbacks):
            callbacks.append(Progress(False))  # an estimator inside a search stays quiet unless asked
        self.result_ = fit(
            make_spec(self.kernel, self.mean, d=X.shape[1], ard=self.ard),
            federation,
            self.strategy if isinstance(self.strategy, ClientDP) else make_strategy(self.strategy),
            rounds=self.rounds,
            engine=self.engine,
            seed=self.seed,
            transforms=self.transforms,
            faults=self.faults,
            stop=self.stop,
            callbacks=callbacks,
        )
        self.groups_ = np.array(list(owners), dtype=object)
        self.history_ = self.result_.history
        return self

    def predict(
        self, X: Any, groups: Any = None, return_std: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Each row's prediction from its owner's posterior: the mean, and with ``return_std`` the
        standard deviation of a new observation."""
        check_is_fitted(self)
        X = self._in_fitted_order(X)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        if self.unknown_groups not in ("warn", "prior", "error", *RULES):
            raise InputError(
                f"unknown_groups must be 'warn', 'prior', 'error' or a combine rule ({', '.join(RULES)}), "
                f"got {self.unknown_groups!r}"
            )
        if groups is None:
            if len(self.groups_) != 1:
                raise InputError(
                    f"groups: the model was fitted on {len(self.groups_)} owners, so predict needs each "
                    "row's owner (groups=...); an owner not seen in fit gets the shared prior"
                )
            groups = np.full(len(X), self.groups_[0], dtype=object)
        check_consistent_length(X, groups)
        known = {owner: position for position, owner in enumerate(self.groups_)}
        asked = _owners(groups)
        unknown = [owner for owner in asked if owner not in known]
        if unknown and self.unknown_groups in ("warn", "error"):
            self._unknown(unknown, {owner: len(rows) for owner, rows in asked.items()})
        mean, std = np.empty(len(X)), np.empty(len(X))
        for owner, rows in asked.items():
            if owner in known:
                pred = self.result_.posterior(X[rows], known[owner])
            elif self.unknown_groups in RULES:  # every fitted owner's posterior, combined
                pred = self.result_.posterior(X[rows], combine=self.unknown_groups)
            else:  # "prior" or "warn": a new owner without data, fedgp's cold start
                cold = ClientData(np.empty((0, X.shape[1])), np.empty(0), id=owner)
                pred = self.result_.posterior(X[rows], cold)
            mean[rows] = pred.mean.numpy()
            std[rows] = pred.variance_y.sqrt().numpy()
        return (mean, std) if return_std else mean

    def _in_fitted_order(self, X: Any) -> Any:
        """A DataFrame's columns in ``feature_names_in_``'s order, matched by name (missing or extra
        ones refused, naming them); anything else as it is, for ``validate_data`` to check."""
        fitted = getattr(self, "feature_names_in_", None)
        given = frame_names(X, "FederatedGPRegressor.predict") if fitted is not None else None
        if given is None:
            return X
        order = order_of(given, [str(n) for n in fitted], "FederatedGPRegressor.predict")
        return X if order is None else X.iloc[:, order]

    def _unknown(self, owners: list, rows: dict) -> None:
        """Warn (``"warn"``) or refuse (``"error"``) owners not seen at fit, naming them."""
        seen = f"{', '.join(map(repr, self.groups_[:10]))}{', ...' if len(self.groups_) > 10 else ''}"
        named = ", ".join(f"{o!r} ({rows[o]} row{'s' if rows[o] != 1 else ''})" for o in owners[:10])
        named += f" and {len(owners) - 10} more" if len(owners) > 10 else ""
        which = "owner" if len(owners) == 1 else "owners"
        if self.unknown_groups == "error":
            raise InputError(
                f"groups: {which} {named} not seen in fit (owners: {seen}). Check the labels (they are "
                "matched exactly: 'A' is not 'a'), or choose unknown_groups='prior' or a combine rule "
                "('rbcm', 'bcm', 'gpoe', 'poe') to predict for owners without training rows"
            )
        warnings.warn(
            f"FederatedGPRegressor.predict: {which} {named} not seen in fit (owners: {seen}) got the "
            "shared prior, not a personalised prediction. Check the labels (they are matched exactly: 'A' "
            "is not 'a'); to predict for owners without training rows, choose it explicitly: "
            "unknown_groups='prior' (this prediction, without this warning), a combine rule ('rbcm', "
            "'bcm', 'gpoe', 'poe': every fitted owner's posterior combined) or 'error'",
            FallbackWarning,
            stacklevel=3,
        )

    def score(self, X: Any, y: Any, sample_weight: Any = None, groups: Any = None) -> float:
        """R² of the personalised predictions ``predict(X, groups)``."""
        return float(r2_score(y, self.predict(X, groups=groups), sample_weight=sample_weight))


def _owners(groups: Any) -> dict[Any, np.ndarray]:
    """Rows per owner label, with the first missing label named (``rows_by_owner``'s error)."""
    try:
        return rows_by_owner(groups)
    except ValueError as err:
        raise InputError(f"groups: {err}") from None
