"""Where a device tensor's frames are sealed and opened: on the device (the Triton engine)
or staged through host memory (OpenSSL), priced from a hardware profile.

One message of ``n`` bytes, sealed by its sender and opened by its receiver:

- ``device``: a seal and an open by the device engine, each a kernel launch (with CC's
  launch toll), the per-call cost and the bytes at the engine's rate::

      2 * kernel_launch_us * cc_launch_toll + 2 * crypto_op_us + n / enc_gbps + n / dec_gbps

- ``staged``: the plaintext copied into pinned host memory, sealed by OpenSSL on one host
  core; at the receiver the frame opened by OpenSSL and the plaintext copied back::

      2 * staging_copy_us + n / staging_d2h_gbps + n / cpu_crypto_gbps
                          + n / cpu_crypto_gbps + n / staging_h2d_gbps

How the frame crosses between sender and receiver is left out, except for what the
**wire** of device frames adds (``CommSettings.device_wire``): over NCCL a device frame
goes from device to device; over gloo (ranks sharing a GPU) its ciphertext is copied to
host memory at the sender and back at the receiver::

      device over gloo: device + 2 * staging_copy_us + n / staging_d2h_gbps + n / staging_h2d_gbps

A staged frame is in host memory already and crosses on gloo either way.
The staging fields are what ``ccddp calibrate --device cuda`` measures beside the engine
(``staging_d2h_gbps``, ``staging_h2d_gbps``, ``staging_copy_us``).

Example::

    from ccddp.sim import load_profile
    hw = load_profile("h100-cc")
    placement_us(hw, 4 << 20)                 # {"device": ..., "staged": ...} (device frames on NCCL)
    cheaper_placement(hw, 4 << 20, "gloo")    # "device" or "staged", two ranks on one GPU
"""

from __future__ import annotations

from ccddp.sim.profile import HardwareProfile

#: The placements a device frame can have.
PLACEMENTS = ("device", "staged")
#: What can carry a device-placed frame (``CommSettings.device_wire``, resolved).
WIRES = ("nccl", "gloo")


def _us(nbytes: float, gbps: float) -> float:
    """Microseconds to move ``nbytes`` at ``gbps`` GB/s (1 GB/s = 1e3 bytes/us)."""
    return nbytes / (gbps * 1e3)


def placement_us(hw: HardwareProfile, nbytes: int, wire: str = "nccl") -> dict[str, float]:
    """Microseconds one ``nbytes`` message costs in seal + open, per placement, with device
    frames on ``wire`` (``nccl`` or ``gloo``)."""
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
    launch = hw.kernel_launch_us * hw.cc_launch_toll
    copies = 2 * hw.staging_copy_us + _us(nbytes, hw.staging_d2h_gbps) + _us(nbytes, hw.staging_h2d_gbps)
    device = 2 * (launch + hw.crypto_op_us) + _us(nbytes, hw.enc_gbps) + _us(nbytes, hw.dec_gbps)
    if wire == "gloo":
        device += copies
    staged = copies + 2 * _us(nbytes, hw.cpu_crypto_gbps)
    return {"device": device, "staged": staged}


def cheaper_placement(hw: HardwareProfile, nbytes: int, wire: str = "nccl") -> str:
    """The placement whose seal + open of an ``nbytes`` message costs less with device
    frames on ``wire`` (``device`` on a tie)."""
    cost = placement_us(hw, nbytes, wire)
    return "staged" if cost["staged"] < cost["device"] else "device"


__all__ = ["PLACEMENTS", "WIRES", "placement_us", "cheaper_placement"]
