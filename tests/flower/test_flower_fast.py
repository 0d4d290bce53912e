"""``fedgp flower supernode`` (``fedgp.flower.fast``) and the Flower release it runs on (issue 54,
item 5): the private Flower names its fast path relies on are checked at start; the installed Flower
(1.41 or 1.42) has them all; a Flower that lacks one gets one line naming it and Flower's own
SuperNode with the same arguments. The fast path itself runs in test_flower_deployment.py.
"""

import os
import sys
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

if os.environ.get("CI", "").strip().lower() == "true":
    import flwr  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("flwr")

from fedgp.flower import fast  # noqa: E402

GONE = ("flwr.supernode.start_client_internal", "_pull_and_store_message_v2")


@pytest.fixture
def flower_without_a_name(monkeypatch):
    """This Flower, as if a release had renamed one of the loop's private functions."""
    monkeypatch.setattr(fast, "FLOWER_NAMES", (*fast.FLOWER_NAMES, GONE))
    calls = []
    monkeypatch.setattr(fast, "supernode", lambda argv: calls.append(("fast", argv)))
    monkeypatch.setattr(fast, "stock_supernode", lambda argv: calls.append(("stock", argv)))
    return calls


def test_the_installed_flower_has_every_private_name_the_fast_path_relies_on():
    from importlib.metadata import version

    assert version("flwr").startswith(("1.41.", "1.42.")), version("flwr")
    assert fast.supported() is None
    # short_object_pulls shortens this keyword's default, and silently leaves a Flower without it.
    from flwr.supercore.inflatable import inflatable_utils as iu

    for function in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        assert "initial_backoff" in (function.__kwdefaults__ or {}), function.__qualname__


def test_the_check_names_each_missing_name_and_module(monkeypatch):
    monkeypatch.setattr(fast, "FLOWER_NAMES", (*fast.FLOWER_NAMES, GONE, ("flwr.no_such_module", "run")))
    assert fast.supported() == "flwr.supernode.start_client_internal._pull_and_store_message_v2, " + (
        "flwr.no_such_module"
    )


def test_a_flower_lacking_a_name_runs_flowers_own_supernode_and_says_why_in_one_line(
    flower_without_a_name, capsys
):
    from importlib.metadata import version

    fast.main(["supernode", "--insecure", "--superlink", "127.0.0.1:9092", "--isolation", "process"])
    assert flower_without_a_name == [("stock", ["--insecure", "--superlink", "127.0.0.1:9092", "--isolation",
                                                "process"])]  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"Flower {version('flwr')} lacks {'.'.join(GONE)}" in err
    assert "running Flower's own SuperNode (flower-supernode) instead" in err


def test_with_every_name_the_fast_path_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(fast, "supernode", lambda argv: calls.append(("fast", argv)))
    monkeypatch.setattr(fast, "stock_supernode", lambda argv: calls.append(("stock", argv)))
    fast.main(["supernode", "--insecure"])
    assert calls == [("fast", ["--insecure"])]


def test_the_superexec_refuses_naming_the_missing_name(flower_without_a_name):
    with pytest.raises(SystemExit, match=r"fedgp flower superexec: Flower .* lacks .*store_message_v2"):
        fast.main(["superexec", "--runtime-api-address", "127.0.0.1:9094"])
    assert flower_without_a_name == []


def test_the_fallback_is_the_flower_supernode_command(monkeypatch, capsys):
    """Not a stand-in: Flower's own entry point answers ``--help`` with its usage."""
    monkeypatch.setattr(fast, "supported", lambda: "flwr.somewhere.gone")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as done:
        fast.main(["supernode", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr()
    assert "usage: flower-supernode" in out.out and "--superlink" in out.out
    assert "lacks flwr.somewhere.gone; running Flower's own SuperNode" in out.err


ARG = st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=12).filter(
    lambda a: not a.startswith("--isolation")
)


@given(before=st.lists(ARG, max_size=5), after=st.lists(ARG, max_size=5),
       isolation=st.sampled_from([[], ["--isolation", "process"], ["--isolation=process"]]))  # fmt: skip
def test_the_fallback_gets_the_arguments_given_less_the_isolation(before, after, isolation):
    """The one option the fast path owns (it starts the SuperExec itself) is dropped; every other
    argument reaches flower-supernode as given, in order."""
    seen = []
    argv = list(sys.argv)
    with mock.patch.object(fast, "_flower_supernode_command", lambda: lambda: seen.append(list(sys.argv))):
        try:
            fast.stock_supernode([*before, *isolation, *after])
        finally:
            sys.argv = argv
    assert seen == [["flower-supernode", *before, *after]]


def test_a_flower_without_the_flower_supernode_command_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(fast, "_flower_supernode_command", lambda: None)
    with pytest.raises(SystemExit, match="^fedgp flower supernode: this Flower has no flower-supernode"):
        fast.stock_supernode(["--insecure"])


@pytest.mark.skipif(os.environ.get("CI", "").strip().lower() != "true", reason="CI builds from the pins")
def test_ci_runs_flower_at_the_release_the_constraints_pin():
    """The deployment test runs on the Flower that constraints.txt pins (make builds .venv from it)."""
    from importlib.metadata import version
    from pathlib import Path

    pins = (Path(__file__).resolve().parents[2] / "constraints.txt").read_text().splitlines()
    assert f"flwr=={version('flwr')}" in pins
