"""Secure aggregation of summed fields on a Flower grid (fedgp.flower.secagg), in process.

What each test would catch: an encoding that loses more than its stated bound or clips silently; a
node's own sum anywhere in what it sends (searched for as the no-row-leaves test searches rows, in
both its float and its fixed-point form, and found when secure aggregation is off); masks that do
not cancel, or cannot be removed when a node drops out at any step; a round released with fewer
nodes than the threshold; a node that reveals both shares of one peer.
"""

from __future__ import annotations

import base64
import json

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.engines.tasks import summary_fields
from fedgp.errors import EngineError, InputError, RoundFailedError
from fedgp.flower import Flower, SecureAggregation
from fedgp.flower.capture import message_bytes
from fedgp.flower.records import outcome_from_content
from fedgp.flower.secagg import RECORD, decode_sums, encode_sums
from fedgp.messages import Field, Record, Task

pytest.importorskip("flwr")

NODES = 3
BITS = SecureAggregation().fraction_bits


@pytest.fixture(scope="module")
def federation():
    draws = fedgp.synthetic.gp_federation(num_clients=9, n=30, d=2, n_test=0, seed=3)
    return draws.federation


def spec():
    return fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))


def node_clients(federation) -> list[list]:
    """The clients of each in-process node (Flower(num_nodes=3): contiguous thirds)."""
    shards = np.array_split(np.arange(len(federation)), NODES)
    return [[federation[int(i)] for i in shard] for shard in shards]


class Recorder:
    """A Flower mod keeping every message a node receives and sends, as Flower serialises them;
    ``fail`` makes a node answer chosen steps with an error (a node lost at that step)."""

    def __init__(self, fail: dict[int, str] | None = None):
        self.sent: dict[int, list[bytes]] = {}
        self.fail = fail or {}
        self.steps: list[tuple[int, str]] = []
        self.own: dict[int, list[float]] = {}  # each node's own summed values, as it sent them

    @staticmethod
    def step(message) -> str:
        records = message.content.config_records
        if RECORD in records and "stage" in records[RECORD]:
            return str(records[RECORD]["stage"])
        return "masked-input" if RECORD in records else message.metadata.message_type

    def __call__(self, message, context, call_next):
        partition, step = int(context.node_config["partition-id"]), self.step(message)
        self.steps.append((partition, step))
        if self.fail.get(partition) == step:
            raise RuntimeError(f"node {partition} lost at the {step} step")
        reply = call_next(message, context)
        self.sent.setdefault(partition, []).append(message_bytes(reply))
        if step == "query.summarise":
            sums = outcome_from_content(reply.content).sums
            self.own.setdefault(partition, []).extend(float(v) for v in sums.values())
        return reply


def fit(federation, secure, mods=(), rounds=2, strategy=None, **options):
    engine = Flower(num_nodes=NODES, secure=secure, mods=tuple(mods))
    strategy = fedgp.strategies.FGPR() if strategy is None else strategy
    return fedgp.fit(spec(), federation, strategy, rounds=rounds, seed=0, engine=engine, **options)


def pooled_mean_sd(clients) -> tuple[float, float]:
    y = torch.cat([c.y for c in clients])
    return float(y.mean()), float(y.std())


# -- the encoding ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=64), min_size=3, max_size=3),
        min_size=1,
        max_size=12,
    )
)
def test_fixed_point_sums_are_within_the_stated_bound(values):
    fields = {"a": Field((2,), summed=True), "b": Field((), summed=True), "i": Field((4,))}
    secure, m = SecureAggregation(), len(values)
    total = np.zeros(0, dtype=np.uint64)
    for row in values:
        sums = {
            "a": torch.tensor(row[:2], dtype=torch.float64),
            "b": torch.tensor(row[2], dtype=torch.float64),
        }
        vector = encode_sums(sums, fields, BITS, secure.limit(m))
        total = vector if not total.size else total + vector
    decoded = decode_sums(total, fields, BITS)
    exact = np.array(values, dtype=np.float64).sum(0)
    assert set(decoded) == {"a", "b"}  # individual fields are never encoded
    got = np.concatenate([decoded["a"].numpy(), decoded["b"].numpy().reshape(1)])
    # The bound is on the exact sum of the node's values; the float sum adds its own rounding.
    slack = secure.error_bound(m) + 4 * np.finfo(float).eps * np.abs(np.array(values)).sum(0)
    assert np.all(np.abs(got - exact) <= slack)


def test_a_value_outside_the_encodable_range_is_an_error_naming_the_field():
    fields = {"count": Field((), summed=True), "y_sumsq": Field((), summed=True)}
    secure = SecureAggregation()
    with pytest.raises(InputError, match="'y_sumsq' holds 1e\\+12.*fraction_bits=32"):
        encode_sums(
            {"count": torch.tensor(3.0), "y_sumsq": torch.tensor(1e12)}, fields, BITS, secure.limit(3)
        )
    with pytest.raises(InputError, match="'count' holds nan"):
        encode_sums({"count": torch.tensor(float("nan"))}, fields, BITS, secure.limit(3))
    # A coarser encoding reaches that far.
    coarse = SecureAggregation(fraction_bits=16)
    vector = encode_sums({"y_sumsq": torch.tensor(1e12, dtype=torch.float64)}, fields, 16, coarse.limit(3))
    assert float(decode_sums(vector, fields, 16)["y_sumsq"]) == 1e12


def test_the_settings_are_checked_and_read_from_json():
    assert SecureAggregation.from_json("") is None
    assert SecureAggregation.from_json('{"threshold": 0.6}') == SecureAggregation(threshold=0.6)
    assert SecureAggregation.from_json(SecureAggregation(0.7, 24, 3).to_json()) == SecureAggregation(
        0.7, 24, 3
    )
    assert SecureAggregation().needed(3) == 2 and SecureAggregation().needed(10) == 6
    assert SecureAggregation(threshold=0.75).needed(4) == 4
    for bad in ('{"threshold": 0.4}', '{"fraction_bits": 60}', '{"min_nodes": 1}'):
        with pytest.raises(InputError):
            SecureAggregation.from_json(bad)
    with pytest.raises(InputError, match="unknown settings \\['noise'\\]"):
        SecureAggregation.from_json('{"noise": 1}')


# -- the protocol over an in-process grid ----------------------------------------------------------
def test_secure_sums_equal_the_plain_ones_and_no_node_sends_its_own_sum(federation):
    plain, secure = Recorder(), Recorder()
    reference = fit(federation, None, [plain])
    result = fit(federation, SecureAggregation(), [secure])
    # The protocol ran around both summary passes: keys, shares, masked input, unmask, on each node.
    for node in range(NODES):
        steps = [s for n, s in secure.steps if n == node]
        assert steps.count("keys") == steps.count("shares") == steps.count("unmask") == 2
        assert steps.count("masked-input") == 2
    # The transform from the securely aggregated sums: the federation's mean and sd, within the bound.
    mean, sd = pooled_mean_sd(federation)
    assert (
        abs(float(result.transform.y_offset) - mean) <= SecureAggregation().error_bound(NODES) / 270 + 1e-12
    )
    assert abs(float(result.transform.y_scale) - sd) <= 1e-9 * sd
    for key, value in reference.state.items():
        torch.testing.assert_close(result.state[key], value, rtol=1e-8, atol=0)
    # Rounds without summed fields (FGPR's training) cost the same bytes.
    assert (result.history["bytes_up"] == reference.history["bytes_up"]).all()
    # Each node's own sums (count, Σy, Σ log sd, ... and Σ(y - ȳ)², as the node computed them without
    # secure aggregation) are nowhere in what it sent with it, neither as floats nor in fixed point.
    assert sorted(plain.own) == list(range(NODES)) and not secure.own
    for node, values in plain.own.items():
        assert len(values) == 5 and values[0] == 90.0
        for value in values[1:]:  # the count is also each client's size, an individual field
            for needle in (np.float64(value).tobytes(), np.int64(round(value * 2.0**BITS)).tobytes()):
                assert any(np.float64(value).tobytes() in blob for blob in plain.sent[node])
                assert not any(needle in blob for blob in secure.sent[node]), f"node {node}'s {value} left it"


def summary_round(federation, secure, mods=()):
    """One ``summarise`` exchange (stage "mean": count and Σy, summed) straight through the engine,
    as fit's first exchange sends it but without fit's every-client-must-answer rule."""
    engine = Flower(num_nodes=NODES, secure=secure, mods=tuple(mods)).build(spec(), federation)
    engine.start(fedgp.strategies.FGPR(), 0)
    task = Task("summarise", 0, Record({}, {"stage": "mean"}), Record())
    return engine.run(task, torch.arange(len(federation)), summary_fields(2, "mean"))


@pytest.mark.parametrize("step", ["keys", "shares", "masked-input", "unmask"])
def test_a_node_lost_at_any_step_leaves_the_round_to_the_others(federation, step):
    plain = Recorder()
    without = summary_round(federation, None, [plain])
    out = summary_round(federation, SecureAggregation(), [Recorder(fail={2: step})])
    if step == "unmask":  # the same replies, plus the protocol's keys, shares and unmask messages
        assert out.bytes_down > without.bytes_down + 3 * 2 * 300 and out.bytes_up > without.bytes_up + 3 * 300
    # Lost before its masked input arrived: the sum is the other two nodes' (node 2's pairwise masks
    # rebuilt from its key's shares when it had shared them). Lost at the unmask step: its input is in
    # (its self mask removed through the others' shares).
    kept = [0, 1] if step != "unmask" else [0, 1, 2]
    for i, name in enumerate(["count", "y_sum"]):
        expected = sum(plain.own[n][i] for n in kept)
        assert abs(float(out.sums[name]) - expected) <= SecureAggregation().error_bound(len(kept)) + 1e-12
    lost = {p: r for p, r in out.failures.items()}
    if step == "unmask":
        assert not lost and len(out.clients) == 9
    else:
        assert sorted(lost) == [6, 7, 8] and len(out.clients) == 6
        assert all(
            "node 2 lost" in r and (step == "masked-input" or f"({step} step)" in r) for r in lost.values()
        )


def test_a_round_below_the_threshold_is_not_released(federation):
    out = summary_round(
        federation, SecureAggregation(), [Recorder(fail={1: "masked-input", 2: "masked-input"})]
    )
    assert not out.sums and not len(out.clients) and sorted(out.failures) == list(range(9))
    assert all(
        "1 node(s) left after the masked-input step, fewer than the 2 needed" in r
        for r in out.failures.values()
    )
    with pytest.raises(
        RoundFailedError, match="secure aggregation: 1 node\\(s\\) left after the masked-input"
    ):
        fit(
            federation, SecureAggregation(), [Recorder(fail={1: "masked-input", 2: "masked-input"})], rounds=1
        )


def test_one_node_alone_is_never_a_secure_sum(federation):
    engine = Flower(num_nodes=1, secure=SecureAggregation())
    with pytest.raises(RoundFailedError, match="1 node\\(s\\) left after the start step, fewer than the 2"):
        fedgp.fit(spec(), federation, fedgp.strategies.FGPR(), rounds=1, seed=0, engine=engine)
    # Without summed fields there is nothing to protect: no transforms, no protocol.
    result = fedgp.fit(
        spec(), federation, fedgp.strategies.FGPR(), rounds=1, seed=0, engine=engine, transforms=None
    )
    assert len(result.history) == 1


def test_a_node_never_reveals_both_shares_of_a_peer_nor_twice():
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from fedgp.flower.local import LocalGrid
    from fedgp.flower.secagg import SecAggRound, handle_stage, mask_reply

    LocalGrid({})  # a Flower task identity for the messages, when this test runs alone
    contexts = {
        n: Context(run_id=0, node_id=n, node_config={}, state=RecordDict(), run_config={}) for n in (5, 6, 7)
    }

    def exchange(contents):
        out = {}
        for node, content in contents.items():
            message = Message(content, dst_node_id=node, message_type="query.secagg")
            out[node] = handle_stage(message, contexts[node]).content
        return out

    secure = SecAggRound(SecureAggregation(), exchange, [5, 6, 7])
    carry = secure.setup()
    assert secure.t == 2 and sorted(carry) == [5, 6, 7]

    def ask(node, stage, **values):
        record = ConfigRecord({"stage": stage, "session": secure.session, **values})
        content = RecordDict()
        content[RECORD] = record
        reply = handle_stage(Message(content, dst_node_id=node, message_type="query.secagg"), contexts[node])
        return reply.content.config_records[RECORD]

    fields = {"s": Field((), summed=True)}
    for node in (5, 6, 7):
        mask_reply(contexts[node], carry[node], {"s": torch.tensor(1.0)}, fields)
    with pytest.raises(EngineError, match="signs only a survivor set .* at least 2 nodes"):
        ask(5, "consistency", survivors=json.dumps([5]))
    sigs = {n: bytes(ask(n, "consistency", survivors=json.dumps([5, 6]))["sig"]) for n in (5, 6)}
    with pytest.raises(EngineError, match="already answered the consistency step"):
        ask(5, "consistency", survivors=json.dumps([5, 6, 7]))  # a second set: its shares would differ
    every = json.dumps({str(n): base64.b64encode(s).decode() for n, s in sigs.items()})
    with pytest.raises(EngineError, match="signed survivors \\[5, 6\\], not \\[5, 6, 7\\]"):
        ask(5, "unmask", survivors=json.dumps([5, 6, 7]), signatures=every)
    alone = json.dumps({"5": base64.b64encode(sigs[5]).decode()})
    with pytest.raises(EngineError, match="1 valid signature\\(s\\) .* fewer than the threshold 2"):
        ask(5, "unmask", survivors=json.dumps([5, 6]), signatures=alone)
    shares = json.loads(str(ask(5, "unmask", survivors=json.dumps([5, 6]), signatures=every)["shares"]))
    # 5 and 6 survived: shares of their seeds (52 bytes); 7 dropped: a share of its mask key (68).
    assert {k: len(base64.b64decode(v)) for k, v in shares.items()} == {"5": 52, "6": 52, "7": 68}
    with pytest.raises(EngineError, match="already answered the unmask step"):
        ask(5, "unmask", survivors=json.dumps([5, 6]), signatures=every)


def test_under_client_dp_a_round_whose_sum_is_withheld_is_skipped_not_the_end_of_the_run(federation):
    """Issue 49: with ClientDP the RoundFailedError of a round secure aggregation withholds ended the
    run. Two nodes lost mid-protocol every round (at rate 1: no sampling to account for): every round
    is skipped, the state never moves, ε is accounted for each, and the run ends at its budget."""
    pytest.importorskip("dp_accounting")
    from fedgp.run.privacy import epsilon_spent

    private = fedgp.run.ClientDP(fedgp.strategies.FGPR(), noise=1.0, delta=1e-3)
    lost = [Recorder(fail={1: "masked-input", 2: "masked-input"})]
    quiet = [fedgp.run.Progress(False)]
    result = fit(federation, SecureAggregation(), lost, rounds=3, strategy=private, callbacks=quiet)
    history = result.history
    assert list(history["skipped"]) == [True] * 3 and (history["failed"] == 9).all()
    assert history["failures"].str.contains("1 node\\(s\\) left after the masked-input step").all()
    assert history["bytes_down"].gt(0).all()  # the protocol's messages went out all the same
    first = history.filter(like="covar_module").iloc[0]
    assert (history.filter(like="covar_module") == first).all().all()
    assert list(history["epsilon"]) == [epsilon_spent(1.0, 1.0, t, 1e-3) for t in (1, 2, 3)]
    assert len(result.failures) == 27 and set(result.failures["round"]) == {1, 2, 3}
    # Sampling on an engine that may skip is accounted without amplification (ClientDP.accounted_rate).
    sampled = fedgp.run.ClientDP(fedgp.strategies.FGPR(), epsilon=4.0, delta=1e-3, rate=0.5)
    run = fit(federation, SecureAggregation(), rounds=1, strategy=sampled, callbacks=quiet)
    assert run.history.attrs["privacy"]["accounted_rate"] == 1.0 and Flower().min_nodes_per_sum == 1
    # Without privacy a withheld sum still ends the run (here the transforms' summary), as min_replies says.
    with pytest.raises(RoundFailedError, match="left after the masked-input"):
        fit(federation, SecureAggregation(), lost, rounds=1)
