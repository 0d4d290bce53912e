"""Secure aggregation of summed fields over Flower's Message API: the server learns the sum over the
nodes that completed a round, never one node's own sum — also when the server is actively hostile,
and a hostile node can make a round fail but never make it release a wrong sum.

The protocol is Bonawitz et al.'s (CCS 2017) in its active-adversary form (Flower's SecAgg+ with
every node a neighbour of every other, plus signed key adverts and a consistency round), run by
:class:`~fedgp.flower.grid_engine.GridEngine` around any task whose reply declares a summed field
(the transforms' summary, Su-Xu-Yang's moments, clustered gradient sums, DP-FGPR's clipped
updates). Five exchanges per such round, all ``query.secagg`` messages but the third:

1. **keys**: each node makes two fresh EC key pairs (one to encrypt shares for its peers, one to
   agree pairwise masks) and draws its self-mask seed ``b``; it sends the public halves and a hash
   commitment to ``b``, signed with its Ed25519 identity key (kept in ``context.state``, or the
   node config's ``secagg-identity-key``), whose public half it sends too;
2. **shares**: the server relays every advert and the threshold ``t``; each node checks every
   signature (and, with a ``secagg-roster``, every identity key), that no key repeats, and that
   ``t`` and the node count meet its own floors (node config ``secagg-min-threshold``,
   ``secagg-min-peers``) whatever the server announced; then it Shamir-shares ``b`` and its mask
   private key among all nodes (threshold ``t``), each share encrypted for its recipient;
3. **masked input**: the task itself, with the shares addressed to the node; the node checks the
   peer list (nodes that sent keys, a share for each, at least ``t`` and its floor), runs the task
   and sends its summed fields as fixed-point integers plus a check word of 1, plus its self mask
   and one pairwise mask per peer (added towards higher node ids, subtracted towards lower), mod 2^64;
4. **consistency**: the server names the survivors (masked input received); each survivor signs
   (session, peers, survivors) — once per session;
5. **unmask**: the server sends the signatures; a node that signed that very set and sees at least
   ``t`` valid signatures on it returns its shares of the survivors' ``b`` and of the dropped nodes'
   mask keys. With ``t`` of them the server removes every mask.

Threat model: a server that may deviate from the protocol (announce any threshold or peer list, tell
different nodes different survivors, replay or alter messages) and up to ``t - 1`` nodes colluding
with it learn no honest node's own value, provided ``t > (n + colluders) / 2``: an honest node signs
one survivor set per session and reveals only for the set it signed with ``t`` signatures on it, so
no two survivor sets both get their shares. Without ``secagg-roster`` the identity keys are the ones
the server relays: a server that forges whole nodes (Sybils with keys of its own) is outside the
model; with it, every identity key must be on the node's roster. Flower's SuperNode authentication
and TLS are the transport's guarantees.

Hostile nodes: every reply is checked; a malformed one (missing record, wrong type or length, a bad
signature, repeated keys, an unknown, missing or mis-indexed share) drops that node from the round
with the reason, never an exception. An altered share that is well formed is caught at
reconstruction, since each ``b`` is committed to and each mask key is fixed by its public key:
other share subsets are tried (up to :data:`SEARCH` of them) to name the sender, and the round is
refused. A garbage masked input of the right length cannot be attributed, but it is caught after
unmasking: its check word differs from 1 except with probability 2^-64 (a random word), and a
crafted one that keeps the check word puts each other word outside the range honest nodes can sum
to with probability at least 1/2 (the summed range is at most half of Z_2^64); the round is then
refused. What a hostile node can still do is bias its own contribution inside that range — as
lying about its data does; secure sums hide each node's value, so no robust rule can bound it.

What is built here is only the protocol's bookkeeping; every cryptographic step is a library's:
Flower's Shamir sharing (pycryptodome) and share encryption (Fernet over an ECDH key),
``cryptography``'s EC keys, Ed25519 signatures, SHA-256 and ChaCha20. The masks are ChaCha20
keystreams, not Flower's ``pseudo_rand_gen``, whose NumPy generator is seeded with 32 bits.

Exactness: each summed value ``x`` is sent as ``round(x * 2**fraction_bits)`` in two's complement
mod 2^64, so the decoded sum over ``m`` nodes is within ``m * 2**-(fraction_bits + 1)`` of the float
sum (:meth:`SecureAggregation.error_bound`); a value whose encoding could overflow the sum is an
error naming the field, never clipped.
"""

from __future__ import annotations

import base64
import hmac
import itertools
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
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
from fedgp.messages import Field

__all__ = [
    "SecureAggregation",
    "SecAggRound",
    "NodePolicy",
    "encode_sums",
    "decode_sums",
    "handle_stage",
    "mask_reply",
]

#: Flower message type of the protocol's key, share, consistency and unmask exchanges.
MESSAGE_TYPE = "query.secagg"
#: The config record carrying the protocol's values in a message (and a node's state between them).
RECORD = "fedgp.secagg"
#: The config record of a node's state holding its Ed25519 identity key (kept across sessions).
IDENTITY = "fedgp.secagg.identity"
#: Share subsets the server tries, per secret, to rebuild it when the first ``t`` shares do not fit.
SEARCH = 2000
_MOD = 2**64
#: Byte lengths of one Shamir share (Flower's format: 4-byte index, 16 bytes per padded 16-byte chunk)
#: of a 32-byte self-mask seed and of a 48-byte P-384 scalar.
_B_SHARE, _SK_SHARE = 4 + 48, 4 + 64


@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation of summed fields on a Flower grid (``GridEngine(secure=...)``, the app's
    ``secure-aggregation`` run config).

    Args:
        threshold: share of a round's nodes whose unmasking shares rebuild the masks: ``t`` is the
            smallest whole number above ``threshold`` times the nodes that sent keys, and at least
            ``min_nodes``. Fewer than ``t`` survivors fail the round. At least 0.5, so that a server
            cannot learn one node's value by claiming different drops to different nodes (with
            ``c`` nodes colluding with the server, choose it above ``(n + c) / 2n``).
        fraction_bits: bits after the binary point of the fixed-point encoding; the absolute error
            of a sum over ``m`` nodes is at most ``m * 2**-(fraction_bits + 1)`` and each node's
            values must stay below ``2**(62 - fraction_bits) / m`` in magnitude.
        min_nodes: fewest nodes whose sum is released; a round with fewer fails (a one-node "sum" is
            that node's value).
    """

    threshold: float = 0.5
    fraction_bits: int = 32
    min_nodes: int = 2

    def __post_init__(self):
        if not 0.5 <= self.threshold < 1:
            raise InputError(f"SecureAggregation.threshold must be in [0.5, 1), got {self.threshold!r}")
        if not 8 <= self.fraction_bits <= 52:
            raise InputError(f"SecureAggregation.fraction_bits must be in 8..52, got {self.fraction_bits!r}")
        if self.min_nodes < 2:
            raise InputError(f"SecureAggregation.min_nodes must be at least 2, got {self.min_nodes!r}")

    @classmethod
    def from_json(cls, text: str) -> SecureAggregation | None:
        """The settings from JSON (``{}``: the defaults; empty text: no secure aggregation)."""
        if not text.strip():
            return None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"secure-aggregation settings are not JSON ({err}): {text!r}") from None
        if not isinstance(values, dict):
            raise InputError(f"secure-aggregation settings must be a JSON object, e.g. {{}}, got {text!r}")
        unknown = set(values) - {"threshold", "fraction_bits", "min_nodes"}
        if unknown:
            raise InputError(f"secure-aggregation: unknown settings {sorted(unknown)} in {text!r}")
        return cls(**values)

    def to_json(self) -> str:
        """The settings as JSON (what ``secure-aggregation`` in a run config takes)."""
        return json.dumps(asdict(self))

    def needed(self, nodes: int) -> int:
        """``t``: the shares (and survivors) needed among ``nodes`` that sent keys."""
        return max(self.min_nodes, math.floor(self.threshold * nodes) + 1)

    def limit(self, nodes: int) -> float:
        """The largest magnitude a node's summed value may have when ``nodes`` add up."""
        return 2.0 ** (62 - self.fraction_bits) / max(nodes, 1)

    def error_bound(self, nodes: int) -> float:
        """The most a decoded sum over ``nodes`` differs from the float sum of their values."""
        return nodes * 2.0 ** -(self.fraction_bits + 1)


@dataclass(frozen=True)
class NodePolicy:
    """What a node accepts whatever the server announces, from its node config.

    Args:
        min_threshold: ``secagg-min-threshold``: the node shares only if ``t`` is above this share of
            the nodes that sent keys (default 0.5, in [0.5, 1)).
        min_peers: ``secagg-min-peers``: the fewest nodes (itself included) the node shares among,
            masks among and signs a survivor set of (default 2).
        roster: ``secagg-roster``: a file of trusted Ed25519 identity public keys (base64 of the raw
            32 bytes, one a line, ``#`` comments); every node of a round must advertise one of them
            (``None``: any key the server relays).
    """

    min_threshold: float = 0.5
    min_peers: int = 2
    roster: frozenset[bytes] | None = None

    @classmethod
    def from_context(cls, context: Context) -> NodePolicy:
        config = context.node_config
        try:
            low = float(config.get("secagg-min-threshold", 0.5))
            peers = int(config.get("secagg-min-peers", 2))
        except (TypeError, ValueError) as err:
            raise InputError(f"node config secagg-min-threshold/secagg-min-peers: {err}") from None
        if not 0.5 <= low < 1:
            raise InputError(f"node config secagg-min-threshold must be in [0.5, 1), got {low!r}")
        if peers < 2:
            raise InputError(f"node config secagg-min-peers must be at least 2, got {peers!r}")
        roster = None
        if config.get("secagg-roster"):
            path = Path(str(config["secagg-roster"])).expanduser()
            try:
                lines = path.read_text().splitlines()
                roster = frozenset(
                    base64.b64decode(s.strip(), validate=True)
                    for s in lines
                    if s.strip() and not s.lstrip().startswith("#")
                )
            except (OSError, ValueError) as err:
                raise InputError(f"node config secagg-roster {str(path)!r}: {err}") from None
        return cls(low, peers, roster)

    def check(self, nodes: int, t: int) -> None:
        """Refuse a round of ``nodes`` nodes with threshold ``t`` below this node's floors."""
        need = math.floor(self.min_threshold * nodes) + 1
        if nodes < self.min_peers or not need <= t <= nodes:
            raise EngineError(
                f"secure aggregation: this node shares only among at least {self.min_peers} nodes with a "
                f"threshold of at least {need} of {nodes} (node config secagg-min-threshold="
                f"{self.min_threshold}, secagg-min-peers={self.min_peers}); the server announced t={t}"
            )


# -- fixed-point encoding ---------------------------------------------------------------------------
def _summed(fields: Mapping[str, Field]) -> list[str]:
    return sorted(k for k, f in fields.items() if f.summed)


def _words(fields: Mapping[str, Field]) -> int:
    """The length of a masked input: every summed value, plus the check word."""
    return sum(math.prod(tuple(fields[name].shape)) for name in _summed(fields)) + 1


def encode_sums(
    sums: Mapping[str, torch.Tensor], fields: Mapping[str, Field], fraction_bits: int, limit: float
) -> np.ndarray:
    """A node's summed fields as one ``uint64`` vector (names in order, each ``round(x * 2**bits)``
    in two's complement); a field the node has no sum of (none of its clients replied) is zeros."""
    parts = []
    for name in _summed(fields):
        shape = tuple(fields[name].shape)
        value = sums.get(name)
        x = np.zeros(shape) if value is None else value.detach().to(torch.float64).cpu().numpy()
        if x.shape != shape:
            raise InputError(
                f"secure aggregation: summed field {name!r} has shape {x.shape}, declared {shape}"
            )
        big = np.abs(x)
        if not np.all(np.isfinite(x)) or (big.size and big.max() >= limit):
            worst = x.flat[int(np.argmax(np.where(np.isfinite(x), big, np.inf)))]
            raise InputError(
                f"secure aggregation: summed field {name!r} holds {worst:.6g}, outside the encodable range "
                f"±{limit:.6g} (fraction_bits={fraction_bits}); lower fraction_bits or rescale the data"
            )
        parts.append(np.rint(np.ldexp(x, fraction_bits)).astype(np.int64).reshape(-1))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat.view(np.uint64)


def decode_sums(
    vector: np.ndarray, fields: Mapping[str, Field], fraction_bits: int
) -> dict[str, torch.Tensor]:
    """The summed fields from an unmasked ``uint64`` sum (the inverse of :func:`encode_sums`)."""
    values = np.ldexp(vector.view(np.int64).astype(np.float64), -fraction_bits)
    out, start = {}, 0
    for name in _summed(fields):
        shape = tuple(fields[name].shape)
        size = math.prod(shape)
        out[name] = torch.from_numpy(values[start : start + size].reshape(shape).copy())
        start += size
    return out


def _stream(key: bytes, size: int) -> np.ndarray:
    """``size`` uint64 words of ChaCha20 keystream under a 32-byte key (each key masks one message)."""
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * size)), dtype="<u8").astype(np.uint64)


def _scalar(private: ec.EllipticCurvePrivateKey) -> bytes:
    """A P-384 private key as its 48-byte scalar: what is Shamir-shared (a fifth of its PEM's size;
    Flower's sharing is pure Python, 16 bytes at a time)."""
    return private.private_numbers().private_value.to_bytes(48, "big")


def _from_scalar(secret: bytes) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(int.from_bytes(secret, "big"), ec.SECP384R1())


def _pairwise(
    me: int, peer: int, private: ec.EllipticCurvePrivateKey, public: bytes, size: int
) -> np.ndarray:
    """The mask ``me`` adds for ``peer``: +stream towards a higher node id, -stream towards a lower."""
    key = base64.urlsafe_b64decode(generate_shared_key(private, bytes_to_public_key(public)))
    stream = _stream(key, size)
    return stream if me < peer else (np.uint64(0) - stream)


# -- what is signed and committed to ----------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)


def _frame(tag: str, *parts) -> bytes:
    """An unambiguous byte string to sign or hash: JSON of a tag and the parts, bytes as base64."""
    return json.dumps([tag, *(_b64(p) if isinstance(p, bytes) else p for p in parts)]).encode()


def _commit(session: str, node: int, b: bytes) -> bytes:
    """The hash commitment to a node's self-mask seed (``b`` is 32 random bytes: hiding as it is)."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(_frame("fedgp.secagg.b", session, node, b))
    return digest.finalize()


class _Malformed(ValueError):
    """A protocol message that is not what the protocol makes (its reason)."""


#: What parsing an untrusted message may raise: each is that message's sender's fault.
_BAD = (_Malformed, ValueError, TypeError, KeyError, OverflowError, UnsupportedAlgorithm, InvalidSignature)


class _Advert(NamedTuple):
    """A node's signed key advertisement (step 1): its public keys, ``b``'s commitment, identity."""

    enc_pk: bytes
    mask_pk: bytes
    commit: bytes
    id_pk: bytes
    sig: bytes

    @classmethod
    def parse(cls, record: Mapping, session: str, node: int) -> _Advert:
        """The advert in ``record`` (a reply, or a relayed list), checked: keys of the protocol's
        curve, a 32-byte commitment, a valid signature by the identity key on all of it."""
        advert = cls(*(_field(record, name, bytes) for name in cls._fields))
        _ec_public(advert.enc_pk), _ec_public(advert.mask_pk)
        if len(advert.commit) != 32:
            raise _Malformed(f"a commitment of {len(advert.commit)} bytes, not 32")
        identity = Ed25519PublicKey.from_public_bytes(advert.id_pk)
        try:
            identity.verify(advert.sig, advert.signed(session, node))
        except InvalidSignature:
            raise _Malformed("its key advert's signature does not verify") from None
        return advert

    def signed(self, session: str, node: int) -> bytes:
        return _frame("fedgp.secagg.keys", session, node, self.enc_pk, self.mask_pk, self.commit, self.id_pk)

    def to_json(self) -> list[str]:
        return [_b64(v) for v in self]

    @classmethod
    def from_json(cls, values) -> dict:
        if not isinstance(values, list) or len(values) != len(cls._fields):
            raise _Malformed(f"an advert must be {len(cls._fields)} base64 strings")
        return {k: _unb64(_str(v)) for k, v in zip(cls._fields, values)}


def _field(record: Mapping, name: str, kind: type):
    if name not in record:
        raise _Malformed(f"no {name!r}")
    value = record[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Malformed(f"{name!r} is {type(value).__name__}, not {kind.__name__}")
    return value


def _str(value) -> str:
    if not isinstance(value, str):
        raise _Malformed(f"{type(value).__name__} where text belongs")
    return value


def _json(record: Mapping, name: str, kind: type):
    value = json.loads(_field(record, name, str))
    if not isinstance(value, kind):
        raise _Malformed(f"{name!r} is JSON {type(value).__name__}, not {kind.__name__}")
    return value


def _nodes(values) -> list[int]:
    """A list of distinct node ids, sorted (a set as the protocol sends it)."""
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise _Malformed(f"{values!r} is not a list of node ids")
    if len(set(values)) != len(values):
        raise _Malformed(f"node ids repeat in {values}")
    return sorted(values)


def _ec_public(data: bytes) -> ec.EllipticCurvePublicKey:
    key = bytes_to_public_key(data)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise _Malformed("a public key that is not on the protocol's curve (P-384)")
    return key


def _survivor_set(session: str, peers: Sequence[int], survivors: Sequence[int]) -> bytes:
    """What a node signs at the consistency step: the session, its peers and the survivors."""
    return _frame("fedgp.secagg.survivors", session, sorted(peers), sorted(survivors))


def _repeated(adverts: Mapping[int, _Advert]) -> dict[int, int]:
    """Nodes whose public keys (any of the three) another node advertised too: node -> that node.
    Both leave: which of them made its keys cannot be told, and two nodes with one mask key would
    have pairwise masks that cancel."""
    seen, out = {}, {}
    for node in sorted(adverts):
        for key in (adverts[node].enc_pk, adverts[node].mask_pk, adverts[node].id_pk):
            if key in seen and seen[key] != node:
                out.setdefault(node, seen[key])
                out.setdefault(seen[key], node)
            seen.setdefault(key, node)
    return out


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


# -- the server's side ------------------------------------------------------------------------------
Exchange = Callable[[dict[int, RecordDict]], dict[int, RecordDict | str]]


def _combine(shares: Sequence[bytes]) -> bytes | None:
    """The secret ``shares`` rebuild, or ``None`` where Flower's combining refuses them."""
    try:
        return combine_shares(list(shares))
    except Exception:  # noqa: BLE001 - pycryptodome's errors on shares a node made up are not documented
        return None


class SecAggRound:
    """The server's side of one secure round. ``exchange`` sends each node its content (all as
    ``query.secagg`` messages) and returns each node's reply content, or the reason it has none.

    Every reply is checked before it is used; a node whose reply is not what the protocol makes
    leaves the round with the reason (``dropped``), as a node that did not reply does."""

    def __init__(self, settings: SecureAggregation, exchange: Exchange, nodes: Sequence[int]):
        self.settings, self.exchange = settings, exchange
        self.session = secrets.token_hex(8)
        self.nodes = sorted(nodes)
        self.adverts: dict[int, _Advert] = {}
        self.peers: list[int] = []
        self.t = 0
        self.dropped: dict[int, str] = {}  # node -> why it left the round
        self.complaints: dict[int, list[str]] = {}  # node -> revealing nodes that could not open its share

    def _ask(
        self,
        stage: str,
        nodes: Sequence[int],
        parse: Callable[[int, Mapping], object],
        extra: Callable[[int], dict],
    ) -> dict:
        """One exchange: each node's reply, parsed by ``parse`` (which raises on a malformed one)."""
        contents = {}
        for node in nodes:
            content = RecordDict()
            content[RECORD] = ConfigRecord({"stage": stage, "session": self.session, **extra(node)})
            contents[node] = content
        answers = self.exchange(contents)
        got = {}
        for node in nodes:
            answer = answers.get(node, "no reply")
            try:
                if isinstance(answer, str):
                    raise EngineError(answer)
                record = answer.config_records.get(RECORD)
                if record is None:
                    raise _Malformed(f"a reply without the {RECORD!r} record")
                got[node] = parse(node, record)
            except EngineError as err:
                self.dropped.setdefault(node, f"secure aggregation ({stage} step): {err}")
            except _BAD as err:
                why = str(err) or type(err).__name__  # InvalidSignature says nothing more
                self.dropped.setdefault(node, f"secure aggregation ({stage} step): malformed reply: {why}")
        return got

    def _check(self, alive: int, stage: str) -> None:
        if alive < max(self.t, self.settings.min_nodes):
            raise EngineError(
                f"secure aggregation: {alive} node(s) left after the {stage} step, fewer than the "
                f"{max(self.t, self.settings.min_nodes)} needed; the round's sums are not released"
            )

    def setup(self) -> dict[int, ConfigRecord]:
        """Steps 1 and 2; returns, per node still in, what its task message must carry."""
        self._check(len(self.nodes), "start")
        adverts = self._ask("keys", self.nodes, lambda n, r: _Advert.parse(r, self.session, n), lambda n: {})
        for node, first in _repeated(adverts).items():
            self.dropped.setdefault(
                node, f"secure aggregation (keys step): its public keys are node {first}'s too"
            )
        self.adverts = {n: a for n, a in adverts.items() if n not in self.dropped}
        self.t = self.settings.needed(len(self.adverts))
        self._check(len(self.adverts), "keys")
        public = json.dumps({str(n): a.to_json() for n, a in self.adverts.items()})
        wanted = {str(n) for n in self.adverts}

        def parse(node: int, record: Mapping) -> dict[str, str]:
            shares = _json(record, "shares", dict)
            if set(shares) != wanted:
                raise _Malformed(f"shares for nodes {sorted(shares)}, not for {sorted(wanted)}")
            for value in shares.values():
                if not 0 < len(_unb64(_str(value))) <= 4096:
                    raise _Malformed("an encrypted share of the wrong size")
            return shares

        outgoing = self._ask("shares", sorted(self.adverts), parse, lambda n: {"keys": public, "t": self.t})
        self._check(len(outgoing), "shares")
        self.peers = peers = sorted(outgoing)
        extra = {}
        for node in peers:
            inbox = json.dumps({str(src): outgoing[src][str(node)] for src in peers})
            extra[node] = ConfigRecord(
                {"session": self.session, "peers": json.dumps(peers), "inbox": inbox,
                 "bits": self.settings.fraction_bits}
            )  # fmt: skip
        return extra

    def masked_input(self, node: int, content: RecordDict, fields: Mapping[str, Field]) -> bytes | None:
        """Node ``node``'s masked input from its task reply, or ``None`` (the node then leaves the
        round, with the reason in ``dropped``) when it is missing or not of the round's length."""
        record = content.config_records.get(RECORD)
        return self._masked(node, record if record is not None else {}, fields)

    def _masked(self, node: int, record: Mapping, fields: Mapping[str, Field]) -> bytes | None:
        try:
            if node not in self.peers:
                raise _Malformed("a masked input from a node that is not one of the round's peers")
            if "masked" not in record:
                raise _Malformed(f"no {RECORD!r} record with a masked input")
            masked = _field(record, "masked", bytes)
            if len(masked) != 8 * _words(fields):
                raise _Malformed(f"{len(masked)} bytes, not the round's {8 * _words(fields)}")
            return masked
        except _BAD as err:
            self.dropped.setdefault(node, f"secure aggregation: malformed masked input: {err}")
            return None

    def finish(self, masked: Mapping[int, bytes], fields: Mapping[str, Field]) -> dict[str, torch.Tensor]:
        """Steps 3 (the masked inputs received, each checked by :meth:`masked_input`), 4 and 5:
        the sum over ``masked``'s nodes, or an :class:`EngineError` saying why it is not released."""
        masked = {n: v for n, v in masked.items() if self._masked(n, {"masked": v}, fields) is not None}
        for node in self.peers:
            if node not in masked:
                self.dropped.setdefault(node, "secure aggregation: no masked input")
        survivors = sorted(masked)
        dropped = [n for n in self.peers if n not in survivors]
        self._check(len(survivors), "masked-input")
        statement = _survivor_set(self.session, self.peers, survivors)

        def signed(node: int, record: Mapping) -> bytes:
            sig = _field(record, "sig", bytes)
            Ed25519PublicKey.from_public_bytes(self.adverts[node].id_pk).verify(sig, statement)
            return sig

        ask = {"survivors": json.dumps(survivors)}
        signatures = self._ask("consistency", survivors, signed, lambda n: ask)
        self._check(len(signatures), "consistency")
        ask = {**ask, "signatures": json.dumps({str(n): _b64(s) for n, s in signatures.items()})}
        got = self._ask(
            "unmask", sorted(signatures), lambda n, r: self._shares(n, r, survivors), lambda n: ask
        )
        self._check(len(got), "unmask")
        total = np.zeros(_words(fields), dtype=np.uint64)
        for node in survivors:
            total = total + np.frombuffer(masked[node], dtype="<u8").astype(np.uint64)
        for node in survivors:
            b = self._rebuild(node, "self-mask seed", {r: s[node] for r, s in got.items() if node in s})
            total = total - _stream(b, total.size)
        for gone in dropped:
            secret = self._rebuild(gone, "mask key", {r: s[gone] for r, s in got.items() if gone in s})
            mask_sk = _from_scalar(secret)
            for node in survivors:  # undo what each survivor added towards the dropped node
                total = total - _pairwise(node, gone, mask_sk, self.adverts[node].mask_pk, total.size)
        self._in_range(total, fields, len(survivors))
        return decode_sums(total[:-1], fields, self.settings.fraction_bits)

    def _shares(self, node: int, record: Mapping, survivors: Sequence[int]) -> dict[int, bytes]:
        """A node's unmask reply, checked: one share of each peer (or the reason it has none, in
        ``bad``), of the right kind and length, with the node's own Shamir index."""
        shares, bad = _json(record, "shares", dict), _json(record, "bad", dict)
        if set(shares) & set(bad) or set(shares) | set(bad) != {str(p) for p in self.peers}:
            raise _Malformed(
                f"shares of {sorted(shares)} and none of {sorted(bad)}, not one for each of {self.peers}"
            )
        index, out = sorted(self.adverts).index(node) + 1, {}  # shares were made among all that sent keys
        for src, text in shares.items():
            share, owner = _unb64(_str(text)), int(src)
            size = _B_SHARE if owner in survivors else _SK_SHARE
            if len(share) != size or int.from_bytes(share[:4], "little") != index:
                raise _Malformed(
                    f"its share of node {owner}'s {'seed' if owner in survivors else 'mask key'} has "
                    f"{len(share)} bytes and index {int.from_bytes(share[:4], 'little')}, "
                    f"not {size} and {index}"
                )
            out[owner] = share
        for src, why in bad.items():
            self.complaints.setdefault(int(src), []).append(f"node {node}: {_str(why)[:200]}")
        return out

    def _rebuild(self, owner: int, kind: str, shares: Mapping[int, bytes]) -> bytes:
        """Node ``owner``'s seed or mask key from ``shares`` (revealing node -> share), checked
        against its commitment or public key. When the first ``t`` do not fit, other subsets are
        tried to name the nodes whose shares do not; either way the round is refused."""

        def fits(secret: bytes | None) -> bool:
            if secret is None:
                return False
            if kind == "self-mask seed":
                return hmac.compare_digest(_commit(self.session, owner, secret), self.adverts[owner].commit)
            if len(secret) != 48 or not 0 < int.from_bytes(secret, "big"):
                return False
            try:
                public = _from_scalar(secret).public_key().public_numbers()
            except ValueError:
                return False
            return public == _ec_public(self.adverts[owner].mask_pk).public_numbers()

        order, t = sorted(shares), self.t
        if len(order) < t:
            complaints = "".join(f" ({c} could not open its share)" for c in self.complaints.get(owner, []))
            raise EngineError(
                f"secure aggregation: {len(order)} share(s) of node {owner}'s {kind}, fewer than the "
                f"threshold {t}{complaints}; the round's sums are not released"
            )
        secret = _combine([shares[n] for n in order[:t]])
        if fits(secret):
            return secret
        for subset in itertools.islice(itertools.combinations(order, t), SEARCH):
            if fits(_combine([shares[n] for n in subset])):
                base = [shares[n] for n in subset[: t - 1]]
                wrong = [n for n in order if n not in subset and not fits(_combine([*base, shares[n]]))]
                if not wrong:
                    break
                for node in wrong:
                    self.dropped.setdefault(
                        node, f"secure aggregation: sent a share of node {owner}'s {kind} that does not fit"
                    )
                raise EngineError(
                    f"secure aggregation: node(s) {', '.join(map(str, wrong))} sent a share of node "
                    f"{owner}'s {kind} that does not fit its commitment; the round's sums are not released"
                )
        raise EngineError(
            f"secure aggregation: the shares of node {owner}'s {kind} from nodes {order} rebuild nothing "
            f"that fits its commitment (fewer than {t} of them fit, or more than {SEARCH} subsets to try); "
            "the round's sums are not released"
        )

    def _in_range(self, total: np.ndarray, fields: Mapping[str, Field], survivors: int) -> None:
        """Refuse an unmasked sum no set of honest nodes makes: a check word other than the number
        of survivors, or a value beyond what ``survivors`` nodes within the encoding's limit add up to."""
        if int(total[-1]) != survivors:
            raise EngineError(
                f"secure aggregation: the unmasked check word is {int(total[-1])}, not the {survivors} "
                "survivors: a node's masked input is not what the protocol makes (altered, or masks left "
                "out); which node cannot be told; the round's sums are not released"
            )
        values = np.abs(total[:-1].view(np.int64).astype(np.float64))
        bound = survivors * (2.0**62 / len(self.peers) + 1)
        if np.any(values > bound):
            at, start = int(np.argmax(values > bound)), 0
            for name in _summed(fields):
                start += math.prod(tuple(fields[name].shape))
                if at < start:
                    break
            raise EngineError(
                f"secure aggregation: the unmasked sum of {name!r} is beyond what {survivors} nodes within "
                "the encoding's range can add up to: a node's masked input is not what the protocol "
                "makes; which node cannot be told; the round's sums are not released"
            )
