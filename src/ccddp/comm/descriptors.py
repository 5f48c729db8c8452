"""The descriptor check of a sealed collective: before their data is trusted, the ranks of
a collective prove to each other that they called the same one.

Invariants:

- with each secure collective (settings ``check_descriptors``, the default) each rank
  sends every peer it receives data from, and receives from every peer it sends to, a
  sealed descriptor (op, reduction, element count, dtype, root, wire, a digest of the
  settings) on tag 0: ranks that called different collectives still pair these messages;
- every receive on tag 0 is posted with room for the longest tag-0 message
  (:data:`TAG0_CAPACITY`), because a two-rank op of at most :data:`FOLDED_DATA_MAX` bytes
  sends its data frame in its descriptor's message (:mod:`ccddp.comm.prepared`, wire
  :data:`FOLDED`): gloo takes a message shorter than the receive (the rest of the buffer
  is left as it was) but aborts the process on a longer one, so no tag-0 message is ever
  longer than the receive it meets. A tag-0 message always starts with the sealed
  descriptor, of one fixed size (:data:`DESC_FRAME`), so a receiver opens and compares
  that first, whatever follows;
- the other collectives' data goes on a tag derived from the descriptor (:func:`data_tag`,
  a keyed hash: the tag on the wire gives away no hash of the descriptor), so ranks that
  called different collectives never pair their data frames either;
- :meth:`Descriptors.verify` runs before the first data frame is waited on (and again at
  the end): a mismatch raises a :class:`ConfigError` that says what differs at once,
  instead of a failed tag or a timeout; every frame's AAD holds the op too, so a frame of
  another collective never opens, even where two tags collide (2^-31).

Example::

    desc = post_descriptors(endpoint, seq, Op.ALL_REDUCE, numel, "float32", 0, [peer], [peer])
    ...                   # post the data on desc.tag
    desc.verify()         # ConfigError naming both calls where the ranks differ
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import weakref

import torch

from ccddp.comm import probe
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import DTYPE_NAME_BYTES, FrameContext, Op, Phase, dtype_field
from ccddp.crypto.channel import TAG_BYTES
from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError, one_line

DESC = struct.Struct(f">BBQ{DTYPE_NAME_BYTES}sIB16s")
#: A sealed descriptor on the wire: the first bytes of every tag-0 message.
DESC_FRAME = DESC.size + TAG_BYTES
#: The most plaintext a data frame that travels in its descriptor's message may carry.
FOLDED_DATA_MAX = 1 << 20
#: What every tag-0 receive has room for: a descriptor and a folded data frame.
TAG0_CAPACITY = DESC_FRAME + FOLDED_DATA_MAX + TAG_BYTES
# Which wire a collective's data takes: the one both ends must post on.
WIRES = ("gloo", "an ordered wire (NCCL)", "gloo, in the descriptor's message")
#: The index in :data:`WIRES` of a data frame sent in its descriptor's message.
FOLDED = 2


def describe(g: Endpoint, op: Op, numel: int, dtype: str, root: int, reduction: Reduction,
              wire: int = 0) -> bytes:
    """This rank's descriptor of a collective (``wire``: the index in :data:`WIRES`)."""
    return DESC.pack(int(op), int(reduction), numel, dtype_field(dtype), root, wire, g.settings_digest)


def explain(blob: bytes) -> str:
    """A descriptor in words, for the error that says how two ranks' collectives differ.

    The peer's descriptor was authenticated before it gets here (it opened on the link
    from that peer), but a peer on another ccddp version may still name an op or a
    reduction this one does not know: those are shown as numbers, and a descriptor of
    another size as its length, so that explaining a mismatch never raises.
    """
    if len(blob) != DESC.size:
        return f"a descriptor of {len(blob)} bytes (another ccddp version?)"
    op, reduction, numel, dtype, root, wire, _ = DESC.unpack(blob)
    name = one_line(dtype.rstrip(b"\0").decode(errors="replace"))
    try:
        op_name = Op(op).name.lower()
    except ValueError:
        op_name = f"op {op}"
    try:
        red = Reduction(reduction).name
    except ValueError:
        red = str(reduction)
    count = f"{numel >> 32} and {numel & 0xFFFFFFFF}" if op == int(Op.ALL_TO_ALL) else str(numel)
    return f"{op_name} of {count} {name} elements (root {root}, {red}) over {wire_name(blob)}"


def wire_name(blob: bytes) -> str:
    """The wire a (well-sized) descriptor names, in words."""
    wire = DESC.unpack(blob)[5]
    return WIRES[wire] if wire < len(WIRES) else f"wire {wire}"


class Descriptors:
    """The sealed descriptor exchange of one collective, posted together with its data.

    Each rank sends its neighbours a sealed descriptor (on tag 0) and then, without
    waiting for theirs, posts the collective's data on a tag derived from its own
    descriptor (:func:`data_tag`). Ranks that call the same collective meet on the same
    tag, so the descriptor and the data travel in the same round trip; ranks that differ
    post their data on different tags, gloo never pairs those messages (so it never sees a
    frame of the wrong size, which it answers by aborting the process), and
    :meth:`verify` -- run before the first data receive is waited on, and again at the
    end -- raises the :class:`ConfigError` that says what differs. A tag is 31 bits of a
    keyed hash: two different descriptors share one with probability 2^-31, and then the
    data frames still fail their AAD check (or gloo stops on the size); none is accepted.
    """

    def __init__(self, g: Endpoint, seq: int, mine: bytes, send_to: list[int], recv_from: list[int],
                 per_peer: dict[int, bytes] | None = None) -> None:
        # per_peer[p]: the descriptor of the link pair with p where a collective's links
        # differ (all_to_all's per-pair sizes, :func:`pair_sizes`): sent to p, expected from
        # p, and the tag of the data both ways between the two.
        self.g, self.seq, self.mine, self.recv_from = g, seq, mine, recv_from
        self.per_peer = per_peer or {}
        self.tag = data_tag(g, seq, mine)
        self.tags = {p: data_tag(g, seq, blob) for p, blob in self.per_peer.items()}
        tr = g.transport
        # Room for a peer's folded message too: see the module's invariants.
        self.frames = {p: torch.empty(TAG0_CAPACITY, dtype=torch.uint8) for p in recv_from}
        if probe.ON:
            probe.stamp("descriptor: tag HMAC + buffers")
        self.works = {p: tr.irecv(self.frames[p], p) for p in recv_from}
        if probe.ON:
            probe.stamp("descriptor: irecv post")
        self.sends = []
        for p in send_to:
            ours = self.per_peer.get(p, mine)
            frame = torch.empty(len(ours) + TAG_BYTES, dtype=torch.uint8)
            aad = FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, g.rank, p, len(ours), "").pack()
            g.channels.tx(p).seal(ours, frame.numpy(), aad)
            g.counters.add_message(sealed=True, control=True)
            if probe.ON:
                probe.stamp("descriptor: seal")
            self.sends.append((tr.isend(frame, p), p))
        self.done = False

    def tag_with(self, p: int) -> int:
        """The tag of this collective's data to and from rank ``p``."""
        return self.tags.get(p, self.tag)

    def verify(self) -> None:
        """Wait for the neighbours' descriptors and compare (once; later calls return)."""
        if self.done:
            return
        self.done = True
        g, seq, tr = self.g, self.seq, self.g.transport
        mismatch = None
        for p in self.recv_from:
            mine = self.per_peer.get(p, self.mine)
            tr.wait(self.works[p], p, FrameLabel(f"{p}->{g.rank}", f"descriptor#{seq}", 0))
            theirs = bytearray(len(mine))
            aad = FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, p, g.rank, len(mine), "").pack()
            g.channels.rx(p).open(self.frames[p].numpy()[:DESC_FRAME], theirs, aad,
                                  collective=f"descriptor#{seq}", step=0)
            g.counters.add_message(sealed=False, control=True)
            if bytes(theirs) != mine:
                mismatch = differs(g, seq, p, bytes(theirs), mine)
                break
        # Our own descriptors are delivered even when we stop: the neighbours then say what
        # differs instead of timing out on a sender that exited.
        for w, p in self.sends:
            try:
                tr.wait(w, p, FrameLabel(f"{g.rank}->{p}", f"descriptor#{seq}", 0))
            except PeerTimeoutError:
                if mismatch is None:
                    raise
        if mismatch is not None:
            raise mismatch


def differs(g: Endpoint, seq: int, p: int, theirs: bytes, mine: bytes) -> ConfigError:
    """The error that says how rank ``p``'s descriptor ``theirs`` differs from ours."""
    if theirs[-16:] != mine[-16:]:
        return ConfigError(f"rank {p} and rank {g.rank} use different collective settings")
    if only_differs_in(_NUMEL, theirs, mine) and DESC.unpack(mine)[0] == int(Op.ALL_TO_ALL):
        return pair_sizes_differ(seq, p, g.rank, DESC.unpack(theirs)[2], mine)
    if only_differs_in(_WIRE, theirs, mine) and FOLDED in (DESC.unpack(theirs)[_WIRE], DESC.unpack(mine)[_WIRE]):
        return ConfigError(
            f"collective #{seq}: rank {p} sends its data over {wire_name(theirs)}, rank {g.rank} over "
            f"{wire_name(mine)}: a two-rank op of at most {FOLDED_DATA_MAX >> 20} MiB in host memory goes in "
            "the descriptor's message, so both ranks need their tensors in host memory (or both on a device)")
    if only_differs_in(_WIRE, theirs, mine):
        return ConfigError(
            f"collective #{seq}: rank {p} sends its frames over {wire_name(theirs)}, rank "
            f"{g.rank} over {wire_name(mine)}: with the NCCL device wire, every rank needs the same "
            "placement for CUDA tensors (CommSettings.placement)")
    return ConfigError(f"collective #{seq} differs between ranks: rank {p} called "
                       f"{explain(theirs)}, rank {g.rank} called {explain(mine)}")


def pair_sizes(r: int, p: int, to_p: int, from_p: int) -> int:
    """The element counts rank ``r`` sends rank ``p`` and expects back, in one descriptor
    field both ranks compute alike: the lower rank's count in the high 32 bits. A count is
    below 2^32 (one message is at most ``MAX_FRAME_BYTES``), so the two ranks' fields are
    equal exactly when each direction's sender and receiver agree."""
    low_to_high, high_to_low = (to_p, from_p) if r < p else (from_p, to_p)
    return low_to_high << 32 | high_to_low


def pair_sizes_differ(seq: int, p: int, r: int, theirs: int, blob: bytes) -> ConfigError:
    """The error for rank ``r`` (descriptor ``blob``) and rank ``p`` (count field ``theirs``)
    whose all_to_all sizes between them differ."""
    mine, dtype = DESC.unpack(blob)[2], one_line(DESC.unpack(blob)[3].rstrip(b"\0").decode(errors="replace"))
    low, high = min(p, r), max(p, r)
    said = []
    for shift, src, dst in ((32, low, high), (0, high, low)):
        t, m = theirs >> shift & 0xFFFFFFFF, mine >> shift & 0xFFFFFFFF
        if t != m:
            sender, receiver = (t, m) if src == p else (m, t)
            said.append(f"rank {src} sends rank {dst} {sender} elements, rank {dst} expects {receiver}")
    return ConfigError(f"collective #{seq}, all_to_all of {dtype}: the ranks' sizes differ: " + "; ".join(said))


# Fields of a descriptor (DESC's order) that one mismatch can be explained by alone.
_NUMEL, _WIRE = 2, 5


def only_differs_in(field: int, a: bytes, b: bytes) -> bool:
    """Two (well-sized) descriptors of one collective that differ in ``field`` alone."""
    if len(a) != DESC.size or len(b) != DESC.size:
        return False
    x, y = DESC.unpack(a), DESC.unpack(b)
    return x[field] != y[field] and x[:field] + x[field + 1:] == y[:field] + y[field + 1:]


# Per group, HMAC-SHA256 under its tag key with the key schedule done once (each tag copies
# it); held no longer than the group (weak keys).
_TAG_MACS: "weakref.WeakKeyDictionary[Endpoint, object]" = weakref.WeakKeyDictionary()


def data_tag(g: Endpoint, seq: int, descriptor: bytes) -> int:
    """The gloo tag (1 .. 2^31-1) of collective ``seq``'s data: a keyed hash of its
    descriptor, so only ranks that agree on the collective pair up their messages."""
    base = _TAG_MACS.get(g)
    if base is None:
        base = _TAG_MACS[g] = hmac.new(g.tag_key, digestmod=hashlib.sha256)
    mac = base.copy()
    mac.update(seq.to_bytes(8, "big") + descriptor)
    return 1 + int.from_bytes(mac.digest()[:8], "big") % ((1 << 31) - 2)



class Unchecked:
    """Settings that run without descriptors: data on tag 0, nothing to verify."""

    tag = 0

    def verify(self) -> None:
        pass

    def tag_with(self, p: int) -> int:
        return 0


def post_descriptors(g: Endpoint, seq: int, op: Op, numel: int, dtype: str, root: int,
              send_to: list[int], recv_from: list[int],
              reduction: Reduction = Reduction.SUM, wire: int = 0,
              per_peer_numel: dict[int, int] | None = None) -> Descriptors | Unchecked:
    """Post the descriptor exchange, if these settings run with one (``wire``: the index
    in :data:`WIRES` of the wire the data takes; ``per_peer_numel[p]``: the element count
    of the link pair with ``p`` where it differs per pair, :func:`pair_sizes`)."""
    s = g.settings
    if not (s.secure and s.check_descriptors):
        return Unchecked()
    per_peer = {p: describe(g, op, n, dtype, root, reduction, wire) for p, n in (per_peer_numel or {}).items()}
    return Descriptors(g, seq, describe(g, op, numel, dtype, root, reduction, wire), send_to, recv_from, per_peer)
