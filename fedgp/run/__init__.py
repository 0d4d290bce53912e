"""Running a federation: the round loop as an object, what happens around it, what it leaves.

* :func:`fit` — the front door: spec + federation + strategy + engine → a :class:`FitResult`;
* :class:`Run` — the same loop one round at a time (:mod:`~fedgp.run.loop`);
* :class:`Faults` — failure tolerance, simulated failures, attacks (:mod:`~fedgp.run.faults`);
* :class:`ClientDP` — a strategy with client-level differential privacy, and its accountant
  (:mod:`~fedgp.run.privacy`);
* callbacks (:mod:`~fedgp.run.callbacks`): :class:`Evaluate`, :class:`Progress`,
  :class:`Checkpointing`, your own :class:`Callback`;
* stopping rules (:mod:`~fedgp.run.stopping`): :class:`StateChange`, :class:`NLLPlateau`,
  :class:`AnyOf`;
* :class:`FitResult` and :func:`load` (:mod:`~fedgp.run.result`, :mod:`~fedgp.run.saved`);
* the plumbing: one exchange of a round (:mod:`~fedgp.run.exchange`), the data transforms' summary
  stage (:mod:`~fedgp.run.summary`), evaluation, checkpoint files and fingerprints, progress.
"""

from fedgp.run.callbacks import Callback, Checkpointing, Evaluate, Progress, RunView
from fedgp.run.faults import Faults
from fedgp.run.fitting import fit
from fedgp.run.loop import Run
from fedgp.run.privacy import ClientDP
from fedgp.run.result import FitResult
from fedgp.run.stopping import AnyOf, NLLPlateau, StateChange, StopRule

#: Read a result written by :meth:`FitResult.save` (``fedgp.load``).
load = FitResult.load

__all__ = [
    "fit",
    "Run",
    "FitResult",
    "load",
    "Faults",
    "ClientDP",
    "Callback",
    "RunView",
    "Evaluate",
    "Progress",
    "Checkpointing",
    "StopRule",
    "StateChange",
    "NLLPlateau",
    "AnyOf",
]
