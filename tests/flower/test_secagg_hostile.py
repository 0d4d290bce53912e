"""Secure aggregation against hostile nodes and an active server (fedgp.flower.secagg).

The server side (``SecAggRound``) runs against in-process nodes (``handle_stage``/``mask_reply`` on
fake Contexts); one node, or the server, mutates the protocol's messages: each step's reply by
length, type, content, omission and replay, and the server's requests (threshold, peer list, keys,
survivor sets). What each case asserts: the round ends in the exact sum over the survivors (the
hostile node dropped with its reason where its message is malformed) or in a refusal naming the
cause — never a wrong sum, never an exception other than the refusal out of the server's side, and
never a server holding enough shares to unmask one node's own input (the honest node's reply is an
error instead). Without the checks of issue 51 the malformed cases raise ValueError/KeyError, the
altered ones release a wrong sum, and the active server's ones collect both kinds of share.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from dataclasses import dataclass, field

import gpytorch
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.errors import EngineError, RoundFailedError
from fedgp.flower import Flower, SecureAggregation
from fedgp.flower.secagg import IDENTITY, MESSAGE_TYPE, RECORD, SecAggRound, handle_stage, mask_reply
from fedgp.messages import Field

pytest.importorskip("flwr")

NODES = (11, 12, 13, 14)
HOSTILE = 13
FIELDS = {"count": Field((), summed=True), "y": Field((3,), summed=True), "ids": Field((2,))}


@pytest.fixture(autouse=True, scope="module")
def flower_task():
    """Messages need a Flower task identity: the in-process grid's (as the SuperLink's ServerApp)."""
    from fedgp.flower.local import LocalGrid

    LocalGrid({})


def own(node: int) -> dict[str, torch.Tensor]:
    """A node's own summed values (what must never reach the server alone)."""
    y = torch.tensor([node * 1.5, -(float(node) ** 2), 1e3 + node / 7], dtype=torch.float64)
    return {"count": torch.tensor(float(node), dtype=torch.float64), "y": y}


def content_of(values: dict) -> RecordDict:
    content = RecordDict()
    content[RECORD] = ConfigRecord(values)
    return content


def copy(content: RecordDict, **changes) -> RecordDict:
    """A reply with some of its record's values changed (``None``: removed)."""
    values = dict(content.config_records[RECORD])
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    return content_of(values)


@dataclass
class Result:
    sums: dict | None
    reason: str | None
    secure: SecAggRound
    survivors: list[int] = field(default_factory=list)


class Federation:
    """Nodes on fake Contexts, honest, driven by ``SecAggRound``; ``node_hook(stage, node, reply)``
    and ``server_hook(stage, node, request)`` mutate messages on their way (the identity by default)."""

    def __init__(self, nodes=NODES, node_config=None, settings=None):
        self.contexts = {
            n: Context(
                run_id=0, node_id=n, node_config=dict(node_config or {}), state=RecordDict(), run_config={}
            )
            for n in nodes
        }
        self.settings = settings or SecureAggregation()
        self.node_hook = lambda stage, node, reply: reply
        self.server_hook = lambda stage, node, request: request
        self.refusals: dict[tuple[str, int], str] = {}  # an honest node's error replies
        self.replies: dict[tuple[str, int], RecordDict] = {}  # the last reply of each step and node
        self.previous: dict[tuple[str, int], RecordDict] = {}  # those of the round before

    def answer(self, stage: str, node: int, request: RecordDict):
        request = self.server_hook(stage, node, request)
        context = self.contexts[node]
        try:
            if stage == "masked-input":
                blob = mask_reply(context, request.config_records[RECORD], own(node), FIELDS)
                reply = content_of({"masked": blob})
            else:
                message = Message(request, dst_node_id=node, message_type=MESSAGE_TYPE)
                reply = handle_stage(message, context).content
        except EngineError as err:  # Flower turns it into an error reply
            self.refusals[(stage, node)] = str(err)
            return f"refused: {err}"
        self.replies[(stage, node)] = reply
        return self.node_hook(stage, node, reply)

    def exchange(self, contents):
        return {n: self.answer(str(c.config_records[RECORD]["stage"]), n, c) for n, c in contents.items()}

    def round(self) -> Result:
        """One secure round as GridEngine runs it: setup, the task's masked inputs, finish."""
        self.previous, self.replies = self.replies, {}
        secure = SecAggRound(self.settings, self.exchange, list(self.contexts))
        masked = {}
        try:
            carry = secure.setup()
            for node, ask in carry.items():
                request = RecordDict()
                request[RECORD] = ask
                reply = self.answer("masked-input", node, request)
                if isinstance(reply, str):
                    continue
                value = secure.masked_input(node, reply, FIELDS)
                if value is not None:
                    masked[node] = value
            sums = secure.finish(masked, FIELDS)
        except EngineError as err:
            return Result(None, str(err), secure)
        return Result(sums, None, secure, sorted(masked))


def assert_exact(result: Result) -> None:
    """A released sum is the sum of the survivors' own values (within the encoding's bound)."""
    assert result.sums is not None, result.reason
    bound = SecureAggregation().error_bound(len(result.survivors)) + 1e-9
    for name in ("count", "y"):
        expected = sum(own(n)[name] for n in result.survivors)
        assert torch.allclose(result.sums[name], expected, atol=bound, rtol=0), (
            name,
            result.sums[name],
            expected,
        )


def assert_no_unmasking(fed: Federation, t: int) -> None:
    """No node's seed and mask key both came back in at least ``t`` shares (enough to unmask it)."""
    seeds, keys = {}, {}
    for (stage, _), reply in fed.replies.items():
        if stage != "unmask":
            continue
        for owner, share in json.loads(str(reply.config_records[RECORD]["shares"])).items():
            kind = seeds if len(base64.b64decode(share)) == 52 else keys
            kind[owner] = kind.get(owner, 0) + 1
    assert not [o for o in seeds if seeds[o] >= t and keys.get(o, 0) >= t]


# -- mutations of one node's reply -------------------------------------------------------------------
def flip(data: bytes, at: int | None = None) -> bytes:
    at = len(data) // 2 if at is None else at
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]


def record(reply: RecordDict) -> ConfigRecord:
    return reply.config_records[RECORD]


def resigned(fed: Federation, node: int, values: dict, session: str) -> dict:
    """An advert with changed keys, signed again with the node's own identity (a well-formed lie)."""
    from fedgp.flower.secagg_parts import _Advert

    identity = Ed25519PrivateKey.from_private_bytes(
        bytes(fed.contexts[node].state.config_records[IDENTITY]["sk"])
    )
    advert = _Advert(**{k: bytes(values[k]) for k in _Advert._fields})
    return {**values, "sig": identity.sign(advert.signed(session, node))}


def session_of(fed: Federation) -> str:
    return str(fed.contexts[HOSTILE].state.config_records[RECORD]["session"])


def other_b_shares(fed: Federation, reply: RecordDict, fraction: float) -> RecordDict:
    """The hostile node's shares redone, a ``fraction`` of its peers getting shares of a seed
    other than the one it committed to (encrypted properly: each recipient opens its share)."""
    state = fed.contexts[HOSTILE].state.config_records[RECORD]
    keys, t = json.loads(str(state["keys"])), int(state["t"])
    peers = sorted(int(n) for n in keys)
    from fedgp.flower.secagg_parts import _scalar

    honest = create_shares(bytes(state["b"]), t, len(peers))
    other = create_shares(secrets.token_bytes(32), t, len(peers))
    sk = create_shares(_scalar(bytes_to_private_key(bytes(state["mask_sk"]))), t, len(peers))
    enc_sk = bytes_to_private_key(bytes(state["enc_sk"]))
    out = {}
    for i, peer in enumerate(peers):
        b_share = other[i] if i < round(fraction * len(peers)) else honest[i]
        link = generate_shared_key(enc_sk, bytes_to_public_key(base64.b64decode(keys[str(peer)][0])))
        out[str(peer)] = base64.b64encode(
            encrypt(link, share_keys_plaintext_concat(HOSTILE, peer, b_share, sk[i]))
        ).decode()
    return copy(reply, shares=json.dumps(out))


def shares_of(reply: RecordDict) -> dict:
    return json.loads(str(record(reply)["shares"]))


def edit_shares(reply: RecordDict, change) -> RecordDict:
    shares = shares_of(reply)
    change(shares)
    return copy(reply, shares=json.dumps(shares))


def alter_one(shares: dict) -> None:
    owner = sorted(shares)[-1]
    shares[owner] = base64.b64encode(flip(base64.b64decode(shares[owner]), 10)).decode()


def swap_index(shares: dict) -> None:
    owner = sorted(shares)[0]
    raw = base64.b64decode(shares[owner])
    shares[owner] = base64.b64encode(
        (int.from_bytes(raw[:4], "little") + 1).to_bytes(4, "little") + raw[4:]
    ).decode()


def duplicate(shares: dict) -> None:  # its share of one survivor's seed sent as its share of another's
    a, b = sorted(shares)[:2]
    shares[b] = shares[a]


def garble_one(shares: dict) -> None:
    peer = str(NODES[0])
    shares[peer] = base64.b64encode(secrets.token_bytes(len(base64.b64decode(shares[peer])))).decode()


def garble_all(shares: dict) -> None:
    for peer in shares:
        if peer != str(HOSTILE):
            shares[peer] = base64.b64encode(secrets.token_bytes(len(base64.b64decode(shares[peer])))).decode()


def add_words(reply: RecordDict, word: int, amount: int) -> RecordDict:
    words = np.frombuffer(bytes(record(reply)["masked"]), dtype="<u8").copy()
    words[word] = np.uint64((int(words[word]) + amount) % 2**64)  # mod 2^64, as the protocol adds
    return copy(reply, masked=words.astype("<u8").tobytes())


DROPPED, REFUSED, KEPT = "dropped", "refused", "kept"
CASES = {
    # keys: the hostile node leaves; the other three sum
    "keys-omitted": ("keys", lambda f, r: RecordDict(), DROPPED, "without the 'fedgp.secagg' record"),
    "keys-lost": ("keys", lambda f, r: "connection reset", DROPPED, "connection reset"),
    "keys-type": ("keys", lambda f, r: copy(r, enc_pk="not bytes"), DROPPED, "'enc_pk' is str, not bytes"),
    "keys-missing-field": ("keys", lambda f, r: copy(r, commit=None), DROPPED, "no 'commit'"),
    "keys-short-key": (
        "keys",
        lambda f, r: copy(r, mask_pk=bytes(record(r)["mask_pk"])[:-20]),
        DROPPED,
        "malformed reply",
    ),
    "keys-short-commit": (
        "keys",
        lambda f, r: copy(r, commit=bytes(record(r)["commit"])[:31]),
        DROPPED,
        "commitment of 31 bytes",
    ),
    "keys-forged-sig": (
        "keys",
        lambda f, r: copy(r, sig=flip(bytes(record(r)["sig"]))),
        DROPPED,
        "signature does not verify",
    ),
    "keys-replayed": (
        "keys",
        lambda f, r: f.previous[("keys", HOSTILE)],
        DROPPED,
        "signature does not verify",
    ),
    "keys-copied": (
        "keys",
        lambda f, r: content_of(
            resigned(
                f,
                HOSTILE,
                {**record(r), "mask_pk": record(f.replies[("keys", 11)])["mask_pk"]},
                session_of(f),
            )
        ),
        DROPPED,
        "public keys are node 11's too",
    ),
    # shares: malformed ones drop the node; ones its peers cannot open leave its seed short of t
    "shares-omitted": ("shares", lambda f, r: RecordDict(), DROPPED, "without the 'fedgp.secagg' record"),
    "shares-type": ("shares", lambda f, r: copy(r, shares=b"{}"), DROPPED, "'shares' is bytes"),
    "shares-not-json": ("shares", lambda f, r: copy(r, shares="{"), DROPPED, "malformed reply"),
    "shares-missing-peer": (
        "shares",
        lambda f, r: edit_shares(r, lambda s: s.pop(str(NODES[0]))),
        DROPPED,
        "shares for nodes",
    ),
    "shares-unknown-peer": (
        "shares",
        lambda f, r: edit_shares(r, lambda s: s.update({"999": s[str(HOSTILE)]})),
        DROPPED,
        "shares for nodes",
    ),
    "shares-not-base64": (
        "shares",
        lambda f, r: edit_shares(r, lambda s: s.update({str(NODES[0]): "%%"})),
        DROPPED,
        "malformed reply",
    ),
    "shares-one-garbled": ("shares", lambda f, r: edit_shares(r, garble_one), KEPT, ""),
    "shares-all-garbled": (
        "shares",
        lambda f, r: edit_shares(r, garble_all),
        REFUSED,
        "fewer than the threshold 3 .*could not open its share",
    ),
    "shares-replayed": (
        "shares",
        lambda f, r: f.previous[("shares", HOSTILE)],
        REFUSED,
        "fewer than the threshold 3",
    ),
    "shares-of-another-seed": (
        "shares",
        lambda f, r: other_b_shares(f, r, 0.5),
        REFUSED,
        f"node {HOSTILE}'s self-mask seed .*rebuild nothing that fits",
    ),
    "shares-of-another-seed-to-one": (
        "shares",
        lambda f, r: other_b_shares(f, r, 0.25),
        REFUSED,
        f"node\\(s\\) {NODES[0]} sent a share of node {HOSTILE}'s self-mask seed",
    ),
    # masked input: a malformed one drops the node; a well-formed lie is refused after unmasking
    "masked-omitted": (
        "masked-input",
        lambda f, r: RecordDict(),
        DROPPED,
        "malformed masked input: no 'fedgp.secagg' record with a masked input",
    ),
    "masked-lost": ("masked-input", lambda f, r: "node lost", DROPPED, "no masked input"),
    "masked-type": (
        "masked-input",
        lambda f, r: copy(r, masked="text"),
        DROPPED,
        "'masked' is str, not bytes",
    ),
    "masked-truncated": (
        "masked-input",
        lambda f, r: copy(r, masked=bytes(record(r)["masked"])[:-8]),
        DROPPED,
        "32 bytes, not the round's 40",
    ),
    "masked-extended": (
        "masked-input",
        lambda f, r: copy(r, masked=bytes(record(r)["masked"]) + bytes(8)),
        DROPPED,
        "48 bytes, not the round's 40",
    ),
    "masked-garbage": (
        "masked-input",
        lambda f, r: copy(r, masked=secrets.token_bytes(40)),
        REFUSED,
        "check word is .*, not the 4 survivors",
    ),
    "masked-replayed": (
        "masked-input",
        lambda f, r: f.previous[("masked-input", HOSTILE)],
        REFUSED,
        "check word",
    ),
    "masked-wrapped": (
        "masked-input",
        lambda f, r: add_words(r, 2, 2**63),
        REFUSED,
        "unmasked sum of 'y' is beyond",
    ),
    # consistency: a node without a valid signature is no signer; its input still counts
    "consistency-omitted": ("consistency", lambda f, r: RecordDict(), KEPT, ""),
    "consistency-type": ("consistency", lambda f, r: copy(r, sig="sig"), KEPT, ""),
    "consistency-forged": ("consistency", lambda f, r: copy(r, sig=flip(bytes(record(r)["sig"]))), KEPT, ""),
    "consistency-replayed": ("consistency", lambda f, r: f.previous[("consistency", HOSTILE)], KEPT, ""),
    # unmask: malformed shares are ignored (three others are t); a well-formed altered one is named
    "unmask-omitted": ("unmask", lambda f, r: RecordDict(), KEPT, ""),
    "unmask-type": ("unmask", lambda f, r: copy(r, shares=7), KEPT, ""),
    "unmask-unknown-share": (
        "unmask",
        lambda f, r: edit_shares(r, lambda s: s.update({"999": s[str(NODES[0])]})),
        KEPT,
        "",
    ),
    "unmask-missing-share": ("unmask", lambda f, r: edit_shares(r, lambda s: s.pop(str(NODES[0]))), KEPT, ""),
    "unmask-truncated-share": (
        "unmask",
        lambda f, r: edit_shares(r, lambda s: s.update({str(NODES[0]): s[str(NODES[0])][:-8]})),
        KEPT,
        "",
    ),
    "unmask-index": ("unmask", lambda f, r: edit_shares(r, swap_index), KEPT, ""),
    "unmask-claims-bad": (
        "unmask",
        lambda f, r: copy(r, shares="{}", bad=json.dumps({str(n): "no" for n in NODES})),
        KEPT,
        "",
    ),
    "unmask-altered": (
        "unmask",
        lambda f, r: edit_shares(r, alter_one),
        REFUSED,
        f"node\\(s\\) {HOSTILE} sent a share of node 14's self-mask seed",
    ),
    "unmask-duplicate": (
        "unmask",
        lambda f, r: edit_shares(r, duplicate),
        REFUSED,
        f"node\\(s\\) {HOSTILE} sent a share",
    ),
    "unmask-replayed": (
        "unmask",
        lambda f, r: f.previous[("unmask", HOSTILE)],
        REFUSED,
        f"node\\(s\\) {HOSTILE} sent a share",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_node_never_gets_a_wrong_sum_released_nor_crashes_the_server(case):
    stage, mutate, outcome, reason = CASES[case]
    fed = Federation()
    assert_exact(fed.round())  # an honest round first: what the replays replay
    fed.node_hook = lambda s, node, reply: mutate(fed, reply) if (s, node) == (stage, HOSTILE) else reply
    result = fed.round()
    assert not fed.refusals  # the honest nodes never had to refuse anything
    if outcome == REFUSED:
        assert result.sums is None and result.reason is not None
        assert "the round's sums are not released" in result.reason
        assert re.search(reason, result.reason), result.reason
        return
    assert_exact(result)
    if outcome == DROPPED:
        victims = {11} if case == "keys-copied" else set()  # whose keys it copied leaves too
        assert result.survivors == sorted(set(NODES) - {HOSTILE} - victims)
        assert re.search(reason, result.secure.dropped[HOSTILE]), result.secure.dropped[HOSTILE]
    else:  # its input is in, as it made it
        assert result.survivors == list(NODES)
    if stage in ("consistency", "unmask") and case != "unmask-claims-bad":
        assert HOSTILE in result.secure.dropped  # named, with the step


def change_one_value(reply: RecordDict, pick: int, at: int, delta: int) -> RecordDict:
    """One byte or character of one value of a reply's record changed."""
    name = sorted(record(reply))[pick % len(record(reply))]
    value = record(reply)[name]
    if isinstance(value, bytes):
        i = at % len(value)
        return copy(reply, **{name: value[:i] + bytes([value[i] ^ delta]) + value[i + 1 :]})
    i = at % len(value)
    return copy(reply, **{name: value[:i] + chr((ord(value[i]) - 32 + delta) % 95 + 32) + value[i + 1 :]})


@settings(max_examples=30, deadline=None)
@given(
    stage=st.sampled_from(["keys", "shares", "consistency", "unmask"]),
    pick=st.integers(0, 10),
    at=st.integers(0, 10**6),
    delta=st.integers(1, 94),
)
def test_any_changed_byte_of_a_protocol_reply_gives_the_exact_sum_or_a_refusal(stage, pick, at, delta):
    """Outside the masked input (whose value words a node may bias within range, as a lie about its
    data), no change to one byte of a node's reply gets a wrong sum released or crashes the server."""
    fed = Federation()
    fed.node_hook = lambda s, n, r: change_one_value(r, pick, at, delta) if (s, n) == (stage, HOSTILE) else r
    result = fed.round()
    if result.sums is None:
        assert "the round's sums are not released" in result.reason
    else:
        assert_exact(result)


def test_a_node_can_still_bias_its_own_contribution_within_the_range():
    """The documented limit: a node may add any amount that keeps the sum in range (as lying about
    its data would); the sum released is then off by exactly that amount."""
    fed = Federation()
    fed.node_hook = lambda s, node, r: add_words(r, 0, 2**32) if (s, node) == ("masked-input", HOSTILE) else r
    result = fed.round()
    assert result.survivors == list(NODES)
    assert float(result.sums["count"]) == sum(NODES) + 1.0


# -- an active server ------------------------------------------------------------------------------
def request_hook(stage, **changes):
    def hook(s, node, request):
        if s != stage:
            return request
        values = dict(request.config_records[RECORD])
        values.update({k: (v(node, values) if callable(v) else v) for k, v in changes.items()})
        return content_of(values)

    return hook


@pytest.mark.parametrize(
    "t, config, reason",
    [
        (1, {}, "threshold of at least 3 of 4"),
        (2, {}, "threshold of at least 3 of 4"),
        (5, {}, "threshold of at least 3 of 4"),
        (3, {"secagg-min-threshold": 0.75}, "threshold of at least 4 of 4"),
        (3, {"secagg-min-peers": 5}, "at least 5 nodes"),
    ],
)
def test_nodes_refuse_a_threshold_below_their_own_floor_whatever_the_server_announces(t, config, reason):
    fed = Federation(node_config=config)
    fed.server_hook = request_hook("shares", t=t)
    result = fed.round()
    assert result.sums is None and "left after the shares step" in result.reason
    assert sorted(n for s, n in fed.refusals if s == "shares") == list(NODES)
    assert all(reason in r for r in fed.refusals.values())
    assert not [k for k in fed.replies if k[0] == "shares"]  # no share left any node


def test_a_node_config_floor_is_checked():
    fed = Federation(node_config={"secagg-min-threshold": 0.4})
    with pytest.raises(fedgp.errors.InputError, match="secagg-min-threshold must be in \\[0.5, 1\\)"):
        fed.round()


def forged_keys(node_of_interest: int, resign: bool):
    """The server relays its own mask key for one node (re-signed with its own identity, or not)."""
    server_id = Ed25519PrivateKey.generate()

    def hook(stage, node, request):
        if stage != "shares":
            return request
        from fedgp.flower.secagg_parts import _Advert, _b64

        values = dict(request.config_records[RECORD])
        keys = json.loads(str(values["keys"]))
        advert = dict(zip(_Advert._fields, (base64.b64decode(v) for v in keys[str(node_of_interest)])))
        from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

        advert["mask_pk"] = public_key_to_bytes(generate_key_pairs()[1])
        if resign:
            advert["id_pk"] = server_id.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
            unsigned = _Advert(**advert)
            advert["sig"] = server_id.sign(unsigned.signed(str(values["session"]), node_of_interest))
        keys[str(node_of_interest)] = [_b64(advert[k]) for k in _Advert._fields]
        values["keys"] = json.dumps(keys)
        return content_of(values)

    return hook


def test_nodes_refuse_keys_the_server_altered():
    fed = Federation()
    fed.server_hook = forged_keys(12, resign=False)
    result = fed.round()
    assert result.sums is None
    assert fed.refusals[("shares", 11)].endswith("its key advert's signature does not verify")
    assert "own keys are not among those relayed" in fed.refusals[("shares", 12)]


def test_with_a_roster_nodes_refuse_a_node_the_server_forged(tmp_path):
    identities = {}

    def roster_round(resign):
        fed = Federation()
        for node, context in fed.contexts.items():  # each node's identity from a file, as operators set it
            key = identities.setdefault(node, Ed25519PrivateKey.generate())
            path = tmp_path / f"{node}.pem"
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            context.node_config["secagg-identity-key"] = str(path)
        lines = ["# the federation's identity keys"] + [
            base64.b64encode(
                k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            ).decode()
            for k in identities.values()
        ]
        (tmp_path / "roster.txt").write_text("\n".join(lines) + "\n")
        for context in fed.contexts.values():
            context.node_config["secagg-roster"] = str(tmp_path / "roster.txt")
        if resign:
            fed.server_hook = forged_keys(12, resign=True)
        return fed, fed.round()

    fed, honest = roster_round(False)
    assert_exact(honest)
    assert IDENTITY not in fed.contexts[11].state.config_records  # the node's key is the file's
    fed, forged = roster_round(True)
    assert forged.sums is None
    assert "nodes [12] have identity keys not on secagg-roster" in fed.refusals[("shares", 11)]


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            {"peers": lambda n, v: json.dumps([n, 12] if n != 12 else [11, 12])},
            "asked to mask among",
        ),  # shrunk
        (
            {"peers": lambda n, v: json.dumps([*json.loads(v["peers"]), 99])},
            "asked to mask among",
        ),  # a stranger
        (
            {
                "inbox": lambda n, v: json.dumps(
                    {k: s for k, s in json.loads(v["inbox"]).items() if k != "14"}
                )
            },
            "inbox holds",
        ),
        ({"bits": 60}, "inbox holds|not of"),
    ],
)
def test_nodes_refuse_a_peer_list_they_cannot_trust_at_the_mask_step(change, reason):
    fed = Federation()
    fed.server_hook = request_hook("masked-input", **change)
    result = fed.round()
    assert result.sums is None
    assert sorted(n for s, n in fed.refusals if s == "masked-input") == list(NODES)
    assert all(re.search(reason, r) for r in fed.refusals.values())


def unmask_drive(fed: Federation):
    """Setup and masking as the protocol runs them; the rest is the test's (a server of its own)."""
    secure = SecAggRound(SecureAggregation(), fed.exchange, list(fed.contexts))
    carry = secure.setup()
    for node, ask in carry.items():
        request = RecordDict()
        request[RECORD] = ask
        assert not isinstance(fed.answer("masked-input", node, request), str)
    return secure


def ask(fed, secure, stage, nodes, **values):
    contents = {n: content_of({"stage": stage, "session": secure.session, **values}) for n in nodes}
    return fed.exchange(contents)


def test_different_survivor_sets_for_different_nodes_never_unmask_a_node():
    """The server tells 11 and 12 that 14 dropped and 13 and 14 that 11 dropped, hoping for 14's seed
    from one group and its mask key from the other: each node signs one set, and reveals only for
    the set it signed, seeing t signatures on it."""
    fed = Federation()
    secure = unmask_drive(fed)
    a, b = [11, 12, 13], [12, 13, 14]
    sigs_a = ask(fed, secure, "consistency", [11, 12], survivors=json.dumps(a))
    sigs_b = ask(fed, secure, "consistency", [13, 14], survivors=json.dumps(b))
    # A second set for a node that signed: refused (13 would complete a's signatures).
    assert isinstance(ask(fed, secure, "consistency", [13], survivors=json.dumps(a))[13], str)
    assert "already answered the consistency step" in fed.refusals[("consistency", 13)]
    signatures = {**sigs_a, **sigs_b}
    every = json.dumps(
        {
            str(n): base64.b64encode(bytes(r.config_records[RECORD]["sig"])).decode()
            for n, r in signatures.items()
        }
    )
    for survivors, nodes in ((a, [11, 12, 13, 14]), (b, [11, 12, 13, 14])):
        ask(fed, secure, "unmask", nodes, survivors=json.dumps(survivors), signatures=every)
    assert not [k for k in fed.replies if k[0] == "unmask"]  # two signatures on each set: below t = 3
    assert all(
        "fewer than the threshold 3" in r or "signed survivors" in r
        for (s, _), r in fed.refusals.items()
        if s == "unmask"
    )
    assert_no_unmasking(fed, secure.t)


def test_a_peer_list_shrunk_for_one_node_gets_the_server_nothing():
    """Node 11 is told that 14 dropped before masking (three peers: still t); it masks without 14
    and signs only a survivor set among those peers: the server gets 11's seed from the others but
    no mask key that removes its pairwise masks, and the sum it unmasks fails its check."""
    fed = Federation()
    fed.server_hook = request_hook(
        "masked-input",
        peers=lambda n, v: json.dumps([11, 12, 13]) if n == 11 else v["peers"],
        inbox=lambda n, v: json.dumps(
            {k: s for k, s in json.loads(v["inbox"]).items() if k != "14" or n != 11}
        ),
    )
    result = fed.round()
    assert result.sums is None and "check word" in result.reason
    assert "signs only a survivor set of its peers [11, 12, 13]" in result.secure.dropped[11]
    assert_no_unmasking(fed, result.secure.t)


def test_the_server_cannot_skip_or_repeat_a_step():
    fed = Federation()
    secure = unmask_drive(fed)
    survivors = json.dumps(list(NODES))
    ask(fed, secure, "unmask", [11], survivors=survivors, signatures="{}")  # before any signature
    assert "takes a unmask request only after the consistency step" in fed.refusals[("unmask", 11)]
    ask(fed, secure, "shares", [12], keys="{}", t=3)  # sharing again, after masking
    assert "already answered the masked-input step" in fed.refusals[("shares", 12)]
    ask(fed, secure, "keys", [13])  # new keys and seed in the same session
    assert "already answered the masked-input step" in fed.refusals[("keys", 13)]
    signed = ask(fed, secure, "consistency", list(NODES), survivors=survivors)
    every = json.dumps(
        {str(n): base64.b64encode(bytes(r.config_records[RECORD]["sig"])).decode() for n, r in signed.items()}
    )
    first = ask(fed, secure, "unmask", list(NODES), survivors=survivors, signatures=every)
    assert not any(isinstance(r, str) for r in first.values())
    again = ask(fed, secure, "unmask", [11], survivors=json.dumps([11, 12, 13]), signatures=every)
    assert isinstance(again[11], str) and "already answered the unmask step" in fed.refusals[("unmask", 11)]
    assert_no_unmasking(fed, secure.t)


@pytest.mark.parametrize("survivors", [[11, 12], [12, 13, 14], [11, 12, 13, 99]])
def test_nodes_refuse_to_sign_a_survivor_set_they_cannot_trust(survivors):
    fed = Federation()
    secure = unmask_drive(fed)
    ask(fed, secure, "consistency", [11, 12], survivors=json.dumps(survivors))
    assert ("consistency", 11) in fed.refusals and "signs only a survivor set" in fed.refusals[
        ("consistency", 11)
    ]


def test_a_malformed_server_request_is_an_error_reply_not_a_crash():
    fed = Federation()
    secure = unmask_drive(fed)
    ask(fed, secure, "consistency", [11], survivors="[11, 12")
    ask(fed, secure, "whatever", [12])
    assert "refuses a malformed request" in fed.refusals[("consistency", 11)]
    assert "unknown stage 'whatever'" in fed.refusals[("whatever", 12)]


# -- end to end, through fedgp.fit on an in-process Flower grid --------------------------------------
@pytest.fixture(scope="module")
def federation():
    return fedgp.synthetic.gp_federation(num_clients=8, n=30, d=2, n_test=0, seed=3).federation


class Mutate:
    """A Flower mod on one node (partition 3) that mutates its replies at one step."""

    def __init__(self, step: str, change):
        self.step, self.change = step, change

    def __call__(self, message, context, call_next):
        reply = call_next(message, context)
        records = message.content.config_records
        stage = (
            str(records[RECORD]["stage"])
            if RECORD in records and "stage" in records[RECORD]
            else ("masked-input" if RECORD in records else "")
        )
        if int(context.node_config["partition-id"]) == 3 and stage == self.step and not reply.has_error():
            values = dict(reply.content.config_records[RECORD])
            self.change(values)
            reply.content.config_records[RECORD] = ConfigRecord(values)
        return reply


SECURE = SecureAggregation()


def fit4(federation, mods, secure=SECURE):
    spec = fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    engine = Flower(num_nodes=4, secure=secure, mods=tuple(mods))
    return fedgp.fit(spec, federation, fedgp.strategies.FGPR(), rounds=1, seed=0, engine=engine)


def test_end_to_end_a_malformed_unmask_reply_is_ignored_and_the_sum_is_right(federation):
    def unknown(values):
        values["shares"] = json.dumps({**json.loads(values["shares"]), "12345": "AAAA"})

    result = fit4(federation, [Mutate("unmask", unknown)])
    y = torch.cat([c.y for c in federation])
    assert abs(float(result.transform.y_offset) - float(y.mean())) < 1e-9
    assert abs(float(result.transform.y_scale) - float(y.std())) < 1e-9 * float(y.std())


def test_end_to_end_a_garbage_masked_input_is_refused_naming_the_cause(federation):
    def garbage(values):
        values["masked"] = secrets.token_bytes(len(values["masked"]))

    with pytest.raises(RoundFailedError, match="check word .* not the 4 survivors"):
        fit4(federation, [Mutate("masked-input", garbage)])


def test_end_to_end_a_truncated_masked_input_drops_the_node_with_its_reason(federation):
    def truncate(values):
        values["masked"] = values["masked"][:-8]

    result = fit4(federation, [Mutate("masked-input", truncate)])
    failures = result.failures
    assert sorted(failures["client"]) == [6, 7]  # partition 3's clients, in the transforms' summary
    assert failures["reason"].str.contains("malformed masked input: 8 bytes, not the round's 16").all()
    y = torch.cat([c.y for c in federation[:6]])  # the transform: the other three nodes' sum
    assert abs(float(result.transform.y_offset) - float(y.mean())) < 1e-9
    assert abs(float(result.transform.y_scale) - float(y.std())) < 1e-9 * float(y.std())


def test_finish_checks_the_masked_inputs_it_is_given():
    """``finish`` takes masked inputs straight from a caller too: one of the wrong type or length
    leaves the round with the reason, as through ``masked_input``."""
    fed = Federation()
    secure = unmask_drive(fed)
    masked = {n: bytes(record(fed.replies[("masked-input", n)])["masked"]) for n in NODES}
    masked[HOSTILE] = "not bytes"
    result = Result(secure.finish(masked, FIELDS), None, secure, [11, 12, 14])
    assert_exact(result)
    assert "'masked' is str, not bytes" in secure.dropped[HOSTILE]


class Strip:
    """A Flower mod on partition 3 dropping the outcome of its ``summarise`` replies (keeping only
    a masked input, under secure aggregation)."""

    def __call__(self, message, context, call_next):
        reply = call_next(message, context)
        if (
            int(context.node_config["partition-id"]) == 3
            and message.metadata.message_type == "query.summarise"
        ):
            content = RecordDict()
            if RECORD in reply.content.config_records:
                content[RECORD] = reply.content.config_records[RECORD]
            reply.content = content
        return reply


@pytest.mark.parametrize("secure", [SecureAggregation(), None])
def test_end_to_end_a_task_reply_without_its_outcome_drops_the_node(federation, secure):
    result = fit4(federation, [Strip()], secure)
    failures = result.failures
    assert sorted(failures["client"]) == [6, 7]
    assert failures["reason"].str.contains("Flower node 1003: malformed reply: KeyError").all()
    y = torch.cat([c.y for c in federation[:6]])
    assert abs(float(result.transform.y_offset) - float(y.mean())) < 1e-9
