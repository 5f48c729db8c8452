"""Crypto layer: keys, the AES-GCM link channel, counters and the crypto thread pool."""

from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import TAG_BYTES, LinkChannel, link_id
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.engine import CryptoEngine
from ccddp.crypto.keys import GroupSecret, derive_link_key, derive_purpose_key, ratchet

__all__ = ["FrameContext", "Op", "Phase", "TAG_BYTES", "LinkChannel", "link_id", "CryptoCounters",
           "CryptoEngine", "GroupSecret", "derive_link_key", "derive_purpose_key", "ratchet"]
