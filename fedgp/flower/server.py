"""The Flower ``ServerApp`` of fedgp: ``fedgp.fit`` over the run's ``Grid``.

``server_app(build)`` returns a ``ServerApp`` whose ``main`` asks ``build(context)`` for the model
specification, the strategy and ``fit``'s other arguments (read them from ``context.run_config``),
runs ``fedgp.fit`` with a :class:`~fedgp.flower.grid_engine.GridEngine` — fedgp's own round loop,
seeded sampling and failure-tolerant rounds, Flower only carrying the messages — and writes the
result to ``out_dir`` if given: ``flwr run`` reports success even when a ServerApp fails, so
callers should check for these files, not for an exit code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedgp.flower.grid_engine import GridEngine
from fedgp.models.spec import GPSpec
from fedgp.run import FitResult, Progress, fit
from fedgp.strategies.base import Strategy

__all__ = ["server_app", "write_outputs"]

Build = Callable[[Context], tuple[GPSpec, Strategy, dict[str, Any]]]


def write_outputs(result: FitResult, folder: str | Path) -> None:
    """``model.fedgp`` (:meth:`FitResult.save`: what ``fedgp.load`` reads), ``state.json`` (the
    learned state, constrained values as nested lists), ``history.csv``, ``failures.csv`` and
    ``evaluate.csv`` (per-client test metrics, if clients have test data). With personal
    hyper-parameters (``FGPR(personal=...)``) no ``model.fedgp``: each owner's own values stay on
    its node, and a file of the server's state would predict every owner under the initial ones;
    ``evaluate.csv`` has each owner scored by its node under its own."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not result.strategy.keeps_client_memory:
        result.save(folder / "model.fedgp")
    state = {k: v.tolist() for k, v in result.state.items()}
    (folder / "state.json").write_text(json.dumps(state, indent=1))
    result.history.to_csv(folder / "history.csv", index=False)
    result.failures.to_csv(folder / "failures.csv", index=False)
    if bool((result.roster.n_test > 0).any()):
        result.evaluate().to_csv(folder / "evaluate.csv", index=False)


def server_app(build: Build) -> ServerApp:
    """A ``ServerApp`` running ``fedgp.fit``; ``build(context)`` gives ``(spec, strategy, options)``
    where options are ``fit``'s keyword arguments plus ``timeout`` (seconds per round) and
    ``out_dir`` (where the result goes, and ``progress.txt``, the last finished round, while it
    runs)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        spec, strategy, options = build(context)
        options = dict(options)
        out_dir, timeout = options.pop("out_dir", None), options.pop("timeout", None)
        callbacks = [*options.pop("callbacks", ()), Progress(False)]
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            callbacks.append(lambda run: (Path(out_dir) / "progress.txt").write_text(str(run.completed)))
        engine = GridEngine(grid, spec, timeout)
        result = fit(spec, None, strategy, engine=engine, callbacks=callbacks, **options)
        if out_dir is not None:
            write_outputs(result, out_dir)

    return app
