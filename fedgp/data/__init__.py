"""Data layer: clients, federations, partitioners, synthetic generators, real-data loaders."""

from fedgp.data.client import ClientData, Federation
from fedgp.data.partition import (
    ContinuousPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    SizeSkewedPartitioner,
    skewed_sizes,
)
from fedgp.data.synthetic import (
    GPDraws,
    MixedRegression,
    example1_theta,
    gp_federation,
    gp_spec,
    mixed_linear_regression,
    sin_personalisation,
)

__all__ = [
    "ClientData",
    "Federation",
    "IidPartitioner",
    "SizeSkewedPartitioner",
    "ContinuousPartitioner",
    "NaturalIdPartitioner",
    "skewed_sizes",
    "GPDraws",
    "MixedRegression",
    "example1_theta",
    "gp_federation",
    "gp_spec",
    "mixed_linear_regression",
    "sin_personalisation",
]
