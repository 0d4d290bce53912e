"""The node's side of secure aggregation (:mod:`fedgp.flower.secagg` says the protocol): its
identity, and its answers to the keys, shares, masked-input, consistency and unmask steps, each
checked against its own floors and what it signed; what it keeps between steps lives in its
``context.state``."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fedgp.errors import EngineError, InputError
from fedgp.flower.secagg_parts import (
    _BAD,
    IDENTITY,
    RECORD,
    NodePolicy,
    _Advert,
    _b64,
    _commit,
    _field,
    _json,
    _Malformed,
    _nodes,
    _pairwise,
    _repeated,
    _scalar,
    _str,
    _stream,
    _survivor_set,
    _unb64,
    encode_sums,
)
from fedgp.messages import Field

__all__ = ["handle_stage", "mask_reply"]


# -- the node's side --------------------------------------------------------------------------------
def _identity(context: Context) -> Ed25519PrivateKey:
    """The node's Ed25519 identity key: the node config's ``secagg-identity-key`` (a PEM file), else
    one drawn once and kept in the node's state."""
    path = context.node_config.get("secagg-identity-key")
    if path:
        try:
            key = serialization.load_pem_private_key(Path(str(path)).expanduser().read_bytes(), None)
        except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as err:
            raise InputError(f"node config secagg-identity-key {str(path)!r}: {err}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise InputError(f"node config secagg-identity-key {str(path)!r} is not an Ed25519 key")
        return key
    held = context.state.config_records.get(IDENTITY)
    if held is None:
        raw = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        held = context.state.config_records[IDENTITY] = ConfigRecord({"sk": raw})
    return Ed25519PrivateKey.from_private_bytes(bytes(held["sk"]))


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def handle_stage(message: Message, context: Context) -> Message:
    """A node's answer to a ``query.secagg`` message (the keys, shares, consistency or unmask step);
    what it must keep between steps lives in its ``context.state`` (its own machine), never in a
    reply. A request the node refuses is an error reply with the reason."""
    ask = message.content.config_records.get(RECORD)
    me, policy = int(context.node_id), NodePolicy.from_context(context)
    try:
        if ask is None:
            raise _Malformed(f"no {RECORD!r} record")
        stage, session = _field(ask, "stage", str), _field(ask, "session", str)
        if stage == "keys":
            held = context.state.config_records.get(RECORD)
            if held is not None and str(held["session"]) == session:
                raise EngineError(
                    f"secure aggregation: this node already answered the {held['step']} step of this "
                    "session; its keys and seed are made once per session"
                )
            reply = _advertise(context, session, me)
        else:
            state = _state(context, session)
            if stage == "shares":
                reply = _share(state, me, policy, ask, session)
            elif stage == "consistency":
                reply = _sign(context, state, me, policy, ask, session)
            elif stage == "unmask":
                reply = _reveal(state, me, ask, session)
            else:
                raise _Malformed(f"unknown stage {stage!r}")
    except _BAD as err:
        raise EngineError(f"secure aggregation: this node refuses a malformed request: {err}") from None
    content = RecordDict()
    content[RECORD] = ConfigRecord(reply)
    return Message(content, reply_to=message)


def _state(context: Context, session: str) -> ConfigRecord:
    state = context.state.config_records.get(RECORD)
    if state is None or str(state["session"]) != session:
        raise EngineError(f"secure aggregation: this node holds no keys for session {session}")
    return state


def _at(state: ConfigRecord, step: str, then: str) -> None:
    """Each step runs once, in order: refuse a request for ``then`` unless the last was ``step``."""
    if str(state["step"]) != step:
        raise EngineError(
            f"secure aggregation: this node already answered the {state['step']} step of this session "
            f"and takes a {then} request only after the {step} step (each step once, in order)"
        )


def _advertise(context: Context, session: str, me: int) -> dict:
    enc_sk, enc_pk = generate_key_pairs()
    mask_sk, mask_pk = generate_key_pairs()
    b = secrets.token_bytes(32)
    identity = _identity(context)
    commit, id_pk = _commit(session, me, b), _raw(identity.public_key())
    unsigned = _Advert(public_key_to_bytes(enc_pk), public_key_to_bytes(mask_pk), commit, id_pk, b"")
    advert = unsigned._replace(sig=identity.sign(unsigned.signed(session, me)))
    context.state.config_records[RECORD] = ConfigRecord(
        {"session": session, "step": "keys", "enc_sk": private_key_to_bytes(enc_sk),
         "mask_sk": private_key_to_bytes(mask_sk), "b": b, "advert": json.dumps(advert.to_json())}
    )  # fmt: skip
    return advert._asdict()


def _share(state: ConfigRecord, me: int, policy: NodePolicy, ask: Mapping, session: str) -> dict:
    """Check every advert and the threshold, then send every peer (self included) its encrypted
    shares of this node's ``b`` and mask key."""
    _at(state, "keys", "shares")
    relayed, t = _json(ask, "keys", dict), _field(ask, "t", int)
    if relayed.get(str(me)) != json.loads(str(state["advert"])):
        raise EngineError(f"secure aggregation: node {me}'s own keys are not among those relayed as its own")
    adverts = {int(n): _Advert.parse(_Advert.from_json(v), session, int(n)) for n, v in relayed.items()}
    peers = sorted(adverts)
    policy.check(len(peers), t)
    repeated = _repeated(adverts)
    if repeated:
        raise EngineError(f"secure aggregation: relayed keys repeat: node -> node {repeated}")
    if policy.roster is not None:
        strangers = [n for n in peers if adverts[n].id_pk not in policy.roster]
        if strangers:
            raise EngineError(
                f"secure aggregation: nodes {strangers} have identity keys not on secagg-roster"
            )
    b_shares = create_shares(bytes(state["b"]), t, len(peers))
    sk_shares = create_shares(_scalar(bytes_to_private_key(bytes(state["mask_sk"]))), t, len(peers))
    enc_sk = bytes_to_private_key(bytes(state["enc_sk"]))
    out, links = {}, {}
    for peer, b_share, sk_share in zip(peers, b_shares, sk_shares):
        links[str(peer)] = generate_shared_key(enc_sk, bytes_to_public_key(adverts[peer].enc_pk))
        out[str(peer)] = _b64(
            encrypt(links[str(peer)], share_keys_plaintext_concat(me, peer, b_share, sk_share))
        )
    # The share keys are kept (on this node) for decrypting at the unmask step: one ECDH per peer, not two.
    state["keys"], state["t"], state["step"] = json.dumps(relayed), t, "shares"
    state["links"] = json.dumps({k: v.decode() for k, v in links.items()})
    return {"shares": json.dumps(out)}


def mask_reply(
    context: Context, ask: ConfigRecord, sums: Mapping[str, torch.Tensor], fields: Mapping[str, Field]
) -> bytes:
    """The node's summed fields, encoded (:func:`encode_sums`) with a check word of 1, plus its self
    mask and its pairwise masks towards every peer (``ask["peers"]``: nodes whose adverts it checked,
    one share from each in its inbox, at least ``t`` and its ``secagg-min-peers``); the shares
    addressed to it are kept for the unmask step."""
    state = _state(context, str(ask.get("session")))
    me, keys = int(context.node_id), json.loads(str(state["keys"]))
    try:
        _at(state, "shares", "masked-input")
        peers, bits, inbox = (
            _nodes(_json(ask, "peers", list)),
            _field(ask, "bits", int),
            _json(ask, "inbox", dict),
        )
    except _BAD as err:
        raise EngineError(
            f"secure aggregation: this node refuses a malformed masked-input request: {err}"
        ) from None
    floor = max(int(state["t"]), NodePolicy.from_context(context).min_peers)
    if me not in peers or len(peers) < floor or not {str(p) for p in peers} <= set(keys):
        raise EngineError(
            f"secure aggregation: node {me} asked to mask among {peers}: it masks only among at least "
            f"{floor} of the nodes that sent keys ({sorted(int(k) for k in keys)}), itself included"
        )
    if sorted(inbox) != sorted(str(p) for p in peers) or not 8 <= bits <= 52:
        raise EngineError(
            f"secure aggregation: node {me}'s inbox holds shares of {sorted(inbox)}, not of {peers}"
        )
    vector = encode_sums(sums, fields, bits, 2.0 ** (62 - bits) / len(peers))
    vector = np.concatenate([vector, np.ones(1, dtype=np.uint64)])  # the check word
    masked = vector + _stream(bytes(state["b"]), vector.size)
    mask_sk = bytes_to_private_key(bytes(state["mask_sk"]))
    for peer in peers:
        if peer != me:
            masked = masked + _pairwise(me, peer, mask_sk, _unb64(keys[str(peer)][1]), vector.size)
    state["inbox"], state["peers"], state["step"] = json.dumps(inbox), json.dumps(peers), "masked-input"
    return masked.astype("<u8").tobytes()


def _sign(
    context: Context, state: ConfigRecord, me: int, policy: NodePolicy, ask: Mapping, session: str
) -> dict:
    """The consistency step: sign (session, peers, survivors) — one survivor set per session."""
    _at(state, "masked-input", "consistency")
    survivors, peers = _nodes(_json(ask, "survivors", list)), json.loads(str(state["peers"]))
    floor = max(int(state["t"]), policy.min_peers)
    if me not in survivors or not set(survivors) <= set(peers) or len(survivors) < floor:
        raise EngineError(
            f"secure aggregation: node {me} signs only a survivor set of its peers {peers} holding "
            f"itself and at least {floor} nodes, not {survivors}"
        )
    state["signed"], state["step"] = json.dumps(survivors), "consistency"
    return {"sig": _identity(context).sign(_survivor_set(session, peers, survivors))}


def _reveal(state: ConfigRecord, me: int, ask: Mapping, session: str) -> dict:
    """This node's shares of the survivors' self-mask seeds and of the dropped nodes' mask keys —
    once per session, never both for one node, only for the survivor set it signed and only with
    at least ``t`` valid signatures of its peers on that very set. A share it cannot decrypt (its
    sender's fault) is named in ``bad`` instead."""
    _at(state, "consistency", "unmask")
    survivors, signatures = _nodes(_json(ask, "survivors", list)), _json(ask, "signatures", dict)
    peers, t, signed = json.loads(str(state["peers"])), int(state["t"]), json.loads(str(state["signed"]))
    if survivors != signed:
        raise EngineError(f"secure aggregation: node {me} signed survivors {signed}, not {survivors}")
    keys, message = json.loads(str(state["keys"])), _survivor_set(session, peers, survivors)
    valid = set()
    for node, sig in signatures.items():
        if node.isdigit() and int(node) in survivors:
            identity = Ed25519PublicKey.from_public_bytes(_unb64(keys[node][3]))
            try:
                identity.verify(_unb64(_str(sig)), message)
                valid.add(int(node))
            except InvalidSignature:
                pass
    if len(valid) < t:
        raise EngineError(
            f"secure aggregation: {len(valid)} valid signature(s) on the survivor set {survivors}, fewer "
            f"than the threshold {t}; node {me} reveals nothing"
        )
    state["step"] = "unmask"
    links, inbox = json.loads(str(state["links"])), json.loads(str(state["inbox"]))
    out, bad = {}, {}
    for src in peers:
        try:
            plain = decrypt(links[str(src)].encode(), _unb64(inbox[str(src)]))
            sender, dst, b_share, sk_share = share_keys_plaintext_separate(plain)
        except Exception as err:  # noqa: BLE001 - Fernet's InvalidToken and any bytes a sender made up
            bad[str(src)] = f"its share does not decrypt ({type(err).__name__})"
            continue
        if (sender, dst) != (src, me):
            bad[str(src)] = f"its share claims {sender}->{dst}"
            continue
        out[str(src)] = _b64(b_share if src in survivors else sk_share)
    return {"shares": json.dumps(out), "bad": json.dumps(bad)}
