"""All-reduce across nodes, where the CPU TEE relays (paper Sec. VI-C).

Beyond one node (``gpus_per_node``), the all-reduce is hierarchical: a reduce-scatter
inside each node (secure ring over NVLink), then each device's 1/g shard is all-reduced by
a ring over the N nodes, then an all-gather inside each node. Under CC a device cannot
reach the NIC directly: each inter-node message goes device seal -> PCIe bounce -> CPU TEE
open + re-seal -> network -> CPU TEE open + re-seal -> PCIe -> device open + reduce. The
node's CPU-TEE cores and NIC are shared by its g devices, and each relayed message costs
four CPU AES-GCM passes (two on each host), which is why the paper expects the CPU's slow
crypto to dominate. CC-off uses GPUDirect RDMA: the network is the only extra stage.

With ``tree``, each node reduces up its own tree, the node roots all-reduce the whole
buffer over the relay ring, and each node broadcasts down its tree.

A node is one trust domain. With the ``native`` schedule (a CC system that protects its
device link itself: fenced or hardware-encrypted) nothing is sealed in software inside
it: the library's own collective runs there, and only the relay between nodes seals;
the device's side of the bounce is the copy engine's own encryption, whose cost is the
bandwidth the bounce keeps (``cc_pcie_kept``).

Example::

    allreduce_cost(hw, Schedule(), Rates.resolve(hw, Schedule(), 64, True), 64,
                   25 << 20, cc=True).relay_ops
"""

from __future__ import annotations

import math

from ccddp.errors import ConfigError
from ccddp.sim.collective import (CollectiveCost, native_allreduce, pipeline_ms,
                                  plain_allreduce, secure_allreduce, secure_ring, secure_tree)
from ccddp.sim.rates import GB_MS, US_MS, Rates


def layout(hw, n: int) -> tuple[int, int]:
    """(nodes, devices in the fullest node). A partial last node still waits for the full
    ones, so costs use the fullest node; this keeps cost monotone in ``n``."""
    per = min(n, hw.gpus_per_node)
    return math.ceil(n / hw.gpus_per_node), per


def _relay_ring(hw, r: Rates, sched, nodes: int, per: int, shard: float) -> CollectiveCost:
    if nodes <= 1 or shard <= 0:
        return CollectiveCost()
    chunk = shard / nodes
    steps = 2 * (nodes - 1)
    if sched.schedule != "naive" and sched.tag == "segment":
        segs = max(1.0, chunk / sched.segment_bytes)
        segs_int = max(1, math.ceil(chunk / sched.segment_bytes))
    else:
        segs, segs_int = 1.0, 1
    s = chunk / segs
    # The native schedule's device side is the copy engine's encryption (in the bounce
    # rate); a sealed schedule seals on the device in software first.
    soft = sched.sealed
    dev_seal = r.seal_ms(s) + r.tag_cost_ms() if soft else 0.0
    dev_open = r.open_ms(s) + r.tag_cost_ms() if soft else 0.0
    pcie = r.toll_ms + s / (hw.pcie_gbps * hw.cc_pcie_kept * GB_MS)
    one_pass = s / (hw.cpu_crypto_gbps * GB_MS) if r.crypto_on else 0.0
    host_cpu = 4 * one_pass * per / hw.cpu_crypto_threads    # shared by the node's devices
    nic = s * per / (hw.inter_node_gbps * GB_MS)
    lat = hw.inter_node_latency_us * US_MS
    engine = dev_seal + dev_open + s * r.reduce_ms_per_b + r.seg_ms
    chain = (dev_seal + r.seg_ms + pcie + 2 * one_pass + lat + nic + 2 * one_pass + pcie
             + dev_open + s * r.reduce_ms_per_b)
    ms = pipeline_ms(steps, segs, max(engine, host_cpu), max(pcie, nic), chain)
    crypto = segs * steps * (dev_seal + dev_open + 4 * one_pass)
    return CollectiveCost(
        ms=ms, busy_ms=segs * steps * engine, crypto_ms=crypto,
        seals=steps * segs_int if soft else 0, opens=steps * segs_int if soft else 0,
        messages=steps * segs_int,
        bytes_sent=steps * chunk, relay_ops=4 * steps * segs_int,
    )


def _plain_inter(hw, r: Rates, nodes: int, per: int, shard: float) -> CollectiveCost:
    chunk = shard / nodes
    lat = hw.inter_node_latency_us * US_MS
    per_step = lat + chunk * per / (hw.inter_node_gbps * GB_MS)
    ms = 2 * (nodes - 1) * per_step + (nodes - 1) * chunk * r.reduce_ms_per_b
    return CollectiveCost(ms=ms, busy_ms=(nodes - 1) * chunk * r.reduce_ms_per_b,
                          messages=2 * (nodes - 1), bytes_sent=2 * (nodes - 1) * chunk)


def _call_fixed(r: Rates) -> CollectiveCost:
    """The sealed collective call's own fixed software cost (``op_fixed_us``: descriptor,
    frame setup, posts), once per call on the calling rank, in series before its first
    message; software, not crypto, so free crypto keeps it."""
    return CollectiveCost(ms=r.call_fixed_ms, busy_ms=r.call_fixed_ms)


def allreduce_cost(hw, sched, r: Rates, n: int, nbytes: float, *, cc: bool,
                   pads: float = 0.0) -> CollectiveCost:
    """Cost of one all-reduce of ``nbytes`` over ``n`` devices, any number of nodes;
    ``pads``: pre-computed keystream bytes left per device-link peer. A sealed schedule's
    call also pays the profile's ``op_fixed_us`` once (:func:`_call_fixed`)."""
    native = cc and not sched.sealed
    if native and hw.sealed_inside_node:
        raise ConfigError(f"the native schedule needs a device link the CC system protects "
                          f"(fenced or hardware-encrypted); profile {hw.name!r} has "
                          f"device_link = {hw.device_link!r}, where it would send gradients "
                          "in the clear")
    nodes, per = layout(hw, n)
    if nodes == 1:
        if native:
            return native_allreduce(r, n, nbytes, hw.cc_nvls)
        if cc:
            return _call_fixed(r) + secure_allreduce(r, sched, n, nbytes, pads)
        return plain_allreduce(r, n, nbytes, hw.nvls)
    shard = nbytes / per
    if not cc:
        half = plain_allreduce(r, per, nbytes, False)
        intra = CollectiveCost(ms=half.ms / 2, busy_ms=half.busy_ms / 2,
                               messages=half.messages // 2, bytes_sent=half.bytes_sent / 2)
        return intra + _plain_inter(hw, r, nodes, per, shard) + intra
    if native:
        half = native_allreduce(r, per, nbytes, hw.cc_nvls)
        intra = CollectiveCost(ms=half.ms / 2, busy_ms=half.busy_ms / 2,
                               messages=half.messages // 2, bytes_sent=half.bytes_sent / 2)
        return intra + _relay_ring(hw, r, sched, nodes, per, shard) + intra
    # Pads cover the device-link peers only, not the relay hops (keys with the CPU TEE).
    if sched.algorithm == "tree":
        # Reduce up each node's tree, a relay ring among node roots, broadcast down.
        return (_call_fixed(r) + secure_tree(r, sched, per, nbytes, pads)
                + _relay_ring(hw, r, sched, nodes, 1, nbytes))
    return (_call_fixed(r) + secure_ring(r, sched, per, nbytes, pads, phases="rs")
            + _relay_ring(hw, r, sched, nodes, per, shard)
            + secure_ring(r, sched, per, nbytes, pads, phases="ag"))


__all__ = ["allreduce_cost", "layout"]
