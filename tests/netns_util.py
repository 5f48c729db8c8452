"""Real separate hosts on one machine: network namespaces joined through a host that owns the wire.

:func:`hosts` (a context manager) builds three namespaces with names of their own for this
run::

    hostA  eth0 10.0.1.2/24  <-veth->  ha 10.0.1.1/24  hostH  hb 10.0.2.1/24  <-veth->  eth0 10.0.2.2/24  hostB

``hostH`` plays the machine's owner: every byte between hostA and hostB crosses it. Each
host has its own loopback and its own abstract AF_UNIX namespace, and its processes run
under a host name of their own (``unshare --uts``, resolvable through
``/etc/netns/<ns>/hosts``). Everything is removed on exit, also when the body failed;
where namespaces cannot be made (not root, no iproute2, ``ip netns add`` refused) the
calling test is skipped with the reason.

What hostH does, as the threat model lets the host do:

- :meth:`Hosts.wire`: the only path between the hosts, a forwarder in hostH (AF_PACKET
  sockets on its two interfaces, ``python netns_util.py wire``): it records every frame on
  hostH's interfaces (searchable with :func:`found_in`) and injects faults into what it
  forwards -- loss, delay with jitter, reordering, a partition (:meth:`Wire.faults`). It is
  a program rather than ``tc netem`` because kernels without ``sch_netem`` (this CI's) have
  no netem qdisc; hostH's kernel forwards nothing itself (``ip_forward`` stays 0): the
  hosts route to each other through a gateway MAC that no interface owns, so only the
  forwarder carries those frames. The hosts' offloads are off (ethtool ioctls), so every
  frame is one MTU at most with its checksums, forwardable as it is;
- :meth:`Hosts.serve_store`: serve the job's TCPStore from hostH, and a relay
  (``python netns_util.py host``) that splices connections which a rewritten gloo
  address sent to it, recording every byte it forwards.

This file is also the program that runs inside hostH (``wire`` and ``host`` subcommands,
and ``no-offload`` in the hosts); it imports torch only for the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import dist_util

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

A_IP, HA_IP, HB_IP, B_IP = "10.0.1.2", "10.0.1.1", "10.0.2.1", "10.0.2.2"
#: The gateway each host routes the other through, and its MAC, which no interface owns.
GW_A, GW_B = "10.0.1.254", "10.0.2.254"
FAKE_A, FAKE_B = "02:cc:dd:00:00:0a", "02:cc:dd:00:00:0b"
#: The port hostH serves the job's store on, and the relay's.
STORE_PORT, RELAY_PORT = 29400, 29411


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def why_not() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2 / util-linux) is not installed"
    return None


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process started in a namespace: this one's, with ``src`` and
    the tests first on PYTHONPATH (the rest kept), one thread per process."""
    env = dist_util.child_env({"OMP_NUM_THREADS": "1", **extra})
    env.pop("CCDDP_GROUP_SECRET_FILE", None)
    return env


@dataclass
class Hosts:
    """The namespaces of one run: ``ns["A"]``, ``ns["B"]``, ``ns["H"]``, and each host's
    name (``hostname["A"]``)."""

    tag: str
    ns: dict[str, str]
    hostname: dict[str, str]
    mac: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    # -- processes --------------------------------------------------------------------

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host`` (A, B or H) under that host's name."""
        name = self.hostname[host]
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c",
                f'hostname "$0" && exec "$@"', name, *argv]

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("env", child_env())
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        proc = subprocess.Popen(self.argv(host, argv), **kw)
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(host, argv), env=kw.pop("env", child_env()), capture_output=True,
                              text=True, timeout=timeout, **kw)

    # -- what hostH does ----------------------------------------------------------------

    @contextlib.contextmanager
    def wire(self, path: Path):
        """The wire between hostA and hostB (hostH's forwarder): hostA and hostB reach each
        other only while it runs. Yields a :class:`Wire`: ``faults(...)`` changes what it
        does to the frames it forwards, ``frames()`` (after exit) is everything hostH saw."""
        w = Wire(Path(path))
        w.control.write_text("{}")
        proc = self.popen("H", [sys.executable, str(HERE / "netns_util.py"), "wire", str(w.path), str(w.control),
                                self.mac["A"], self.mac["B"]])
        try:
            _wait_line(proc, "ready", 30)
            yield w
        finally:
            _stop(proc)
            out = proc.stdout.read() if proc.stdout else ""
            for line in out.splitlines():
                if line.startswith("{"):
                    w.stats = json.loads(line)

    @contextlib.contextmanager
    def serve_store(self, out: Path):
        """The job's TCPStore on hostH (``HA_IP`` / ``HB_IP``:``STORE_PORT``) and the relay
        (``RELAY_PORT``); yields a :class:`Relay` whose record is read on exit."""
        relay = Relay(out)
        proc = self.popen("H", [sys.executable, str(HERE / "netns_util.py"), "host", str(out)])
        try:
            _wait_line(proc, "ready", 120)
            yield relay
        finally:
            _stop(proc)
            relay.load()

    def check_wire(self, path: Path) -> bool:
        """A positive control: bytes sent from hostA to hostB over TCP cross the wire and are
        found in what it recorded (so a search that finds nothing there means something)."""
        marker = uuid.uuid4().bytes * 64
        server = self.popen("B", [sys.executable, "-c", _ECHO_SERVER, B_IP, "29499"])
        try:
            _wait_line(server, "ready", 30)
            with self.wire(path) as w:
                sent = self.run("A", [sys.executable, "-c", _SEND, B_IP, "29499", marker.hex()])
                if sent.returncode != 0:
                    raise RuntimeError(f"sending the control marker: {sent.stderr[-2000:]}")
            return bool(found_in(w.frames(), [marker[:32]])) and w.stats.get("forwarded", 0) > 0
        finally:
            _stop(server)


_ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept()
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    n += len(b)
c.sendall(str(n).encode()); c.close()
"""

_SEND = """
import socket, sys
data = bytes.fromhex(sys.argv[3])
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.sendall(data); c.shutdown(socket.SHUT_WR)
got = c.recv(64)
assert int(got) == len(data), (got, len(data))     # all of it crossed the wire
"""


def _wait_line(proc: subprocess.Popen, want: str, timeout: float) -> None:
    """Wait until ``proc`` prints a line starting with ``want`` (its stdout, line by line)."""
    box: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(want):
                box.append(line)
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        _stop(proc)
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"{proc.args!r} did not say {want!r} within {timeout}s: {err[-3000:]}")


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def hosts():
    """Three fresh namespaces (hostA, hostB, and hostH between them), removed on exit with
    every process started in them; skips the calling test with the reason where they
    cannot be made."""
    import pytest

    reason = why_not()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:8]
    ns = {h: f"ccddp-{h.lower()}-{tag}" for h in ("A", "B", "H")}
    names = {h: f"host{h.lower()}-{tag}" for h in ("A", "B", "H")}
    made: list[str] = []
    etc: list[Path] = []
    made_etc = False
    try:
        for h in ("A", "B", "H"):
            done = _ip("netns", "add", ns[h], check=False)
            if done.returncode != 0:
                pytest.skip(f"ip netns add failed: {done.stderr.strip()}")
            made.append(ns[h])
        # hostH's kernel forwards nothing (ip_forward stays 0): each host reaches the other
        # through a gateway whose MAC no interface owns, and hostH's forwarder (Hosts.wire)
        # carries those frames across.
        steps = [
            ["link", "add", "eth0", "netns", ns["A"], "type", "veth", "peer", "name", "ha", "netns", ns["H"]],
            ["link", "add", "eth0", "netns", ns["B"], "type", "veth", "peer", "name", "hb", "netns", ns["H"]],
            ["-n", ns["A"], "addr", "add", f"{A_IP}/24", "dev", "eth0"],
            ["-n", ns["B"], "addr", "add", f"{B_IP}/24", "dev", "eth0"],
            ["-n", ns["H"], "addr", "add", f"{HA_IP}/24", "dev", "ha"],
            ["-n", ns["H"], "addr", "add", f"{HB_IP}/24", "dev", "hb"],
        ]
        for h, devs in (("A", ["lo", "eth0"]), ("B", ["lo", "eth0"]), ("H", ["lo", "ha", "hb"])):
            steps += [["-n", ns[h], "link", "set", d, "up"] for d in devs]
        steps += [["-n", ns["A"], "neigh", "add", GW_A, "lladdr", FAKE_A, "dev", "eth0", "nud", "permanent"],
                  ["-n", ns["B"], "neigh", "add", GW_B, "lladdr", FAKE_B, "dev", "eth0", "nud", "permanent"],
                  ["-n", ns["A"], "route", "add", "10.0.2.0/24", "via", GW_A],
                  ["-n", ns["B"], "route", "add", "10.0.1.0/24", "via", GW_B]]
        for st in steps:
            done = _ip(*st, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot build the test hosts: ip {' '.join(st)}: {done.stderr.strip()}")
        mac = {}
        for h in ("A", "B"):
            mac[h] = json.loads(_ip("-n", ns[h], "-j", "link", "show", "eth0").stdout)[0]["address"]
            off = subprocess.run(["ip", "netns", "exec", ns[h], sys.executable, str(HERE / "netns_util.py"),
                                  "no-offload", "eth0"], capture_output=True, text=True, timeout=60)
            if off.returncode != 0:
                pytest.skip(f"cannot turn off offloads on the test hosts: {off.stderr.strip()[-500:]}")
        # Each host's name resolves inside it (ip netns exec mounts /etc/netns/<ns>/hosts
        # over /etc/hosts), so nothing waits on a DNS server the namespaces cannot reach.
        etc_netns = Path("/etc/netns")
        made_etc = not etc_netns.exists()
        for h, ip in (("A", A_IP), ("B", B_IP), ("H", HA_IP)):
            d = etc_netns / ns[h]
            with contextlib.suppress(OSError):      # a read-only /etc: names just do not resolve
                d.mkdir(parents=True, exist_ok=True)
                etc.append(d)
                (d / "hosts").write_text(f"127.0.0.1 localhost\n{ip} {names[h]}\n")
        box = Hosts(tag, ns, names, mac)
        try:
            yield box
        finally:
            for p in box.procs:
                _stop(p, grace=5)
    finally:
        for n in made:
            _ip("netns", "del", n, check=False)
        for d in etc:
            shutil.rmtree(d, ignore_errors=True)
        if etc and made_etc:
            with contextlib.suppress(OSError):
                Path("/etc/netns").rmdir()      # ours, and only if no one else uses it now


# -- searching what the host saw -------------------------------------------------------

def found_in(chunks, probes: list[bytes]) -> list[bytes]:
    """The probes that occur in any of ``chunks`` (bytes objects: frames, or a relay's
    streams). Chunks are joined with 0xff runs: a probe of finite float32 values cannot
    match across a join."""
    blob = (b"\xff" * 16).join(chunks)
    return [p for p in probes if blob.find(p) >= 0]


class Wire:
    """hostH's forwarder between the hosts: its faults, and what it recorded (every frame
    on hostH's interfaces, as seen there)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.control = self.path.with_suffix(".faults.json")
        self.stats: dict = {}

    def faults(self, *, partition: bool = False, partition_after: int | None = None, loss: float = 0.0,
               delay_ms: float = 0.0, jitter_ms: float = 0.0, reorder: float = 0.0, settle: float = 0.3) -> None:
        """From now on (after ``settle`` seconds, the forwarder's poll), do this to every
        frame between the hosts: drop all (``partition``), or all once ``partition_after``
        more frames went through; drop each with probability ``loss``; hold each
        ``delay_ms`` +- ``jitter_ms`` except a ``reorder`` fraction sent at once (which
        therefore overtakes the frames held before it)."""
        spec = {"partition": partition, "partition_after": partition_after, "loss": loss, "delay_ms": delay_ms,
                "jitter_ms": jitter_ms, "reorder": reorder}
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        os.replace(tmp, self.control)
        time.sleep(settle)

    def partition(self) -> None:
        """Cut hostA from hostB: nothing more is forwarded either way."""
        self.faults(partition=True)

    def frames(self) -> list[bytes]:
        data = self.path.read_bytes() if self.path.exists() else b""
        out, i = [], 0
        while i + 4 <= len(data):
            (n,) = struct.unpack_from("<I", data, i)
            out.append(data[i + 4:i + 4 + n])
            i += 4 + n
        return out

    def tcp_payload_bytes(self) -> int:
        """Bytes of TCP payload in the recorded IPv4 frames (each forwarded frame is seen
        twice: in on one interface, out on the other)."""
        total = 0
        for f in self.frames():
            if len(f) < 34 or f[12:14] != b"\x08\x00" or f[23] != 6:
                continue
            ihl = (f[14] & 0x0F) * 4
            tot = struct.unpack_from("!H", f, 16)[0]
            doff = (f[14 + ihl + 12] >> 4) * 4
            total += max(0, tot - ihl - doff)
        return total


class Relay:
    """What the relay in hostH forwarded: per spliced link (by the pair id a rewritten
    address carried), both directions' bytes."""

    def __init__(self, out: Path) -> None:
        self.dir = Path(out)
        self.links: dict = {}

    def load(self) -> None:
        index = self.dir / "relay.json"
        self.links = json.loads(index.read_text()) if index.exists() else {}

    def streams(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.dir.glob("relay-*.bin"))]

    def forwarded(self) -> int:
        return sum(len(s) for s in self.streams())


# -- the programs hostH runs -------------------------------------------------------------

ETH_P_ALL, SOL_PACKET, PACKET_STATISTICS = 0x0003, 263, 6
SIOCETHTOOL = 0x8946
#: ethtool's legacy set commands: tx checksum, scatter-gather, TSO, GSO, GRO.
ETHTOOL_OFF = (0x17, 0x19, 0x1F, 0x24, 0x2C)


def _no_offload(dev: str) -> None:
    """Turn off checksum and segmentation offloads on ``dev`` (ethtool's ioctl, no ethtool
    binary needed): every frame leaves whole, at most one MTU, with its checksums, so the
    host in the middle can forward it as it is."""
    import array
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for cmd in ETHTOOL_OFF:
        val = array.array("I", [cmd, 0])
        addr, _ = val.buffer_info()
        ifreq = struct.pack("16sP", dev.encode(), addr).ljust(40, b"\0")
        try:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
        except OSError as e:
            if cmd != 0x2C:                          # GRO may be fixed off
                raise SystemExit(f"ethtool {cmd:#x} on {dev}: {e}")


def _wire(path: str, control: str, mac_a: str, mac_b: str) -> None:
    """The wire between hostA and hostB, as hostH runs it: frames the hosts address to their
    gateway's MAC (``FAKE_A`` / ``FAKE_B``, which no interface owns, so hostH's kernel
    drops them unseen) are forwarded to the other host, under the faults that ``control``
    (a JSON file, re-read when it changes) asks for: ``partition`` (now) or
    ``partition_after`` (once that many more frames were forwarded: a cut in the middle of
    whatever is under way), ``loss`` (probability), ``delay_ms``, ``jitter_ms``, ``reorder``
    (probability that a frame skips the delay). The stats say when it cut (``cut_at``,
    CLOCK_MONOTONIC, which every namespace shares).
    Every frame seen on hostH's two interfaces -- forwarded or hostH's own -- is appended
    to ``path`` (length-prefixed). Runs until SIGTERM; then prints its counts as JSON."""
    import heapq
    import random

    macs = {"ha": bytes.fromhex(mac_a.replace(":", "")), "hb": bytes.fromhex(mac_b.replace(":", ""))}
    fake = {"ha": bytes.fromhex(FAKE_A.replace(":", "")), "hb": bytes.fromhex(FAKE_B.replace(":", ""))}
    socks = {}
    for dev in ("ha", "hb"):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)        # SO_RCVBUFFORCE (root)
        s.bind((dev, ETH_P_ALL))
        s.setblocking(False)
        socks[dev] = s
    other = {"ha": "hb", "hb": "ha"}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    faults: dict = {}
    seen_mtime = None
    queue: list = []
    seq = 0
    counts = {"frames": 0, "forwarded": 0, "dropped": 0, "send_errors": 0}
    forwarded_at_spec, cut_at = 0, None
    rng = random.Random()
    import select

    with open(path, "wb", buffering=1 << 20) as rec:
        print("ready", flush=True)
        next_poll = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + 0.05
                try:
                    m = os.stat(control).st_mtime_ns
                except FileNotFoundError:
                    m = None
                if m != seen_mtime:
                    seen_mtime = m
                    with contextlib.suppress(FileNotFoundError, ValueError):
                        faults = json.loads(Path(control).read_text() or "{}")
                        forwarded_at_spec, cut_at = counts["forwarded"], None
                        if faults.get("partition"):
                            cut_at = time.monotonic()
                    rec.flush()
            wait = 0.05 if not queue else max(0.0, min(0.05, queue[0][0] - now))
            ready, _, _ = select.select(list(socks.values()), [], [], wait)
            for dev, s in socks.items():
                if s not in ready:
                    continue
                while True:
                    try:
                        frame, addr = s.recvfrom(1 << 17)
                    except BlockingIOError:
                        break
                    counts["frames"] += 1
                    rec.write(struct.pack("<I", len(frame)) + frame)
                    if addr[2] == socket.PACKET_OUTGOING or frame[:6] != fake[dev] or frame[12:14] != b"\x08\x00":
                        continue
                    after = faults.get("partition_after")
                    if after is not None and not cut_at and counts["forwarded"] - forwarded_at_spec >= int(after):
                        cut_at = time.monotonic()
                    if faults.get("partition") or cut_at or rng.random() < float(faults.get("loss", 0)):
                        counts["dropped"] += 1
                        continue
                    out = other[dev]
                    fwd = macs[out] + fake[out] + frame[12:]
                    delay = float(faults.get("delay_ms", 0)) / 1000
                    if delay and rng.random() >= float(faults.get("reorder", 0)):
                        delay = max(0.0, delay + rng.uniform(-1, 1) * float(faults.get("jitter_ms", 0)) / 1000)
                    else:
                        delay = 0.0
                    seq += 1
                    heapq.heappush(queue, (time.monotonic() + delay, seq, out, fwd))
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, fwd = heapq.heappop(queue)
                try:
                    socks[out].send(fwd)
                    counts["forwarded"] += 1
                except OSError:
                    counts["send_errors"] += 1
    drops = 0
    for s in socks.values():
        drops += struct.unpack("II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
    print(json.dumps({**counts, "kernel_drops": drops, "cut_at": cut_at}), flush=True)


def _host(out: str) -> None:
    """The job's store (TCPStore on every interface of hostH) and the relay: a connection
    to RELAY_PORT is a gloo initiator that sent the 8-byte sequence number of the address
    the host wrote for it; two connections with the same number are spliced, both
    directions recorded. Runs until SIGTERM."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    store = TCPStore("0.0.0.0", STORE_PORT, None, True, timedelta(seconds=120), wait_for_workers=False)
    waiting: dict[int, socket.socket] = {}
    index: dict[str, dict] = {}
    lock = threading.Lock()
    outdir = Path(out)

    def pump(src: socket.socket, dst: socket.socket, key: str, direction: str) -> None:
        rec = open(outdir / f"relay-{key}-{direction}.bin", "wb", buffering=0)
        try:
            while True:
                b = src.recv(1 << 16)
                if not b:
                    break
                rec.write(b)
                with lock:
                    index[key][direction] += len(b)
                dst.sendall(b)
        except OSError:
            pass
        finally:
            rec.close()
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def splice(first: socket.socket, second: socket.socket, pid: int) -> None:
        key = f"{pid:016x}"
        with lock:
            index[key] = {"a": first.getpeername()[0], "b": second.getpeername()[0], "a_to_b": 0, "b_to_a": 0}
        for s, d, direction in ((first, second, "a_to_b"), (second, first, "b_to_a")):
            threading.Thread(target=pump, args=(s, d, key, direction), daemon=True).start()

    def serve_one(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b""
        while len(head) < 8:
            b = conn.recv(8 - len(head))
            if not b:
                conn.close()
                return
            head += b
        (pid,) = struct.unpack("<q", head)
        with lock:
            other = waiting.pop(pid, None)
            if other is None:
                waiting[pid] = conn
                return
        splice(other, conn, pid)

    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("0.0.0.0", RELAY_PORT))
    lst.listen(256)
    lst.settimeout(0.2)
    print("ready", flush=True)
    try:
        while not stop.is_set():
            try:
                conn, _ = lst.accept()
            except socket.timeout:
                continue
            conn.settimeout(None)
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()
    finally:
        time.sleep(0.2)
        with lock:
            (outdir / "relay.json").write_text(json.dumps(index))
        del store


if __name__ == "__main__":
    {"wire": _wire, "host": _host, "no-offload": _no_offload}[sys.argv[1]](*sys.argv[2:])
