"""Attacks on federated rounds: ``fedgp.fit(..., attack=fedgp.attacks.BitFlip(fraction=0.2))``.

Reply attacks (:mod:`.replies`: ``Gaussian``, ``BitFlip``, ``SignFlip``, ``IPM``, ``ALIE``,
``Mimic``, ``EdgeOfBall``) forge the attacked clients' replies on the server side, from the
honest ones; the data attack :class:`LabelFlip` makes them train on ``−y``. Where each acts, and
what happens to summed fields, is in :mod:`.base`.
"""

from fedgp.attacks.base import Attack, BoundAttack
from fedgp.attacks.labels import LabelFlip
from fedgp.attacks.replies import ALIE, IPM, BitFlip, EdgeOfBall, Gaussian, Mimic, SignFlip

__all__ = [
    "Attack",
    "BoundAttack",
    "Gaussian",
    "BitFlip",
    "SignFlip",
    "IPM",
    "ALIE",
    "Mimic",
    "EdgeOfBall",
    "LabelFlip",
]
