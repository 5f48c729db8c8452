"""Key material: the group secret and the per-link keys derived from it.

Every directed link ``src -> dst`` gets its own AES-256 key, derived with HKDF-SHA256
from an authenticated shared secret, a per-run session id, the two ranks and a key epoch.
A fresh random session id per run makes keys differ across process restarts, so a
counter that restarts at zero never meets a key it was used with before.

Example::

    secret = GroupSecret.generate()
    k01 = derive_link_key(secret, session_id=b"\\0" * 16, src=0, dst=1)
    assert k01 != derive_link_key(secret, session_id=b"\\0" * 16, src=1, dst=0)
"""

from __future__ import annotations

import hashlib
import hmac
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
            raise ConfigError(f"group secret must be at least {KEY_BYTES} bytes, got {len(self.value)}")

    def __repr__(self) -> str:
        return "GroupSecret(<hidden>)"

    @classmethod
    def generate(cls) -> "GroupSecret":
        return cls(os.urandom(KEY_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> "GroupSecret":
        try:
            return cls(bytes.fromhex(text.strip()))
        except ValueError as e:
            raise ConfigError(f"group secret is not valid hex: {e}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GroupSecret":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"group secret file {p} does not exist")
        return cls.from_hex(p.read_text())

    @classmethod
    def from_env(cls) -> "GroupSecret":
        if os.environ.get(ENV_SECRET):
            return cls.from_hex(os.environ[ENV_SECRET])
        if os.environ.get(ENV_SECRET_FILE):
            return cls.from_file(os.environ[ENV_SECRET_FILE])
        raise ConfigError(
            f"no group secret: set {ENV_SECRET} (64 hex digits) or {ENV_SECRET_FILE}, "
            "e.g. export CCDDP_GROUP_SECRET=$(python -c 'import os;print(os.urandom(32).hex())')"
        )

    def fingerprint(self, session_id: bytes) -> bytes:
        """A one-way value ranks compare to confirm they hold the same secret.

        It is bound to the session so that it says nothing across runs.
        """
        return _hkdf(self.value, session_id, _LABEL + b"confirm")[:16]


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


def constant_time_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
