"""The input path: the host sends each device its batch (paper Fig. 2, steps 1-2).

CC off: data preparation, then a PCIe copy. CC on: the CPU TEE seals the batch into the
bounce buffer, the copy runs at the bandwidth kept under CC (seed 003), and the device
opens it (device crypto rates). The three run back to back (the paper's emulation) or
overlap when the profile says the driver pipelines its staging. When one host feeds all
its devices, data and copy time grow with devices per node (paper Sec. VI-B).

Example::

    InputCost.of(hw, wl, n=4, cc=True, rates=r).bounce_ms
"""

from __future__ import annotations

from dataclasses import dataclass

from ccddp.sim.rates import GB_MS, Rates


@dataclass(frozen=True)
class InputCost:
    """``data_ms`` + ``transfer_ms`` is the CC-off path; ``bounce_ms`` is what CC adds
    (``crypto_ms`` of it is CPU sealing and device opening)."""

    data_ms: float = 0.0
    transfer_ms: float = 0.0
    bounce_ms: float = 0.0
    crypto_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.data_ms + self.transfer_ms + self.bounce_ms

    @classmethod
    def of(cls, hw, wl, *, n: int, cc: bool, rates: Rates) -> "InputCost":
        share = min(n, hw.gpus_per_node) if hw.input_path_shared else 1
        data = wl.data_ms * share
        host_bytes = wl.input_bytes * share
        plain = host_bytes / (hw.pcie_gbps * GB_MS)
        if not cc or wl.input_bytes <= 0:
            return cls(data, plain)
        # Each device's batch is sealed by its own threads, up to the cores the CPU TEE
        # has; the PCIe copy is what the devices share.
        cores = min(hw.cpu_crypto_threads, hw.bounce_threads * share)
        cpu = host_bytes / (hw.cpu_crypto_gbps * cores * GB_MS)
        copy = host_bytes / (hw.pcie_gbps * hw.cc_pcie_kept * GB_MS)
        dev = rates.open_ms(wl.input_bytes) + rates.tag_cost_ms()
        if not rates.crypto_on:
            cpu = dev = 0.0
        total = max(cpu, copy, dev) if hw.bounce_pipelined else cpu + copy + dev
        return cls(data, plain, max(0.0, total - plain), cpu + dev)


__all__ = ["InputCost"]
