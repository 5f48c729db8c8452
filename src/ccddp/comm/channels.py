"""The link channels of one secure group: what seals the frames a rank sends and opens the
frames it receives, keyed for each directed link of one session.

Invariants:

- one channel per direction of each link (``tx(dst)``: this rank -> ``dst``; ``rx(src)``:
  ``src`` -> this rank), and one group-key channel per all-gather owner, each made on first
  use and kept for the session: a channel's message counter is half of every nonce it
  uses, and both ends advance it in the order they use the link, so a second channel for
  the same link would repeat (key, nonce) pairs;
- a link's key is derived from the session's key material and bound to its ends: the
  pairwise keys of an authenticated establishment, or HKDF of the pre-shared group secret
  with the session id, ``src`` and ``dst`` (:func:`~ccddp.crypto.keys.derive_link_key`);
- a plaintext group (``impl="ring"``) holds no key material, and asking it for a channel
  is a :class:`~ccddp.errors.ConfigError`.

Example::

    channels = LinkChannels(rank=0, secret=GroupSecret.from_env(), session_id=sid)
    channels.tx(1).seal(plain, frame, aad)      # rank 0 -> rank 1, counter 0, then 1, ...
"""

from __future__ import annotations

from ccddp.crypto.channel import LinkChannel, NonceRecorder, link_id
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.establish import EstablishedKeys
from ccddp.crypto.keys import GroupSecret, derive_link_key, derive_purpose_key
from ccddp.errors import ConfigError

# Link ids above this mark group-key channels (owner in the low bits), so their nonces
# never collide with a per-link channel's even though the keys differ anyway.
_GROUP_LINK_BASE = 0xFFFF0000


class LinkChannels:
    """The channels of rank ``rank`` in one session (see the module docstring).

    ``keys``: the pairwise keys of an authenticated establishment (then ``secret`` is the
    group secret it agreed on); ``counters`` are shared by every channel, and so is
    ``recorder`` (every nonce used; tests), which may be set later: channels made after
    that report to it; ``options``: what each channel is built with besides its key and counter
    (:meth:`~ccddp.comm.settings.CommSettings.channel_options`).
    """

    def __init__(self, rank: int, secret: GroupSecret | None, session_id: bytes, *,
                 keys: EstablishedKeys | None = None, counters: CryptoCounters | None = None,
                 recorder: NonceRecorder | None = None, options: dict | None = None) -> None:
        self.rank = rank
        self._secret = secret
        self._session_id = session_id
        self._keys = keys
        self.counters = counters if counters is not None else CryptoCounters()
        self.recorder = recorder
        self._options = options or {}
        self._tx: dict[int, LinkChannel] = {}
        self._rx: dict[int, LinkChannel] = {}
        self._group: dict[int, LinkChannel] = {}

    def tx(self, dst: int) -> LinkChannel:
        """Channel sealing frames this rank sends to ``dst``."""
        if dst not in self._tx:
            self._tx[dst] = self._link(self.rank, dst)
        return self._tx[dst]

    def rx(self, src: int) -> LinkChannel:
        """Channel opening frames this rank receives from ``src``."""
        if src not in self._rx:
            self._rx[src] = self._link(src, self.rank)
        return self._rx[src]

    def group_channel(self, owner: int) -> LinkChannel:
        """Group-key channel of frames sealed by ``owner`` (forwarded all-gather).

        The sealing side (owner == rank) and every opening side advance the same counter
        sequence, so each rank holds one channel per owner.
        """
        if owner not in self._group:
            key = derive_purpose_key(self._key_material(), self._session_id, "allgather-group-key")
            self._group[owner] = self._channel(key, _GROUP_LINK_BASE | owner, f"group-key owner {owner}")
        return self._group[owner]

    def _link(self, src: int, dst: int) -> LinkChannel:
        if self._keys is not None:
            key = self._keys.link_key(src, dst)
        else:
            key = derive_link_key(self._key_material(), self._session_id, src, dst)
        return self._channel(key, link_id(src, dst), f"{src}->{dst}")

    def _channel(self, key: bytes, lid: int, name: str) -> LinkChannel:
        return LinkChannel(key, lid, name, counters=self.counters, recorder=self.recorder, **self._options)

    def _key_material(self) -> GroupSecret:
        if self._secret is None:
            raise ConfigError("this group is plaintext (impl ring): it holds no link keys to seal or open with")
        return self._secret
