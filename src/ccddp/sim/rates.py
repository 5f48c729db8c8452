"""Per-rank costs in milliseconds, resolved once for (profile, schedule, world size, CC).

Everything downstream is arithmetic on these numbers, so the host-sharing rules live here
only: when ranks run on ``host_cores`` shared cores, a rank's crypto, reduction, message
software and loopback copies slow down once the ranks' threads outnumber the cores.

The crypto of one seal (or open) of ``b`` bytes is::

    fixed + (b - pad) / ctr_rate + pad / xor_rate + b / (mac_rate * chains)

where ``fixed`` = per-call cost + one kernel launch (with CC's launch toll), ``pad`` is the
part whose keystream was pre-computed, and chains stop helping at ``max_chains``. In a
ring, ``b`` is what the op seals, stretched towards the whole bucket by the profile's
``op_bucket_share`` (:meth:`Rates.op_scale`).

A transfer also costs core time where the link is software on shared cores (gloo over
loopback: ``link_cpu_gbps``); it competes with the rank's crypto and with backward.

Example::

    r = Rates.resolve(load_profile("h100-cc"), Schedule(), n=8, cc=True)
    r.seal_ms(1 << 20)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

GB_MS = 1e6      # bytes per ms at 1 GB/s
US_MS = 1e-3     # ms per us


def compute_factor(hw: Any, n: int) -> float:
    """How much slower one rank computes when ``n`` ranks share the host's cores."""
    if hw.host_cores <= 0:
        return 1.0
    ranks = max(1, min(n, hw.gpus_per_node))
    return max(1.0, ranks * hw.compute_threads / hw.host_cores)


@dataclass(frozen=True)
class Rates:
    cc: bool
    ranks_on_host: int
    chains: int                 # effective parallel chains
    op_fixed_ms: float          # per seal/open call
    call_fixed_ms: float        # per sealed collective call (descriptor, frame setup, posts)
    tag_ms: float               # per tag
    tag_bytes: float
    enc_ms_per_b: float
    dec_ms_per_b: float
    mac_ms_per_b: float
    xor_ms_per_b: float
    reduce_ms_per_b: float
    seg_ms: float               # software cost per message
    link_ms_per_b: float
    link_cpu_ms_per_b: float    # core time of a transfer (per byte sent; 0: the link's own engine)
    link_latency_ms: float
    toll_ms: float              # CC per-exchange toll
    compute_factor: float       # host contention on forward/backward/optimizer
    op_bucket_share: float      # share of an op's byte cost that scales with the bucket
    crypto_on: bool = True

    @classmethod
    def resolve(cls, hw: Any, sched: Any, n: int, cc: bool) -> "Rates":
        ranks = max(1, min(n, hw.gpus_per_node))
        p = max(1, min(sched.chains_for(hw, n), hw.max_chains))
        comm_f = 1.0
        comp_f = compute_factor(hw, n)
        if hw.host_cores > 0:
            threads = p if hw.chains_scale_enc else 1
            comm_f = max(1.0, ranks * threads / hw.host_cores)
        # The 1-thread rate governs software and copies; crypto threads may use p cores.
        soft_f = max(1.0, ranks / hw.host_cores) if hw.host_cores > 0 else 1.0
        enc_par = p if hw.chains_scale_enc else 1
        mac = 0.0 if math.isinf(hw.mac_gbps) else comm_f / (hw.mac_gbps * p * GB_MS)
        kept = hw.cc_bandwidth_kept if cc else 1.0
        return cls(
            cc=cc,
            ranks_on_host=ranks,
            chains=p,
            op_fixed_ms=comm_f * (hw.crypto_op_us + hw.kernel_launch_us * hw.cc_launch_toll)
            * US_MS,
            # Python on the rank's own thread: slows once ranks outnumber the cores.
            call_fixed_ms=soft_f * hw.op_fixed_us * US_MS if cc else 0.0,
            tag_ms=comm_f * hw.tag_us * US_MS,
            tag_bytes=hw.tag_bytes,
            enc_ms_per_b=comm_f / (hw.enc_gbps * enc_par * GB_MS),
            dec_ms_per_b=comm_f / (hw.dec_gbps * enc_par * GB_MS),
            mac_ms_per_b=mac,
            xor_ms_per_b=comm_f / (hw.xor_gbps * enc_par * GB_MS),
            reduce_ms_per_b=soft_f / (hw.reduce_gbps * GB_MS),
            seg_ms=soft_f * hw.segment_overhead_us * US_MS,
            link_ms_per_b=soft_f / (hw.link_gbps * kept * GB_MS),
            link_cpu_ms_per_b=0.0 if math.isinf(hw.link_cpu_gbps)
            else soft_f / (hw.link_cpu_gbps * GB_MS),
            link_latency_ms=hw.link_latency_us * US_MS,
            toll_ms=hw.cc_exchange_toll_us * US_MS if cc else 0.0,
            compute_factor=comp_f,
            op_bucket_share=hw.op_bucket_share,
        )

    def op_scale(self, n: int) -> float:
        """Crypto bytes of one ring op per byte it seals: 1 for an engine that seals what
        it sends, ``n`` when the op's cost scales with the whole bucket (n chunks)."""
        return 1.0 + self.op_bucket_share * (n - 1)

    def without_crypto(self) -> "Rates":
        """Same ring, same CC link tolls, free crypto: what the crypto costs is the
        difference (used to split exposed time into crypto and communication)."""
        return replace(self, crypto_on=False)

    def seal_ms(self, nbytes: float, pad: float = 0.0) -> float:
        return self._aead(nbytes, pad, self.enc_ms_per_b)

    def open_ms(self, nbytes: float, pad: float = 0.0) -> float:
        return self._aead(nbytes, pad, self.dec_ms_per_b)

    def _aead(self, nbytes: float, pad: float, ctr_per_b: float) -> float:
        if not self.crypto_on:
            return 0.0
        pad = min(pad, nbytes)
        # A pad is only used where applying it beats computing the keystream.
        xor = min(self.xor_ms_per_b, ctr_per_b)
        return (self.op_fixed_ms + (nbytes - pad) * ctr_per_b + pad * xor
                + nbytes * self.mac_ms_per_b)

    def tag_cost_ms(self) -> float:
        return self.tag_ms if self.crypto_on else 0.0

    def wire_ms(self, nbytes: float) -> float:
        """Link occupancy of one message (toll + bytes); latency is separate."""
        return self.toll_ms + nbytes * self.link_ms_per_b


__all__ = ["Rates", "compute_factor", "GB_MS", "US_MS"]
