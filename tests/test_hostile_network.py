"""Trust domains on real separate hosts, against a host that owns the store and the wire.

Two test hosts (network namespaces hostA and hostB, two ranks each) reach each other only
through a third, hostH, which plays the machine's owner (``tests/netns_util.py``): it
serves the job's TCPStore, forwards every byte between the hosts, records every frame it
forwards, runs a relay, and injects faults into what it forwards. The ranks
(``tests/hostile_network_main.py``) run ``init_process_group("ccddp")`` with
``trust_domains "node"`` and all-reduce tensors that repeat a 16-byte pattern of their
own, drawn per run: any 16 bytes of plaintext of an input, a partial sum or the result
are one of a few hundred probes, searched for in everything hostH saw.

- nothing unsealed leaves a host: correct results, the ``node`` map is the two hosts, and
  no probe in hostH's recording (which does see a control marker sent between the hosts);
  also while hostH delays, reorders and drops frames (results stay exact);
- issue 37, findings 1 and 2: the host rewrites every gloo address the ranks read from the
  store to its relay (below the reader's own address, so both ends of a link connect out
  to the relay, which splices them), and, in a second variant, also makes every rank
  report one node, and in a third, the ranks claim one explicit domain of all four.
  Every rank must end either with correct results in a domain that does not span hosts,
  or with a typed ccddp error (for the explicit map: a ConfigError naming a rank of the
  other host); and no probe may appear in what hostH forwarded or relayed. (On 73afd36
  all three fail: the domains' plaintext up/down links run through the relay, and with
  one node or the explicit map all four ranks form one plaintext domain across the
  hosts);
- faults: a partition during all-reduces ends every rank with a typed ccddp error within
  ``timeout_s`` (plus a margin for a busy machine).

Skipped, with the reason, where network namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import netns_util as nu

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 10                         # the ranks' ccddp timeout_s
#: Finite limit on any one rank process: start-up (torch import on a busy machine), the
#: group's setup and the ops, with room to spare; a rank still running then has hung.
PROC_LIMIT = 150
HOST_OF = {0: "A", 1: "A", 2: "B", 3: "B"}
#: What a rank may end with instead of a result: ccddp's typed errors.
TYPED = {"ConfigError", "PeerTimeoutError", "IntegrityError", "FrameFormatError", "EstablishmentError"}


def _patterns() -> list[list[float]]:
    """Each rank's 4 float32 values: integers in [2^20, 2^21), so every partial sum is exact
    and finite (a probe can never match the 0xff joins of :func:`netns_util.found_in`)."""
    rng = random.SystemRandom()
    return [[float(rng.randrange(1 << 20, 1 << 21)) for _ in range(4)] for _ in range(4)]


def _probes(patterns) -> list[bytes]:
    """Every 16-byte window of any rank's tensor, of the result, and of every partial sum
    (each subset of ranks): 16 rotations of 15 patterns."""
    out = []
    for subset in range(1, 1 << len(patterns)):
        vals = [sum(p[i] for r, p in enumerate(patterns) if subset >> r & 1) for i in range(4)]
        b = struct.pack("<4f", *vals)
        out += [(b + b)[j:j + 16] for j in range(16)]
    return out


def _env(tmp: Path, host: str, domains="node", **extra) -> dict:
    settings = {"trust_domains": domains, "timeout_s": TIMEOUT_S}
    return nu.child_env(CCDDP_SETTINGS=json.dumps(settings),
                        GLOO_SOCKET_IFNAME="eth0", GROUP_RANK="0" if host == "A" else "1",
                        CCDDP_TEST_GO=str(tmp / "go"), **extra)


def _launch(h: nu.Hosts, tmp: Path, mode: str, patterns, domains="node") -> list[subprocess.Popen]:
    secret = os.urandom(32).hex()                       # one secret for the job, drawn per run
    procs = []
    for rank in range(4):
        host = HOST_OF[rank]
        via = nu.HA_IP if host == "A" else nu.HB_IP    # hostH, as this host reaches it
        env = dict(_env(tmp, host, domains), CCDDP_GROUP_SECRET=secret)
        procs.append(h.popen(host, [sys.executable, str(nu.HERE / "hostile_network_main.py"), str(rank), via, via,
                                    mode, json.dumps(patterns)], env=env))
    return procs


class _Reader:
    """Reads a rank's stdout lines as they come (ready lines, then its result)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self.err = proc, [], ""
        self.ended_at: float | None = None
        self._t = threading.Thread(target=self._read, daemon=True)
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._t.start()
        self._e.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
        self.proc.wait()
        self.ended_at = time.monotonic()

    def _read_err(self) -> None:
        self.err = self.proc.stderr.read()

    def ready(self) -> bool:
        return any('"ready": true' in line for line in self.lines)

    def result(self, deadline: float) -> dict:
        """The rank's result line; a rank still running at ``deadline`` (``time.monotonic``)
        is killed and reported as hung."""
        self._t.join(max(0.0, deadline - time.monotonic()))
        if self._t.is_alive():
            self.proc.kill()
            self._t.join(10)
            self._e.join(10)
            return {"error_type": "Hung", "error": "still running at the test's deadline", "stderr": self.err[-1500:]}
        self._e.join(10)
        for line in reversed(self.lines):
            if line.startswith("{") and '"ready"' not in line:
                return {**json.loads(line), "exit": self.proc.returncode}
        return {"error_type": "NoResult", "exit": self.proc.returncode, "stderr": self.err[-3000:]}


def _results(procs, limit: float = PROC_LIMIT) -> list[dict]:
    readers = [_Reader(p) for p in procs]
    deadline = time.monotonic() + limit
    return [r.result(deadline) for r in readers]


def _short(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "rewrites"}


def _spans_hosts(domains) -> list[list[int]]:
    return [d for d in domains or [] if len({HOST_OF[r] for r in d}) > 1]


def _where(found: list[bytes], chunks: dict[str, bytes]) -> list[str]:
    return [name for name, data in chunks.items() if nu.found_in([data], found)]


def test_two_hosts_node_domains_keep_plaintext_inside_each_host_also_under_delay_reordering_and_loss(tmp_path):
    """2 hosts x 2 ranks, ``node``: the map is the two hosts; a first all-reduce on a clean
    wire, then ten more while hostH delays what it forwards (20 ms +- 10 ms), lets 25 % of
    the frames overtake the held ones and drops 1 %: every sum exact on every rank, each op
    slower than the delay allows and frames dropped (the faults were on the path); and no
    plaintext of any input, partial sum or result in any frame hostH saw (which does see a
    control marker sent between the hosts)."""
    ops = 10
    patterns = _patterns()
    with nu.hosts() as h:
        assert h.check_wire(tmp_path / "control.bin"), "the wire did not carry or record a marker sent A -> B"
        with h.serve_store(tmp_path) as relay, h.wire(tmp_path / "wire.bin") as wire:
            procs = _launch(h, tmp_path, f"count:{ops}", patterns)
            readers = [_Reader(p) for p in procs]
            _until_ready(procs, readers, PROC_LIMIT)
            wire.faults(delay_ms=20, jitter_ms=10, reorder=0.25, loss=0.01)
            (tmp_path / "go").touch()
            deadline = time.monotonic() + PROC_LIMIT
            results = [r.result(deadline) for r in readers]
    print("node:", [_short(r) for r in results], wire.stats)
    for rank, res in enumerate(results):
        assert res.get("ok") is True and res.get("ops") == ops + 1, (rank, _short(res))
        if res.get("domains") is not None:
            assert sorted(map(sorted, res["domains"])) == [[0, 1], [2, 3]], (rank, res["domains"])
        # Every op crosses the wire at least once each way: 2 x (20 - 10) ms at the least.
        assert res["op_seconds_after_go"] >= ops * 0.02, (rank, _short(res))
    assert wire.stats.get("dropped", 0) > 0, wire.stats          # loss happened, and TCP recovered
    assert wire.stats.get("kernel_drops") == 0, wire.stats       # the recording is complete
    assert wire.tcp_payload_bytes() >= 4 * 16384, "hostH saw less than the sealed traffic across hosts"
    assert relay.forwarded() == 0                                 # no rewrites: nothing went through the relay
    leaked = nu.found_in(wire.frames(), _probes(patterns))
    assert not leaked, f"{len(leaked)} plaintext probes in frames hostH saw"


ATTACKS = [("relay", "node"), ("attack", "node"), ("relay", [[0, 1, 2, 3]])]


@pytest.mark.parametrize("mode,domains", ATTACKS,
                         ids=["rewritten-addresses", "one-node-and-rewritten-addresses", "explicit-map-across-hosts"])
def test_host_that_relays_the_links_and_joins_the_hosts_learns_nothing(tmp_path, mode, domains):
    """Issue 37, findings 1 and 2. ``rewritten-addresses``: the host rewrites every gloo
    address a rank reads from the store to its relay on hostH -- below the reader's own
    address, so both ends of each link connect out to the relay, which splices them and
    records both directions (a listener bound to loopback does not stop the reader from
    connecting out). ``one-node-and-rewritten-addresses``: also, every rank is told it runs
    on the one node (host name and GROUP_RANK, what ``"node"`` learns in the clear), so
    all four would form one plaintext domain across the hosts. ``explicit-map-across-hosts``:
    the ranks themselves claim one domain of all four (``[[0, 1, 2, 3]]``), which ranks on
    two hosts cannot prove, under the same rewrites: every rank must refuse with a
    ``ConfigError`` that names a rank of the other host.

    Every rank must end either with exact sums in a domain within its own host, or with a
    typed ccddp error; the host must have rewritten addresses (the attack happened) and,
    where the job ran, carried its links through the relay; and no plaintext probe may
    appear in anything hostH forwarded or relayed."""
    patterns = _patterns()
    with nu.hosts() as h:
        assert h.check_wire(tmp_path / "control.bin"), "the wire did not carry or record a marker sent A -> B"
        with h.serve_store(tmp_path) as relay, h.wire(tmp_path / "wire.bin") as wire:
            results = _results(_launch(h, tmp_path, mode, patterns, domains))
    summary = [_short(r) for r in results]
    print(f"{mode}:", summary, relay.forwarded(), wire.stats)
    rewrites = [w for r in results for w in r.get("rewrites") or []]
    assert rewrites, f"the host rewrote no gloo address: the attack did not happen ({summary})"
    assert wire.stats.get("kernel_drops") == 0, wire.stats      # hostH's recording is complete
    probes = _probes(patterns)
    streams = {p.name: p.read_bytes() for p in sorted(tmp_path.glob("relay-*.bin"))}
    in_relay = nu.found_in(list(streams.values()), probes)
    in_wire = nu.found_in(wire.frames(), probes)
    names = {w["pair"]: f"{w['key'].rsplit('//', 1)[-1].rsplit('/', 1)[0]} {min(w['reader'], w['owner'])}<->"
             f"{max(w['reader'], w['owner'])}" for w in rewrites}
    problems = []
    if in_relay or in_wire:
        leaking = sorted({names.get(n.split("-")[1], n) for n in _where(in_relay, streams)})
        problems.append(f"plaintext left the hosts: {len(in_relay)} of {len(probes)} probes in the relay's streams, "
                        f"{len(in_wire)} in hostH's frames; relayed links that carried it: {leaking}")
    for rank, res in enumerate(results):
        if res.get("ok") is True:
            if _spans_hosts(res.get("domains")):
                problems.append(f"rank {rank} ran with exact sums in a plaintext domain across hosts: {res['domains']}")
        elif res.get("error_type") not in TYPED:
            problems.append(f"rank {rank} ended with {res.get('error_type')}: {res.get('error')}")
    if domains != "node":
        for rank, res in enumerate(results):
            others = "23" if HOST_OF[rank] == "A" else "01"
            if res.get("error_type") != "ConfigError" or not any(c in (res.get("error") or "") for c in others):
                problems.append(f"rank {rank} should refuse the map {domains} with a ConfigError naming a rank of "
                                f"the other host; it ended with {res.get('error_type')}: {res.get('error')}")
    if all(r.get("ok") is True for r in results) and relay.forwarded() == 0:
        problems.append("the job ran but nothing went through the relay: the rewrites were not in effect")
    assert not problems, "\n".join(problems + [f"ranks: {summary}"])


def _until_ready(procs, readers, limit: float) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if all(r.ready() for r in readers):
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.1)
    raise AssertionError(f"not every rank got through its first all-reduce: "
                         f"{[(r.lines[-1:], r.err[-800:]) for r in readers]}")


def test_partition_during_all_reduces_gives_every_rank_a_typed_error_within_the_timeout(tmp_path):
    """After a first exact all-reduce the ranks keep all-reducing, and hostH cuts the wire in
    the middle of one (it forwards 40 more frames, then nothing either way): each rank
    must stop with a typed ccddp error (not hang, not a bare RuntimeError) within
    ``timeout_s`` of the cut, plus a margin."""
    margin = 20                              # a busy two-core machine
    patterns = _patterns()
    with nu.hosts() as h, h.serve_store(tmp_path), h.wire(tmp_path / "wire.bin") as wire:
        procs = _launch(h, tmp_path, "loop", patterns)
        readers = [_Reader(p) for p in procs]
        _until_ready(procs, readers, PROC_LIMIT)
        wire.faults(partition_after=40)
        (tmp_path / "go").touch()
        deadline = time.monotonic() + TIMEOUT_S + margin + 60
        results = [r.result(deadline) for r in readers]
        ended = [r.ended_at for r in readers]
    cut = wire.stats.get("cut_at")
    print("partition:", [(_short(r), e and cut and round(e - cut, 1)) for r, e in zip(results, ended)], wire.stats)
    assert cut is not None, f"the wire never cut: {wire.stats}"
    for rank, (res, end) in enumerate(zip(results, ended)):
        assert res.get("error_type") in TYPED, (rank, _short(res))
        assert res.get("failed_in") == "all_reduce" and res.get("ops", 0) >= 1, (rank, _short(res))
        assert end is not None and end - cut <= TIMEOUT_S + margin, (rank, end and end - cut, _short(res))
