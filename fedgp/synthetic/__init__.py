"""Synthetic federations with their truth kept: draws from GP priors and mixtures of models, the
Werner et al. settings, and the multi-fidelity test functions.

A GP draw needs a model (:class:`fedgp.models.GPSpec`), so this folder stands above
:mod:`fedgp.models`; the clients it hands back are :mod:`fedgp.data`'s.
"""

from fedgp.synthetic.draws import (
    GPDraws,
    MixedRegression,
    example1_theta,
    gp_federation,
    gp_spec,
    mixed_linear_regression,
    sin_personalisation,
)
from fedgp.synthetic.mixture import (
    SU_XU_YANG_SETTINGS,
    GPMixture,
    gaussian_mixed_regression,
    gp_mixture_federation,
    su_xu_yang_setting,
)
from fedgp.synthetic.multifidelity import (
    MF_FUNCTIONS,
    MultiFidelityFunction,
    MultiFidelityProblem,
    multifidelity_federation,
)
from fedgp.synthetic.own_features import OWN_CORE, own_feature_owners
from fedgp.synthetic.werner import BumpClusters, WernerDX, bump_federation, dx_federation

__all__ = [
    "OWN_CORE",
    "own_feature_owners",
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
    "MultiFidelityFunction",
    "MultiFidelityProblem",
    "MF_FUNCTIONS",
    "multifidelity_federation",
    "WernerDX",
    "dx_federation",
    "BumpClusters",
    "bump_federation",
]
