"""The pieces both sides of secure aggregation (:mod:`fedgp.flower.secagg`) use: its settings
and a node's own floors, the fixed-point encoding, the masks, what is signed and committed to,
and the parsing of a peer's values (every malformed value a :class:`_Malformed`)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from flwr.app import Context
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import (
    bytes_to_public_key,
)

from fedgp.errors import EngineError, InputError
from fedgp.messages import Field

__all__ = [
    "SecureAggregation",
    "NodePolicy",
    "encode_sums",
    "decode_sums",
    "MESSAGE_TYPE",
    "RECORD",
    "IDENTITY",
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
        """The floors the node config sets (``secagg-min-threshold``, ``secagg-min-peers``), checked:
        they are the node's own, whatever the server announces."""
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
