"""The evidence a rank sends: an SEV-SNP report and (optionally) its VCEK certificate, or
a TDX quote.

Wire formats (all lengths checked before anything is parsed; nothing is unpickled)::

    b"CCDDPSNP" | version u8 (1) | report length u32 BE (1184) | report
                | VCEK length u32 BE (0..16384) | VCEK certificate (DER)
    b"CCDDPTDX" | version u8 (1) | quote length u32 BE (<= 64 KiB) | quote

A bare 1184-byte report (what ``/dev/sev-guest`` and ``snpguest`` save) is accepted too,
with no VCEK: then the VCEK must be among the staged certificates.

Where the policy has a ``[gpu]`` table, a rank sends its CPU evidence (either form above)
with its GPU's (:func:`ccddp.crypto.attest.gpu.encode_gpu_evidence`)::

    b"CCDDPCMB" | version u8 (1) | CPU evidence length u32 BE | CPU evidence
                | GPU evidence length u32 BE | GPU evidence
"""

from __future__ import annotations

import struct

from ccddp.crypto.attest.snp import REPORT_BYTES
from ccddp.crypto.attest.tdx import MAX_QUOTE_BYTES
from ccddp.errors import AttestationError

MAGIC = b"CCDDPSNP"
MAGIC_TDX = b"CCDDPTDX"
VERSION = 1
MAX_VCEK_BYTES = 1 << 14      # a VCEK is ~1.4 KiB
MAX_EVIDENCE_BYTES = len(MAGIC) + 1 + 4 + REPORT_BYTES + 4 + MAX_VCEK_BYTES


def _fail(message: str) -> AttestationError:
    return AttestationError(f"SEV-SNP evidence refused, claim 'evidence.format': {message}", claim="evidence.format")


def encode_evidence(report: bytes, vcek_der: bytes | None = None) -> bytes:
    vcek_der = vcek_der or b""
    if len(report) != REPORT_BYTES or len(vcek_der) > MAX_VCEK_BYTES:
        raise _fail(f"cannot encode a {len(report)}-byte report with a {len(vcek_der)}-byte VCEK")
    return (MAGIC + bytes([VERSION]) + struct.pack(">I", len(report)) + report
            + struct.pack(">I", len(vcek_der)) + vcek_der)


def decode_evidence(blob: bytes) -> tuple[bytes, bytes | None]:
    """``(report, VCEK DER or None)``, or :class:`AttestationError` (claim
    ``evidence.format``) for anything truncated, oversized or unknown."""
    blob = bytes(blob)
    if len(blob) > MAX_EVIDENCE_BYTES:
        raise _fail(f"evidence is {len(blob)} bytes; at most {MAX_EVIDENCE_BYTES} are accepted")
    if not blob.startswith(MAGIC):
        if len(blob) == REPORT_BYTES:
            return blob, None
        raise _fail(f"evidence of {len(blob)} bytes is neither ccddp SNP evidence nor a "
                    f"{REPORT_BYTES}-byte report (unknown or missing TEE evidence)")
    head = len(MAGIC) + 1 + 4
    if len(blob) < head or blob[len(MAGIC)] != VERSION:
        raise _fail("truncated header or unknown evidence version")
    (rlen,) = struct.unpack_from(">I", blob, len(MAGIC) + 1)
    if rlen != REPORT_BYTES or len(blob) < head + rlen + 4:
        raise _fail(f"report length {rlen} (must be {REPORT_BYTES}) or evidence truncated")
    report = blob[head:head + rlen]
    (vlen,) = struct.unpack_from(">I", blob, head + rlen)
    if vlen > MAX_VCEK_BYTES or len(blob) != head + rlen + 4 + vlen:
        raise _fail(f"VCEK length {vlen} does not match the evidence's size {len(blob)}")
    vcek = blob[head + rlen + 4:]
    return report, (vcek or None)


def encode_tdx_evidence(quote: bytes) -> bytes:
    if len(quote) > MAX_QUOTE_BYTES:
        raise _fail(f"cannot encode a {len(quote)}-byte quote")
    return MAGIC_TDX + bytes([VERSION]) + struct.pack(">I", len(quote)) + quote


def decode_any(blob: bytes) -> tuple[str, bytes, bytes | None]:
    """``("snp", report, VCEK or None)`` or ``("tdx", quote, None)``, or
    :class:`AttestationError` (claim ``evidence.format``)."""
    blob = bytes(blob)
    if not blob.startswith(MAGIC_TDX):
        return ("snp", *decode_evidence(blob))
    head = len(MAGIC_TDX) + 1 + 4
    if len(blob) < head or blob[len(MAGIC_TDX)] != VERSION:
        raise _fail("truncated header or unknown evidence version")
    (qlen,) = struct.unpack_from(">I", blob, len(MAGIC_TDX) + 1)
    if qlen > MAX_QUOTE_BYTES or len(blob) != head + qlen:
        raise _fail(f"quote length {qlen} does not match the evidence's size {len(blob)}")
    return "tdx", blob[head:], None


MAGIC_COMBINED = b"CCDDPCMB"


def encode_combined(cpu: bytes, gpu: bytes) -> bytes:
    """A rank's CPU evidence with its GPU's (see the module)."""
    from ccddp.crypto.attest.gpu import MAX_GPU_EVIDENCE_BYTES

    if len(cpu) > max(MAX_EVIDENCE_BYTES, len(MAGIC_TDX) + 5 + MAX_QUOTE_BYTES) or len(gpu) > MAX_GPU_EVIDENCE_BYTES:
        raise _fail(f"cannot combine {len(cpu)} bytes of CPU evidence with {len(gpu)} of GPU evidence")
    return MAGIC_COMBINED + bytes([VERSION]) + struct.pack(">I", len(cpu)) + cpu + struct.pack(">I", len(gpu)) + gpu


def split_combined(blob: bytes) -> tuple[bytes, bytes | None]:
    """``(CPU evidence, GPU evidence or None)``: evidence without a GPU part is returned
    whole. Lengths are checked against the blob before anything is sliced."""
    from ccddp.crypto.attest.gpu import MAX_GPU_EVIDENCE_BYTES

    blob = bytes(blob)
    if not blob.startswith(MAGIC_COMBINED):
        return blob, None
    head = len(MAGIC_COMBINED) + 1 + 4
    cpu_max = max(MAX_EVIDENCE_BYTES, len(MAGIC_TDX) + 5 + MAX_QUOTE_BYTES)
    if len(blob) > head + cpu_max + 4 + MAX_GPU_EVIDENCE_BYTES:
        raise _fail(f"combined evidence is {len(blob)} bytes: more than a CPU's and a GPU's together")
    if len(blob) < head or blob[len(MAGIC_COMBINED)] != VERSION:
        raise _fail("truncated header or unknown combined-evidence version")
    (clen,) = struct.unpack_from(">I", blob, len(MAGIC_COMBINED) + 1)
    if clen > cpu_max or len(blob) < head + clen + 4:
        raise _fail(f"CPU evidence length {clen} runs past the combined evidence's {len(blob)} bytes")
    (glen,) = struct.unpack_from(">I", blob, head + clen)
    if glen > MAX_GPU_EVIDENCE_BYTES or len(blob) != head + clen + 4 + glen:
        raise _fail(f"GPU evidence length {glen} does not match the combined evidence's size {len(blob)}")
    return blob[head:head + clen], blob[head + clen + 4:]
