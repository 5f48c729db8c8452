"""One rank of a 4-rank ccddp job on a test host (``tests/netns_util.py``), against a host
that owns the store and the wire.

    ip netns exec hostX python hostile_network_main.py RANK STORE_IP HOST_IP MODE PATTERNS

- ``RANK``: this rank (0..3); ``STORE_IP``: where hostH serves the job's TCPStore;
  ``HOST_IP``: hostH's address on this host's link (where its relay listens);
- ``MODE``:
  - ``plain``: one all-reduce of the marker tensor;
  - ``relay``: the same, while the host plays finding 1 of issue 37: every gloo address a
    rank reads from the store is rewritten to the host's relay, below the reader's own
    address so that the reader connects out (gloo's ``tcp::Device::isInitiator``), and
    the relay splices the two initiators of each link;
  - ``attack``: ``relay``, and finding 2: every rank reports one node
    (``socket.gethostname`` and ``GROUP_RANK`` are what the host relays in the clear for
    ``"node"``);
  - ``loop`` / ``count:K``: after a first all-reduce, says ``{"ready": true}`` and waits for
    the file ``$CCDDP_TEST_GO`` (the test has changed the wire meanwhile: a partition, or
    netem), then all-reduces until one fails (``loop``) or K more times (``count:K``);
- ``PATTERNS``: JSON, each rank's 4 float32 values; the rank's tensor repeats its 4 values.

Prints one JSON line: ``{"rank", "ok", "error_type", "error", "domains", "rewrites", ...}``
(the exception's type name, whatever was raised), then exits at once (``os._exit``): a rank
whose group failed must not wait on its peers in teardown.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
import zlib
from datetime import timedelta

NUMEL = 16384           # 64 KiB of float32 per rank: several TCP segments per link


def _patch_node(name: str) -> None:
    """The host's answer to every rank's "which node are you": one name, one node rank."""
    socket.gethostname = lambda: name
    os.environ["GROUP_RANK"] = "0"


# -- the host's rewrites of gloo's published addresses ---------------------------------------

def _parse_rank_info(v: bytes):
    """gloo's ``tcp::Rank`` (gloo/transport/tcp/context.cc): size_t hostname length,
    hostname, size_t address length, address (sockaddr_storage, then int64 sequence
    number: ``tcp::Address::Impl``), then one int64 pair identifier per rank. None when
    ``v`` is not one."""
    try:
        (hn,) = struct.unpack_from("<Q", v, 0)
        if hn > 255:
            return None
        (an,) = struct.unpack_from("<Q", v, 8 + hn)
        if an != 136:
            return None
        rest = len(v) - (16 + hn + an)
        if rest <= 0 or rest % 8:
            return None
        addr = v[16 + hn:16 + hn + an]
        family = struct.unpack_from("<H", addr, 0)[0]
        if family != socket.AF_INET:
            return None
        ids = list(struct.unpack_from(f"<{rest // 8}q", v, 16 + hn + an))
        return hn, addr, ids
    except struct.error:
        return None


def _pair_id(prefix: str, a: int, b: int) -> int:
    return (zlib.crc32(f"{prefix}|{min(a, b)}|{max(a, b)}".encode()) << 16) | 0x5EED


class HostStore:
    """Built lazily (torch imported first): a ``dist.Store`` over the host's TCPStore that
    returns what the host wants a rank to read."""

    def __new__(cls, inner, relay_ip: str, relay_port: int, log: list):
        import torch.distributed as dist

        class _HostStore(dist.Store):
            def __init__(self):
                super().__init__()
                self.mine: dict[str, int] = {}      # gloo set prefix -> this rank's index in it

            def _rewrite(self, key: str, value: bytes) -> bytes:
                prefix, _, idx = key.rpartition("/")
                if not idx.isdigit():
                    return value
                info = _parse_rank_info(value)
                reader = self.mine.get(prefix)
                if info is None or reader is None:
                    return value
                hn, addr, ids = info
                owner = int(idx)
                if reader >= len(ids) or owner == reader:
                    return value
                new_addr = bytearray(addr)
                new_addr[2:4] = struct.pack("!H", relay_port)
                new_addr[4:8] = socket.inet_aton(relay_ip)
                ids[reader] = _pair_id(prefix, reader, owner)
                was = socket.inet_ntoa(addr[4:8]) + f":{struct.unpack_from('!H', addr, 2)[0]}"
                log.append({"key": key, "reader": reader, "owner": owner, "was": was,
                            "now": f"{relay_ip}:{relay_port}", "pair": f"{ids[reader]:016x}"})
                return value[:16 + hn] + bytes(new_addr) + struct.pack(f"<{len(ids)}q", *ids)

            def set(self, key, value):
                value = bytes(value) if not isinstance(value, (bytes, str)) else value
                raw = value.encode() if isinstance(value, str) else value
                prefix, _, idx = key.rpartition("/")
                if idx.isdigit() and _parse_rank_info(raw) is not None:
                    self.mine[prefix] = int(idx)
                inner.set(key, value)

            def get(self, key):
                return self._rewrite(key, inner.get(key))

            def add(self, key, value):
                return inner.add(key, value)

            def compare_set(self, key, expected, desired):
                return inner.compare_set(key, expected, desired)

            def wait(self, keys, timeout=None):
                return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

            def check(self, keys):
                return inner.check(keys)

            def delete_key(self, key):
                return inner.delete_key(key)

            def num_keys(self):
                return inner.num_keys()

            def set_timeout(self, timeout):
                return inner.set_timeout(timeout)

        return _HostStore()


def main() -> None:
    rank, store_ip, host_ip, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    patterns = json.loads(sys.argv[5])
    world = len(patterns)
    from netns_util import RELAY_PORT, STORE_PORT

    real_host = socket.gethostname()
    if mode == "attack":
        _patch_node("the-one-node")

    import torch
    import torch.distributed as dist

    import ccddp.backend  # noqa: F401  (registers the backend)

    settings = json.loads(os.environ.get("CCDDP_SETTINGS", "{}"))
    timeout_s = float(settings.get("timeout_s", 20))
    tcp = dist.TCPStore(store_ip, STORE_PORT, world, False, timedelta(seconds=60))
    log: list = []
    store = HostStore(tcp, host_ip, RELAY_PORT, log) if mode in ("attack", "relay") else tcp
    mine = torch.tensor(patterns[rank], dtype=torch.float32).repeat(NUMEL // 4)
    want = torch.tensor([sum(p[i] for p in patterns) for i in range(4)], dtype=torch.float32).repeat(NUMEL // 4)
    out = {"rank": rank, "host": real_host, "mode": mode, "ok": False, "error_type": None, "error": None,
           "domains": None, "rewrites": log, "ops": 0}
    t0 = time.monotonic()
    phase = "init"
    try:
        dist.init_process_group("ccddp", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        sg = getattr(dist.group.WORLD, "endpoint", None)
        dm = getattr(sg, "domains", None)
        out["domains"] = [list(d) for d in dm.domains] if dm is not None else None
        phase = "all_reduce"
        more = None if mode == "loop" else int(mode.split(":")[1]) if mode.startswith("count:") else 0
        while True:
            t = mine.clone()
            t_op = time.monotonic()
            dist.all_reduce(t)
            out["ops"] += 1
            if "t_go" in locals():
                out["op_seconds_after_go"] = round(out.get("op_seconds_after_go", 0) + time.monotonic() - t_op, 3)
            if not torch.equal(t, want):
                out["ok"] = False
                out["error_type"] = "WrongResult"
                out["error"] = f"op {out['ops']}: max diff {(t - want).abs().max().item()}"
                break
            out["ok"] = True
            if out["ops"] == 1 and more != 0:
                print(json.dumps({"rank": rank, "ready": True}), flush=True)
                go = os.environ["CCDDP_TEST_GO"]
                while not os.path.exists(go):
                    if time.monotonic() - t0 > 120:
                        raise TimeoutError("the test never said go")
                    time.sleep(0.02)
                t_go = time.monotonic()
            if more is not None and out["ops"] > more:
                break
            if time.monotonic() - t0 > 6 * timeout_s + 120:
                out["error_type"], out["error"] = "NoFault", "the wire was never cut"
                break
            time.sleep(0.02)
    except BaseException as e:  # noqa: BLE001 -- report whatever ended the rank, by type
        out["ok"] = False
        out["error_type"] = type(e).__name__
        out["error"] = str(e).splitlines()[0][:500] if str(e) else ""
        out["failed_in"] = phase
        if phase == "all_reduce":
            out["op_seconds"] = round(time.monotonic() - t_op, 2)
    out["seconds"] = round(time.monotonic() - t0, 2)
    if "t_go" in locals():
        out["seconds_after_go"] = round(time.monotonic() - t_go, 2)
    print(json.dumps(out), flush=True)
    if out["ok"] and mode != "loop":
        try:
            dist.barrier()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
