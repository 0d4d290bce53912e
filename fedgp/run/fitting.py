"""``fedgp.fit``: spec + federation + strategy + engine → a result that predicts per client."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fedgp import defaults
from fedgp.data.client import Federation
from fedgp.engines.base import Engine
from fedgp.engines.config import EngineConfig
from fedgp.models.spec import GPSpec
from fedgp.run.callbacks import Callback
from fedgp.run.faults import Faults
from fedgp.run.loop import Run
from fedgp.run.privacy import ClientDP
from fedgp.run.result import FitResult
from fedgp.run.stopping import StopRule
from fedgp.strategies.base import Strategy
from fedgp.transforms import Transforms

__all__ = ["fit"]


def fit(
    spec: GPSpec,
    federation: Federation | None,
    strategy: Strategy | ClientDP | None = None,
    rounds: int = defaults.ROUNDS,
    *,
    engine: str | EngineConfig | Engine = defaults.ENGINE,
    seed: int = defaults.SEED,
    transforms: Transforms | str | None = defaults.TRANSFORMS,
    faults: Faults | None = None,
    stop: StopRule | str | None = defaults.STOP,
    callbacks: Iterable[Callback | Callable] = (),
) -> FitResult:
    """Train ``strategy`` (default :class:`~fedgp.strategies.FGPR`) on ``federation``.

    Args:
        spec: the model: GPyTorch mean, kernel and likelihood (:class:`fedgp.GPSpec`).
        federation: the clients (:class:`fedgp.data.Federation`); ``None`` when ``engine`` is an
            :class:`~fedgp.engines.base.Engine` that hosts them (a Flower grid, say).
        strategy: the algorithm (:mod:`fedgp.strategies`), or one made private:
            ``fedgp.run.ClientDP(FGPR(), epsilon=..., delta=..., clip=...)`` — client-level
            differential privacy: clipped updates, Gaussian noise on their sum, Poisson sampling,
            ε spent in the history's ``epsilon`` column (dp-accounting). FGPR only; see the
            Privacy guide.
        rounds: communication rounds R (total, including rounds restored from a checkpoint); with a
            ``stop`` rule, the budget.
        engine: who runs the clients' side. ``"auto"`` (default): the batched engine where its tensor
            path reproduces GPyTorch for the spec, else the sequential one. A name (``"sequential"``:
            the reference, one GPyTorch model per client; ``"batched"``: all clients' steps as one
            tensor program, the same results to rounding, much faster for many clients;
            ``"ray"``; ``"flower"``) uses that engine's defaults; a config sets its options, e.g.
            ``fedgp.engines.Batched(device="cuda")`` or ``fedgp.engines.Ray(num_workers=4)``; an
            :class:`~fedgp.engines.base.Engine` instance is used as it is. An engine built here is
            closed when the run ends or fails: a Ray that ``fit`` had to start stops (unless
            ``Ray(keep_alive=True)``); the result still predicts and evaluates.
        seed: master seed; every random draw derives from it, per round and client.
        transforms: ``"auto"`` (default), ``None`` (the data as they are) or
            :class:`fedgp.transforms.Transforms` (``outcome=Standardize(...)``,
            ``inputs=Normalize(...)``): see there. ``result.transforms`` says what was applied;
            predictions and metrics are always in the original units.
        faults: :class:`fedgp.run.Faults` — ``min_replies`` (below it a round raises
            :class:`~fedgp.errors.RoundFailedError`), simulated client failures, an attack.
        stop: a stopping rule (:mod:`fedgp.run.stopping`: ``StateChange(tol, window)``,
            ``NLLPlateau(patience, min_delta, state_tol)``, ``AnyOf(...)``), ``"auto"`` (either of
            the two with their defaults), or ``None`` (default: every one of ``rounds`` rounds, as
            in the papers' protocols). With a rule the run ends at the first round where it holds;
            ``history.attrs["stop_reason"]`` says why the run ended, ``history.attrs["stopped"]``
            whether it converged and ``history.attrs["diverging"]`` whether its training objective
            rose (with a :class:`~fedgp.errors.DivergenceWarning`): a rule that holds after the
            training NLL rose above its best is never convergence, whatever the optimiser; a run
            that ends at the round budget warns with :class:`~fedgp.errors.ConvergenceWarning`.
            The rule's statistics are the history's ``stop_*`` columns.
        callbacks: what else happens around the rounds (:mod:`fedgp.run.callbacks`):
            :class:`~fedgp.run.Checkpointing` (write and resume checkpoints),
            :class:`~fedgp.run.Evaluate` (per-client test metrics; default every round when clients
            have test splits), :class:`~fedgp.run.Progress` (default: a bar on a terminal), your own
            :class:`~fedgp.run.Callback` or a function ``f(run)`` called after every round.

    Returns:
        A :class:`~fedgp.run.FitResult`: the learned state, the history (one row per round), and
        personalised prediction per client.
    """
    run = Run(
        spec, federation, strategy, rounds, engine=engine, seed=seed, transforms=transforms, faults=faults,
        stop=stop, callbacks=callbacks,
    )  # fmt: skip
    try:
        with run.engine.thread_setting():  # the batched engine: torch on one thread for the whole loop
            run.start()
            while not run.done:
                run.round()
            return run.finish()
    finally:
        run.close()  # an engine fit built, also when the run fails (a Ray it started stops)
