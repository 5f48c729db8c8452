"""Authenticated key establishment over an untrusted store.

The process group and its store belong to the host, which the threat model does not
trust (it can read and rewrite everything they carry). So every rank draws a fresh
X25519 key pair, signs its public half with its long-term Ed25519 *identity* key, and
publishes ``(rank, world size, settings digest, X25519 public key, identity public key,
nonce, evidence, signature)``. Every rank checks every other rank's message:

- the signature verifies under the identity key it carries, and
- an :class:`AttestationVerifier` accepts that identity key (and its evidence) for that
  rank. The first verifier is :class:`Allowlist`: a file of identity public keys written
  by ``ccddp keygen``. A real attestation verifier (SEV-SNP / TDX quote, NVIDIA GPU
  attestation) plugs in at the same seam: it checks that a quote vouches for the identity
  key *and* for the ``binding`` hash of this run's message.

Pairwise X25519 secrets then give each directed link its AES-256 key through
:func:`ccddp.crypto.keys.derive_link_key` (HKDF: session id, src, dst, epoch), where the
session id is a hash of the whole signed transcript. A second round confirms keys: each
rank sends every peer a MAC of the transcript under their pair key, so ranks that were
shown different transcripts (a split view) fail before any training byte moves. Rank 0
also sends every peer the group secret (for group-key all-gather and purpose keys)
wrapped under their pair key.

A failure one rank detects is announced to all in the next round, so every rank fails
with the same clear message instead of some ranks waiting on a peer that gave up. A third
round carries each rank's *verdict* on the second: "verified" is a MAC to every peer under
their pair key, bound to the transcript, so a rank goes on only when every peer proves it
verified too -- the host cannot make a rank go on by forging or replaying a peer's "ok".
A failure is a plain one-line reason; the host can forge one, which only stops the run
(denial of service, always in the host's power anyway).

Example::

    ident = Identity.generate("node0-gpu0")
    allow = Allowlist({"node0-gpu0": ident.public_bytes})
    est = KeyEstablishment(ident, allow)
    keys = est.run(rank=0, world_size=1, exchange=lambda blob: [blob])
    keys.session_id          # 16 bytes, fresh every run

``ccddp.comm.session.establish(transport, settings, KeyEstablishment.from_env())`` does
this on a process group's links; ``CCDDP_IDENTITY`` / ``CCDDP_ALLOWLIST`` select it
without code changes (``ccddp.comm.session.key_source_from_env``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import numbers
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ccddp.config import read_bounded
from ccddp.crypto.keys import KEY_BYTES, SESSION_ID_BYTES, GroupSecret, _hkdf, derive_link_key
from ccddp.crypto.wirejson import parse_json
from ccddp.errors import AttestationError, ConfigError, EstablishmentError, one_line

ENV_IDENTITY = "CCDDP_IDENTITY"
ENV_ALLOWLIST = "CCDDP_ALLOWLIST"
ENV_ATTESTATION_POLICY = "CCDDP_ATTESTATION_POLICY"
ENV_ATTESTATION_CERTS = "CCDDP_ATTESTATION_CERTS"
ALLOWLIST_FORMAT = "ccddp-allowlist/1"

_MAGIC = b"ccddp-est/v1"  # 12 bytes
_BODY = struct.Struct(">12sII32s32s32s16s")  # magic, rank, world, context, x25519, ed25519, nonce
_SIG_BYTES = 64
_MAX_EVIDENCE = 1 << 20
# ~130 bytes an identity: room for half a million.
# An Ed25519 private key in PEM is under 200 bytes; anything far larger is not one.
_MAX_IDENTITY_BYTES = 1 << 16
_MAX_ALLOWLIST_BYTES = 1 << 26
_CONFIRM_BYTES = 16
_WRAPPED_BYTES = KEY_BYTES + 16
_LABEL = b"ccddp/v1/est/"
_OK, _FAIL = b"\x00", b"\x01"   # the first byte of a round-2 reply or a verdict


Exchange = Callable[[bytes], "list[bytes]"]


def fingerprint(public_key: bytes) -> str:
    """Short, printable name of a public key (first 8 bytes of its SHA-256, hex)."""
    return hashlib.sha256(public_key).hexdigest()[:16]


# -- identities ----------------------------------------------------------------------

class Identity:
    """A rank's long-term Ed25519 identity key.

    Example::

        ident = Identity.generate("node0-gpu0")
        ident.save("id0.pem")
        Identity.from_file("id0.pem").public_bytes == ident.public_bytes
    """

    def __init__(self, private_key: Ed25519PrivateKey, name: str = "") -> None:
        self._key = private_key
        self.name = name
        self.public_bytes = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                  serialization.PublicFormat.Raw)

    def __repr__(self) -> str:
        return f"Identity({self.name!r}, {fingerprint(self.public_bytes)})"

    @classmethod
    def generate(cls, name: str = "") -> "Identity":
        return cls(Ed25519PrivateKey.generate(), name)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Identity":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"identity key file {p} does not exist (create it with `ccddp keygen`)")
        # The path may come from the environment (CCDDP_IDENTITY): read no more than a key's size.
        data = read_bounded(p, what=f"identity key file {p}", max_bytes=_MAX_IDENTITY_BYTES)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"identity key file {p} is not a PEM private key: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"identity key file {p} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key, p.stem)

    def save(self, path: str | os.PathLike) -> None:
        """Write the private key as PEM (PKCS#8), readable by the owner only."""
        pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        p = Path(path)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        os.chmod(p, 0o600)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)


# -- the verifier seam -------------------------------------------------------------------

@runtime_checkable
class AttestationVerifier(Protocol):
    """Decides whether a peer may join. Implement both methods to plug in attestation.

    ``binding`` is a 32-byte hash of the rank's establishment message for *this run* (its
    fresh X25519 key, nonce, rank, settings). A hardware-attestation verifier puts it in
    the quote's user-data field in :meth:`evidence` and checks it in :meth:`verify`, so a
    quote cannot be replayed to vouch for another key.
    """

    def evidence(self, identity: Identity, binding: bytes) -> bytes:
        """Evidence this rank presents along with its message (e.g. an attestation quote)."""
        ...

    def verify(self, rank: int, identity_public: bytes, evidence: bytes, binding: bytes) -> str:
        """Return a printable name for the peer, the job's rank ``rank`` (its global rank,
        in a subgroup too), or raise :class:`EstablishmentError`."""
        ...


class Allowlist:
    """The first :class:`AttestationVerifier`: a fixed set of identity public keys.

    File format (JSON, written by ``ccddp keygen``)::

        {"format": "ccddp-allowlist/1",
         "identities": [{"name": "rank0", "public_key": "<64 hex digits>", "ranks": [0]}]}

    ``ranks`` is optional; when present the key may only be used by those ranks.

    Example::

        allow = Allowlist.from_file("keys/allowlist.json")
        allow.verify(0, ident.public_bytes, b"", binding=b"\\0" * 32)   # -> "rank0"
    """

    def __init__(self, keys: Mapping[str, bytes], ranks: Mapping[str, "list[int] | None"] | None = None) -> None:
        self._by_key: dict[bytes, tuple[str, frozenset[int] | None]] = {}
        for name, pub in keys.items():
            if len(pub) != 32:
                raise ConfigError(f"allowlist entry {name!r}: an Ed25519 public key is 32 bytes, got {len(pub)}")
            self._by_key[bytes(pub)] = (name, _rank_set(name, (ranks or {}).get(name)))

    def __len__(self) -> int:
        return len(self._by_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Allowlist":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"allowlist {p} does not exist (create it with `ccddp keygen`)")
        # A local file, but one an operator may copy from elsewhere: refused with a
        # ConfigError however it is malformed (parse_json bounds its size and nesting).
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"allowlist {p} cannot be read: {e.strerror}") from None
        doc = parse_json(data, what=f"allowlist {p}", max_bytes=_MAX_ALLOWLIST_BYTES, max_depth=8)
        try:
            if not isinstance(doc, dict):
                raise ValueError("it is not a JSON object")
            if doc.get("format") != ALLOWLIST_FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {ALLOWLIST_FORMAT!r}")
            keys, ranks = {}, {}
            for i, e in enumerate(doc["identities"]):
                name = str(e.get("name") or f"entry{i}")
                if name in keys:
                    raise ValueError(f"name {name!r} appears twice")
                keys[name] = bytes.fromhex(e["public_key"])
                ranks[name] = e.get("ranks")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"allowlist {p} is malformed: {one_line(str(e))}") from None
        return cls(keys, ranks)

    def to_json(self) -> str:
        entries = []
        for pub, (name, ranks) in self._by_key.items():
            e: dict = {"name": name, "public_key": pub.hex()}
            if ranks is not None:
                e["ranks"] = sorted(ranks)
            entries.append(e)
        return json.dumps({"format": ALLOWLIST_FORMAT, "identities": entries}, indent=2) + "\n"

    def evidence(self, identity: Identity, binding: bytes) -> bytes:
        return b""

    def verify(self, rank: int, identity_public: bytes, evidence: bytes, binding: bytes) -> str:
        entry = self._by_key.get(bytes(identity_public))
        if entry is None:
            raise EstablishmentError(f"rank {rank} presented identity key {fingerprint(identity_public)}, "
                                     "which is not on the allowlist")
        name, ranks = entry
        if ranks is not None and rank not in ranks:
            raise EstablishmentError(f"identity {name!r} ({fingerprint(identity_public)}) is allowed only for "
                                     f"rank(s) {sorted(ranks)}, but rank {rank} presented it")
        return name


def _rank_set(name: str, allowed: object) -> frozenset[int] | None:
    """The ranks an allowlist entry may be used by (None: any), or a ConfigError."""
    if allowed is None:
        return None
    try:
        ok = not isinstance(allowed, (str, bytes, Mapping)) and all(
            isinstance(r, numbers.Integral) and not isinstance(r, bool) and r >= 0 for r in allowed)
    except TypeError:  # not iterable
        ok = False
    if not ok:
        raise ConfigError(f"allowlist entry {name!r}: ranks must be a list of non-negative integers, "
                          f"got {one_line(repr(allowed))[:80]}")
    return frozenset(int(r) for r in allowed)


# -- messages --------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    """One rank's signed round-1 message, as parsed from the untrusted exchange."""

    rank: int
    world_size: int
    context: bytes
    x25519: bytes
    identity: bytes
    nonce: bytes
    evidence: bytes
    signature: bytes
    raw: bytes

    @property
    def body(self) -> bytes:
        return self.raw[:_BODY.size]

    @property
    def binding(self) -> bytes:
        return binding_of(self.body)


def binding_of(body: bytes) -> bytes:
    return hashlib.sha256(_LABEL + b"binding" + body).digest()


def _signed_part(body: bytes, evidence: bytes) -> bytes:
    return _LABEL + b"sign" + body + struct.pack(">I", len(evidence)) + evidence


def parse_message(blob: bytes) -> Message:
    """Parse a round-1 message; anything malformed raises :class:`EstablishmentError`.

    It checks structure only; :meth:`KeyEstablishment.run` checks signature and trust.
    """
    blob = bytes(blob)
    min_len = _BODY.size + 4 + _SIG_BYTES
    if len(blob) < min_len:
        raise EstablishmentError(f"establishment message is {len(blob)} bytes, shorter than {min_len}")
    magic, rank, world, context, x, ident, nonce = _BODY.unpack_from(blob)
    if magic != _MAGIC:
        raise EstablishmentError("establishment message has an unknown format (is every rank on this ccddp version?)")
    (ev_len,) = struct.unpack_from(">I", blob, _BODY.size)
    if ev_len > _MAX_EVIDENCE or len(blob) != min_len + ev_len:
        raise EstablishmentError(f"establishment message of rank {rank} has an inconsistent length")
    ev_start = _BODY.size + 4
    evidence = blob[ev_start:ev_start + ev_len]
    signature = blob[ev_start + ev_len:]
    return Message(rank, world, context, x, ident, nonce, evidence, signature, blob)


def _verify_signature(m: Message) -> None:
    try:
        Ed25519PublicKey.from_public_bytes(m.identity).verify(m.signature, _signed_part(m.body, m.evidence))
    except (InvalidSignature, ValueError):
        raise EstablishmentError(f"the signature on rank {m.rank}'s key-exchange message does not verify under "
                                 f"identity {fingerprint(m.identity)}: its public key was swapped or the message "
                                 "was altered in transit") from None


# -- the result ------------------------------------------------------------------------

class EstablishedKeys:
    """What an establishment yields for one rank: the session id, the verified peers, the
    pairwise link keys and a group secret shared by all ranks (wrapped by rank 0)."""

    def __init__(self, rank: int, world_size: int, session_id: bytes, peers: list[str],
                 pair_secrets: dict[int, bytes], group_secret: GroupSecret) -> None:
        self.rank = rank
        self.world_size = world_size
        self.session_id = session_id
        self.peers = peers
        self._pair = pair_secrets
        self.group_secret = group_secret

    def __repr__(self) -> str:
        return f"EstablishedKeys(rank={self.rank}, session={self.session_id.hex()[:8]}, peers={self.peers})"

    def link_key(self, src: int, dst: int, epoch: int = 0) -> bytes:
        """AES-256 key of directed link ``src -> dst`` (this rank must be one end)."""
        if self.rank not in (src, dst) or src == dst:
            raise ConfigError(f"rank {self.rank} holds no key for link {src}->{dst}")
        peer = dst if src == self.rank else src
        return derive_link_key(GroupSecret(self._pair[peer]), self.session_id, src, dst, epoch)


# -- the protocol -----------------------------------------------------------------------

class KeyEstablishment:
    """Runs the authenticated X25519 exchange (three rounds) for one rank.

    ``exchange(blob) -> [blob of rank 0, ..., blob of rank n-1]`` is an all-gather of
    bytes over any transport, trusted or not (``ccddp.comm.session.establish`` passes one
    over the group's links). ``context`` must be equal on all ranks (``establish`` passes
    the group's ranks and settings fingerprint), so a rank started with other settings
    fails here already.
    """

    def __init__(self, identity: Identity, verifier: AttestationVerifier) -> None:
        if not isinstance(verifier, AttestationVerifier):
            raise ConfigError("verifier must implement evidence() and verify() (see AttestationVerifier)")
        self.identity = identity
        self.verifier = verifier

    @classmethod
    def from_env(cls) -> "KeyEstablishment | None":
        """From ``CCDDP_IDENTITY`` (a key file; ``{rank}`` and ``{local_rank}`` are replaced
        from the environment torchrun sets) and ``CCDDP_ALLOWLIST``; None if unset.

        ``CCDDP_ATTESTATION_POLICY`` (a policy TOML file) turns on hardware attestation
        (:class:`ccddp.crypto.attest.TeeVerifier`: SEV-SNP and/or TDX, as the policy's
        tables say) with the vendor material staged in ``CCDDP_ATTESTATION_CERTS`` (AMD's
        ASK/ARK, required for SEV-SNP; Intel CRLs, ``*.crl``): every peer must present
        evidence of its hardware bound to its key-exchange message. Then
        ``CCDDP_IDENTITY`` is optional (a fresh identity key per run: the hardware vouches
        for the message it signs), and ``CCDDP_ALLOWLIST``, where set, must also list the
        peer's identity."""
        template = os.environ.get(ENV_IDENTITY)
        allow = os.environ.get(ENV_ALLOWLIST)
        policy_path = os.environ.get(ENV_ATTESTATION_POLICY)
        path = (template or "").replace("{rank}", os.environ.get("RANK", "0")).replace(
            "{local_rank}", os.environ.get("LOCAL_RANK", "0"))
        if policy_path:
            from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
            from ccddp.crypto.attest.tdx import load_crls

            policy = AttestationPolicy.from_file(policy_path)
            certs = os.environ.get(ENV_ATTESTATION_CERTS)
            if not certs and policy.snp is not None:
                raise ConfigError(f"{ENV_ATTESTATION_POLICY} accepts SEV-SNP but {ENV_ATTESTATION_CERTS} is not set: "
                                  "name the directory holding AMD's ASK/ARK certificates")
            identity = Identity.from_file(path) if template else Identity.generate(
                f"rank{os.environ.get('RANK', '0')}")
            verifier = TeeVerifier(policy, TrustStore.from_dir(certs) if policy.snp is not None else None,
                                   allowlist=Allowlist.from_file(allow) if allow else None,
                                   tdx_crls=load_crls(certs) if policy.tdx is not None else None)
            return cls(identity, verifier)
        if not template:
            return None
        if not allow:
            raise ConfigError(f"{ENV_IDENTITY} is set but {ENV_ALLOWLIST} is not: peers cannot be verified")
        return cls(Identity.from_file(path), Allowlist.from_file(allow))

    def message(self, rank: int, world_size: int, context: bytes, x25519_public: bytes, nonce: bytes) -> bytes:
        body = _BODY.pack(_MAGIC, rank, world_size, hashlib.sha256(context).digest(), x25519_public,
                          self.identity.public_bytes, nonce)
        evidence = bytes(self.verifier.evidence(self.identity, binding_of(body)))
        if len(evidence) > _MAX_EVIDENCE:
            raise ConfigError(f"attestation evidence is {len(evidence)} bytes; at most {_MAX_EVIDENCE} are allowed")
        return body + struct.pack(">I", len(evidence)) + evidence + self.identity.sign(_signed_part(body, evidence))

    def run(self, rank: int, world_size: int, exchange: Exchange, context: bytes = b"",
            ranks: Sequence[int] | None = None) -> EstablishedKeys:
        """Establish keys with every other rank; raise :class:`EstablishmentError` on all
        ranks if any rank cannot be trusted. ``ranks``: the job's rank of each slot of the
        group (a subgroup's global ranks; default: the slots themselves), which the
        verifier checks an identity bound to ranks against (``ccddp keygen --bind-ranks``)."""
        ranks = tuple(range(world_size)) if ranks is None else tuple(ranks)
        if len(ranks) != world_size:
            raise ConfigError(f"{len(ranks)} job ranks given for a group of {world_size}")
        eph = X25519PrivateKey.generate()
        eph_pub = eph.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        mine = self.message(rank, world_size, context, eph_pub, os.urandom(16))
        blobs = exchange(mine)

        problem, names, msgs = None, [], []
        # The claim of a refused attestation, kept so this rank raises AttestationError
        # (naming it) after the rounds that tell every peer, not a bare EstablishmentError.
        claim: str | None = None
        try:
            msgs, names = self._check_round1(rank, world_size, context, mine, blobs, ranks)
        except EstablishmentError as e:
            problem = str(e)
            claim = e.claim if isinstance(e, AttestationError) else None

        transcript = hashlib.sha256(_LABEL + b"transcript" +
                                    b"".join(struct.pack(">I", len(b)) + bytes(b) for b in blobs)).digest()
        session_id = hashlib.sha256(_LABEL + b"session" + transcript).digest()[:SESSION_ID_BYTES]
        pair: dict[int, bytes] = {}
        group_value = os.urandom(KEY_BYTES) if rank == 0 else b""
        if problem is None:
            try:
                for j, m in enumerate(msgs):
                    if j != rank:
                        shared = eph.exchange(X25519PublicKey.from_public_bytes(m.x25519))
                        lo, hi = min(rank, j), max(rank, j)
                        pair[j] = _hkdf(shared, transcript, _LABEL + b"pair" + struct.pack(">II", lo, hi))
            except ValueError:
                problem = f"rank {j}'s X25519 public key is invalid (a low-order point): the exchange was tampered with"
        del eph  # forward secrecy: the ephemeral secret is not kept past this call

        reply = self._round2(rank, world_size, problem, pair, transcript, group_value)
        replies = exchange(reply)
        try:
            keys = self._check_round2(rank, world_size, problem, names, pair, transcript, session_id, replies,
                                      group_value)
        except EstablishmentError as e:
            keys, problem = None, str(e)
        # Round 3, a verdict: a failure only one rank can see (its round-2 replies were
        # tampered with) still stops every rank here, instead of leaving the others to
        # wait on it later. "Verified" is proven to each peer (a MAC under the pair key,
        # bound to this transcript), so neither a forged nor a replayed "ok" lets a rank
        # go on while a peer failed. A failure needs no proof: the host forging one only
        # denies service.
        verdicts = exchange(self._verdict(rank, world_size, problem, pair, transcript))
        if keys is None:
            if claim is not None:
                raise AttestationError(problem, claim=claim)
            raise EstablishmentError(problem)
        self._check_verdicts(rank, world_size, pair, transcript, verdicts)
        return keys

    # round 1: who is in the group --------------------------------------------------------
    def _check_round1(self, rank: int, world_size: int, context: bytes, mine: bytes,
                      blobs: list[bytes], ranks: tuple[int, ...]) -> tuple[list[Message], list[str]]:
        if len(blobs) != world_size:
            raise EstablishmentError(f"the key exchange returned {len(blobs)} messages for {world_size} ranks")
        if bytes(blobs[rank]) != mine:
            raise EstablishmentError(f"rank {rank}'s own key-exchange message came back altered: "
                                     "the exchange was tampered with")
        digest = hashlib.sha256(context).digest()
        msgs, names = [], []
        for j, blob in enumerate(blobs):
            m = parse_message(blob)
            if m.rank != j:
                raise EstablishmentError(f"the message in rank {j}'s slot is signed for rank {m.rank}: "
                                         "messages were swapped or replayed")
            _verify_signature(m)
            if m.world_size != world_size:
                raise EstablishmentError(f"rank {j} was started with world size {m.world_size}, "
                                         f"rank {rank} with {world_size}")
            if not hmac.compare_digest(m.context, digest):
                raise EstablishmentError(f"rank {j} was started with other collective settings than rank {rank}")
            try:
                # The job's rank of slot j: an identity bound to rank 2 is rank 2's in any
                # subgroup that holds it, whatever slot that is.
                names.append(str(self.verifier.verify(ranks[j], m.identity, m.evidence, m.binding)))
            except EstablishmentError:
                raise
            except Exception as e:  # a plug-in verifier's own failure is still a refusal
                raise EstablishmentError(f"attestation of rank {j} failed: {type(e).__name__}: {e}") from None
            msgs.append(m)
        return msgs, names

    # round 2: key confirmation and the group secret ---------------------------------------
    @staticmethod
    def _pair_tag(purpose: bytes, pair_secret: bytes, transcript: bytes, src: int, dst: int) -> bytes:
        """A MAC from ``src`` to ``dst`` under their pair key, bound to the transcript; each
        purpose (confirm, verified) has its own key, so one round's tags never pass as
        another's."""
        key = _hkdf(pair_secret, transcript, _LABEL + purpose + struct.pack(">II", src, dst))
        return hmac.new(key, transcript, hashlib.sha256).digest()[:_CONFIRM_BYTES]

    @classmethod
    def _confirm_tag(cls, pair_secret: bytes, transcript: bytes, src: int, dst: int) -> bytes:
        return cls._pair_tag(b"confirm", pair_secret, transcript, src, dst)

    @staticmethod
    def _wrap_key(pair_secret: bytes, transcript: bytes, dst: int) -> AESGCM:
        return AESGCM(_hkdf(pair_secret, transcript, _LABEL + b"wrap" + struct.pack(">I", dst)))

    def _round2(self, rank: int, world_size: int, problem: str | None, pair: dict[int, bytes],
                transcript: bytes, group_value: bytes) -> bytes:
        if problem is not None:
            return _FAIL + one_line(problem).encode()
        out = [_OK]
        for j in range(world_size):
            out.append(bytes(_CONFIRM_BYTES) if j == rank else self._confirm_tag(pair[j], transcript, rank, j))
        if rank == 0:
            for j in range(world_size):
                if j == 0:
                    out.append(bytes(_WRAPPED_BYTES))
                else:
                    # The wrap key is unique to (session, pair), so a fixed nonce is used once.
                    out.append(self._wrap_key(pair[j], transcript, j).encrypt(bytes(12), group_value,
                                                                              transcript + struct.pack(">I", j)))
        return b"".join(out)

    def _check_round2(self, rank: int, world_size: int, problem: str | None, names: list[str],
                      pair: dict[int, bytes], transcript: bytes, session_id: bytes, replies: list[bytes],
                      group_value: bytes) -> EstablishedKeys:
        if problem is not None:
            raise EstablishmentError(f"key establishment failed on rank {rank}: {problem}")
        if len(replies) != world_size:
            raise EstablishmentError(f"the key exchange returned {len(replies)} replies for {world_size} ranks")
        for j, r in enumerate(replies):
            r = bytes(r)
            if r[:1] == _FAIL:
                raise EstablishmentError(f"key establishment failed on rank {j} (as rank {j} reports): "
                                         f"{one_line(r[1:].decode(errors='replace'))}")
        for j, r in enumerate(replies):
            r = bytes(r)
            expect_len = 1 + world_size * _CONFIRM_BYTES + (world_size * _WRAPPED_BYTES if j == 0 else 0)
            if j == rank:
                continue
            tag = r[1 + rank * _CONFIRM_BYTES:1 + (rank + 1) * _CONFIRM_BYTES]
            if (r[:1] != _OK or len(r) != expect_len
                    or not hmac.compare_digest(tag, self._confirm_tag(pair[j], transcript, j, rank))):
                raise EstablishmentError(f"rank {j} derived different keys than rank {rank}: the two saw "
                                         "different key exchanges (tampered or split view)")
        if rank == 0:
            group = group_value
        else:
            start = 1 + world_size * _CONFIRM_BYTES + rank * _WRAPPED_BYTES
            try:
                group = self._wrap_key(pair[0], transcript, rank).decrypt(
                    bytes(12), bytes(replies[0])[start:start + _WRAPPED_BYTES], transcript + struct.pack(">I", rank))
            except InvalidTag:
                raise EstablishmentError(f"the group secret rank 0 sent to rank {rank} does not authenticate: "
                                         "the exchange was tampered with") from None
        return EstablishedKeys(rank, world_size, session_id, names, pair, GroupSecret(group))

    # round 3: the verdict ------------------------------------------------------------------
    def _verdict(self, rank: int, world_size: int, problem: str | None, pair: dict[int, bytes],
                 transcript: bytes) -> bytes:
        """``0x00`` and a "verified" tag to every peer (a zero slot for this rank), or ``0x01``
        and the reason this rank failed."""
        if problem is not None:
            return _FAIL + one_line(problem).encode()
        return _OK + b"".join(bytes(_CONFIRM_BYTES) if j == rank else
                              self._pair_tag(b"verified", pair[j], transcript, rank, j)
                              for j in range(world_size))

    def _check_verdicts(self, rank: int, world_size: int, pair: dict[int, bytes], transcript: bytes,
                        verdicts: list[bytes]) -> None:
        """Raise :class:`EstablishmentError` unless every peer proves it verified: a failure
        a peer reports comes first (it says what went wrong), then any proof that does not
        verify (a forged, replayed or missing verdict)."""
        if len(verdicts) != world_size:
            raise EstablishmentError(f"the key exchange returned {len(verdicts)} verdicts for {world_size} ranks")
        verdicts = [bytes(v) for v in verdicts]
        for j, v in enumerate(verdicts):
            if j != rank and v[:1] == _FAIL:
                raise EstablishmentError(f"key establishment failed on rank {j} (as rank {j} reports): "
                                         f"{one_line(v[1:].decode(errors='replace'))}")
        for j, v in enumerate(verdicts):
            if j == rank:
                continue
            tag = v[1 + rank * _CONFIRM_BYTES:1 + (rank + 1) * _CONFIRM_BYTES]
            if (v[:1] != _OK or len(v) != 1 + world_size * _CONFIRM_BYTES
                    or not hmac.compare_digest(tag, self._pair_tag(b"verified", pair[j], transcript, j, rank))):
                raise EstablishmentError(f"rank {j}'s verdict does not authenticate (seen at rank {rank}): "
                                         f"the host forged or replayed it, so rank {j} may have failed")

