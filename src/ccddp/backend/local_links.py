"""A trust domain's plaintext links: sockets that cannot leave this machine, to peers that
proved they share it.

Why not gloo: a gloo connection goes to the address its peer published in the group's
store, and the store is the host's. Binding the local listener to 127.0.0.1 does not bind
the peer: a host that rewrites the published address relays the "loopback" link through a
machine of its own (docs/security.md §1, "Trust domains"). So a link that carries plaintext is made here, by hand
(neither torch.distributed nor gloo has a transport confined to one machine):

- **Where it goes cannot be reported.** Each rank listens on an AF_UNIX socket in Linux's
  abstract namespace under a name every member computes from the group's agreed session
  id and the listener's group rank (:func:`socket_name`); nothing is read from the store.
  The kernel connects an AF_UNIX socket only to a listener of the same network namespace
  on the same kernel: another machine (or another container's namespace) is unreachable,
  whatever the host writes anywhere.
- **Who is there is proven.** Every connection starts with a challenge-response under a
  key derived from the session (``derive_purpose_key(secret, session_id, "local-link")``,
  known only to members of this session). Initiator ``I`` to listener ``L``::

      I -> L  magic, I, L, nI (32 random bytes)
      L -> I  nL (32 random bytes), HMAC(K, "L" | magic | I | L | nI | nL)
      I -> L  HMAC(K, "I" | magic | I | L | nI | nL)
      L -> I  one byte: accepted

  A peer that answers is a member of this session (it holds K) reachable over a channel
  that does not leave the machine: that is the proof of co-residence that trust domains
  rest on (:func:`ccddp.backend.links.prove_domains`). Fresh nonces on both sides make
  a recorded answer useless in another connection.
- **Every handshake and every wait is bounded** by the group's timeout; a peer that dies
  closes its sockets, and every pending receive from it fails at once.

Once proven, a rank's connection to a peer carries only what it sends to that peer (the
peer's connection back carries the other direction), so a link never waits on its own
reverse traffic. :class:`LocalLinkSet` offers the process-group calls the engine's
:class:`~ccddp.comm.transport.Transport` uses (``send``/``recv`` matched by peer and tag
in posting order, as gloo does, and ``allgather``), so the engine's unsealed ring runs on
it unchanged.

Example::

    ep = LocalEndpoint.listen(session_id, key, rank=0, timeout_s=30)
    proven = ep.prove([1, 2, 3])            # the group ranks that answered, on this machine
    links = LocalLinkSet(ep, members=[0, 1])  # once rank 1 has proven itself both ways
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from ccddp.errors import ConfigError, PeerTimeoutError

_MAGIC = b"ccddp-local/v1\x00\x00"                    # 16 bytes
_HELLO = struct.Struct(f">{len(_MAGIC)}sII32s")        # magic, initiator, listener, nonce
_NONCE = 32
_MAC = 32
_ACCEPTED = b"\x01"
_HEADER = struct.Struct("<qQ")                          # tag, payload bytes
# A socket buffer large enough that a segment of the ring streams without a round trip
# per few kilobytes (the kernel caps it at net.core.wmem_max/rmem_max).
_SOCKET_BUFFER = 4 << 20


def socket_name(session_id: bytes, rank: int) -> bytes:
    """The abstract-namespace name group rank ``rank`` of session ``session_id`` listens on
    (a leading NUL: no file is made, nothing to clean up)."""
    h = hashlib.sha256(b"ccddp/local-link/" + session_id + rank.to_bytes(4, "big")).hexdigest()[:32]
    return b"\0ccddp-" + h.encode()


def _mac(key: bytes, role: bytes, initiator: int, listener: int, n_i: bytes, n_l: bytes) -> bytes:
    msg = role + _MAGIC + struct.pack(">II", initiator, listener) + n_i + n_l
    return hmac.new(key, msg, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("Connection closed by peer")
        got += k


class LocalEndpoint:
    """This rank's listener and the proven connections to and from its peers on this
    machine (group ranks)."""

    @classmethod
    def listen(cls, session_id: bytes, key: bytes, rank: int, timeout_s: float) -> "LocalEndpoint":
        if not sys.platform.startswith("linux"):
            raise ConfigError("trust domains larger than one rank need Linux (their plaintext links are "
                              "AF_UNIX sockets in the abstract namespace); use trust_domains 'rank'")
        return cls(session_id, key, rank, timeout_s)

    def __init__(self, session_id: bytes, key: bytes, rank: int, timeout_s: float) -> None:
        self.session_id, self.rank, self.timeout_s = session_id, rank, timeout_s
        self._key = key
        self._lock = threading.Condition()
        self.outbound: dict[int, socket.socket] = {}   # peer -> the connection this rank opened
        self.inbound: dict[int, socket.socket] = {}    # peer -> the connection the peer opened
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(socket_name(session_id, rank))
        except OSError as e:
            self._server.close()
            raise ConfigError(f"rank {rank}: cannot listen for this trust domain's local links ({e})") from None
        self._server.listen(64)
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"ccddp-local-accept-{rank}", daemon=True)
        self._acceptor.start()

    # -- listener side ----------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return                                  # closed
            # Each handshake on a thread of its own: a connection that never speaks waits
            # out its own timeout without holding up the peers behind it.
            threading.Thread(target=self._admit, args=(conn,), name=f"ccddp-local-admit-{self.rank}",
                             daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        try:
            peer = self._answer(conn)
        except (OSError, ConnectionError, ValueError, struct.error):
            conn.close()                                # not a member of this session: dropped
            return
        with self._lock:
            old = self.inbound.pop(peer, None)
            self.inbound[peer] = conn
            self._lock.notify_all()
        if old is not None:
            old.close()

    def _answer(self, conn: socket.socket) -> int:
        conn.settimeout(self.timeout_s)
        magic, initiator, listener, n_i = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
        if magic != _MAGIC or listener != self.rank or initiator == self.rank:
            raise ValueError("not a hello for this rank")
        n_l = os.urandom(_NONCE)
        conn.sendall(n_l + _mac(self._key, b"L", initiator, listener, n_i, n_l))
        if not hmac.compare_digest(_recv_exact(conn, _MAC), _mac(self._key, b"I", initiator, listener, n_i, n_l)):
            raise ValueError("the initiator's proof failed")
        conn.sendall(_ACCEPTED)
        conn.settimeout(None)
        return initiator

    # -- initiator side ---------------------------------------------------------------
    def prove(self, peers: list[int]) -> set[int]:
        """Connect to each of ``peers`` (group ranks) on this machine and run the proof;
        the peers that passed. A peer not on this machine (no such listener) is simply not
        among them; one that is there but fails the proof is not either."""
        proven = set()
        for peer in peers:
            if peer == self.rank:
                continue
            sock = self._open(peer)
            if sock is not None:
                with self._lock:
                    old = self.outbound.pop(peer, None)
                    self.outbound[peer] = sock
                if old is not None:
                    old.close()
                proven.add(peer)
        return proven

    def _open(self, peer: int) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(socket_name(self.session_id, peer))
            n_i = os.urandom(_NONCE)
            sock.sendall(_HELLO.pack(_MAGIC, self.rank, peer, n_i))
            answer = _recv_exact(sock, _NONCE + _MAC)
            n_l, mac = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(mac, _mac(self._key, b"L", self.rank, peer, n_i, n_l)):
                sock.close()
                return None
            sock.sendall(_mac(self._key, b"I", self.rank, peer, n_i, n_l))
            if _recv_exact(sock, 1) != _ACCEPTED:
                sock.close()
                return None
        except (OSError, ConnectionError):
            sock.close()
            return None
        sock.settimeout(None)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
        return sock

    def wait_inbound(self, peers: list[int]) -> dict[int, socket.socket]:
        """The connections ``peers`` opened to this rank (they proved themselves here),
        waiting at most the timeout for the last of them."""
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            while not all(p in self.inbound for p in peers):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(p for p in peers if p not in self.inbound)
                    raise PeerTimeoutError(f"rank {self.rank}: ranks {missing} of this trust domain did not open "
                                           f"their local links within {self.timeout_s:g}s")
                self._lock.wait(left)
            return {p: self.inbound[p] for p in peers}

    def drop(self, keep: set[int]) -> None:
        """Close the connections to and from every peer not in ``keep``."""
        with self._lock:
            for table in (self.outbound, self.inbound):
                for peer in [p for p in table if p not in keep]:
                    table.pop(peer).close()

    def close(self) -> None:
        """Stop listening and close every connection (pending receives fail)."""
        with self._lock:
            socks = list(self.outbound.values()) + list(self.inbound.values())
            self.outbound.clear()
            self.inbound.clear()
        for s in socks:
            _shut(s)
        _shut(self._server)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


# -- the link set -------------------------------------------------------------------------

class _Work:
    """A send or receive: complete, failed (the reason), or pending; waits are bounded."""

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: str | None = None

    def finish(self, error: str | None = None) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        # RuntimeError with gloo's words: Transport turns it into a typed, one-line error.
        if not self._done.wait(None if timeout is None else timeout.total_seconds()):
            raise RuntimeError("Timed out waiting for a local link")
        if self._error is not None:
            raise RuntimeError(self._error)
        return True


class _AllWorks:
    """Several works as one (an all-gather): waits share one deadline."""

    def __init__(self, works: list[_Work]) -> None:
        self.works = works

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self, timeout: timedelta | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        for w in self.works:
            w.wait(None if deadline is None else timedelta(seconds=max(0.0, deadline - time.monotonic())))
        return True


def _bytes_of(t: torch.Tensor) -> memoryview:
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ConfigError(f"a local link moves contiguous host tensors, got one on {t.device}")
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy()).cast("B")


@dataclass
class _Arrival:
    """A message read (or being read) before its receive was posted."""

    data: bytearray
    complete: bool = False
    waiter: tuple | None = None          # (view, work, tensor) of the receive that took it


class _Peer:
    """Both directions of one proven link: a sender thread on this rank's connection, a
    reader thread on the peer's."""

    def __init__(self, out: socket.socket, inp: socket.socket, name: str) -> None:
        self.out, self.inp = out, inp
        self.lock = threading.Lock()
        self.posted: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.arrived: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.failed: str | None = None
        self.outbox: collections.deque = collections.deque()
        self.outbox_ready = threading.Condition()
        threading.Thread(target=self._send_loop, name=f"{name}-send", daemon=True).start()
        threading.Thread(target=self._read_loop, name=f"{name}-read", daemon=True).start()

    # -- sending: one thread, messages in posting order -------------------------------
    def send(self, tag: int, t: torch.Tensor) -> _Work:
        work = _Work()
        view = _bytes_of(t)
        with self.outbox_ready:
            if self.failed is not None:
                work.finish(self.failed)
                return work
            self.outbox.append((tag, view, work, t))
            self.outbox_ready.notify()
        return work

    def _send_loop(self) -> None:
        while True:
            with self.outbox_ready:
                while not self.outbox and self.failed is None:
                    self.outbox_ready.wait()
                if self.failed is not None:
                    pending, self.outbox = list(self.outbox), collections.deque()
                    for _, _, work, _ in pending:
                        work.finish(self.failed)
                    return
                tag, view, work, _ = self.outbox.popleft()
            try:
                self.out.sendall(_HEADER.pack(tag, len(view)))
                if len(view):
                    self.out.sendall(view)
            except OSError:
                self._fail("Connection closed by peer")
                work.finish(self.failed)
                continue
            work.finish()

    # -- receiving: one thread, matched by tag in posting order -----------------------
    def recv(self, tag: int, t: torch.Tensor) -> _Work:
        work = _Work()
        view = _bytes_of(t)
        with self.lock:
            if self.failed is not None:
                work.finish(self.failed)
                return work
            early = self.arrived.get(tag)
            if early:
                a = early.popleft()
                if not a.complete:
                    a.waiter = (view, work, t)     # the reader hands it over once read
                    return work
                _deliver(a.data, view, work)
                return work
            self.posted[tag].append((view, work, t))
        return work

    def _read_loop(self) -> None:
        header = bytearray(_HEADER.size)
        while True:
            try:
                _recv_into(self.inp, memoryview(header))
                tag, n = _HEADER.unpack(header)
                with self.lock:
                    q = self.posted.get(tag)
                    target = q.popleft() if q else None
                    arrival = None
                    if target is None or len(target[0]) != n:
                        # Taken in order even before it is read, so a receive posted while
                        # it streams in still gets this message, not the next one.
                        arrival = _Arrival(bytearray(n))
                        if target is None:
                            self.arrived[tag].append(arrival)
                if arrival is None:
                    _recv_into(self.inp, target[0])
                    target[1].finish()
                    continue
                if n:
                    _recv_into(self.inp, memoryview(arrival.data))
                if target is not None:
                    target[1].finish(f"a message of {n} bytes arrived for a receive of {len(target[0])} bytes")
                    continue
                with self.lock:
                    arrival.complete = True
                    waiter = arrival.waiter
                if waiter is not None:
                    _deliver(arrival.data, waiter[0], waiter[1])
            except (OSError, ConnectionError):
                self._fail("Connection closed by peer")
                return

    def _fail(self, reason: str) -> None:
        with self.lock:
            if self.failed is None:
                self.failed = reason
            pending = [w for q in self.posted.values() for _, w, _ in q]
            pending += [a.waiter[1] for q in self.arrived.values() for a in q if a.waiter is not None]
            self.posted.clear()
        for w in pending:
            w.finish(reason)
        with self.outbox_ready:
            self.outbox_ready.notify_all()


def _deliver(data: bytearray, view: memoryview, work: _Work) -> None:
    if len(data) != len(view):
        work.finish(f"a message of {len(data)} bytes arrived for a receive of {len(view)} bytes")
        return
    view[:] = data
    work.finish()


class LocalLinkSet:
    """The plaintext links among the ranks of one trust domain on this machine, with the
    process-group calls the engine's transport makes (``rank``, ``size``, ``send``,
    ``recv``, ``allgather``), in the domain's own ranks (an index into ``members``).

    Every member builds it with the same ``members`` (group ranks, in domain order) after
    each pair proved itself both ways (:meth:`LocalEndpoint.prove`)."""

    def __init__(self, endpoint: LocalEndpoint, members: list[int]) -> None:
        self.members = list(members)
        self._rank = self.members.index(endpoint.rank)
        others = [m for m in self.members if m != endpoint.rank]
        missing = [m for m in others if m not in endpoint.outbound]
        if missing:
            raise ConfigError(f"rank {endpoint.rank}: ranks {missing} of this trust domain have not proven they "
                              "share this machine")
        inbound = endpoint.wait_inbound(others)
        self._peers = {self.members.index(m): _Peer(endpoint.outbound[m], inbound[m],
                                                   f"ccddp-local-{endpoint.rank}-{m}") for m in others}
        self._endpoint = endpoint
        self._gathers = 0

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self.members)

    def _peer(self, r: int) -> _Peer:
        peer = self._peers.get(r)
        if peer is None:
            raise RuntimeError(f"no local link from rank {self._rank} to rank {r} of this trust domain")
        return peer

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        (t,) = tensors
        return self._peer(dst).send(tag, t)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Work:
        (t,) = tensors
        return self._peer(src).recv(tag, t)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> _AllWorks:
        """Every member's input into ``outputs[0][member]`` (the setup's plaintext hellos).
        Tagged below zero, where the engine's data tags (>= 0) never are."""
        (outs,), (inp,) = outputs, inputs
        self._gathers += 1
        tag = -self._gathers
        works = []
        for r, peer in self._peers.items():
            works.append(peer.send(tag, inp))
            works.append(peer.recv(tag, outs[r]))
        outs[self._rank].copy_(inp)
        return _AllWorks(works)

    def close(self) -> None:
        self._endpoint.close()
