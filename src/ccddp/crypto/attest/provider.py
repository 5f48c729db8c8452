"""Reading this machine's attestation evidence from the hardware.

Two Linux interfaces, tried in order:

1. **configfs-tsm** (Linux >= 6.7, one ABI for SEV-SNP and TDX guests): create a
   directory under ``/sys/kernel/config/tsm/report``, write the 64 bytes of user data to
   ``inblob``, read the report from ``outblob``, the TEE from ``provider`` and, for
   SEV-SNP, the host's certificate table (VCEK, ASK, ARK) from ``auxblob``.
2. **/dev/sev-guest** (the SEV-SNP guest driver's ``SNP_GET_REPORT`` ioctl) where
   configfs-tsm is missing.

Where neither exists the provider raises :class:`NoEvidenceError` with one line naming
what is missing. It never makes evidence up: what it returns came from the firmware (and
is checked to carry the requested user data).
"""

from __future__ import annotations

import ctypes
import os
import struct
import uuid
from pathlib import Path

from ccddp.crypto.attest.snp import REPORT_BYTES, REPORT_DATA_BYTES
from ccddp.errors import AttestationError

TSM_ROOT = "/sys/kernel/config/tsm/report"
SEV_GUEST = "/dev/sev-guest"

# GUIDs of the GHCB extended-report certificate table (GHCB spec, "SNP Extended Guest Request").
_GUID_VCEK = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd").bytes_le
_MAX_AUX = 1 << 16
_MAX_OUT = 1 << 16


class NoEvidenceError(AttestationError):
    """This machine cannot produce evidence (not a TEE, or its interface is missing)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, claim="provider")


def parse_cert_table(aux: bytes) -> bytes | None:
    """The VCEK (DER) from a GHCB certificate table: entries of (GUID 16, offset u32,
    length u32), ended by an all-zero entry; offsets index the table itself."""
    aux = bytes(aux[:_MAX_AUX])
    for pos in range(0, len(aux) - 23, 24):
        guid = aux[pos:pos + 16]
        off, length = struct.unpack_from("<II", aux, pos + 16)
        if guid == bytes(16):
            return None
        if guid == _GUID_VCEK:
            if off + length > len(aux) or length == 0:
                raise AttestationError("the certificate table's VCEK entry points outside it", claim="evidence.certs")
            return aux[off:off + length]
    return None


class SnpProvider:
    """This machine's SEV-SNP report for 64 bytes of user data."""

    def __init__(self, tsm_root: str | None = None, sev_guest: str | None = None) -> None:
        # The module's paths are read here, not bound as defaults, so a test can point
        # every provider (the CLI's too) at a directory of its own.
        self.tsm_root = Path(tsm_root or TSM_ROOT)
        self.sev_guest = Path(sev_guest or SEV_GUEST)

    def missing(self) -> str | None:
        """None if an interface exists, else the one-line reason there is no evidence."""
        if self.tsm_root.is_dir() or self.sev_guest.exists():
            return None
        return (f"no attestation evidence on this machine: neither configfs-tsm ({self.tsm_root}) nor the "
                f"SEV-SNP guest device ({self.sev_guest}) exists (not a confidential VM, or its guest driver "
                "is not loaded)")

    def read(self, report_data: bytes) -> tuple[str, bytes, bytes | None, str]:
        """``(kind, evidence, VCEK DER or None, source)`` with kind ``"snp"`` (a report) or
        ``"tdx"`` (a quote, from configfs-tsm's ``tdx_guest`` provider);
        :class:`NoEvidenceError` if there is none."""
        if len(report_data) != REPORT_DATA_BYTES:
            raise AttestationError(f"user data must be {REPORT_DATA_BYTES} bytes", claim="report_data")
        reason = self.missing()
        if reason is not None:
            raise NoEvidenceError(reason)
        if self.tsm_root.is_dir():
            kind, blob, vcek = self._configfs_tsm(report_data)
            source = "configfs-tsm"
        else:
            kind, blob, vcek = "snp", self._sev_guest(report_data), None
            source = str(self.sev_guest)
        if kind == "tdx":
            from ccddp.crypto.attest.tdx import parse_quote

            if parse_quote(blob).report_data != report_data:
                raise AttestationError(f"{source} returned a quote that is not for this user data", claim="provider")
        return kind, blob, vcek, source

    def report(self, report_data: bytes) -> tuple[bytes, bytes | None, str]:
        """``(report, VCEK DER or None, source)`` of an SEV-SNP guest; :class:`NoEvidenceError`
        if there is none (or it is another TEE's)."""
        kind, report, vcek, source = self.read(report_data)
        if kind != "snp":
            raise NoEvidenceError(f"{source} gives {kind.upper()} evidence; an SEV-SNP report was asked for")
        # What comes back is checked to be a report for *our* user data, so a provider bug
        # or a stale blob is caught here rather than as a peer's refusal later.
        if len(report) != REPORT_BYTES or report[0x50:0x90] != report_data:
            raise AttestationError(f"{source} returned {len(report)} bytes that are not a report of this "
                                   "user data", claim="provider")
        return report, vcek, source

    def _configfs_tsm(self, report_data: bytes) -> tuple[str, bytes, bytes | None]:
        entry = self.tsm_root / f"ccddp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            entry.mkdir()
        except OSError as e:
            raise NoEvidenceError(f"configfs-tsm: cannot create {entry}: {e.strerror}") from None
        try:
            gen0 = self._read_int(entry / "generation")
            (entry / "inblob").write_bytes(report_data)
            provider = (entry / "provider").read_text().strip()
            kinds = {"sev_guest": "snp", "tdx_guest": "tdx"}
            if provider not in kinds:
                raise NoEvidenceError(f"configfs-tsm provider is {provider!r}: only SEV-SNP (sev_guest) and TDX "
                                      "(tdx_guest) evidence is supported")
            out = (entry / "outblob").read_bytes()[:_MAX_OUT]
            aux_path = entry / "auxblob"
            aux = aux_path.read_bytes()[:_MAX_AUX] if aux_path.exists() else b""
            gen1 = self._read_int(entry / "generation")
            # Another writer of the same entry between our write and read would change the
            # generation by more than our one write: then outblob may be its report.
            if gen0 is not None and gen1 is not None and gen1 != gen0 + 1:
                raise AttestationError("configfs-tsm entry was written concurrently (generation "
                                       f"{gen0} -> {gen1})", claim="provider")
        except OSError as e:
            raise NoEvidenceError(f"configfs-tsm: {e.strerror or e} ({e.filename})") from None
        finally:
            try:
                entry.rmdir()
            except OSError:
                pass
        kind = kinds[provider]
        return kind, out, (parse_cert_table(aux) if aux and kind == "snp" else None)

    @staticmethod
    def _read_int(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _sev_guest(self, report_data: bytes) -> bytes:
        import fcntl

        # struct snp_report_req { u8 user_data[64]; u32 vmpl; u8 rsvd[28]; }
        req = ctypes.create_string_buffer(report_data + struct.pack("<I", 0) + bytes(28), 96)
        # struct snp_report_resp { u8 data[4000]; }: MSG_REPORT_RSP = status u32, size u32,
        # 24 reserved, then the report.
        resp = ctypes.create_string_buffer(4000)
        # struct snp_guest_request_ioctl { u8 msg_version; u64 req_data; u64 resp_data; u64 exitinfo2; }
        ioctl_arg = ctypes.create_string_buffer(struct.pack("<B7xQQQ", 1, ctypes.addressof(req),
                                                            ctypes.addressof(resp), 0), 32)
        snp_get_report = (3 << 30) | (32 << 16) | (ord("S") << 8) | 0x0   # _IOWR('S', 0x0, 32 bytes)
        try:
            fd = os.open(self.sev_guest, os.O_RDWR)
        except OSError as e:
            raise NoEvidenceError(f"{self.sev_guest}: {e.strerror}") from None
        try:
            fcntl.ioctl(fd, snp_get_report, ioctl_arg, True)
        except OSError as e:
            exitinfo2 = struct.unpack_from("<Q", ioctl_arg.raw, 24)[0]
            raise NoEvidenceError(f"{self.sev_guest}: SNP_GET_REPORT failed: {e.strerror} "
                                  f"(firmware/VMM error {exitinfo2:#x})") from None
        finally:
            os.close(fd)
        status, size = struct.unpack_from("<II", resp.raw, 0)
        if status != 0 or size != REPORT_BYTES:
            raise AttestationError(f"{self.sev_guest}: firmware status {status:#x}, report size {size}",
                                   claim="provider")
        return resp.raw[32:32 + REPORT_BYTES]


# -- NVIDIA GPUs -----------------------------------------------------------------------

#: Where the NVIDIA kernel driver lists its GPUs (one directory per GPU); read to tell
#: "no NVIDIA GPU here" from "a GPU, but no way to ask it" without loading NVML.
NVIDIA_PROC = "/proc/driver/nvidia/gpus"


class GpuProvider:
    """This machine's NVIDIA GPU evidence through NVML, from Python via ``pynvml`` (the
    ``nvidia-ml-py`` package: ``pip install 'ccddp[gpu-attest]'``).

    :meth:`state` says the GPU and its CC mode (``nvmlSystemGetConfComputeState``);
    :meth:`read` returns the GPU's SPDM attestation report for a 32-byte nonce and its
    certificate chain, only where CC mode is on (or devtools). Where pynvml, the driver,
    a GPU or CC mode is missing, :class:`NoEvidenceError` says which in one line; nothing
    is ever made up. ``nvml``: a module to use instead of ``pynvml`` (tests).
    """

    def __init__(self, index: int = 0, nvml=None) -> None:
        self.index = index
        self._module = nvml

    def _nvml(self):
        if self._module is not None:
            return self._module
        try:
            import pynvml
        except ImportError:
            raise NoEvidenceError("no GPU evidence: pynvml is not installed (the nvidia-ml-py package; "
                                  "pip install 'ccddp[gpu-attest]')") from None
        return pynvml

    @staticmethod
    def driver_present() -> bool:
        """Whether the NVIDIA kernel driver lists a GPU (no NVML needed)."""
        try:
            return any(Path(NVIDIA_PROC).iterdir())
        except OSError:
            return False

    def _call(self, nvml, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - pynvml raises NVMLError subclasses; any failure is "no evidence"
            raise NoEvidenceError(f"no GPU evidence: NVML {what} failed: {e}") from None

    def state(self) -> tuple[str, str]:
        """``(CC mode "on" | "off" | "devtools", GPU description)``; NoEvidenceError if
        NVML cannot say."""
        nvml = self._nvml()
        self._call(nvml, "nvmlInit (no NVIDIA driver loaded?)", nvml.nvmlInit)
        try:
            return self._state(nvml)
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def _state(self, nvml) -> tuple[str, str]:
        count = self._call(nvml, "nvmlDeviceGetCount", nvml.nvmlDeviceGetCount)
        if count <= self.index:
            raise NoEvidenceError(f"no GPU evidence: NVML sees {count} GPUs, GPU {self.index} was asked for")
        handle = self._call(nvml, "nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, self.index)
        name = self._call(nvml, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        what = f"GPU {self.index} ({name})"
        st = self._call(nvml, f"nvmlSystemGetConfComputeState for {what} (a GPU or driver without confidential "
                              "computing)", nvml.nvmlSystemGetConfComputeState)
        if int(getattr(st, "ccFeature", 0)) != 1:
            return "off", what
        return ("devtools" if int(getattr(st, "devToolsMode", 0)) == 1 else "on"), what

    def read(self, nonce: bytes) -> tuple[bytes, bytes, str, str]:
        """``(report, certificate chain (PEM), CC mode, source)`` for a 32-byte nonce;
        :class:`NoEvidenceError` where there is none (CC mode off included)."""
        from ccddp.crypto.attest.gpu import MAX_CHAIN_BYTES, MAX_REPORT_BYTES, NONCE_BYTES, parse_gpu_report

        if len(nonce) != NONCE_BYTES:
            raise AttestationError(f"a GPU nonce is {NONCE_BYTES} bytes, not {len(nonce)}", claim="gpu.nonce")
        nvml = self._nvml()
        self._call(nvml, "nvmlInit (no NVIDIA driver loaded?)", nvml.nvmlInit)
        try:
            cc, what = self._state(nvml)
            if cc == "off":
                raise NoEvidenceError(f"no GPU evidence: {what} has confidential computing (CC) mode off "
                                      "(nvidia-smi conf-compute -f says OFF); it attests only in CC mode")
            handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
            rep = self._call(nvml, "nvmlDeviceGetConfComputeGpuAttestationReport",
                             nvml.nvmlDeviceGetConfComputeGpuAttestationReport, handle, nonce)
            size = int(rep.attestationReportSize)
            if not 0 < size <= MAX_REPORT_BYTES:
                raise AttestationError(f"NVML returned an attestation report of {size} bytes", claim="provider")
            report = bytes(rep.attestationReport[:size])
            cert = self._call(nvml, "nvmlDeviceGetConfComputeGpuCertificate",
                              nvml.nvmlDeviceGetConfComputeGpuCertificate, handle)
            csize = int(cert.attestationCertChainSize)
            if not 0 < csize <= MAX_CHAIN_BYTES:
                raise AttestationError(f"NVML returned a certificate chain of {csize} bytes", claim="provider")
            chain = bytes(cert.attestationCertChain[:csize])
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        # What came back must be a report for *this* nonce (caught here, not as a peer's refusal).
        if parse_gpu_report(report).nonce != bytes(nonce):
            raise AttestationError(f"NVML returned a report for {what} that is not for this nonce", claim="provider")
        return report, chain, cc, f"NVML, {what}"
