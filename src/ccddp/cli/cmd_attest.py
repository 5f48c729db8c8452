"""``ccddp attest``: this machine's attestation evidence, or verify a saved one.

``ccddp attest`` asks the hardware (configfs-tsm, else /dev/sev-guest) for an SEV-SNP
report or a TDX quote and prints its summary (TEE, measurement, TCB, policy); where the
machine is not a confidential VM it says so in one line and exits 1. ``--out FILE`` saves the evidence
(report and, where the host provides it, the VCEK) for ``ccddp attest verify``.

Then the GPU part: the NVIDIA GPU's CC mode through NVML (``pynvml``, the
``gpu-attest`` extra) and, where CC mode is on, its SPDM attestation report for a nonce
(the first 32 bytes of the report data), verified against NVIDIA's pinned root and
printed (driver, VBIOS, measurements); else one line saying why there is none.
``--gpu-out FILE`` saves it (report, chain, CC mode). The exit status is the CPU part's:
0 with CPU TEE evidence, 1 without, whatever the GPU says. A machine with a GPU but no
CPU TEE exits 1: GPU evidence alone attests nothing about the machine driving the GPU.
There the GPU line follows the CPU line on stderr, and only where the NVIDIA driver lists
a GPU (``/proc/driver/nvidia/gpus``), so a machine with neither still prints one line.

``ccddp attest verify EVIDENCE --policy POLICY.toml --certs DIR`` verifies a saved SEV-SNP
report (ccddp evidence, or a bare 1184-byte report) offline against AMD's chain staged in
DIR (the ARK's key is pinned), or a TDX v4 quote against Intel's root (pinned; the PCK
chain is in the quote, DIR may hold CRLs), and the policy, printing each claim's verdict;
exit 0 when every claim holds, 2 when one is refused. GPU evidence (``ccddp attest
--gpu-out``, or NVIDIA's bare report, binary or hex, with ``--gpu-chain PEM``) is
verified against NVIDIA's pinned device root and the policy's ``[gpu]`` table; ``--nonce
HEX`` is the 32-byte nonce it must carry.

Example::

    $ ccddp attest --out me.snp
    $ ccddp attest verify me.snp --policy policy.toml --certs amd-certs/
"""

from __future__ import annotations

import argparse
import sys

SUMMARY = "print this machine's attestation evidence (SEV-SNP, TDX, NVIDIA GPU), or verify a saved report or quote"


def register(sub) -> None:
    p = sub.add_parser("attest", help=SUMMARY, description=__doc__.split("\n\n")[1],
                       epilog="see `ccddp attest verify --help` to verify saved evidence")
    p.add_argument("--report-data", default=None, metavar="HEX",
                   help="up to 64 bytes (hex) to put in REPORT_DATA (default: 64 random bytes); the GPU's nonce "
                        "is its first 32 bytes")
    p.add_argument("--out", default=None, metavar="FILE", help="save the evidence (report and VCEK) to FILE")
    p.add_argument("--gpu-out", default=None, metavar="FILE",
                   help="save the GPU's evidence (report, certificate chain, CC mode) to FILE")
    p.add_argument("--gpu-index", type=int, default=0, metavar="N", help="which GPU (NVML index, default 0)")
    p.set_defaults(func=run_local)
    verbs = p.add_subparsers(dest="verb", metavar="verify", required=False)
    v = verbs.add_parser("verify", help="verify a saved report or quote against a policy and the vendor's chain",
                         description="Verify a saved SEV-SNP report, TDX quote or NVIDIA GPU report offline and "
                                     "print each claim's verdict.")
    v.add_argument("evidence", metavar="EVIDENCE",
                   help="ccddp evidence (ccddp attest --out / --gpu-out), a 1184-byte SEV-SNP report, a TDX v4 "
                        "quote, or an NVIDIA GPU report (binary or hex, with --gpu-chain)")
    v.add_argument("--gpu-chain", default=None, metavar="PEM",
                   help="GPU: the certificate chain of a bare NVIDIA report (ccddp GPU evidence carries its own)")
    v.add_argument("--nonce", default=None, metavar="HEX",
                   help="GPU: the 32-byte nonce the report must carry (64 hex digits; default: not compared)")
    v.add_argument("--policy", required=True, metavar="POLICY.toml", help="the attestation policy")
    v.add_argument("--certs", default=None, metavar="DIR",
                   help="SEV-SNP: AMD's ASK/ARK (the KDS cert_chain of the product) and any VCEKs, as files "
                        "(required); TDX: Intel's PCK/root CRLs (*.crl, DER or PEM), optional: the PCK chain "
                        "travels in the quote")
    v.add_argument("--report-data", default=None, metavar="HEX",
                   help="the REPORT_DATA the report must carry (hex, zero-padded to 64 bytes; default: not compared)")
    v.add_argument("--at", default=None, metavar="ISO-TIME",
                   help="check certificate validity at this UTC time instead of now (e.g. 2026-01-01T00:00)")
    v.set_defaults(func=run_verify)


def _report_data(text: str | None) -> bytes | None:
    from ccddp.errors import ConfigError

    if text is None:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"--report-data must be hex, got {text[:40]!r}") from None
    if len(raw) > 64:
        raise ConfigError(f"--report-data is {len(raw)} bytes; REPORT_DATA holds 64")
    return raw.ljust(64, b"\0")


def run_local(args: argparse.Namespace) -> int:
    import os

    from ccddp.crypto.attest import parse_report
    from ccddp.crypto.attest.evidence import encode_evidence
    from ccddp.crypto.attest.provider import GpuProvider, NoEvidenceError, SnpProvider

    data = _report_data(args.report_data) or os.urandom(64)
    try:
        kind, report, vcek, source = SnpProvider().read(data)
    except NoEvidenceError as e:
        print(f"ccddp attest: {e}", file=sys.stderr)
        if GpuProvider.driver_present():
            _gpu_part(args, data[:32], sys.stderr)
        return 1
    if kind == "tdx":
        from ccddp.crypto.attest.tdx import parse_quote

        q = parse_quote(report)
        print(f"tee            TDX (quote v{q.version}, from {source})")
        print(f"mrtd           {q.mrtd.hex()}")
        for i, rtmr in enumerate(q.rtmrs):
            print(f"rtmr{i}          {rtmr.hex()}")
        print(f"td attributes  {q.td_attributes:#x} (debug {'on' if q.debug else 'off'})")
        print(f"tee tcb svn    {q.tee_tcb_svn.hex()}")
        print(f"report data    {q.report_data.hex()}")
        if args.out:
            with open(args.out, "wb") as f:
                f.write(q.raw)
            print(f"saved          {args.out}")
        _gpu_part(args, data[:32], sys.stdout)
        return 0
    r = parse_report(report)
    s = r.summary()
    print(f"tee            SEV-SNP (report v{r.version}, from {source})")
    print(f"measurement    {s['measurement']}")
    print(f"reported tcb   {s['reported_tcb']}")
    print(f"policy         {s['policy']} (debug {'on' if r.debug else 'off'}, migration agent "
          f"{'allowed' if r.migrate_ma else 'not allowed'}), VMPL {r.vmpl}, guest SVN {r.guest_svn}")
    print(f"chip id        {s['chip_id'][:32]}...")
    print(f"report data    {s['report_data']}")
    print(f"vcek           {'carried by the host (' + str(len(vcek)) + ' bytes)' if vcek else 'not provided: stage it'}")
    if args.out:
        with open(args.out, "wb") as f:
            f.write(encode_evidence(report, vcek))
        print(f"saved          {args.out}")
    _gpu_part(args, data[:32], sys.stdout)
    return 0


def _gpu_part(args: argparse.Namespace, nonce: bytes, out) -> None:
    """The GPU lines of ``ccddp attest``: its evidence verified and summarised, or one
    line saying why there is none. Never changes the exit status (see the module)."""
    from ccddp.crypto.attest.gpu import encode_gpu_evidence, parse_gpu_report, verify_gpu
    from ccddp.crypto.attest.provider import GpuProvider, NoEvidenceError
    from ccddp.errors import AttestationError

    provider = GpuProvider(index=args.gpu_index)
    try:
        report, chain, cc, source = provider.read(nonce)
    except NoEvidenceError as e:
        print(f"gpu            none: {e}" if out is sys.stdout else f"ccddp attest: gpu: {e}", file=out)
        return
    except AttestationError as e:
        print(f"gpu            refused: {e}" if out is sys.stdout else f"ccddp attest: gpu: {e}", file=out)
        return
    r = parse_gpu_report(report)
    try:
        # The chain and signature, against NVIDIA's pinned root (no policy here).
        verify_gpu(report, chain, None, expected_nonce=nonce, cc_mode=cc)
        checked = "signature and chain verified to NVIDIA's pinned root"
    except AttestationError as e:
        checked = f"NOT verified: {e}"
    print(f"gpu            {source}: CC mode {cc}, SPDM report of {len(report)} bytes, {checked}", file=out)
    print(f"gpu driver     {r.driver_version}", file=out)
    print(f"gpu vbios      {r.vbios_version}", file=out)
    print(f"gpu blocks     {len(r.measurements)} measurements, nonce {r.nonce.hex()}", file=out)
    if args.gpu_out:
        with open(args.gpu_out, "wb") as f:
            f.write(encode_gpu_evidence(report, chain, cc))
        print(f"gpu saved      {args.gpu_out}", file=out)


def run_verify(args: argparse.Namespace) -> int:
    import datetime as dt
    from pathlib import Path

    from ccddp.crypto.attest import AttestationPolicy, TrustStore, verify_snp
    from ccddp.crypto.attest.evidence import decode_evidence
    from ccddp.crypto.attest.tdx import MAX_QUOTE_BYTES
    from ccddp.crypto.attest.snp import Verdict, load_certificates
    from ccddp.crypto.attest.gpu import looks_like_gpu_evidence
    from ccddp.crypto.attest.tdx import load_crls, looks_like_tdx_quote, verify_tdx
    from ccddp.errors import AttestationError, ConfigError

    at = None
    if args.at:
        try:
            at = dt.datetime.fromisoformat(args.at)
        except ValueError:
            raise ConfigError(f"--at must be an ISO time, got {args.at!r}") from None
        at = at.replace(tzinfo=dt.timezone.utc) if at.tzinfo is None else at.astimezone(dt.timezone.utc)
    path = Path(args.evidence)
    verdicts: list[Verdict] = []
    try:
        try:
            size = path.stat().st_size
            # Bounded before it is read: the file may be anything a host handed over.
            blob = path.read_bytes() if size <= MAX_QUOTE_BYTES else b"\0" * (MAX_QUOTE_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"cannot read evidence {path}: {e.strerror}") from None
        policy = AttestationPolicy.from_file(args.policy)
        if looks_like_gpu_evidence(blob) or args.gpu_chain:
            _verify_gpu_file(args, blob, policy, at, verdicts)
        elif looks_like_tdx_quote(blob):
            if policy.tdx is None:
                raise AttestationError("the evidence is a TDX quote and the policy has no [tdx] table",
                                       claim="policy_file.tdx")
            verify_tdx(blob, policy.tdx, expected_report_data=_report_data(args.report_data), at=at,
                       crls=load_crls(args.certs), into=verdicts)
        else:
            report, vcek_der = decode_evidence(blob)
            if policy.snp is None:
                raise AttestationError("the evidence is an SEV-SNP report and the policy has no [snp] table",
                                       claim="policy_file.snp")
            if not args.certs:
                raise ConfigError("an SEV-SNP report needs --certs DIR (AMD's ASK/ARK)")
            trust = TrustStore.from_dir(args.certs)
            vcek = load_certificates(vcek_der, f"{path}'s VCEK")[0] if vcek_der else None
            verify_snp(report, trust, policy.snp, expected_report_data=_report_data(args.report_data), vcek=vcek,
                       at=at, into=verdicts)
    except AttestationError as e:
        for v in verdicts:
            print(f"ok    {v.claim:<24} {v.detail}")
        print(f"FAIL  {e.claim:<24} {e}")
        print(f"refused: claim {e.claim!r} failed")
        return 2
    for v in verdicts:
        print(f"ok    {v.claim:<24} {v.detail}")
    print(f"verified: {len(verdicts)} claims hold")
    return 0



def _verify_gpu_file(args: argparse.Namespace, blob: bytes, policy, at, verdicts: list) -> None:
    """``ccddp attest verify`` of GPU evidence: ccddp's (report, chain, CC mode) or a bare
    report (binary, or hex as NVIDIA's samples store it) with ``--gpu-chain``."""
    import string

    from ccddp.crypto.attest.gpu import CC_UNKNOWN, MAX_CHAIN_BYTES, decode_gpu_evidence, looks_like_gpu_evidence
    from ccddp.crypto.attest.gpu import verify_gpu
    from ccddp.errors import AttestationError, ConfigError

    if args.report_data is not None:
        raise ConfigError("--report-data is for SEV-SNP/TDX evidence: give a GPU report's nonce with --nonce")
    if looks_like_gpu_evidence(blob):
        if args.gpu_chain:
            raise ConfigError("--gpu-chain is for a bare report: this ccddp GPU evidence carries its own chain")
        report, chain, cc = decode_gpu_evidence(blob)
    else:
        text = blob.strip()
        report = (bytes.fromhex(text.decode()) if text and len(text) % 2 == 0
                  and all(chr(c) in string.hexdigits for c in text) else blob)
        try:
            with open(args.gpu_chain, "rb") as f:
                chain = f.read(MAX_CHAIN_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"cannot read --gpu-chain {args.gpu_chain}: {e.strerror}") from None
        cc = CC_UNKNOWN      # a bare report does not say; the policy's CC claim then fails
    if policy.gpu is None:
        raise AttestationError("the evidence is an NVIDIA GPU report and the policy has no [gpu] table",
                               claim="policy_file.gpu")
    nonce = None
    if args.nonce is not None:
        try:
            nonce = bytes.fromhex(args.nonce)
        except ValueError:
            raise ConfigError(f"--nonce must be hex, got {args.nonce[:40]!r}") from None
        if len(nonce) != 32:
            raise ConfigError(f"--nonce is {len(nonce)} bytes; a GPU nonce is 32")
    verify_gpu(report, chain, policy.gpu, expected_nonce=nonce, cc_mode=cc, at=at, into=verdicts)
