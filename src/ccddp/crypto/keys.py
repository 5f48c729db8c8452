"""Key material: the group secret and the per-link keys derived from it.

Every directed link ``src -> dst`` gets its own AES-256 key, derived with HKDF-SHA256
from an authenticated shared secret, a session id, the two ranks and a key epoch. The
session id is the hash of a setup exchange to which every rank contributed fresh
randomness (:mod:`ccddp.crypto.session`), so keys differ for every group and every run,
and a counter that restarts at zero never meets a key it was used with before -- however
the host replays or rewrites the setup messages.

Example::

    secret = GroupSecret.generate()
    sid = os.urandom(16)                   # in a group: agree_session(...).session_id
    k01 = derive_link_key(secret, session_id=sid, src=0, dst=1)
    assert k01 != derive_link_key(secret, session_id=sid, src=1, dst=0)
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ccddp.errors import ConfigError

KEY_BYTES = 32
SESSION_ID_BYTES = 16
ENV_SECRET = "CCDDP_GROUP_SECRET"
ENV_SECRET_FILE = "CCDDP_GROUP_SECRET_FILE"

_LABEL = b"ccddp/v1/"
# A secret that repeats a pattern this short, or has fewer distinct byte values than
# this in its first KEY_BYTES bytes, is refused as guessable. A random 32-byte secret
# fails either rule with probability below 2^-80.
_MAX_PATTERN = 16
_MIN_DISTINCT = 12
# A secret file holds hex digits and whitespace: anything longer is not one.
_MAX_SECRET_FILE = 4096
HOW_TO_MAKE = "make one with: python -c \"import secrets; print(secrets.token_hex(32))\""


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(ikm)


@dataclass(frozen=True, repr=False)
class GroupSecret:
    """A secret shared by all ranks of a job (the "attested by the same verifier" case).

    Load it with :meth:`from_env` (``CCDDP_GROUP_SECRET`` as hex, or a file named by
    ``CCDDP_GROUP_SECRET_FILE``) or :meth:`from_file`; never log it (``repr`` hides it).
    """

    value: bytes

    def __post_init__(self) -> None:
        if len(self.value) < KEY_BYTES:
            raise ConfigError(f"group secret is {len(self.value)} bytes; it must be at least {KEY_BYTES} "
                              f"random bytes ({2 * KEY_BYTES} hex digits): {HOW_TO_MAKE}")
        weakness = guessable(self.value)
        if weakness:
            raise ConfigError(f"group secret looks guessable ({weakness}); use a random one: {HOW_TO_MAKE}")

    def __repr__(self) -> str:
        return "GroupSecret(<hidden>)"

    @classmethod
    def generate(cls) -> "GroupSecret":
        return cls(os.urandom(KEY_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> "GroupSecret":
        text = text.strip()
        bad = next((i for i, ch in enumerate(text) if ch not in "0123456789abcdefABCDEF"), None)
        if bad is not None:
            raise ConfigError(f"group secret must be hex digits (0-9, a-f), but character {bad + 1} is "
                              f"{text[bad]!r}: {HOW_TO_MAKE}")
        if len(text) % 2:
            raise ConfigError(f"group secret has an odd number of hex digits ({len(text)}); it must be "
                              f"{2 * KEY_BYTES} hex digits: {HOW_TO_MAKE}")
        return cls(bytes.fromhex(text))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GroupSecret":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"group secret file {p} does not exist")
        # Read a bounded prefix: the file is named by the environment, which need not be ours.
        try:
            with open(p, "rb") as f:
                data = f.read(_MAX_SECRET_FILE + 1)
        except OSError as e:
            raise ConfigError(f"group secret file {p}: cannot read it ({e.strerror or e})") from None
        if len(data) > _MAX_SECRET_FILE:
            raise ConfigError(f"group secret file {p} is larger than {_MAX_SECRET_FILE} bytes: it must hold "
                              f"{2 * KEY_BYTES} hex digits")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as e:
            raise ConfigError(f"group secret file {p} holds a byte that is not a hex digit (byte {e.start})") from None
        return cls.from_hex(text)

    @classmethod
    def from_env(cls) -> "GroupSecret":
        """The process's group secret: ``CCDDP_GROUP_SECRET`` (hex), else the file named by
        ``CCDDP_GROUP_SECRET_FILE``.

        Either is read once and taken out of the environment (:func:`take_secret_from_env`),
        so processes the training script starts later (data-loader workers, subprocesses,
        anything that logs ``os.environ``) do not inherit it; later calls return the same
        secret.

        Example::

            secret = GroupSecret.from_env()     # CCDDP_GROUP_SECRET is now gone from os.environ
        """
        take_secret_from_env()
        if _taken is not None:
            return _taken
        raise ConfigError(
            f"no group secret: start the script with `ccddp launch` (one node: it makes one), or set "
            f"{ENV_SECRET} (64 hex digits, the same on every rank) or {ENV_SECRET_FILE}, "
            "e.g. export CCDDP_GROUP_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"
        )



_taken: GroupSecret | None = None


def take_secret_from_env() -> None:
    """Move the group secret from the environment into this process's memory:
    ``CCDDP_GROUP_SECRET`` (hex), else the file ``CCDDP_GROUP_SECRET_FILE`` names (read
    now: under ``ccddp launch`` it is the launcher's in-memory file). Both variables are
    removed, malformed or not, so what this process starts learns neither the secret nor
    where it is. A malformed value raises :class:`ConfigError`; a later value put in the
    environment replaces the one taken."""
    global _taken
    text = os.environ.pop(ENV_SECRET, None)
    path = os.environ.pop(ENV_SECRET_FILE, None)
    if text:
        _taken = GroupSecret.from_hex(text)
    elif path:
        _taken = GroupSecret.from_file(path)


def guessable(value: bytes) -> str | None:
    """Why ``value`` is too regular to be a secret (a short repeated pattern, few distinct
    bytes), or None. Only obvious non-random values are caught: a secret that passes is not
    thereby random -- generate it with a CSPRNG."""
    for period in range(1, _MAX_PATTERN + 1):
        if period < len(value) and all(value[i] == value[i - period] for i in range(period, len(value))):
            return f"it repeats a pattern of {period} byte{'s' if period > 1 else ''}"
    distinct = len(set(value[:KEY_BYTES]))
    if distinct < _MIN_DISTINCT:
        return f"its first {KEY_BYTES} bytes hold only {distinct} distinct values"
    return None


def derive_link_key(secret: GroupSecret, session_id: bytes, src: int, dst: int, epoch: int = 0) -> bytes:
    """The AES-256 key of directed link ``src -> dst`` for a session at epoch 0, ratcheted
    ``epoch`` times."""
    key = _hkdf(secret.value, session_id, _LABEL + b"link" + struct.pack(">II", src, dst))
    for e in range(1, epoch + 1):
        key = ratchet(key, e)
    return key


def derive_purpose_key(secret: GroupSecret, session_id: bytes, purpose: str) -> bytes:
    """A key shared by the whole group for one purpose (group-key all-gather, bounce path)."""
    return _hkdf(secret.value, session_id, _LABEL + b"purpose/" + purpose.encode())


def ratchet(key: bytes, epoch: int) -> bytes:
    """The next key of a link: one-way, so a leaked key does not expose earlier epochs."""
    return _hkdf(key, b"", _LABEL + b"ratchet" + struct.pack(">Q", epoch))


def digest(*parts: bytes) -> str:
    """Short hex digest used to compare settings across ranks (not a secret)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(struct.pack(">Q", len(p)))
        h.update(p)
    return h.hexdigest()[:16]
