"""Model layer: GP specs from GPyTorch modules, hyper-parameter states, objective, posterior."""

from fedgp.models.experts import combine_experts
from fedgp.models.means import GaussianBumpMean
from fedgp.models.mle import MLEFit, fit_mle, maximize_likelihood, total_nll
from fedgp.models.multifidelity import AR1, NARGP, mle_with_restarts
from fedgp.models.multioutput import MultiOutputSpec, output_rows
from fedgp.models.objective import exact_settings, minibatch_nll
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.posterior import Prediction, condition
from fedgp.models.spec import ExactGPModel, GPSpec, ParamInfo, ZeroKernel
from fedgp.models.state import HyperState
from fedgp.models.variational import SparseVariationalGP, VariationalGPSpec

__all__ = [
    "GPSpec",
    "VariationalGPSpec",
    "MultiOutputSpec",
    "OwnFeaturesSpec",
    "output_rows",
    "SparseVariationalGP",
    "ParamInfo",
    "ZeroKernel",
    "GaussianBumpMean",
    "ExactGPModel",
    "HyperState",
    "exact_settings",
    "minibatch_nll",
    "Prediction",
    "condition",
    "combine_experts",
    "fit_mle",
    "maximize_likelihood",
    "MLEFit",
    "AR1",
    "NARGP",
    "mle_with_restarts",
    "total_nll",
]
