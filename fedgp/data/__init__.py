"""Data layer: clients, federations, partitioners, synthetic generators, real-data loaders."""

from fedgp.data.client import ClientData, Federation
from fedgp.data.cmapss import CMAPSS, load_cmapss
from fedgp.data.mixture import (
    SU_XU_YANG_SETTINGS,
    GPMixture,
    gaussian_mixed_regression,
    gp_mixture_federation,
    su_xu_yang_setting,
)
from fedgp.data.multifidelity import (
    MF_FUNCTIONS,
    MultiFidelityFunction,
    MultiFidelityProblem,
    multifidelity_federation,
)
from fedgp.data.partition import (
    ContinuousPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    SizeSkewedPartitioner,
    skewed_sizes,
)
from fedgp.data.registry import data_root
from fedgp.data.sarcos import SARCOS, load_sarcos
from fedgp.data.synthetic import (
    GPDraws,
    MixedRegression,
    example1_theta,
    gp_federation,
    gp_spec,
    mixed_linear_regression,
    sin_personalisation,
)
from fedgp.data.werner import BumpClusters, WernerDX, bump_federation, dx_federation

__all__ = [
    "WernerDX",
    "dx_federation",
    "BumpClusters",
    "bump_federation",
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
    "gaussian_mixed_regression",
    "su_xu_yang_setting",
    "SU_XU_YANG_SETTINGS",
    "GPMixture",
    "gp_mixture_federation",
    "load_cmapss",
    "CMAPSS",
    "load_sarcos",
    "SARCOS",
    "data_root",
    "MultiFidelityFunction",
    "MultiFidelityProblem",
    "MF_FUNCTIONS",
    "multifidelity_federation",
]
