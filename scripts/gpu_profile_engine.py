"""Where a device AES-GCM call's time goes: host work (checks, descriptors, the tag masks,
uploads) against each Triton kernel's time on the GPU, per size.

The GPU check's channel benchmark gives one number per call (GB/s between two device
synchronizes); this splits it. For each size and each call (seal, open, seal and open
with pads) it times ``reps`` calls with a synchronize around each (wall), then profiles
the same calls with ``torch.profiler`` and sums each kernel's device time per call. Writes
JSON (``--json``) and prints one line per size and call.

    python3 scripts/gpu_profile_engine.py --sizes 4K,1M,64M --json profile.json

Needs a CUDA GPU (it says so and exits 2 without one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SIZES = {"K": 1 << 10, "M": 1 << 20}


def parse_size(text: str) -> int:
    unit = SIZES.get(text[-1:].upper(), 1)
    return int(text[:-1] if unit != 1 else text) * unit


def profile_size(nbytes: int, reps: int, device: str = "cuda") -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ccddp.crypto.device import DeviceAESGCM, Segment, pad_bytes

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    aead = DeviceAESGCM(os.urandom(32))
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
    frame = torch.empty(nbytes + 16, dtype=torch.uint8, device=dev)
    out = torch.empty_like(data)
    pad = torch.empty(max(16, pad_bytes(nbytes)), dtype=torch.uint8, device=dev)
    aad = b"\0" * 64
    counter = iter(range(1, 1 << 40))

    def prepared(kind: str):
        """The call of ``kind`` with what it needs made first (a frame to open, a pad).
        Its repetitions reuse one nonce on the same data: a throwaway key, equal frames."""
        n = next(counter).to_bytes(12, "big")
        seg = [Segment(n, aad, 0, nbytes, 0, pad_offset=0)]
        if kind.endswith("_pad"):
            aead.keystream_segments(seg, pad)
        if kind.startswith("open"):
            aead.encrypt_into(n, data, aad, frame)
        return {"seal": lambda: aead.encrypt_into(n, data, aad, frame),
                "open": lambda: aead.decrypt_into(n, frame, aad, out),
                "seal_pad": lambda: aead.encrypt_segments(seg, data, frame, pad=pad),
                "open_pad": lambda: aead.decrypt_segments(seg, frame, out, pad=pad)}[kind]

    wall: dict[str, list[float]] = {}
    per_call: dict[str, dict[str, float]] = {}
    for kind in ("seal", "open", "seal_pad", "open_pad"):
        fn = prepared(kind)
        fn()                                      # compiles
        ts = wall[kind] = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            sync()
        kernels: dict[str, float] = {}
        for ev in prof.key_averages():
            device_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if device_us and not ev.key.startswith(("aten::", "cuda")):
                kernels[ev.key] = kernels.get(ev.key, 0.0) + device_us / reps
        per_call[kind] = kernels
    rows = {}
    for name, ts in wall.items():
        kern = per_call.get(name, {})
        wall_us = statistics.median(ts) * 1e6
        device_us = sum(kern.values())
        rows[name] = {"wall_us_median": wall_us, "wall_us_min": min(ts) * 1e6, "wall_us_max": max(ts) * 1e6,
                      "device_us": device_us, "host_us": max(0.0, wall_us - device_us),
                      "gbps_wall": nbytes / (wall_us * 1e-6) / 1e9,
                      "gbps_device": nbytes / (device_us * 1e-6) / 1e9 if device_us else None,
                      "kernels_us": dict(sorted(kern.items(), key=lambda kv: -kv[1]))}
    return {"bytes": nbytes, "reps": reps, "calls": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_profile_engine: no CUDA GPU here; nothing measured")
        return 2
    import triton

    result = {"schema": "ccddp.gpu-profile-engine/1", "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizes": []}
    for text in args.sizes.split(","):
        r = profile_size(parse_size(text), args.reps)
        result["sizes"].append(r)
        for name, row in r["calls"].items():
            top = ", ".join(f"{k.split('(')[0][:40]} {v:.1f}" for k, v in list(row["kernels_us"].items())[:4])
            print(f"{text:>4} {name:9} wall {row['wall_us_median']:9.1f} us  device {row['device_us']:9.1f} us  "
                  f"host {row['host_us']:8.1f} us  {row['gbps_wall']:7.2f} GB/s wall  [{top}]", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
