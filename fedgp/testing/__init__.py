"""Contracts any engine, strategy or aggregator must keep, as pytest classes to subclass.

In the spirit of ``gpytorch.test`` and ``sklearn.utils.estimator_checks``: fedgp's own engines,
strategies and aggregators are tested by subclassing these, and so can yours.

* :class:`EngineContract` — the same replies and states as the sequential engine, failures
  reported and never raised, summed fields only as sums, only records across the boundary.
* :class:`StrategyContract` — records only, determinism, the declared reply table, a client never
  sees another client's rows.
* :class:`AggregatorContract` — permutation invariance, agreement with its closed form, the
  breakdown bound it states.

Needs pytest (``pip install pytest``).
"""

from fedgp.testing.aggregator import AggregatorContract
from fedgp.testing.engine import EngineContract
from fedgp.testing.strategy import StrategyContract

__all__ = ["EngineContract", "StrategyContract", "AggregatorContract"]
