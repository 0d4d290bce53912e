"""``fedgp fit``'s model and training options, each default read from :mod:`fedgp.defaults` (the
one set every door shares), and what the command says when training did not converge: kept out of
:mod:`fedgp.cli` so that the parser stays one page per concern."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from fedgp import defaults
from fedgp.errors import CommandError
from fedgp.layout import HISTORY_FILE

__all__ = ["add_model_options", "add_training_options", "not_converged", "personal_setting"]


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, refused by argparse (exit status 2) otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model and the strategy by name: ``--kernel``, ``--ard``, ``--mean``, ``--strategy``,
    ``--clusters``."""
    from fedgp.presets import KERNELS, MEANS, STRATEGIES

    parser.add_argument(
        "--kernel",
        default=defaults.KERNEL,
        choices=list(KERNELS),
        help=f"ScaleKernel(...) (default {defaults.KERNEL})",
    )
    parser.add_argument(
        "--ard",
        action=argparse.BooleanOptionalAction,
        default=defaults.ARD,
        help="one lengthscale per feature (default: on, as in every door of fedgp)",
    )
    parser.add_argument(
        "--mean", default=defaults.MEAN, choices=list(MEANS), help=f"mean function (default {defaults.MEAN})"
    )
    parser.add_argument(
        "--strategy",
        default=defaults.STRATEGY,
        choices=list(STRATEGIES),
        help=f"{' or '.join(STRATEGIES)} (default {defaults.STRATEGY})",
    )
    parser.add_argument("--clusters", type=int, default=None, help="ifca: number of clusters (default 2)")
    parser.add_argument(
        "--personal",
        default=None,
        metavar="NAMES",
        help="fgpr: hyper-parameters each owner keeps and trains for itself, comma-separated: noise, "
        "outputscale, mean, lengthscale, scale (an owner's units: its outputscale, noise and mean), or "
        "state names; they never leave the owner, and `fedgp predict` conditions each owner on its own",
    )


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The run: ``--rounds``, ``--stop``, ``--hide-discrete``, the local steps, minibatch and learning
    rate, ``--engine``, ``--seed``."""
    parser.add_argument(
        "--rounds",
        type=_count(1),
        default=defaults.ROUNDS,
        help=f"the round budget (default {defaults.ROUNDS}): the run ends there if --stop has not ended "
        "it before; with --stop none, exactly this many rounds",
    )
    parser.add_argument(
        "--stop",
        default=defaults.value("stop", "cli"),
        choices=["auto", "none"],
        help="auto (default): end the run at the first round where training has converged (fedgp.run."
        "stopping.auto_rule), with a warning if the --rounds budget runs out first; none: run every round. "
        "This default differs from Python's fedgp.fit, which runs every round unless told to stop: a "
        "command hands back a finished model",
    )
    parser.add_argument(
        "--hide-discrete",
        action=argparse.BooleanOptionalAction,
        default=defaults.value("hide_discrete", "cli"),
        help="move integer-valued features' box ends out by 0-3 grid steps so that no owner's extreme "
        "values can be read from the input transform (default: off, as in Python; fedgp's Flower app, "
        "whose server is another party, turns it on)",
    )
    parser.add_argument("--local-steps", type=int, default=None, help="local steps per round (default 1)")
    parser.add_argument("--batch-size", type=int, default=None, help="minibatch size (default 256)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default 0.3)")
    parser.add_argument(
        "--engine",
        default=defaults.ENGINE,
        choices=["auto", "sequential", "batched"],
        help=f"default {defaults.ENGINE}",
    )
    parser.add_argument(
        "--seed", type=_count(0), default=defaults.SEED, help="master seed (training and the test split)"
    )


def not_converged(result, args: argparse.Namespace, out: Path) -> str:
    """A ``ConvergenceWarning`` (or ``DivergenceWarning``) for a command-line user: the stop reason,
    and what to change in the command rather than in Python objects."""
    reason = result.history.attrs.get("stop_reason", "")
    where = f"{out / HISTORY_FILE} shows every round (its stop_* columns: the rule's statistics)"
    if result.history.attrs.get("diverging"):
        return (
            f"training did not converge, it diverges ({reason}). Lower --lr, or take fewer --local-steps; "
            f"{where}"
        )
    return (
        f"training did not converge within --rounds {args.rounds} ({reason}). Raise --rounds, or --lr or "
        f"--local-steps; {where}"
    )


def add_warm_start_option(parser: argparse.ArgumentParser) -> None:
    """``--warm-start MODEL``: continue from a model folder's learned hyper-parameters."""
    parser.add_argument(
        "--warm-start",
        default=None,
        metavar="MODEL",
        help="start from the hyper-parameters fedgp fit wrote to the folder MODEL (its kernel and mean: "
        "--kernel, --mean and --ard are then refused), to continue training after owners added rows; "
        "the same features and target, and --key-file's key if MODEL was sealed",
    )


def personal_setting(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--personal``'s names; refused with ``--warm-start``, which starts every owner from the
    folder's shared values and would silently drop the owners' own."""
    if args.personal is None:
        return None
    names = tuple(n.strip() for n in args.personal.split(",") if n.strip())
    if not names:
        raise CommandError(
            f"--personal: give hyper-parameter names, e.g. noise,outputscale; got {args.personal!r}"
        )
    if args.warm_start is not None:
        raise CommandError(
            "--personal with --warm-start: the folder holds the shared hyper-parameters a warm start "
            "continues from, not the owners' own; fit again without --warm-start"
        )
    return names
