"""Cost of one all-reduce among ranks of one node: secure ring/tree schedules and the
plaintext library collective (the CC-off reference).

Ring: the bucket is cut into n chunks; n-1 reduce-scatter steps then n-1 all-gather
steps, each step a seal, a transfer and an open on every rank: 2(n-1) seals + 2(n-1) opens
per rank (paper Sec. IV-B). Pipelined schedules cut chunks into segments that flow across
steps; their time is the larger of the throughput bound (the busiest resource, engine or
link, times the segment-steps) and the critical path (one segment through every step, then
the rest draining at the bottleneck rate). With one segment this is exactly ``naive``.

Segment counts are kept fractional (``max(1, chunk / segment)``) inside the time formula,
so costs move smoothly and monotonically with sizes and world size; the op counts reported
are the integers the implementation performs.

Example::

    r = Rates.resolve(hw, Schedule("naive"), n=4, cc=True)
    c = secure_allreduce(r, Schedule("naive"), 4, 25 << 20)
    c.seals + c.opens            # 12 = 4(n-1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ccddp.sim.rates import Rates


@dataclass(frozen=True)
class CollectiveCost:
    """One collective on one rank: wall time and what it kept busy or counted.

    ``busy_ms`` is the rank's engine time (crypto + reduction + message software);
    ``crypto_ms`` is the crypto part of it. Counts are per rank (the busiest rank for
    trees); ``relay_ops`` are CPU-TEE decrypt/re-encrypt operations for this rank's data.
    """

    ms: float = 0.0
    busy_ms: float = 0.0
    crypto_ms: float = 0.0
    seals: int = 0
    opens: int = 0
    messages: int = 0
    bytes_sent: float = 0.0
    relay_ops: int = 0
    pad_bytes: float = 0.0      # pre-computed keystream used, per peer table

    def __add__(self, other: "CollectiveCost") -> "CollectiveCost":
        return CollectiveCost(*(getattr(self, f.name) + getattr(other, f.name)
                                for f in fields(self)))


def pipeline_ms(steps: float, segs: float, engine: float, link: float, chain: float) -> float:
    """Wall time of ``segs`` segments crossing ``steps`` dependent hops.

    Per segment-hop the rank's engine is busy ``engine`` and its link ``link``; one
    segment's hop takes ``chain`` end to end. With ``segs == 1`` this is ``steps * chain``.
    """
    if steps <= 0:
        return 0.0
    m = max(engine, link)
    # Never below the busiest resource's total, even when one hop is shorter than it.
    throughput = steps * segs * m + max(0.0, chain - m)
    critical = steps * chain + (segs - 1) * m
    return max(throughput, critical)


@dataclass(frozen=True)
class _Seg:
    """Stage costs of one segment-hop."""

    segs: float         # fractional segments per chunk (time formula)
    segs_int: int       # segments the implementation sends
    tags_int: int       # tags per chunk
    seal: float
    open: float
    reduce: float
    wire: float
    chain_rs: float
    chain_ag: float
    seg_bytes: float
    cpu: float          # core time the transfer takes (software link on shared cores)


def _segment(r: Rates, sched, msg_bytes: float, crypto_scale: float, pad_frac: float) -> _Seg:
    if sched.segmented:
        segs = max(1.0, msg_bytes / sched.segment_bytes)
        segs_int = max(1, math.ceil(msg_bytes / sched.segment_bytes))
        tags_f = max(1.0, segs / sched.mac_batch)
        tags_int = max(1, math.ceil(segs_int / sched.mac_batch))
    else:
        segs, segs_int, tags_f, tags_int = 1.0, 1, 1.0, 1
    s = msg_bytes / segs
    cb = s * crypto_scale
    tag_share = r.tag_cost_ms() * tags_f / segs
    seal = r.seal_ms(cb, pad_frac * cb) + tag_share
    opn = r.open_ms(cb, pad_frac * cb) + tag_share
    red = s * r.reduce_ms_per_b
    wire = r.wire_ms(s + r.tag_bytes * tags_f / segs)
    hop = seal + r.seg_ms + r.link_latency_ms + wire + opn
    return _Seg(segs, segs_int, tags_int, seal, opn, red, wire, hop + red, hop, s,
                s * r.link_cpu_ms_per_b)


def secure_ring(r: Rates, sched, n: int, nbytes: float, pads: float = 0.0, *,
                phases: str = "all") -> CollectiveCost:
    """Secure ring all-reduce (``phases="all"``), or only its reduce-scatter (``"rs"``)
    or all-gather (``"ag"``) half, as the hierarchical schedule uses them. ``pads``:
    pre-computed keystream bytes left in each peer's table."""
    if n <= 1 or nbytes <= 0:
        return CollectiveCost()
    chunk = nbytes / n
    # The paper's emulation (naive) may cost what the whole bucket costs per op (see
    # op_bucket_share); ccddp's engines seal what they send.
    scale = r.op_scale(n) if sched.schedule == "naive" else 1.0
    rs = n - 1 if phases in ("all", "rs") else 0
    ag = n - 1 if phases in ("all", "ag") else 0
    # A half ring draws on the table at the whole ring's rate.
    peer_bytes = 2 * (n - 1) * chunk * scale
    pad_frac = min(1.0, pads / peer_bytes)
    g = _segment(r, sched, chunk, scale, pad_frac)
    # The rank's cores also carry its transfers where the link is software (loopback):
    # with them the engine is what one rank's share of the cores must do per segment-hop.
    e_rs = g.seal + g.open + g.reduce + r.seg_ms + g.cpu
    e_ag = g.seal + g.open + r.seg_ms + g.cpu
    group_key = sched.schedule == "group-key-allgather"
    if not group_key or ag == 0:
        steps = rs + ag
        engine = (rs * e_rs + ag * e_ag) / steps
        chain = (rs * g.chain_rs + ag * g.chain_ag) / steps
        ms = pipeline_ms(steps, g.segs, engine, g.wire, chain)
        sealed_steps, ag_opens = steps, ag
    else:
        ms = pipeline_ms(rs, g.segs, e_rs, g.wire, g.chain_rs)
        # Each rank seals its own chunk once and opens the n-1 it receives, while it
        # forwards ciphertext at once: opens are off the forwarding path.
        m = max(g.open + r.seg_ms + g.seal / ag + g.cpu, g.wire)
        hop = r.seg_ms + r.link_latency_ms + g.wire
        ms += max(ag * g.segs * m, g.seal + ag * hop + (g.segs - 1) * m + g.open)
        sealed_steps, ag_opens = rs + 1, ag
    opened_steps = rs + ag_opens
    crypto = g.segs * (sealed_steps * g.seal + opened_steps * g.open)
    busy = crypto + g.segs * (rs * g.reduce + (rs + ag) * (r.seg_ms + g.cpu))
    return CollectiveCost(
        ms=ms, busy_ms=busy, crypto_ms=crypto,
        seals=sealed_steps * g.tags_int, opens=opened_steps * g.tags_int,
        messages=(rs + ag) * g.segs_int,
        bytes_sent=(rs + ag) * chunk + (rs + ag) * g.tags_int * r.tag_bytes,
        pad_bytes=pad_frac * (rs + ag) * chunk * scale,
    )


def secure_tree(r: Rates, sched, n: int, nbytes: float, pads: float = 0.0
                ) -> CollectiveCost:
    """Secure binary-tree all-reduce: reduce up, broadcast down, whole buffer per message.

    The busiest rank (from 5 ranks on: two children and a parent) opens 3 and seals 3
    messages per all-reduce: the paper's "middle GPUs pay 1.5x" (Sec. IV-C).
    """
    if n <= 1 or nbytes <= 0:
        return CollectiveCost()
    depth = int(math.floor(math.log2(n)))
    # Heap layout: the root has min(2, n-1) children; rank 1 has a parent and the
    # children 3 and 4 when they exist. The busiest of the two sets the pace.
    root, inner = min(2, n - 1), 1 + min(2, max(0, n - 3))
    ops = max(root, inner)                    # seals == opens on the busiest rank
    kids = root if root >= inner else inner - 1
    pad_frac = min(1.0, pads / nbytes)            # each peer's table feeds one message
    g = _segment(r, sched, nbytes, 1, pad_frac)
    engine = ops * (g.seal + g.open + r.seg_ms + g.cpu) + kids * g.reduce
    link = ops * g.wire
    up = g.seal + r.seg_ms + r.link_latency_ms + g.wire + kids * (g.open + g.reduce)
    down = g.seal + r.seg_ms + r.link_latency_ms + g.wire + g.open
    # Segments stream through the whole tree: one pipeline whose hop is the full
    # up-and-down path, bounded by the busiest rank.
    ms = pipeline_ms(1, g.segs, engine, link, depth * (up + down))
    crypto = g.segs * ops * (g.seal + g.open)
    return CollectiveCost(
        ms=ms, busy_ms=g.segs * engine, crypto_ms=crypto,
        seals=ops * g.tags_int, opens=ops * g.tags_int, messages=ops * g.segs_int,
        bytes_sent=ops * (nbytes + g.tags_int * r.tag_bytes),
        pad_bytes=pad_frac * nbytes,
    )


def plain_allreduce(r: Rates, n: int, nbytes: float, nvls: bool) -> CollectiveCost:
    """The library's own plaintext all-reduce (NCCL or gloo), CC off: the faster of ring,
    tree and (where the switch reduces) NVLS, as the library's tuner would pick."""
    if n <= 1 or nbytes <= 0:
        return CollectiveCost()
    lat, bw, red = r.link_latency_ms, r.link_ms_per_b, r.reduce_ms_per_b
    ring = 2 * (n - 1) * lat + 2 * (n - 1) / n * nbytes * bw + (n - 1) / n * nbytes * red
    depth = max(1, math.ceil(math.log2(n)))
    tree = 2 * depth * lat + 2 * nbytes * bw + nbytes * red
    best = min(ring, tree)
    if nvls:
        best = min(best, 2 * lat + nbytes * bw)
    sent = 2 * (n - 1) / n * nbytes
    busy = (n - 1) / n * nbytes * red + sent * r.link_cpu_ms_per_b
    if r.link_cpu_ms_per_b > 0:
        # A software link on shared cores: never faster than the cores can copy and add.
        best = max(best, busy)
    return CollectiveCost(ms=best, busy_ms=busy, messages=2 * (n - 1), bytes_sent=sent)


def native_allreduce(r: Rates, n: int, nbytes: float, nvls: bool) -> CollectiveCost:
    """The library's all-reduce on a CC system that protects the device link itself
    (fenced or hardware-encrypted): the CC-off ring, tree or (``nvls``: where the switch
    stays inside the trust boundary) switch reduction at the bandwidth CC keeps, plus one
    per-exchange toll per collective (one cross-device operation, which the firmware
    books once)."""
    base = plain_allreduce(r, n, nbytes, nvls)
    return CollectiveCost(ms=base.ms + r.toll_ms, busy_ms=base.busy_ms,
                          messages=base.messages, bytes_sent=base.bytes_sent)


def secure_allreduce(r: Rates, sched, n: int, nbytes: float, pads: float = 0.0
                     ) -> CollectiveCost:
    """A sealed schedule's all-reduce in a single-node group (``sched.algorithm``)."""
    if sched.algorithm == "tree":
        return secure_tree(r, sched, n, nbytes, pads)
    return secure_ring(r, sched, n, nbytes, pads)


def domains_allreduce(r: Rates, sched, domains: int, per_domain: int, nbytes: float, pads: float = 0.0
                      ) -> CollectiveCost:
    """The ccddp backend's all-reduce over ``domains`` trust domains of ``per_domain``
    ranks (``ccddp.comm.hierarchy``): a plaintext reduce-scatter inside each domain, a
    sealed all-reduce of each rank's ``1/per_domain`` shard across the domains (one ring
    per shard, all at once), a plaintext all-gather inside; one after the other. ``r``:
    the rates of every rank of the group on its host."""
    inside = plain_allreduce(r, per_domain, nbytes, False)     # its two halves
    return inside + secure_allreduce(r, sched, domains, nbytes / per_domain, pads)


__all__ = ["CollectiveCost", "pipeline_ms", "secure_ring", "secure_tree",
           "plain_allreduce", "native_allreduce", "secure_allreduce", "domains_allreduce"]
