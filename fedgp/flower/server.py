"""The Flower ``ServerApp`` of fedgp: ``fedgp.fit`` over the run's ``Grid``.

``server_app(build)`` returns a ``ServerApp`` whose ``main`` asks ``build(context)`` for the model
specification, the strategy and ``fit``'s options (read them from ``context.run_config``), runs
``fedgp.fit`` with a :class:`~fedgp.flower.grid_engine.GridEngine` — fedgp's own round loop,
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

from fedgp.fit import FitResult, fit
from fedgp.flower.grid_engine import GridEngine
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy

__all__ = ["server_app", "save_result", "load_state"]

Build = Callable[[Context], tuple[GPSpec, Strategy, dict[str, Any]]]


def save_result(result: FitResult, folder: str | Path) -> None:
    """``state.json`` (the learned state, constrained values as nested lists), ``history.csv``,
    ``failures.csv`` and ``evaluate.csv`` (per-client test metrics, if clients have test data)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.tolist() for k, v in result.state.items()}
    (folder / "state.json").write_text(json.dumps(state, indent=1))
    result.history.to_csv(folder / "history.csv", index=False)
    result.failures.to_csv(folder / "failures.csv", index=False)
    if bool((result.registry.n_test > 0).any()):
        result.evaluate().to_csv(folder / "evaluate.csv", index=False)


def load_state(folder: str | Path) -> dict[str, list]:
    """The learned state that :func:`save_result` wrote to ``folder/state.json``, as nested lists."""
    return json.loads((Path(folder) / "state.json").read_text())


def server_app(build: Build) -> ServerApp:
    """A ``ServerApp`` running ``fedgp.fit``; ``build(context)`` gives ``(spec, strategy, options)``
    where options are ``fit`` keywords plus ``timeout`` (seconds per round) and ``out_dir`` (where
    the result goes, and ``progress.txt``, the last finished round, while it runs)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        spec, strategy, options = build(context)
        options = dict(options)
        out_dir, timeout = options.pop("out_dir", None), options.pop("timeout", None)
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            options["callback"] = lambda rnd, server: (Path(out_dir) / "progress.txt").write_text(str(rnd))
        result = fit(spec, None, strategy, engine=GridEngine(grid, spec, timeout), progress=False, **options)
        if out_dir is not None:
            save_result(result, out_dir)

    return app
