"""Robust aggregation: how a server combines the participants' states when some may lie.

Every rule is a :class:`StateAggregator` and plugs into ``FGPR(aggregator=...)`` and the clustered
strategies' aggregation step (``clustered.ClusterAverage(aggregator=...)``,
``GlobalWeighted(aggregator=...)``). :class:`WeightedMean` in constrained units is FGPR's FedAvg;
the robust rules act on the participants' updates in raw space (see :mod:`.base`):

* :class:`CoordinateMedian`, :class:`TrimmedMean` — coordinate-wise (Yin et al. 2018);
* :class:`GeometricMedian` — Weiszfeld (RFA, Pillutla et al. 2022);
* :class:`Krum`, :class:`MultiKrum` — Blanchard et al. 2017;
* :class:`CenteredClipping` — Karimireddy, He & Jaggi 2021;
* :class:`ThresholdMean` — Threshold-Clustering with one centre (Werner et al.);
* :class:`Bucketing` — a pre-aggregator (Karimireddy, He & Jaggi 2022).

Every robust rule ignores the weights p_k (a Byzantine client can inflate its reported size);
each docstring states its breakdown bound, and the tests check it.
"""

from fedgp.aggregators.base import SPACES, StateAggregator, WeightedMean
from fedgp.aggregators.bucketing import Bucketing
from fedgp.aggregators.clipping import CenteredClipping
from fedgp.aggregators.coordinate import CoordinateMedian, TrimmedMean
from fedgp.aggregators.geometric import GeometricMedian
from fedgp.aggregators.krum import Krum, MultiKrum
from fedgp.aggregators.threshold import ThresholdMean

__all__ = [
    "StateAggregator",
    "SPACES",
    "WeightedMean",
    "CoordinateMedian",
    "TrimmedMean",
    "GeometricMedian",
    "Krum",
    "MultiKrum",
    "CenteredClipping",
    "ThresholdMean",
    "Bucketing",
]
