"""Experiments: paper reproductions and studies, as functions returning pandas tables."""

from fedgp.experiments.demo import convergence_study, personalisation_demo
from fedgp.experiments.settings import quick_mode, scaled

__all__ = ["personalisation_demo", "convergence_study", "quick_mode", "scaled"]
