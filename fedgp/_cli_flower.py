"""``fedgp flower ...``: the command line's Flower commands (``new``, ``status``, ``supernode``), kept
out of :mod:`fedgp.cli` so that the parser stays one page per concern. ``status`` reads an
``out-dir`` with nothing of Flower installed (the folder may have been copied from the SuperLink's
machine); the others need the ``flower`` extra and say so in one line without it."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from fedgp.errors import CommandError

__all__ = ["add_flower"]


def _flower(module: str) -> ModuleType:
    """``fedgp.flower.<module>``; without Flower, ``fedgp.flower`` raises fedgp's one line naming the
    extra (:func:`fedgp.errors.missing_extra`), which the CLI prints with exit status 2."""
    return importlib.import_module(f"fedgp.flower.{module}")


def _new(args: argparse.Namespace) -> int:
    path = _flower("template").write_app(args.folder, args.name)
    print(f"wrote {path}: edit its [tool.flwr.app.config], then see the Deployment guide")
    return 0


def _status(args: argparse.Namespace) -> int:
    from fedgp.layout import run_state

    state, detail = run_state(args.folder)
    if state == "none":
        raise CommandError(f"{detail}: give the out-dir of a run of fedgp's Flower app")
    print(f"{state}: {detail}")
    return 1 if state == "failed" else 0


def add_flower(sub) -> None:
    """The ``flower`` command and its actions, on the ``fedgp`` parser's subparsers ``sub``."""
    flower = sub.add_parser(
        "flower",
        help="fedgp on Flower: fedgp flower new DIR, fedgp flower status OUT_DIR, fedgp flower supernode",
    )
    actions = flower.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="write a ready Flower app folder (pyproject.toml) running fedgp")
    new.add_argument("folder", metavar="DIR", help="the app folder to create")
    new.add_argument("--name", default=None, help="the app's name (default: the folder's name)")
    new.set_defaults(func=_new)
    status = actions.add_parser(
        "status",
        help="the state of a run of fedgp's Flower app from its out-dir: running, finished or failed",
        description="Read a run's out-dir (on the SuperLink's machine): 'running: N round(s) completed' "
        "(progress.txt), 'finished: ...' (model.fedgp, written last) or 'failed: <why>' (error.txt, one "
        "line). Exit status 0 when running or finished, 1 when failed, 2 when the folder holds no run. "
        "flwr run exits 0 whatever the ServerApp does: this is where a failure shows.",
    )
    status.add_argument("folder", metavar="OUT_DIR", help="the run config's out-dir")
    status.set_defaults(func=_status)
    node = actions.add_parser("supernode", help="Flower's SuperNode, fast (fedgp.flower.fast)")
    node.add_argument("args", nargs=argparse.REMAINDER, help="flower-supernode's arguments")
    node.set_defaults(func=lambda args: _flower("fast").main(["supernode", *args.args[1:]]) or 0)
