"""The ops of a ccddp group that are no collective of the table: sealed point-to-point
messages (``send``, ``recv``, ``recv_anysource``) and ``monitored_barrier``, which is
made of them. They are posted on the calling thread, on the group's point-to-point links
(``comm.p2p.SealedPeerLinks``), not queued; ``ProcessGroupCCDDP`` binds these functions
as its methods (the group is their first argument).

A device tensor's message is staged: sealed from (opened into) host memory.

Example::

    pg.send([t], 1, tag=7).wait()        # sealed for the link 0 -> 1
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from ccddp.backend.calls import one
from ccddp.backend.work import PeerWork
from ccddp.comm.transport import gloo_timeout
from ccddp.errors import ConfigError, PeerTimeoutError

# The point-to-point tag of monitored_barrier's sealed reports: a stream (key, counter) of
# its own, above any tag torch's tools use.
_MONITORED_TAG = (1 << 31) - 1 - 0x4D42  # gloo takes a C int


def _devices(t: torch.Tensor) -> list[torch.device] | None:
    """What a work's future must be made for (c10d's CUDA-aware futures), if anything."""
    return [t.device] if t.device.type == "cuda" else None


def _tag(tag: int, what: str) -> int:
    """gloo's rule, said as gloo says it (not as a failed wait later)."""
    if tag < 0:
        raise ConfigError(f"{what}: Tag must be nonnegative, got {tag}")
    return tag


def send(pg, tensors, dst_rank, tag=0):
    t = one(tensors, "send")
    tag = _tag(tag, "send")
    # .cpu(): a copy that waits for the caller's stream to have written t.
    host = t.cpu() if t.device.type == "cuda" else t
    return PeerWork(pg.peer_links.isend(host.contiguous(), dst_rank, tag), tensors, "send", devices=_devices(t))


def recv(pg, tensors, src_rank, tag=0):
    """c10d's ``recv`` (``src_rank`` None: ``recv_anysource``)."""
    t = one(tensors, "recv")
    tag = _tag(tag, "recv")
    if t.device.type != "cuda":
        return PeerWork(pg.peer_links.irecv(t, src_rank, tag), tensors, "recv")
    # A shorter message fills the first bytes and leaves the rest of ``t`` as it was (gloo's
    # rule): the host copy of a tensor that cannot take a byte prefix starts as ``t``.
    prefix = t.is_contiguous()
    host = torch.empty(t.shape, dtype=t.dtype) if prefix else t.cpu().contiguous()
    pending = pg.peer_links.irecv(host, src_rank, tag)

    def land() -> None:
        if prefix and pending.nbytes < host.numel() * host.element_size():
            t.view(-1).view(torch.uint8)[:pending.nbytes].copy_(host.view(-1).view(torch.uint8)[:pending.nbytes])
        else:
            t.copy_(host)

    return PeerWork(pending, tensors, "recv", devices=_devices(t), then=land)


def recv_anysource(pg, tensors, tag=0):
    return recv(pg, tensors, None, tag)


def monitored_barrier(pg, timeout=None, wait_all_ranks=False):
    """gloo's ``monitored_barrier``, sealed: every other rank reports to rank 0, which
    names the ranks that did not report within ``timeout`` (the first one, or with
    ``wait_all_ranks`` all of them) in gloo's words, then releases the others. The
    reports are sealed point-to-point messages on a tag of their own, so the host can
    neither fake a rank's arrival nor hide which rank hung."""
    if timeout is None:
        limit = pg.settings.timeout_s
    else:
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    ms = int(limit * 1000)
    n, me = pg.size(), pg.rank()
    links = pg.peer_links
    if me != 0:
        links.isend(torch.ones(1, dtype=torch.int32), 0, _MONITORED_TAG).wait(gloo_timeout(limit))
        try:
            links.irecv(torch.empty(1, dtype=torch.int32), 0, _MONITORED_TAG).wait(
                gloo_timeout(limit))
        except PeerTimeoutError as e:
            raise PeerTimeoutError(f"Rank {me} successfully reached monitoredBarrier, but received errors while "
                                   f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                   f"rank. ({e})") from None
        return None
    start = time.monotonic()
    reports = {r: links.irecv(torch.empty(1, dtype=torch.int32), r, _MONITORED_TAG) for r in range(1, n)}
    missing, processed = [], []
    for r, report in reports.items():
        # As gloo: with wait_all_ranks every rank gets the whole timeout (else the first
        # hung rank would use it up and hide the next ones); without, what is left of it.
        remaining = limit if wait_all_ranks else limit - (time.monotonic() - start)
        if remaining < 0:
            done = (f"Successfully processed ranks: {', '.join(map(str, processed))}" if processed
                    else "No ranks successfully processed in monitoredBarrier.")
            raise PeerTimeoutError(f"Rank {me} timed out in monitoredBarrier after {ms} ms. {done}")
        try:
            report.wait(gloo_timeout(remaining))
        except PeerTimeoutError:
            missing.append(r)
            if not wait_all_ranks:
                raise PeerTimeoutError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms") from None
        else:
            processed.append(r)
    if missing:
        raise PeerTimeoutError(f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier "
                               f"in {ms} ms")
    for r in range(1, n):
        links.isend(torch.ones(1, dtype=torch.int32), r, _MONITORED_TAG).wait(gloo_timeout(limit))
    return None
