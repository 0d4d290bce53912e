"""Settings are validated where they are constructed, naming the class, the field and the default."""

import math

import pytest

from fedgp.aggregators import CenteredClipping
from fedgp.strategies import FGPR, IFCA, SGD, Adam, ClusteredGP, FederatedClustering, LocalTraining
from fedgp.strategies.clustered import (
    GradientDescent,
    GradientSolver,
    GradientStep,
    ProximalSolve,
    RandomInit,
)

BAD = [
    (lambda: FGPR(lr=-1), r"FGPR: lr must be a finite number > 0, got -1 \(default 0.3\)"),
    (lambda: FGPR(lr=0), r"FGPR: lr must be a finite number > 0, got 0"),
    (lambda: FGPR(lr=math.nan), r"FGPR: lr must be a finite number > 0, got nan"),
    (lambda: FGPR(local_steps=0), r"FGPR: local_steps must be an int >= 1, or None, got 0"),
    (lambda: FGPR(local_steps=2.5), r"FGPR: local_steps must be an int >= 1"),
    (lambda: FGPR(local_epochs=-1, local_steps=None), r"FGPR: local_epochs must be an int >= 1"),
    (lambda: FGPR(batch_size=1), r"FGPR: batch_size must be an int >= 2, or None for all local data, got 1"),
    (lambda: FGPR(batch_size=True), r"FGPR: batch_size must be an int >= 2"),
    (lambda: FGPR(clients_per_round=0), r"FGPR: clients_per_round must be an int >= 1, or None, got 0"),
    (lambda: FGPR(prox_mu=-0.1), r"FGPR: prox_mu must be a finite number >= 0, got -0.1"),
    (lambda: IFCA(lr=-0.5), r"IFCA: lr must be a finite number > 0"),
    (lambda: IFCA(num_clusters=0), r"IFCA: num_clusters must be an int >= 1, got 0"),
    (lambda: IFCA(restarts=0), r"IFCA: restarts must be an int >= 1"),
    (lambda: IFCA(gradient_batch_size=1), r"IFCA: gradient_batch_size must be an int >= 2"),
    (lambda: IFCA(batch_size=0), r"IFCA: batch_size must be an int >= 2"),
    (lambda: IFCA(init_scale=-1.0), r"IFCA: init_scale must be a finite number >= 0"),
    (lambda: IFCA(clients_per_round=0), r"IFCA: clients_per_round must be an int >= 1"),
    (lambda: ClusteredGP(num_clusters=0), r"ClusteredGP: num_clusters must be an int >= 1"),
    (lambda: ClusteredGP(clients_per_round=-2), r"ClusteredGP: clients_per_round must be an int >= 1"),
    (lambda: Adam(lr=0.0), r"Adam: lr must be a finite number > 0"),
    (lambda: Adam(eps=0.0), r"Adam: eps must be a finite number > 0"),
    (lambda: Adam(betas=(0.9, 1.0)), r"Adam: betas must be two numbers in \[0, 1\)"),
    (lambda: SGD(lr=-0.01), r"SGD: lr must be a finite number > 0"),
    (lambda: LocalTraining(prox_mu=-1.0), r"LocalTraining: prox_mu must be a finite number >= 0"),
    (lambda: GradientDescent(lr=0.0), r"GradientDescent: lr must be a finite number > 0"),
    (lambda: GradientDescent(steps=0), r"GradientDescent: steps must be an int >= 1"),
    (lambda: ProximalSolve(inner_lr=-1.0), r"ProximalSolve: inner_lr must be a finite number > 0"),
    (lambda: GradientSolver(batch_size=1), r"GradientSolver: batch_size must be an int >= 2"),
    (lambda: GradientStep(lr=-1.0), r"GradientStep: lr must be a finite number > 0"),
    (lambda: RandomInit(scale=-1.0), r"RandomInit: scale must be a finite number >= 0"),
    (lambda: FederatedClustering(lr=0), r"FederatedClustering: lr must be"),
    (lambda: CenteredClipping(tau=0), r"CenteredClipping: tau must be > 0"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_bad_settings_raise_naming_class_field_and_default(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_defaults_and_edges_are_accepted():
    FGPR(), IFCA(), Adam(betas=(0.0, 0.0)), FGPR(batch_size=None, clients_per_round=None, prox_mu=0.0)
    (
        FGPR(local_steps=None, local_epochs=1),
        IFCA(aggregation="gradient", gradient_batch_size=2, init_scale=0.0),
    )
