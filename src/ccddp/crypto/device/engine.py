"""``DeviceAESGCM``: AES-256-GCM on uint8 torch tensors, through the Triton kernels.

The API mirrors ``cryptography``'s ``AESGCM`` (``encrypt_into``/``decrypt_into``, 16-byte
tags, ``InvalidTag``), so a channel can hold either engine; ``encrypt_segments`` and
``decrypt_segments`` run a whole batch of segments, each with its own nonce, AAD and tag,
in one launch of each kernel.

CUDA tensors run compiled kernels. CPU tensors run the same kernels in Triton's
interpreter (numpy; correct and slow: for tests and checks), which a process chooses once,
before Triton is imported (see :func:`interpreting`).

Example::

    aead = DeviceAESGCM(key)
    frame = torch.empty(len(data) + 16, dtype=torch.uint8, device="cuda")
    aead.encrypt_into(nonce, data, aad, frame)       # data: uint8 CUDA tensor
    out = torch.empty_like(data)
    aead.decrypt_into(nonce, frame, aad, out)        # InvalidTag (out zeroed) if altered
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np
import torch
from cryptography.exceptions import InvalidTag

from ccddp.crypto.device import keyschedule
from ccddp.errors import ConfigError

TAG_BYTES = 16
NONCE_BYTES = 12
# Blocks per program. The interpreter pays ~0.1 ms per tensor operation whatever its
# size, so it gets wide tiles; on a GPU, 128 blocks over 8 warps compile for sm_90 to
# ~100 registers a thread without spills (256 over 4 warps spill at 255).
TILE_BLOCKS_GPU = 128
TILE_BLOCKS_INTERPRETED = 8192
WARPS_GPU = 8
FINISH_TILES = 256            # tile partials a finish program XORs per step
# What the kernels can index. ctr_open and keystream number a segment's bytes in int32
# (block index * 16 + column, up to one tile past the end), so a segment stays a widest
# tile short of 2^31 bytes; and a launch's segments are its grid's second axis, which CUDA
# caps at 65,535. Larger work is refused (ConfigError), not indexed wrong.
MAX_SEGMENT_BYTES = (1 << 31) - 16 * max(TILE_BLOCKS_GPU, TILE_BLOCKS_INTERPRETED)
MAX_SEGMENTS_PER_LAUNCH = 65_535

# The interpreter patches triton.language while a kernel runs: one launch at a time.
_LAUNCH_LOCK = threading.Lock()
_aes_tables: dict[torch.device, torch.Tensor] = {}
_MISSING = "the device AES-GCM engine needs Triton: pip install 'ccddp[gpu]'"


def triton_available() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):      # a broken or blocked installation
        return False


def interpreting() -> bool:
    """Whether this process's Triton kernels run in the interpreter. Triton fixes this
    when it is first imported (it decorates its own library then), from the environment
    variable ``TRITON_INTERPRET``; the engine sets that variable itself when no GPU exists
    and Triton is not imported yet, since interpreting is then the only way to run."""
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernels(device: torch.device) -> ModuleType:
    """The kernels module, checked to run on ``device`` in this process."""
    if not triton_available():
        raise ConfigError(_MISSING)
    interpreting()
    from ccddp.crypto.device import kernels

    if device.type == "cpu" and not kernels.INTERPRETED:
        raise ConfigError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before starting Python "
                          "(CUDA tensors then run interpreted too)")
    return kernels


@dataclass(frozen=True)
class Segment:
    """One AES-GCM message of a batch.

    Sealing: plaintext ``data[offset : offset+length]`` -> ``out[out_offset : out_offset+length+16]``
    (ciphertext ‖ tag). Opening: frame ``data[offset : offset+length+16]`` -> plaintext
    ``out[out_offset : out_offset+length]``. ``pad_offset``: where this message's pad (its
    keystream, ``pad_bytes(length)`` bytes) starts in the pad tensor, if it has one.
    """

    nonce: bytes
    aad: bytes
    offset: int
    length: int
    out_offset: int
    pad_offset: int | None = None


def pad_bytes(length: int) -> int:
    """Size of the pad of a ``length``-byte message: one keystream block per ciphertext
    block."""
    return 16 * ((length + 15) // 16)


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _check_u8(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous():
        raise TypeError(f"{name} must be a contiguous 1-D uint8 torch tensor")


def _one_view(src: torch.Tensor, dst: torch.Tensor, segments: list[Segment]):
    """Two views of one buffer (an in-place open or seal) as one tensor, the segments'
    offsets moved to match: Triton's interpreter copies each argument's storage in and
    back, which fails for two storages over the same bytes."""
    delta = dst.data_ptr() - src.data_ptr()
    if src.numel() and 0 <= delta and delta + dst.numel() <= src.numel():
        return src, src, [replace(s, out_offset=s.out_offset + delta) for s in segments]
    if dst.numel() and delta < 0 and src.numel() - delta <= dst.numel():
        return dst, dst, [replace(s, offset=s.offset - delta) for s in segments]
    return src, dst, segments


def _check_aliasing(segments: list[Segment], src: torch.Tensor, dst: torch.Tensor, tag_in: int, tag_out: int) -> None:
    """Each segment may work in place (output starting where its input starts: every
    lane reads its bytes before it writes them); no other input and output may overlap."""
    if not (src.numel() and dst.numel() and src.data_ptr() < dst.data_ptr() + dst.numel()
            and dst.data_ptr() < src.data_ptr() + src.numel()):
        return
    ins = [(src.data_ptr() + s.offset, s.length + tag_in) for s in segments]
    outs = [(dst.data_ptr() + s.out_offset, s.length + tag_out) for s in segments]
    for i, (a, a_len) in enumerate(ins):
        for j, (b, b_len) in enumerate(outs):
            if a_len and b_len and a < b + b_len and b < a + a_len and not (i == j and a == b):
                raise ValueError("outputs may overlap inputs only in place (same segment, same start)")


class _DeviceKey:
    """A key's tables on one device: round keys and the 4-bit tables of the powers of H
    (H^1 .. H^tile for the lanes of a tile, H^(q*tile) for the tiles), grown on demand."""

    def __init__(self, round_keys: np.ndarray, h: int, device: torch.device) -> None:
        self.device = device
        self.rk = torch.from_numpy(round_keys).to(device)
        if device not in _aes_tables:
            _aes_tables[device] = torch.from_numpy(keyschedule.aes_tables()).to(device)
        self.te = _aes_tables[device]
        self.r4 = torch.from_numpy(keyschedule.shift4_reduction()).to(device)
        self.h = h
        self.lane_hi = self.lane_lo = np.zeros(0, dtype=np.uint64)
        self.p4: torch.Tensor | None = None
        self.q4: torch.Tensor | None = None
        self.q_tile = self.q_rows = 0

    def lane_powers(self, rows: int) -> torch.Tensor:
        """4-bit tables of H^1 .. H^rows (at least)."""
        if self.p4 is None or rows > len(self.lane_hi):
            self.lane_hi, self.lane_lo = keyschedule.powers(self.h, rows)
            self.p4 = self._upload(self.lane_hi, self.lane_lo)
        return self.p4

    def tile_powers(self, tile: int, rows: int) -> torch.Tensor:
        """4-bit tables of H^(q*tile) for q = 0 .. rows-1 (at least)."""
        if self.q4 is None or tile != self.q_tile or rows > self.q_rows:
            rows = _next_pow2(rows)
            self.lane_powers(tile)
            h_tile = keyschedule.join(self.lane_hi, self.lane_lo, tile - 1)
            self.q4 = self._upload(*keyschedule.powers(h_tile, rows, first=keyschedule.ONE))
            self.q_tile, self.q_rows = tile, rows
        return self.q4

    def _upload(self, hi: np.ndarray, lo: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(keyschedule.nibble_tables(hi, lo)).to(self.device)


class DeviceAESGCM:
    """AES-256-GCM over uint8 tensors of one device type (CUDA compiled, CPU interpreted)."""

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            raise ValueError("DeviceAESGCM needs a 32-byte (AES-256) key")
        self._key = bytes(key)
        self._round_keys = keyschedule.round_keys(self._key)
        self._h = keyschedule.ghash_key(self._key)
        self._per_device: dict[torch.device, _DeviceKey] = {}

    # -- the AESGCM-shaped API -----------------------------------------------------
    def encrypt_into(self, nonce: bytes, data: torch.Tensor, associated_data: bytes | None,
                     buf: torch.Tensor) -> None:
        """Write ``ciphertext || tag`` of ``data`` into ``buf`` (``len(data) + 16`` bytes)."""
        _check_u8("data", data)
        self._check_single(buf, data.numel() + TAG_BYTES, "buf")
        self.encrypt_segments([Segment(bytes(nonce), bytes(associated_data or b""), 0, data.numel(), 0)], data, buf)

    def decrypt_into(self, nonce: bytes, data: torch.Tensor, associated_data: bytes | None,
                     buf: torch.Tensor) -> None:
        """Verify frame ``data`` (``ciphertext || tag``) and write its plaintext into ``buf``;
        raise ``InvalidTag`` with ``buf`` zeroed if it does not verify."""
        _check_u8("data", data)
        if data.numel() < TAG_BYTES:
            raise InvalidTag()
        self._check_single(buf, data.numel() - TAG_BYTES, "buf")
        self.decrypt_segments([Segment(bytes(nonce), bytes(associated_data or b""), 0, buf.numel(), 0)], data, buf)

    # -- batches -----------------------------------------------------------------
    def encrypt_segments(self, segments: list[Segment], data: torch.Tensor, out: torch.Tensor,
                         pad: torch.Tensor | None = None) -> None:
        """Seal every segment (see :class:`Segment`) with one launch of each kernel."""
        self._run(segments, data, out, pad, seal=True)

    def decrypt_segments(self, segments: list[Segment], data: torch.Tensor, out: torch.Tensor,
                         pad: torch.Tensor | None = None) -> list[bool]:
        """Open every segment; a segment whose tag fails gets zeros. Raises ``InvalidTag``
        if any failed (``.failed`` lists their indices); returns all True otherwise."""
        verdicts = self._run(segments, data, out, pad, seal=False)
        failed = [i for i, ok in enumerate(verdicts) if not ok]
        if failed:
            err = InvalidTag()
            err.failed = failed
            raise err
        return verdicts

    def keystream_segments(self, segments: list[Segment], pad: torch.Tensor) -> None:
        """Write each segment's pad (``pad_bytes(length)`` bytes at ``pad_offset``): the
        keystream its seal or open will XOR, computed before the data exists."""
        _check_u8("pad", pad)
        if not segments:
            return
        self._check_launch(segments)
        for s in segments:
            self._check_segment(s)
            if s.pad_offset is None or s.pad_offset < 0 or s.pad_offset + pad_bytes(s.length) > pad.numel():
                raise ValueError("segment pad lies outside the pad tensor")
        k = _kernels(pad.device)
        dev = self._device_key(pad.device)
        desc, _ = self._descriptors(segments, k, pad.device)
        blocks = max(s.length + 15 for s in segments) // 16
        if blocks == 0:
            return
        tile = min(self._tile(k), max(16, _next_pow2(blocks)))
        with _LAUNCH_LOCK, _on(pad.device):
            k.keystream[(_cdiv(blocks, tile), len(segments))](desc, pad, dev.rk, dev.te, B=tile,
                                                                    num_warps=WARPS_GPU)

    # -- internals ---------------------------------------------------------------
    @staticmethod
    def _check_single(buf, nbytes: int, name: str) -> None:
        _check_u8(name, buf)
        if buf.numel() != nbytes:
            raise ValueError(f"{name} must be {nbytes} bytes, got {buf.numel()}")

    @staticmethod
    def _check_segment(s: Segment) -> None:
        if len(s.nonce) != NONCE_BYTES:
            raise ValueError("nonce must be 12 bytes")
        if s.length < 0 or s.length > (1 << 36) - 32:
            raise ValueError("segment length out of range for AES-GCM")
        if s.length > MAX_SEGMENT_BYTES:
            raise ConfigError(f"a device AES-GCM segment holds at most {MAX_SEGMENT_BYTES} bytes (the kernels "
                              f"index it in int32), got {s.length}: cut the message into smaller segments")

    @staticmethod
    def _check_launch(segments: list[Segment]) -> None:
        """Before any per-segment work: a launch's segments are one grid axis."""
        if len(segments) > MAX_SEGMENTS_PER_LAUNCH:
            raise ConfigError(f"one device AES-GCM launch takes at most {MAX_SEGMENTS_PER_LAUNCH} segments (CUDA's "
                              f"grid limit), got {len(segments)}: split the batch")

    def _device_key(self, device: torch.device) -> _DeviceKey:
        if device not in self._per_device:
            self._per_device[device] = _DeviceKey(self._round_keys, self._h, device)
        return self._per_device[device]

    @staticmethod
    def _tile(kernels: ModuleType) -> int:
        return TILE_BLOCKS_INTERPRETED if kernels.INTERPRETED else TILE_BLOCKS_GPU

    def _descriptors(self, segments: list[Segment], kernels: ModuleType,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The segments' descriptor rows (see ``kernels.DESC_FIELDS``) and their AADs, on ``device``."""
        rows = np.zeros((len(segments), kernels.DESC_FIELDS.value), dtype=np.int64)
        rows[:, 9:] = keyschedule.tag_masks(self._key, [s.nonce for s in segments]).view(np.int64)
        aad = bytearray()
        for i, s in enumerate(segments):
            n = s.nonce
            rows[i, :9] = (s.offset, s.length, s.out_offset, len(aad), len(s.aad),
                           -1 if s.pad_offset is None else s.pad_offset,
                           int.from_bytes(n[:4], "big"), int.from_bytes(n[4:8], "big"), int.from_bytes(n[8:], "big"))
            aad += s.aad
        desc = torch.from_numpy(rows).to(device)
        aad_t = torch.frombuffer(aad + b"\0", dtype=torch.uint8).to(device)
        return desc, aad_t

    def _run(self, segments: list[Segment], src: torch.Tensor, dst: torch.Tensor, pad: torch.Tensor | None,
             seal: bool) -> list[bool]:
        _check_u8("data", src)
        _check_u8("out", dst)
        if src.device != dst.device or (pad is not None and pad.device != src.device):
            raise ValueError("data, out and pad must be on the same device")
        if not segments:
            return []
        self._check_launch(segments)
        tag_in, tag_out = (0, TAG_BYTES) if seal else (TAG_BYTES, 0)
        use_pad = pad is not None
        if use_pad:
            _check_u8("pad", pad)
        for s in segments:
            self._check_segment(s)
            if (s.offset < 0 or s.offset + s.length + tag_in > src.numel() or s.out_offset < 0
                    or s.out_offset + s.length + tag_out > dst.numel()):
                raise ValueError("segment lies outside its tensors")
            if use_pad and (s.pad_offset is None or s.pad_offset < 0
                            or s.pad_offset + pad_bytes(s.length) > pad.numel()):
                raise ValueError("every segment needs a pad inside the pad tensor")
        _check_aliasing(segments, src, dst, tag_in, tag_out)
        src, dst, segments = _one_view(src, dst, segments)
        device = src.device
        k = _kernels(device)
        dev = self._device_key(device)
        tile_max = self._tile(k)
        ghash_blocks = max((len(s.aad) + 15) // 16 + (s.length + 15) // 16 + 1 for s in segments)
        tile = min(tile_max, max(16, _next_pow2(ghash_blocks)))
        tiles = _cdiv(ghash_blocks, tile)
        p4 = dev.lane_powers(tile)
        q4 = dev.tile_powers(tile, tiles) if tiles > 1 else p4
        desc, aad = self._descriptors(segments, k, device)
        nseg = len(segments)
        partials = torch.empty((nseg, tiles, 2), dtype=torch.uint64, device=device)
        verdicts = torch.empty(nseg, dtype=torch.int32, device=device)
        pad_t = pad if use_pad else src
        finish_tiles = min(FINISH_TILES, _next_pow2(tiles))
        ct_tile = min(tile_max, max(16, _next_pow2(max(s.length + 15 for s in segments) // 16)))
        ct_tiles = _cdiv(max(s.length for s in segments), 16 * ct_tile)
        with _LAUNCH_LOCK, _on(device):
            k.gcm_pass[(tiles, nseg)](desc, src, dst, aad, pad_t, dev.rk, dev.te, p4, q4, dev.r4, partials, tiles,
                                      SEAL=seal, USE_PAD=use_pad, B=tile, LOG_B=tile.bit_length() - 1,
                                      num_warps=WARPS_GPU)
            k.gcm_finish[(nseg,)](desc, src, dst, partials, verdicts, tiles, SEAL=seal, B=tile, T=finish_tiles,
                                  LOG_T=finish_tiles.bit_length() - 1)
            if not seal and ct_tiles > 0:
                k.ctr_open[(ct_tiles, nseg)](desc, src, dst, pad_t, dev.rk, dev.te, verdicts, USE_PAD=use_pad,
                                             B=ct_tile, num_warps=WARPS_GPU)
        if seal:
            return [True] * nseg
        return [bool(v) for v in verdicts.cpu().tolist()]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _on(device: torch.device):
    """The CUDA device of a launch (Triton launches on torch's current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
