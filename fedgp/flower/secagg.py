"""Secure aggregation of summed fields over Flower's Message API: the server learns the sum over the
nodes that completed a round, never one node's own sum.

The protocol is Bonawitz et al.'s (CCS 2017; Flower's SecAgg+ with every node a neighbour of every
other), run by :class:`~fedgp.flower.grid_engine.GridEngine` around any task whose reply declares a
summed field (the transforms' summary, Su-Xu-Yang's moments, clustered gradient sums, DP-FGPR's
clipped updates). Four exchanges per such round, all ``query.secagg`` messages but the third:

1. **keys**: each node of the round makes two fresh EC key pairs (one to encrypt shares for its
   peers, one to agree pairwise masks) and sends the public halves;
2. **shares**: the server relays every public key; each node draws a self-mask seed ``b`` and
   Shamir-shares ``b`` and its mask private key among all nodes (threshold ``t``), each share
   encrypted for its recipient;
3. **masked input**: the task itself, with the shares addressed to the node; the node runs it and
   sends its summed fields as fixed-point integers plus its self mask plus one pairwise mask per
   peer (added towards higher node ids, subtracted towards lower), all mod 2^64;
4. **unmask**: the server names the survivors (masked input received) and the dropped; each
   survivor returns its shares of the survivors' ``b`` and of the dropped nodes' mask keys. With
   ``t`` of them the server removes every mask: the pairwise masks of survivors cancel, those
   towards dropped nodes are rebuilt from their reconstructed keys.

A node never returns both kinds of share for one peer, nor answers an unmask request naming fewer
than ``t`` survivors. Below ``t`` at any step the round fails for every client in it, with the reason.

Threat model: an honest-but-curious server and up to ``t - 1`` colluding nodes (the server relays
keys, so a server that *forges* keys is outside it; Flower's SuperNode authentication and TLS are the
transport's guarantees). What is built here is only the protocol's bookkeeping; every cryptographic
step is a library's: Flower's Shamir sharing (pycryptodome) and share encryption (Fernet over an ECDH
key), ``cryptography``'s EC keys and ChaCha20. The masks are ChaCha20 keystreams, not Flower's
``pseudo_rand_gen``, whose NumPy generator is seeded with 32 bits (a server could search them).

Exactness: each summed value ``x`` is sent as ``round(x * 2**fraction_bits)`` in two's complement
mod 2^64, so the decoded sum over ``m`` nodes is within ``m * 2**-(fraction_bits + 1)`` of the float
sum (:meth:`SecureAggregation.error_bound`); a value whose encoding could overflow the sum is an
error naming the field, never clipped.
"""

from __future__ import annotations

import base64
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric import ec
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

__all__ = ["SecureAggregation", "SecAggRound", "encode_sums", "decode_sums", "handle_stage", "mask_reply"]

#: Flower message type of the protocol's key, share and unmask exchanges.
MESSAGE_TYPE = "query.secagg"
#: The config record carrying the protocol's values in a message (and a node's state between them).
RECORD = "fedgp.secagg"
_MOD = 2**64


@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation of summed fields on a Flower grid (``GridEngine(secure=...)``, the app's
    ``secure-aggregation`` run config).

    Args:
        threshold: share of a round's nodes whose unmasking shares rebuild the masks: ``t`` is the
            smallest whole number above ``threshold`` times the nodes that sent keys, and at least
            ``min_nodes``. Fewer than ``t`` survivors fail the round. Above 0.5, so that a server
            cannot learn one node's value by claiming different drops to different nodes.
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


# -- fixed-point encoding ---------------------------------------------------------------------------
def _summed(fields: Mapping[str, Field]) -> list[str]:
    return sorted(k for k, f in fields.items() if f.summed)


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


# -- the node's side --------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode())


def handle_stage(message: Message, context: Context) -> Message:
    """A node's answer to a ``query.secagg`` message (the keys, shares or unmask step); what it must
    keep between steps lives in its ``context.state`` (its own machine), never in a reply."""
    ask = message.content.config_records[RECORD]
    stage, session = str(ask["stage"]), str(ask["session"])
    me = int(context.node_id)
    if stage == "keys":
        enc_sk, enc_pk = generate_key_pairs()
        mask_sk, mask_pk = generate_key_pairs()
        context.state.config_records[RECORD] = ConfigRecord(
            {
                "session": session,
                "enc_sk": private_key_to_bytes(enc_sk),
                "mask_sk": private_key_to_bytes(mask_sk),
            }
        )
        reply = {"enc_pk": public_key_to_bytes(enc_pk), "mask_pk": public_key_to_bytes(mask_pk)}
    else:
        state = _state(context, session)
        if stage == "shares":
            reply = {"shares": json.dumps(_share(state, me, json.loads(str(ask["keys"])), int(ask["t"])))}
        elif stage == "unmask":
            reply = {"shares": json.dumps(_reveal(state, me, ask))}
        else:
            raise InputError(f"secure aggregation: unknown stage {stage!r}")
    content = RecordDict()
    content[RECORD] = ConfigRecord(reply)
    return Message(content, reply_to=message)


def _state(context: Context, session: str) -> ConfigRecord:
    state = context.state.config_records.get(RECORD)
    if state is None or str(state["session"]) != session:
        raise EngineError(f"secure aggregation: this node holds no keys for session {session}")
    return state


def _share(state: ConfigRecord, me: int, keys: dict, t: int) -> dict:
    """Draw the self-mask seed and send every peer (self included) its encrypted shares."""
    peers = sorted(int(n) for n in keys)
    if me not in peers or len(peers) < t:
        raise EngineError(f"secure aggregation: node {me} asked to share among {peers} with threshold {t}")
    b = secrets.token_bytes(32)
    b_shares = create_shares(b, t, len(peers))
    sk_shares = create_shares(_scalar(bytes_to_private_key(bytes(state["mask_sk"]))), t, len(peers))
    enc_sk = bytes_to_private_key(bytes(state["enc_sk"]))
    out, links = {}, {}
    for peer, b_share, sk_share in zip(peers, b_shares, sk_shares):
        links[str(peer)] = generate_shared_key(enc_sk, bytes_to_public_key(_unb64(keys[str(peer)][0])))
        out[str(peer)] = _b64(
            encrypt(links[str(peer)], share_keys_plaintext_concat(me, peer, b_share, sk_share))
        )
    # The share keys are kept (on this node) for decrypting at the unmask step: one ECDH per peer, not two.
    state["b"], state["keys"], state["t"] = b, json.dumps(keys), t
    state["links"] = json.dumps({k: v.decode() for k, v in links.items()})
    return out


def mask_reply(
    context: Context, ask: ConfigRecord, sums: Mapping[str, torch.Tensor], fields: Mapping[str, Field]
) -> bytes:
    """The node's summed fields, encoded (:func:`encode_sums`), plus its self mask and its pairwise
    masks towards every peer that shared (``ask["peers"]``); the shares addressed to it are kept for
    the unmask step."""
    state = _state(context, str(ask["session"]))
    me, keys = int(context.node_id), json.loads(str(state["keys"]))
    peers, bits = json.loads(str(ask["peers"])), int(ask["bits"])
    vector = encode_sums(sums, fields, bits, 2.0 ** (62 - bits) / len(peers))
    if me not in peers or len(peers) < int(state["t"]):
        raise EngineError(
            f"secure aggregation: node {me} asked to mask among {peers} (threshold {state['t']})"
        )
    masked = vector + _stream(bytes(state["b"]), vector.size)
    mask_sk = bytes_to_private_key(bytes(state["mask_sk"]))
    for peer in peers:
        if peer != me:
            masked = masked + _pairwise(me, peer, mask_sk, _unb64(keys[str(peer)][1]), vector.size)
    state["inbox"], state["peers"], state["revealed"] = str(ask["inbox"]), json.dumps(peers), False
    return masked.astype("<u8").tobytes()


def _reveal(state: ConfigRecord, me: int, ask: ConfigRecord) -> dict:
    """This node's shares of the survivors' self-mask seeds and of the dropped nodes' mask keys —
    once per session, never both for one node, and only with at least ``t`` survivors."""
    survivors, dropped = json.loads(str(ask["survivors"])), json.loads(str(ask["dropped"]))
    peers, t = json.loads(str(state["peers"])), int(state["t"])
    if bool(state["revealed"]):
        raise EngineError("secure aggregation: this node already answered the unmask step of this session")
    if set(survivors) & set(dropped) or sorted(survivors + dropped) != sorted(peers) or me not in survivors:
        raise EngineError(
            f"secure aggregation: survivors {survivors} and dropped {dropped} do not split {peers}"
        )
    if len(survivors) < t:
        raise EngineError(f"secure aggregation: {len(survivors)} survivors, fewer than the threshold {t}")
    state["revealed"] = True
    links, inbox = json.loads(str(state["links"])), json.loads(str(state["inbox"]))
    out = {}
    for src in survivors + dropped:
        key = links[str(src)].encode()
        sender, dst, b_share, sk_share = share_keys_plaintext_separate(decrypt(key, _unb64(inbox[str(src)])))
        if (sender, dst) != (src, me):
            raise EngineError(f"secure aggregation: a share claiming {sender}->{dst} arrived as {src}->{me}")
        out[str(src)] = _b64(b_share if src in survivors else sk_share)
    return out


# -- the server's side ------------------------------------------------------------------------------
Exchange = Callable[[dict[int, RecordDict]], dict[int, RecordDict | str]]


class SecAggRound:
    """The server's side of one secure round. ``exchange`` sends each node its content (all as
    ``query.secagg`` messages) and returns each node's reply content, or the reason it has none."""

    def __init__(self, settings: SecureAggregation, exchange: Exchange, nodes: Sequence[int]):
        self.settings, self.exchange = settings, exchange
        self.session = secrets.token_hex(8)
        self.nodes = sorted(nodes)
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.inbox: dict[int, dict[str, str]] = {}
        self.t = 0
        self.dropped: dict[int, str] = {}  # node -> why it left the round

    def _ask(self, stage: str, nodes: Sequence[int], extra: Callable[[int], dict] = lambda n: {}) -> dict:
        contents = {}
        for node in nodes:
            content = RecordDict()
            content[RECORD] = ConfigRecord({"stage": stage, "session": self.session, **extra(node)})
            contents[node] = content
        answers = self.exchange(contents)
        got = {}
        for node in nodes:
            answer = answers.get(node, "no reply")
            if isinstance(answer, str):
                self.dropped.setdefault(node, f"secure aggregation ({stage} step): {answer}")
            else:
                got[node] = answer.config_records[RECORD]
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
        got = self._ask("keys", self.nodes)
        self.keys = {n: (bytes(r["enc_pk"]), bytes(r["mask_pk"])) for n, r in got.items()}
        self.t = self.settings.needed(len(self.keys))
        self._check(len(self.keys), "keys")
        public = json.dumps({str(n): [_b64(a), _b64(b)] for n, (a, b) in self.keys.items()})
        got = self._ask("shares", sorted(self.keys), lambda n: {"keys": public, "t": self.t})
        self._check(len(got), "shares")
        peers = sorted(got)
        outgoing = {n: json.loads(str(r["shares"])) for n, r in got.items()}
        extra = {}
        for node in peers:
            inbox = json.dumps({str(src): outgoing[src][str(node)] for src in peers})
            extra[node] = ConfigRecord(
                {"session": self.session, "peers": json.dumps(peers), "inbox": inbox,
                 "bits": self.settings.fraction_bits}
            )  # fmt: skip
        self.peers = peers
        return extra

    def finish(self, masked: Mapping[int, bytes], fields: Mapping[str, Field]) -> dict[str, torch.Tensor]:
        """Steps 3 (the masked inputs received) and 4: the sum over ``masked``'s nodes."""
        for node in self.peers:
            if node not in masked:
                self.dropped.setdefault(node, "secure aggregation: no masked input")
        survivors = sorted(masked)
        dropped = [n for n in self.peers if n not in masked]
        self._check(len(survivors), "masked-input")
        ask = {"survivors": json.dumps(survivors), "dropped": json.dumps(dropped)}
        got = self._ask("unmask", survivors, lambda n: ask)
        self._check(len(got), "unmask")
        shares: dict[int, list[bytes]] = {n: [] for n in self.peers}
        for answer in got.values():
            for src, share in json.loads(str(answer["shares"])).items():
                shares[int(src)].append(_unb64(share))
        total = np.zeros(0, dtype=np.uint64)
        for node in survivors:
            vector = np.frombuffer(masked[node], dtype="<u8").astype(np.uint64)
            total = vector if not total.size else total + vector
        for node in survivors:
            total = total - _stream(combine_shares(shares[node][: self.t]), total.size)
        for gone in dropped:
            mask_sk = _from_scalar(combine_shares(shares[gone][: self.t]))
            for node in survivors:  # undo what each survivor added towards the dropped node
                total = total - _pairwise(node, gone, mask_sk, self.keys[node][1], total.size)
        return decode_sums(total, fields, self.settings.fraction_bits)
