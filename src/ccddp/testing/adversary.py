"""An adversary on the link: a :class:`Transport` that tampers with the frames it carries.

The threat model (paper §II) gives the host read/write access to every byte that crosses
PCIe/NVLink or the network. :class:`AdversarialTransport` plays that host: each rank's
copy sits on the frames it *sends*, and :class:`Rule` objects say which frame of which
directed link to attack and how:

=========  ===========================================================================
flip       flip one bit of the frame (default: a bit in the middle of the ciphertext)
truncate   send only the first ``keep`` bytes. gloo accepts a shorter message into a
           larger receive buffer and leaves the buffer's tail as it was, so the receiver
           sees exactly what a cut frame looks like on a fixed-length link: the first
           ``keep`` bytes, then stale bytes. (A *longer* message makes gloo abort the
           receiving process, so the adversary never sends one.)
replay     replace the frame with a copy of one sent ``back`` frames earlier on the link
           (a frame the receiver already accepted)
splice     replace the frame with another authentic frame of the same size: frame
           ``from_index`` of window ``from_window`` of this link (another step, another
           bucket/collective), or the latest frame this rank received from rank
           ``from_link`` (another link, another key)
reorder    hold the frame and send it right after the next one on the link
drop       never send the frame: the receiver's next receive gets the following frame
delay      hold the frame for ``seconds`` before sending it (order is kept)
=========  ===========================================================================

Every frame keeps its size, except truncation, because gloo matches messages by order
and the receiver's buffer size is fixed by the schedule; a dropped or reordered frame
must therefore be followed by one of the same size (the adversary checks this).

``arm()`` starts a new *window*: rules fire only in armed windows, and ``nth`` counts the
frames sent on the link since the last ``arm()``. Frames of earlier windows stay in the
history, so a splice can take a frame from a previous collective (another bucket).

The setup of a group crosses the transport too (:meth:`Transport.exchange`: the
all-gathers that carry each rank's contribution, its key confirmation and its verdict).
:class:`SetupRule` objects attack what rank ``dst`` receives of rank ``src``'s message in
the ``nth`` exchange since ``arm()``:

=========  ===========================================================================
flip       flip one bit of ``src``'s message, in byte ``byte`` (default: the middle one)
swap       deliver ``dst``'s own message in ``src``'s slot and ``src``'s in ``dst``'s
replay     ``src``'s message of the same exchange of an earlier setup (another group,
           an earlier run): the transports of one rank can share a history of setups
drop       ``src``'s message never arrives: its slot comes back empty
reorder    ``src``'s message of the previous exchange of this setup in place of this one
=========  ===========================================================================

Frames travel with the P2P ``tag`` given at construction, so frames a failed run left
behind can never be matched by a later run on the same process group; an
:class:`AbortSignal` lets the rank that detects an attack release its peers at once
instead of after the timeout (the in-process equivalent of torchrun tearing a job down).

Example::

    tr = AdversarialTransport(dist.group.WORLD, timeout_s=10)
    g = SecureGroup(CommSettings(timeout_s=10), secret, transport=tr)
    all_reduce(x, g)                                   # clean: history, window 0
    tr.arm([Rule("flip", src=0, dst=1, nth=2)])
    all_reduce(x, g)                                   # rank 1 raises IntegrityError

    tr.arm([SetupRule("flip", src=0, dst=1, nth=1)])   # rank 0's key confirmation
    SecureGroup(CommSettings(timeout_s=10), secret, transport=tr)   # ConfigError on every rank
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ccddp.comm.transport import Transport
from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError

ATTACKS = ("flip", "truncate", "replay", "splice", "reorder", "drop", "delay")
SETUP_ATTACKS = ("flip", "swap", "replay", "drop", "reorder")

_POLL_S = 0.0005
_ABORT_POLL_S = 0.005


class AdversaryError(ConfigError):
    """A rule cannot be applied as written (no earlier frame of that size, a size change
    that gloo would turn into a crash, ...): the test or selftest is misconfigured."""


@dataclass(frozen=True)
class Rule:
    """One attack on frame ``nth`` (counted from ``arm()``) of directed link ``src -> dst``.

    Example::

        Rule("flip", src=0, dst=1, nth=3, bit=100)
        Rule("splice", src=0, dst=1, nth=3, from_window=0, from_index=3)   # another bucket
        Rule("splice", src=0, dst=1, nth=3, from_link=1)                   # another link
    """

    attack: str
    src: int
    dst: int
    nth: int = 0
    count: int = 1
    bit: int | None = None
    keep: int | None = None
    seconds: float = 0.5
    back: int = 1
    from_window: int | None = None
    from_index: int | None = None
    from_link: int | None = None

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ConfigError(f"unknown attack {self.attack!r}; choose from {', '.join(ATTACKS)}")
        if self.nth < 0 or self.count < 1 or self.back < 1:
            raise ConfigError("rule needs nth >= 0, count >= 1, back >= 1")
        if self.attack == "splice" and self.from_link is None and self.from_index is None:
            raise ConfigError("splice needs from_index (a frame of this link) or from_link (another link)")
        if self.attack in ("reorder", "drop") and self.count != 1:
            raise ConfigError(f"{self.attack} affects one frame (count=1)")

    def hits(self, src: int, dst: int, index: int) -> bool:
        return src == self.src and dst == self.dst and self.nth <= index < self.nth + self.count

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SetupRule:
    """One attack on the setup: what rank ``dst`` receives of rank ``src``'s message in
    exchange ``nth`` (counted from ``arm()``; a group's setup is exchanges 0, 1, 2:
    contributions, confirmations, verdicts). ``byte`` is the byte a flip changes (default:
    the middle one); ``sessions_back`` picks the earlier setup a replay draws from (1: the
    one before this).

    Example::

        SetupRule("replay", src=0, dst=1, nth=0)    # rank 0's contribution of an earlier session
        SetupRule("swap", src=0, dst=1, nth=1)      # confirmations of ranks 0 and 1 swapped
    """

    attack: str
    src: int
    dst: int
    nth: int = 0
    byte: int | None = None
    sessions_back: int = 1

    def __post_init__(self) -> None:
        if self.attack not in SETUP_ATTACKS:
            raise ConfigError(f"unknown setup attack {self.attack!r}; choose from {', '.join(SETUP_ATTACKS)}")
        if self.nth < 0 or self.sessions_back < 1 or self.src == self.dst:
            raise ConfigError("setup rule needs nth >= 0, sessions_back >= 1 and src != dst")
        if self.attack == "reorder" and self.nth < 1:
            raise ConfigError("reorder moves a message of the previous exchange: nth >= 1")


class AbandonedWait(PeerTimeoutError):
    """A wait this rank gave up because another rank failed first (the abort signal)."""


class AbortSignal:
    """A flag in the job's store: the first rank to fail sets it with its reason and
    every waiting rank stops waiting. It only shortens waits; it decides nothing about
    integrity (the host could set or hide it, which is denial of service at most).

    Example::

        abort = AbortSignal.default(f"case-{i}")
        abort.set("rank 1: IntegrityError ...")
        abort.reason()     # on any rank -> "rank 1: IntegrityError ..."
    """

    def __init__(self, store, key: str) -> None:
        self.store = store
        self.key = key
        self._seen: str | None = None
        self._next_check = 0.0

    @classmethod
    def default(cls, name: str) -> "AbortSignal":
        # The default store is what init_process_group rendezvoused on; no public accessor.
        return cls(dist.distributed_c10d._get_default_store(), f"ccddp/abort/{name}")

    def set(self, reason: str) -> None:
        self._seen = reason
        self.store.set(self.key, reason.encode())

    def reason(self) -> str | None:
        if self._seen is None:
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + _ABORT_POLL_S
                if self.store.check([self.key]):
                    self._seen = bytes(self.store.get(self.key)).decode(errors="replace")
        return self._seen


class _Accepted:
    """Work handle of a frame the adversary took off the wire (held or dropped): from the
    sender's side the send is done, as with any switch that buffered it."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None


def _bytes(frame: torch.Tensor) -> bytes:
    return frame.contiguous().view(torch.uint8).numpy().tobytes()


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class AdversarialTransport(Transport):
    """A :class:`Transport` that applies :class:`Rule` attacks to the frames this rank sends
    and the :class:`SetupRule` attacks to the setup messages it receives, and labels the
    frames it receives (the :class:`~ccddp.errors.FrameLabel` of the wait), so a test can
    tell which frame a receiver rejected. Put one on every rank, with the same rules.

    ``setup_history`` (a list, shared by the transports of one rank) keeps every setup
    this rank received, one list of exchanges per setup, for replays across groups."""

    def __init__(self, pg: dist.ProcessGroup, timeout_s: float, rules: list[Rule | SetupRule] | tuple = (), *,
                 tag: int = 0, abort: AbortSignal | None = None, history_bytes: int = 64 << 20,
                 setup_history: list[list[list[bytes]]] | None = None) -> None:
        super().__init__(pg, timeout_s)
        self.tag = tag
        self.abort = abort
        self.rules: list[Rule | SetupRule] = list(rules)
        self.setup_history: list[list[list[bytes]]] = setup_history if setup_history is not None else []
        self._exchange_index = 0
        self.window = 0
        self.applied: list[dict] = []
        self._history_bytes = history_bytes
        self._lock = threading.Lock()
        self._send_index: dict[int, int] = defaultdict(int)
        self._recv_index: dict[int, int] = defaultdict(int)
        self._sent: dict[int, deque] = defaultdict(deque)   # dst -> (window, index, bytes)
        self._recv: dict[int, deque] = defaultdict(deque)   # src -> (window, index, bytes)
        self._kept = 0
        self.sent_sizes: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.recv_labels: dict[int, dict[int, dict[int, FrameLabel]]] = defaultdict(lambda: defaultdict(dict))
        self._order: deque = deque()
        self._held: dict[int, torch.Tensor] = {}
        self._must_match: dict[int, tuple[int, str]] = {}
        self._pending: dict[int, tuple[int, int, torch.Tensor, int]] = {}
        # gloo may still write into a receive buffer of an abandoned run: keep every
        # tensor handed to gloo alive for the life of the transport.
        self._in_flight: list = []
        self._abandoned: list[threading.Thread] = []

    # -- control ---------------------------------------------------------------------
    def arm(self, rules: list[Rule | SetupRule] | None = None) -> None:
        """Start a new window (``nth`` counts from here); replace the rules if given."""
        with self._lock:
            if rules is not None:
                self.rules = list(rules)
            self.window += 1
            self._send_index.clear()
            self._recv_index.clear()
            self._exchange_index = 0

    def label(self, src: int, index: int, window: int | None = None) -> FrameLabel | None:
        """The label this rank waited with on frame ``index`` from ``src`` (None if it
        never waited on it)."""
        return self.recv_labels[self.window if window is None else window][src].get(index)

    # -- the setup ---------------------------------------------------------------------
    def exchange(self, blob: bytes) -> list[bytes]:
        with self._lock:
            nth = self._exchange_index
            self._exchange_index += 1
            if nth == 0:
                self.setup_history.append([])   # a new setup begins
            session = self.setup_history[-1]
            earlier = self.setup_history[:-1]
        received = [bytes(b) for b in super().exchange(blob)]
        session.append(list(received))
        for rule in self.rules:
            if isinstance(rule, SetupRule) and self.window > 0 and rule.dst == self.rank and rule.nth == nth:
                received = self._tamper_setup(rule, received, session, earlier)
        return received

    def _tamper_setup(self, rule: SetupRule, received: list[bytes], session: list[list[bytes]],
                      earlier: list[list[list[bytes]]]) -> list[bytes]:
        out, src, dst, nth = list(received), rule.src, rule.dst, rule.nth
        if max(src, dst) >= len(out):
            raise AdversaryError(f"setup {rule.attack}: no rank {max(src, dst)} in a group of {len(out)}")
        if rule.attack == "flip":
            byte = len(out[src]) // 2 if rule.byte is None else rule.byte
            if not 0 <= byte < len(out[src]):
                raise AdversaryError(f"setup flip: rank {src}'s message {nth} has no byte {byte}")
            data = bytearray(out[src])
            data[byte] ^= 0x01
            out[src] = bytes(data)
        elif rule.attack == "swap":
            out[src], out[dst] = out[dst], out[src]
        elif rule.attack == "replay":
            if len(earlier) < rule.sessions_back or len(earlier[-rule.sessions_back]) <= nth:
                raise AdversaryError(f"setup replay: no earlier setup {rule.sessions_back} back with an "
                                     f"exchange {nth} on this rank")
            out[src] = earlier[-rule.sessions_back][nth][src]
        elif rule.attack == "drop":
            out[src] = b""
        elif rule.attack == "reorder":
            out[src] = session[nth - 1][src]
        if out == received:
            raise AdversaryError(f"setup {rule.attack}: rank {src}'s message {nth} would arrive unchanged")
        self.applied.append({"attack": f"setup-{rule.attack}", "src": src, "dst": dst, "index": nth,
                             "window": self.window, "bytes": len(received[src])})
        return out

    # -- frames out --------------------------------------------------------------------
    def _post(self, wire: torch.Tensor, dst: int):
        try:
            work = self.post_send(self.pg, wire, dst, self.tag)
        except RuntimeError as e:
            raise self.peer_failed(e, f"cannot send to rank {dst}") from None
        self._in_flight.append((work, wire))
        return work

    def _remember(self, table: dict, peer: int, index: int, data: bytes) -> None:
        table[peer].append((self.window, index, data))
        self._order.append(table[peer])
        self._kept += len(data)
        while self._kept > self._history_bytes and self._order:
            self._kept -= len(self._order.popleft().popleft()[2])

    def _source(self, rule: Rule, dst: int, index: int, size: int) -> bytes:
        if rule.attack == "replay":
            frames = list(self._sent[dst])
            if len(frames) < rule.back:
                raise AdversaryError(f"replay: link {self.rank}->{dst} has no frame {rule.back} back")
            data = frames[-rule.back][2]
            what = f"frame {rule.back} back"
        elif rule.from_link is not None:
            same = [d for (_, _, d) in self._recv[rule.from_link] if len(d) == size]
            if not same:
                raise AdversaryError(f"splice: no {size}-byte frame received from rank {rule.from_link}")
            data, what = same[-1], f"latest frame of link {rule.from_link}->{self.rank}"
        else:
            window = self.window if rule.from_window is None else rule.from_window
            found = [d for (w, i, d) in self._sent[dst] if w == window and i == rule.from_index]
            if not found:
                raise AdversaryError(f"splice: link {self.rank}->{dst} has no frame {rule.from_index} "
                                     f"in window {window} (or it left the history)")
            data, what = found[0], f"frame {rule.from_index} of window {window}"
        if len(data) != size:
            raise AdversaryError(f"{rule.attack}: the source frame ({what}) is {len(data)} bytes, "
                                 f"the attacked frame {size}; gloo needs equal sizes")
        return data

    def isend(self, frame: torch.Tensor, dst: int, tag: int = 0):
        # Every frame travels on this transport's own tag, whatever ``tag`` the collective
        # asked for: the host owns the wire, and one message order per link is what the
        # rules (``nth``, drop, reorder) are defined on.
        with self._lock:
            index = self._send_index[dst]
            self._send_index[dst] += 1
            size = frame.numel() * frame.element_size()
            self.sent_sizes[self.window][dst].append(size)
            slot = self._must_match.pop(dst, None)
            if slot is not None:
                # After a drop every frame lands in the receive slot of the frame before it,
                # and gloo aborts a receiver whose slot is too small.
                if size > slot[0] or (slot[1] == "reorder" and size != slot[0]):
                    raise AdversaryError(f"{slot[1]} on link {self.rank}->{dst}: the next frame is {size} bytes, "
                                         f"its receive slot {slot[0]}; gloo would abort the receiver")
                if slot[1] == "drop":
                    self._must_match[dst] = (size, "drop")
            held = self._held.pop(dst, None)
            original = _bytes(frame)
            wire, result, delay = frame, None, 0.0
            rules = [r for r in self.rules
                     if isinstance(r, Rule) and self.window > 0 and r.hits(self.rank, dst, index)]
            for rule in rules:
                if rule.attack == "flip":
                    bit = rule.bit if rule.bit is not None else size * 4
                    data = bytearray(_bytes(wire))
                    data[(bit // 8) % size] ^= 1 << (bit % 8)
                    wire = _tensor(bytes(data))
                elif rule.attack == "truncate":
                    keep = rule.keep if rule.keep is not None else size // 2
                    if not 0 <= keep < size:
                        raise AdversaryError(f"truncate: keep must be below the frame size {size}, got {keep}")
                    wire = _tensor(_bytes(wire)[:keep])
                elif rule.attack in ("replay", "splice"):
                    wire = _tensor(self._source(rule, dst, index, size))
                elif rule.attack == "delay":
                    delay = max(delay, rule.seconds)
                elif rule.attack == "drop":
                    result = _Accepted()
                    self._must_match[dst] = (size, "drop")
                elif rule.attack == "reorder":
                    result = _Accepted()
                    self._held[dst] = _tensor(_bytes(wire))
                    self._must_match[dst] = (size, "reorder")
                self.applied.append({"attack": rule.attack, "src": self.rank, "dst": dst, "index": index,
                                     "window": self.window, "bytes": size})
            self._remember(self._sent, dst, index, original)
        if delay:
            self._sleep(delay)
        if result is None:
            result = self._post(wire, dst)
        if held is not None:
            self._post(held, dst)
        return result

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.abort is not None and self.abort.reason() is not None:
                return
            time.sleep(min(0.01, max(0.0, end - time.monotonic())))

    def settle(self) -> None:
        """Wait for the waits this transport abandoned to end (each within the timeout it
        was started with). Call it before the process exits: a thread still blocked in a
        gloo wait when the process group is torn down aborts the process."""
        for thread in self._abandoned:
            thread.join()
        self._abandoned.clear()

    # -- frames in ---------------------------------------------------------------------
    def irecv(self, frame: torch.Tensor, src: int, tag: int = 0):
        with self._lock:
            index = self._recv_index[src]
            self._recv_index[src] += 1
            try:
                work = self.post_recv(self.pg, frame, src, self.tag)
            except RuntimeError as e:
                raise self.peer_failed(e, f"cannot receive from rank {src}") from None
            self._in_flight.append((work, frame))
            self._pending[id(work)] = (src, index, frame, self.window)
        return work

    def wait(self, work, peer: int, label: FrameLabel) -> None:
        info = self._pending.pop(id(work), None)
        if info is not None:
            self.recv_labels[info[3]][info[0]][info[1]] = label
        if isinstance(work, _Accepted):
            pass
        elif self.abort is None:
            super().wait(work, peer, label)
        else:
            self._wait_abortable(work, peer, label)
        if info is not None:
            with self._lock:
                self._remember(self._recv, info[0], info[1], _bytes(info[2]))

    def _wait_abortable(self, work, peer: int, label: FrameLabel) -> None:
        # gloo P2P work reports completion only from wait(), and a wait that times out
        # closes the connection to that peer, so waits cannot be sliced: the wait runs on
        # a helper thread and this thread watches the abort flag. An abandoned helper ends
        # at the transport's timeout; use a process group of its own per run (selftest does).
        done = threading.Event()
        failure: list[BaseException] = []

        def waiter() -> None:
            try:
                Transport.wait(self, work, peer, label)
            except BaseException as e:  # handed to the caller below
                failure.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=waiter, name="ccddp-adversary-wait", daemon=True)
        thread.start()
        while not done.wait(_POLL_S * 4):
            reason = self.abort.reason()
            if reason is not None:
                self._abandoned.append(thread)
                raise AbandonedWait(f"rank {self.rank}: stopped waiting for rank {peer} ({label}): {reason}",
                                    label=label)
        if failure:
            raise failure[0]
