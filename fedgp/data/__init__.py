"""Data layer, the ground floor: clients, federations, partitioners, owner tables, feature names.

Plain tensors, arrays and pandas: nothing here imports a model, so ``import fedgp.data`` loads
neither GPyTorch nor :mod:`fedgp.models`. Federations drawn from a model are in
:mod:`fedgp.synthetic`; the papers' real data sets (C-MAPSS, SARCOS) in :mod:`fedgp.datasets`.
"""

from fedgp.data.client import ClientData, Federation
from fedgp.data.outputs import long_form, outputs_client
from fedgp.data.owners import OwnerData, split_core
from fedgp.data.partition import (
    ContinuousPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    SizeSkewedPartitioner,
    skewed_sizes,
)

__all__ = [
    "ClientData",
    "Federation",
    "OwnerData",
    "split_core",
    "IidPartitioner",
    "SizeSkewedPartitioner",
    "ContinuousPartitioner",
    "NaturalIdPartitioner",
    "skewed_sizes",
    "long_form",
    "outputs_client",
]
