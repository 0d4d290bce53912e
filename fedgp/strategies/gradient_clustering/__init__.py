"""Werner, He, Jordan, Jaggi & Karimireddy's personalised, Byzantine-robust clustering as GP strategies.

Each client keeps a personal GP state; gradients of the clients' per-point NLLs decide whom it
learns from. :class:`FederatedClustering` (Algorithm 2) runs Threshold-Clustering per client over
everyone's gradients at its state; :class:`MomentumClustering` (Algorithm 4) clusters the clients'
momenta around K warm-started centres; :class:`MyopicClustering` (Algorithm 1) is the straw man.
Any GPyTorch mean and kernel work; a linear mean with the zero kernel is the paper's linear
regression. Prediction conditions each client's own state on its own data.
"""

from fedgp.strategies.gradient_clustering import blocks, federated, momentum, personal, state
from fedgp.strategies.gradient_clustering.blocks import *  # noqa: F403
from fedgp.strategies.gradient_clustering.federated import *  # noqa: F403
from fedgp.strategies.gradient_clustering.momentum import *  # noqa: F403
from fedgp.strategies.gradient_clustering.personal import *  # noqa: F403
from fedgp.strategies.gradient_clustering.state import *  # noqa: F403

__all__ = [*federated.__all__, *momentum.__all__, *personal.__all__, *state.__all__, *blocks.__all__]
