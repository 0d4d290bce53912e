"""One clustered federated GP: k cluster GPs, and the algorithms as ways to initialise, assign and aggregate.

A cluster is a GP component — its own mean, kernel and noise hyper-parameters. Mixed linear
regression is a linear mean with the zero kernel (a noise-only GP); a linear kernel adds
within-cluster variation (Bayesian linear regression per cluster); any GPyTorch kernel gives a
clustered FGPR. A client belongs to the component with the highest marginal likelihood of its own
data. The algorithms of Ghosh et al. (IFCA), Su, Xu & Yang (two-phase) and their baselines differ
only in four pluggable parts, one module each:

* **initialiser** (:mod:`.init`, :mod:`.moment_descent`) — :class:`RandomInit`, :class:`SpecInit`,
  :class:`GivenInit` (e.g. the true θ*: the oracle), :class:`OneShotInit` (k-means on local fits)
  and :class:`MomentDescentInit` (Phase 1, federated moment descent). Initialisers may need
  communication rounds of their own; they run first, inside ``fit``'s rounds.
* **assigner** (:mod:`.assign`) — :class:`HardAssigner` (argmin local NLL, or squared error),
  :class:`SoftAssigner` (responsibilities ∝ marginal likelihood), :class:`FixedAssigner`.
* **local solver** (:mod:`.solve`) — :class:`GradientDescent` (s full-batch steps: FedAvg),
  :class:`ProximalSolve` (FedProx), :class:`LocalTrainingSolver` (minibatch Adam/SGD as FGPR),
  :class:`GradientSolver` (one gradient, for IFCA's gradient averaging).
* **aggregator** (:mod:`.aggregate`) — :class:`GlobalWeighted` (Su–Xu–Yang: ``θ_j ← Σ_i (n_i/N)
  θ_{ij}`` over *all* clients, unchanged blocks included), :class:`ClusterAverage` (IFCA model
  averaging within each estimated cluster), :class:`GradientStep` (IFCA gradient averaging).

Named presets (:mod:`.presets`): :func:`fedavg` (k = 1), :func:`ifca`, :func:`oracle`,
:func:`one_shot`, :func:`two_phase`. :class:`~fedgp.strategies.IFCA` is also a configuration of
:class:`ClusteredGP` (:mod:`.model`).

For the noise-only linear model the assignment and the local solvers have closed forms, evaluated
on the client's own data — exact, and much faster than the generic GPyTorch path, which they match
to rounding error (tests check both). ``closed_form="never"`` forces the generic path;
``"always"`` refuses a spec without closed forms.
"""

# Every part's public names, re-exported (each module's __all__ is the one list of them).
from fedgp.strategies.clustered import aggregate, assign, init, model, moment_descent, presets, solve, state
from fedgp.strategies.clustered.aggregate import *  # noqa: F403
from fedgp.strategies.clustered.assign import *  # noqa: F403
from fedgp.strategies.clustered.init import *  # noqa: F403
from fedgp.strategies.clustered.model import *  # noqa: F403
from fedgp.strategies.clustered.moment_descent import *  # noqa: F403
from fedgp.strategies.clustered.presets import *  # noqa: F403
from fedgp.strategies.clustered.solve import *  # noqa: F403
from fedgp.strategies.clustered.state import *  # noqa: F403

__all__ = [
    *state.__all__,
    *model.__all__,
    *init.__all__,
    *moment_descent.__all__,
    *assign.__all__,
    *solve.__all__,
    *aggregate.__all__,
    *presets.__all__,
]
