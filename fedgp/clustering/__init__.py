"""Clustering primitives over vectors: Threshold-Clustering (Werner et al., Algorithm 3) and k-means.

Pure tensor functions with no federated knowledge; the robust aggregators
(:mod:`fedgp.aggregators`) and the gradient-clustering strategies
(:mod:`fedgp.strategies.gradient_clustering`) are built on them.
"""

from fedgp.clustering.kmeans import assign, kmeans, kmeans_plus_plus, lloyd
from fedgp.clustering.threshold import (
    FixedRadius,
    KMeansRadius,
    QuantileRadius,
    Radius,
    ThresholdResult,
    threshold_clustering,
)

__all__ = [
    "threshold_clustering",
    "ThresholdResult",
    "Radius",
    "FixedRadius",
    "QuantileRadius",
    "KMeansRadius",
    "kmeans",
    "kmeans_plus_plus",
    "lloyd",
    "assign",
]
