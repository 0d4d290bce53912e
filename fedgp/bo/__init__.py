"""Federated Bayesian optimisation: K owners, each optimising its own black box, one federation.

* :class:`Owner` — an owner's objective, search box and evaluations (:mod:`~fedgp.bo.owner`);
* :class:`BOLoop` and :class:`BOResult` — the loop, one iteration at a time, and its history
  (:mod:`~fedgp.bo.loop`); callbacks :class:`BOProgress`, :class:`Budget` (:mod:`~fedgp.bo.callbacks`)
  and :class:`BOCheckpoint` (a stopped loop resumes where it was; :mod:`~fedgp.bo.checkpoint`);
* methods (:class:`Method`): :class:`FederatedBO` (a fedgp strategy learns the shared
  hyper-parameters, warm-started every iteration; owners propose on their personalised posteriors),
  :class:`LocalBO` (BoTorch's ``SingleTaskGP`` refitted per owner), :class:`FTS` (federated Thompson
  sampling on random Fourier features; :class:`FederatedFTS` learns its hyper-parameters in the
  federation), :class:`DPFTSDE` (its differentially private version with
  distributed exploration), :class:`RandomSearch`;
* :class:`Acquisition` — qLogEI, qUCB, Thompson sampling or your factory (:mod:`~fedgp.bo.acquisition`);
* :class:`FourierFeatures`, :class:`WeightPosterior` (:mod:`~fedgp.bo.features`) and
  :func:`shared_prior_owners` (:mod:`~fedgp.bo.synthetic`), a benchmark family;
  :func:`cmapss_tuning_owners` and :class:`KernelRidgeTuning` (:mod:`~fedgp.bo.tuning`), the real-data
  one: C-MAPSS engines tuning kernel ridge on their own data.

Needs the ``botorch`` extra.
"""

from fedgp.bo.acquisition import ACQUISITIONS, Acquisition, acquisition_seed
from fedgp.bo.callbacks import BOCallback, BOProgress, Budget
from fedgp.bo.checkpoint import BOCheckpoint
from fedgp.bo.dp_fts_de import DPFTSDE
from fedgp.bo.features import FourierFeatures, WeightPosterior
from fedgp.bo.federated import FederatedBO, WarmStart
from fedgp.bo.fts import FTS
from fedgp.bo.fts_federated import FederatedFTS
from fedgp.bo.local import LocalBO
from fedgp.bo.loop import BOLoop, BOResult
from fedgp.bo.method import Method
from fedgp.bo.owner import Owner
from fedgp.bo.random_search import RandomSearch
from fedgp.bo.synthetic import PriorDraw, shared_prior_owners
from fedgp.bo.tuning import KernelRidgeTuning, cmapss_tuning_owners

__all__ = [
    "Owner",
    "BOLoop",
    "BOResult",
    "BOCallback",
    "BOProgress",
    "Budget",
    "BOCheckpoint",
    "Method",
    "FederatedBO",
    "WarmStart",
    "LocalBO",
    "FTS",
    "FederatedFTS",
    "DPFTSDE",
    "RandomSearch",
    "Acquisition",
    "ACQUISITIONS",
    "acquisition_seed",
    "FourierFeatures",
    "WeightPosterior",
    "PriorDraw",
    "shared_prior_owners",
    "KernelRidgeTuning",
    "cmapss_tuning_owners",
]
