"""Federated BO with every owner a Flower node (fedgp.bo.app, fedgp.bo.node, fedgp.bo.deployment), over
the in-memory grid (the same ServerApp/ClientApp code a deployment runs, messages through Flower's
wire format): the loop equals the in-process FederatedBO on the same owners and seed; nothing but
the declared fields leaves a node; a malformed or hostile reply drops that node with its reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr")
pytest.importorskip("botorch")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402

from fedgp.bo import BOLoop, Owner  # noqa: E402
from fedgp.bo.app import bo_clientapp, bo_pyproject, bo_settings, method  # noqa: E402
from fedgp.bo.deployment import FlowerBO  # noqa: E402
from fedgp.bo.node import REPLY  # noqa: E402
from fedgp.errors import InputError  # noqa: E402
from fedgp.flower import SecureAggregation  # noqa: E402
from fedgp.flower.capture import message_bytes  # noqa: E402
from fedgp.flower.local import LocalGrid  # noqa: E402
from tests.flower import bo_objectives  # noqa: E402

NAMES = ("plant_a", "plant_b", "plant_c")
RUN = {"seed": 3, "bo-rounds": 2, "bo-initial-rounds": 5, "bo-iterations": 2, "bo-raw-samples": 32,
       "bo-restarts": 2}  # fmt: skip
COMPARED = ["iteration", "owner", "evaluations", "y", "best_observed", "round", "train_nll"]


def node_config(name: str, i: int, report: str = "y,best_observed") -> dict:
    return {"bo-objective": f"tests.flower.bo_objectives:{name}", "bo-owner": name,
            "bo-bounds": json.dumps(bo_objectives.BOUNDS), "bo-report": report,
            "partition-id": i, "bo-optimum": 1.0}  # fmt: skip


def grid(run: dict = RUN, report: str = "y,best_observed", mods=(), order=NAMES) -> LocalGrid:
    """One in-memory node per owner (``order``: by partition id), each running the BO ClientApp."""
    app = bo_clientapp(mods)
    return LocalGrid({
        2000 + i: (app, Context(run_id=0, node_id=2000 + i, node_config=node_config(name, i, report),
                                state=RecordDict(), run_config=run))
        for i, name in enumerate(order)
    })  # fmt: skip


def on_flower(run: dict = RUN, secure=None, **kwargs):
    settings_, bo = bo_settings(run)
    loop = FlowerBO(grid(run, **kwargs), lambda width: method(settings_, bo, width), bo["bo-iterations"],
                    initial=bo["bo-initial"], seed=settings_["seed"], secure=secure)  # fmt: skip
    return loop.run()


def in_process(run: dict = RUN, order=NAMES):
    settings_, bo = bo_settings(run)
    owners = [Owner(name, getattr(bo_objectives, name), bo_objectives.BOUNDS, optimum=1.0) for name in order]
    return BOLoop(owners, method(settings_, bo, 2), bo["bo-iterations"], initial=bo["bo-initial"],
                  seed=settings_["seed"]).run()  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    return in_process()


def test_the_loop_on_flower_nodes_is_the_in_process_loop_bit_for_bit(reference):
    result = on_flower(report="y,best_observed,regret")  # every column the in-process history has
    assert len(result.failures) == 0
    flower, local = result.history[[*COMPARED, "regret"]], reference.history[[*COMPARED, "regret"]]
    assert flower.equals(local) and flower["regret"].notna().all(), (flower, local)
    for key, value in reference.method.result.state.items():
        assert torch.equal(result.method.result.state[key], value), key
    later = result.history["iteration"] > 0
    assert (result.history.loc[later, "seconds_propose"] > 0).all()
    # A column a node does not declare is NaN: the default run reports no regret.
    assert on_flower({**RUN, "bo-iterations": 1}).history["regret"].isna().all()


#: Client-level DP whose noise is drawn from the run's seed (``reproducible``: voids the guarantee, so
#: that the runs compare): its clipped updates are summed fields, which secure aggregation masks.
#: FGPR alone replies individual fields only, and secure aggregation would have nothing to do.
PRIVATE = {**RUN, "privacy": json.dumps({"noise": 0.5, "clip": 5.0, "delta": 0.01, "reproducible": True})}


def test_with_secure_aggregation_the_loop_is_the_in_process_one_to_the_encodings_error():
    sent: list = []
    result = on_flower(PRIVATE, secure=SecureAggregation(), mods=(_keep_messages(sent),))
    local = in_process(PRIVATE)
    assert len(result.failures) == 0
    assert sum(kind == "query.secagg" for _, kind, _ in sent) >= 4 * 3 * 9  # every round of the 9 masked
    flower, reference = result.history, local.history
    assert list(flower["owner"]) == list(reference["owner"])
    assert flower["epsilon"].tolist() == reference["epsilon"].tolist()
    # The nodes' updates are summed in fixed point (SecureAggregation's fraction_bits), so the shared
    # state differs by the encoding's error (measured: 3.1e-11 relative at most); the proposals,
    # maximised on those posteriors, came out equal (measured: 0.0), asserted to 1e-6.
    np.testing.assert_allclose(flower["y"], reference["y"], rtol=0, atol=1e-6)
    for key, value in local.method.result.state.items():
        torch.testing.assert_close(result.method.result.state[key], value, rtol=1e-9, atol=0)


def test_a_loop_budget_on_flower_stops_where_the_in_process_loop_does():
    """ClientDP(epsilon=...) is the whole loop's budget on Flower too (fedgp.bo.budget): given a budget
    that affords the start and the first iteration only, both loops stop before the second, saying
    why, having spent the same ε."""
    spent = in_process(PRIVATE).history.groupby("iteration")["epsilon"].max()
    budget = float(spent[1]) * 1.0001
    privacy = {"epsilon": budget, "noise": 0.5, "clip": 5.0, "delta": 0.01, "reproducible": True}
    run = {**RUN, "privacy": json.dumps(privacy)}
    flower, local = on_flower(run), in_process(run)
    assert local.stop_reason is not None and "privacy budget" in local.stop_reason
    assert flower.stop_reason == local.stop_reason
    assert flower.history["iteration"].max() == local.history["iteration"].max() == 1
    assert flower.history["epsilon"].tolist() == local.history["epsilon"].tolist()
    assert flower.history["epsilon"].max() <= budget


def _keep_messages(store: list):
    def mod(message, context, call_next):
        reply = call_next(message, context)
        store.append((context.node_config["bo-owner"], message.metadata.message_type, reply))
        return reply

    return mod


def test_nothing_but_the_declared_fields_leaves_a_node():
    sent: list = []
    run = {**RUN, "bo-iterations": 1}
    result = on_flower(run, report="none", mods=(_keep_messages(sent),))
    assert result.history[["y", "best_observed", "regret"]].isna().all().all()
    assert result.history["evaluations"].tolist() == [3, 3, 3, 4, 4, 4]
    bo_replies = [reply for _, kind, reply in sent if kind == "query.bo"]
    allowed = {"owner", "evaluations", "d", "partition"}
    assert bo_replies and all(set(r.content.config_records[REPLY]) <= allowed for r in bo_replies)
    # No owner's point or value in any message its node sent (the in-process loop's owners evaluated
    # the same rows: the control that they are the nodes' own).
    rows = {o.id: (o.X, o.y) for o in in_process(run).owners}
    for name, kind, reply in sent:
        blob = message_bytes(reply)
        X, y = rows[name]
        for row in [*X, *y.unsqueeze(-1)]:
            needle = np.ascontiguousarray(row.numpy(), dtype="<f8").tobytes()
            assert needle not in blob, f"a row of {name} left its node in a {kind} reply"


def _hostile(owner: str, change):
    """A mod rewriting ``owner``'s BO replies after the first (its start) with ``change``."""
    seen = {"n": 0}

    def mod(message, context, call_next):
        reply = call_next(message, context)
        if context.node_config["bo-owner"] != owner or message.metadata.message_type != "query.bo":
            return reply
        seen["n"] += 1
        if seen["n"] < 3:  # its hello and its start are honest
            return reply
        record = dict(reply.content.config_records[REPLY])
        content = RecordDict()
        content[REPLY] = ConfigRecord(change(record))
        return Message(content, reply_to=message)

    return mod


CHANGES = {
    "another owner": (lambda r: {**r, "owner": "plant_a"}, "answers as owner 'plant_a'"),
    "a count it did not make": (lambda r: {**r, "evaluations": 40}, "reports 40 evaluations, not 4"),
    "a value that is no number": (lambda r: {**r, "best_observed": float("nan")}, "its best_observed is nan"),
    "a field it may not send": (lambda r: {**r, "X": b"\x00" * 16}, "fields ['X'] are not BO reply fields"),
    "no BO field": (lambda r: {}, "KeyError"),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_a_malformed_or_hostile_reply_drops_that_node_with_its_reason(case):
    change, reason = CHANGES[case]
    result = on_flower(mods=(_hostile("plant_b", change),))
    failures = result.failures
    assert list(failures["owner"]) == ["plant_b"] and list(failures["iteration"]) == [1], failures
    assert "malformed BO reply" in failures["reason"].iloc[0] and reason in failures["reason"].iloc[0]
    history = result.history
    assert set(history.loc[history["iteration"] == 2, "owner"]) == {"plant_a", "plant_c"}
    assert history["iteration"].max() == 2


@pytest.mark.parametrize(
    "change", [{"d": "two"}, {"partition": "[1]"}, {"owner": "plant_a"}], ids=["width", "partition", "twin"]
)
def test_a_hostile_hello_leaves_that_node_out_of_the_loop(change):
    def mod(message, context, call_next):
        reply = call_next(message, context)
        bo = message.content.config_records.get("fedgp", {}).get("bo", "")
        if context.node_config["bo-owner"] != "plant_c" or '"hello"' not in bo:
            return reply
        content = RecordDict()
        content[REPLY] = ConfigRecord({**dict(reply.content.config_records[REPLY]), **change})
        return Message(content, reply_to=message)

    result = on_flower({**RUN, "bo-iterations": 1}, mods=(mod,))
    assert list(result.failures["owner"]) == ["node 2002"] and list(result.failures["iteration"]) == [0]
    assert set(result.history["owner"]) == {"plant_a", "plant_b"}
    assert result.history["evaluations"].tolist() == [3, 3, 4, 4]


def test_a_node_whose_objective_fails_is_dropped_saying_why():
    def failing(message, context, call_next):
        if context.node_config["bo-owner"] == "plant_c" and "propose" in str(
            message.content.config_records.get("fedgp", {}).get("bo", "")
        ):
            raise RuntimeError("the assay machine is down")
        return call_next(message, context)

    result = on_flower(mods=(failing,))
    assert list(result.failures["owner"]) == ["plant_c"]
    assert "the assay machine is down" in result.failures["reason"].iloc[0]
    assert set(result.history.loc[result.history["iteration"] >= 1, "owner"]) == {"plant_a", "plant_b"}


@settings(max_examples=40, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=5),
        st.booleans(),
        st.integers(-5, 5),
        st.binary(max_size=4),
    ),  # fmt: skip
    field=st.sampled_from(["owner", "evaluations", "y", "best_observed", "regret", "X", "d"]),
)
def test_any_reply_field_is_checked_never_raised_past_the_loop(value, field):
    loop = FlowerBO(None, lambda width: None, 1)
    loop.owners, loop.counts = {7: "plant_a"}, {7: 3}
    reply = ConfigRecord({"owner": "plant_a", "evaluations": 4, "best_observed": 0.5})
    try:
        reply[field] = value
    except (TypeError, ValueError):  # Flower itself refuses the value
        return
    try:
        checked = loop._checked(7, reply, "propose")
    except (KeyError, ValueError, TypeError):
        return
    assert str(checked["owner"]) == "plant_a" and checked["evaluations"] == 4
    for name in ("y", "best_observed"):
        if name in checked:
            assert np.isfinite(checked[name]) and not isinstance(checked[name], bool)


def test_run_config_keys_a_bo_run_does_not_read_are_refused_and_the_pyproject_lists_bos():
    with pytest.raises(InputError, match=r"\['rounds'\]: a BO run does not read"):
        bo_settings({"rounds": 7})
    with pytest.raises(InputError, match="unknown run config keys"):
        bo_settings({"bo-iteration": 7})
    with pytest.raises(InputError, match="'bo-iterations' must be a int"):
        bo_settings({"bo-iterations": "7"})
    text = bo_pyproject()
    assert 'serverapp = "fedgp.bo.app:serverapp"' in text and 'bo-acquisition = "qlogei"' in text


def test_a_node_config_that_names_no_function_is_one_error_naming_the_key():
    from fedgp.bo.node import node_owner

    for config, words in (({"bo-objective": "nomodule", "bo-bounds": "[[0],[1]]"}, "'bo-objective' must be"),
                          ({"bo-objective": "math:nothing", "bo-bounds": "[[0],[1]]"}, "cannot import"),
                          ({"bo-objective": "math:sin"}, "'bo-bounds' is missing"),
                          ({"bo-objective": "math:sin", "bo-bounds": "[0"}, "not JSON")):  # fmt: skip
        context = Context(run_id=0, node_id=1, node_config=config, state=RecordDict(), run_config={})
        with pytest.raises(InputError, match=words):
            node_owner(context)
