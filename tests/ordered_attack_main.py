"""A rank of the attacks on the ordered wire (run under torchrun, three ranks): the host
tampers with the sealed frames the pipeline sends on an ordered wire (NCCL's rules,
emulated over gloo, every frame a "device" frame); prints one JSON line per rank and case.

Each case gets a group of its own (a new session) and a wire of its own: a clean
all-reduce, then the attack on frame ``nth`` of link 0 -> 1 in a second one, then a third
all-reduce, which must be refused at once on every rank whose wire saw the failure.

Example::

    torchrun --nproc-per-node 3 tests/ordered_attack_main.py
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

from ccddp.startup import pause_collector, resume_collector

pause_collector(__name__)  # a rank of ccddp's tests starts as ccddp's own ranks do (ccddp.startup)
import torch
import torch.distributed as dist

CASES = [("flip", {"nth": 1}), ("reorder", {"nth": 0}), ("drop", {"nth": 0})]
TIMEOUT_S = 3.0


def main() -> None:
    import ccddp.backend  # noqa: F401  (registers the backend)
    from ccddp.backend import Options
    from ccddp.backend.policy import bare_links
    from ccddp.comm import CommSettings
    from ccddp.errors import IntegrityError, PeerTimeoutError
    from ccddp.testing.adversary import AdversarialTransport, Rule
    from ccddp.testing.serial_wire import SerialWire

    resume_collector()          # the imports are done

    settings = CommSettings(segment_bytes=4096, chains=1, timeout_s=TIMEOUT_S)
    # The world group waits long enough for the barrier between cases; the cases' groups not.
    dist.init_process_group("ccddp", pg_options=Options(settings=settings.with_(timeout_s=60)))
    rank, n = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    numel = 6145
    want = sum(torch.arange(numel, dtype=torch.float32) * (r + 1) for r in range(n))

    def outcome(pg) -> tuple[str, str]:
        x = torch.arange(numel, dtype=torch.float32) * (rank + 1)
        try:
            dist.all_reduce(x, group=pg)
        except IntegrityError as e:
            return "integrity", str(e)
        except PeerTimeoutError as e:
            return "timeout", str(e)
        return ("completed" if torch.equal(x, want) else "wrong result"), ""

    for i, (attack, where) in enumerate(CASES):
        pg = dist.new_group(backend="ccddp", pg_options=Options(settings=settings))
        transport = pg.endpoint.transport
        transport.host_device_types = frozenset()           # CPU frames stand in for device frames
        with bare_links():  # the adversary's link carries only sealed frames
            links = dist.ProcessGroupGloo(dist.PrefixStore(f"attack-{i}/", store), rank, n, timedelta(seconds=60))
        host = AdversarialTransport(links, TIMEOUT_S)
        transport.ordered = SerialWire(host, timeout_s=TIMEOUT_S)
        clean = outcome(pg)
        host.arm([Rule(attack, src=0, dst=1, **where)])
        t0 = time.monotonic()
        attacked = outcome(pg)
        seconds = time.monotonic() - t0
        after = outcome(pg)
        print(json.dumps({"rank": rank, "attack": attack, "clean": clean[0], "attacked": attacked[0],
                          "detail": attacked[1], "seconds": seconds, "after": after[0], "after_detail": after[1],
                          "applied": len(host.applied)}), flush=True)
        dist.barrier()
    os._exit(0)    # abandoned groups of the emulated wire may still wait: leave without tearing gloo down


if __name__ == "__main__":
    main()
