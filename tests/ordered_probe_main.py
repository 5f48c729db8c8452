"""A rank of the ordered-wire probe (run under torchrun, two ranks): what the emulated NCCL
wire does with the two ways of posting one exchange; prints one JSON line per rank.

- ``paired``: each rank posts its send and its receive as one group (the ordered schedule):
  both arrive.
- ``receive-first``: each rank posts its receive alone, then its send (gloo's plan, every
  receive before the first send): on NCCL both ranks' streams wait on a receive whose send
  is queued behind it; the emulation must end that in its timeout, not complete it.

- ``mismatch``: under the ccddp backend, rank 0's pipeline frames take the ordered wire and
  rank 1's take gloo (as when ranks' placements differ): both must fail at once with the
  ConfigError that says so, not wait on each other.

Example::

    torchrun --nproc-per-node 2 tests/ordered_probe_main.py --mode paired
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

from ccddp.startup import pause_collector, resume_collector

pause_collector(__name__)  # a rank of ccddp's tests starts as ccddp's own ranks do (ccddp.startup)
import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["paired", "receive-first", "mismatch"], required=True)
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args()

    from ccddp.comm.transport import Transport
    from ccddp.errors import FrameLabel, PeerTimeoutError
    from ccddp.testing.serial_wire import SerialWire

    if args.mode == "mismatch":
        import ccddp.backend  # noqa: F401  (registers the backend)

    dist.init_process_group("ccddp" if args.mode == "mismatch" else "gloo")
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    from ccddp.backend.policy import bare_links

    resume_collector()          # the imports are done
    with bare_links():  # they carry only sealed frames
        up, down = [dist.ProcessGroupGloo(dist.PrefixStore(f"probe-{name}/", store), rank, 2, timedelta(seconds=60))
                    for name in ("up", "down")]
    wire = SerialWire(Transport(up, 60, downward=down), timeout_s=args.timeout)
    if args.mode == "mismatch":
        _mismatch(rank, wire)
        return
    mine, theirs = torch.full((64,), float(rank), dtype=torch.float32), torch.empty(64)
    label = FrameLabel(f"{peer}->{rank}", "probe")
    t0 = time.monotonic()
    outcome = "completed"
    try:
        if args.mode == "paired":
            work = wire.post(send=(mine, peer), recv=(theirs, peer))
        else:
            work = wire.post(recv=(theirs, peer))
            wire.post(send=(mine, peer))
        wire.wait(work, peer, label)
        ok = torch.equal(theirs, torch.full((64,), float(peer)))
    except PeerTimeoutError as e:
        outcome, ok = "timed out", "serial (emulated NCCL) wire" in str(e)
    refused = False
    if outcome == "timed out":
        try:
            wire.post(send=(mine, peer))
        except PeerTimeoutError as e:
            refused = "failed earlier" in str(e)
    print(json.dumps({"rank": rank, "outcome": outcome, "ok": ok, "seconds": time.monotonic() - t0,
                      "refused_after": refused}), flush=True)
    os._exit(0)      # the deadlocked groups never finish: leave without tearing gloo down


def _mismatch(rank: int, wire) -> None:
    from ccddp.errors import ConfigError

    transport = dist.group.WORLD.endpoint.transport
    transport.host_device_types = frozenset()          # CPU frames stand in for device frames
    if rank == 0:
        transport.ordered = wire
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4096))
        error = ""
    except ConfigError as e:
        error = str(e)
    print(json.dumps({"rank": rank, "error": error, "seconds": time.monotonic() - t0}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
