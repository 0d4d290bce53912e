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

import hmac
import itertools
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from flwr.app import ConfigRecord, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares

from fedgp.errors import EngineError
from fedgp.flower.secagg_node import handle_stage, mask_reply
from fedgp.flower.secagg_parts import (
    _B_SHARE,
    _BAD,
    _SK_SHARE,
    IDENTITY,
    MESSAGE_TYPE,
    RECORD,
    SEARCH,
    NodePolicy,
    SecureAggregation,
    _Advert,
    _b64,
    _commit,
    _ec_public,
    _field,
    _from_scalar,
    _json,
    _Malformed,
    _pairwise,
    _repeated,
    _str,
    _stream,
    _summed,
    _survivor_set,
    _unb64,
    _words,
    decode_sums,
    encode_sums,
)
from fedgp.messages import Field

__all__ = [
    "MESSAGE_TYPE",
    "RECORD",
    "IDENTITY",
    "SecureAggregation",
    "SecAggRound",
    "NodePolicy",
    "encode_sums",
    "decode_sums",
    "handle_stage",
    "mask_reply",
]


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
