"""``ccddp attest``: this machine's attestation evidence, or verify a saved one.

``ccddp attest`` asks the hardware (configfs-tsm, else /dev/sev-guest) for an SEV-SNP
report and prints its summary (TEE, measurement, TCB, policy); where the machine is not a
confidential VM it says so in one line and exits 1. ``--out FILE`` saves the evidence
(report and, where the host provides it, the VCEK) for ``ccddp attest verify``.

``ccddp attest verify EVIDENCE --policy POLICY.toml --certs DIR`` verifies a saved report
(ccddp evidence, or a bare 1184-byte report) offline against AMD's chain staged in DIR
(the ARK's key is pinned) and the policy, printing each claim's verdict; exit 0 when every
claim holds, 2 when one is refused.

Example::

    $ ccddp attest --out me.snp
    $ ccddp attest verify me.snp --policy policy.toml --certs amd-certs/
"""

from __future__ import annotations

import argparse
import sys

SUMMARY = "print this machine's attestation evidence (SEV-SNP), or verify a saved report"


def register(sub) -> None:
    p = sub.add_parser("attest", help=SUMMARY, description=__doc__.split("\n\n")[1],
                       epilog="see `ccddp attest verify --help` to verify saved evidence")
    p.add_argument("--report-data", default=None, metavar="HEX",
                   help="up to 64 bytes (hex) to put in REPORT_DATA (default: 64 random bytes)")
    p.add_argument("--out", default=None, metavar="FILE", help="save the evidence (report and VCEK) to FILE")
    p.set_defaults(func=run_local)
    verbs = p.add_subparsers(dest="verb", metavar="verify", required=False)
    v = verbs.add_parser("verify", help="verify a saved report against a policy and AMD's chain",
                         description="Verify saved SEV-SNP evidence offline and print each claim's verdict.")
    v.add_argument("evidence", metavar="EVIDENCE", help="ccddp evidence (ccddp attest --out) or a 1184-byte report")
    v.add_argument("--policy", required=True, metavar="POLICY.toml", help="the attestation policy")
    v.add_argument("--certs", required=True, metavar="DIR",
                   help="AMD's ASK/ARK (the KDS cert_chain of the product) and any VCEKs, as files")
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
    from ccddp.crypto.attest.provider import NoEvidenceError, SnpProvider

    data = _report_data(args.report_data) or os.urandom(64)
    try:
        report, vcek, source = SnpProvider().report(data)
    except NoEvidenceError as e:
        print(f"ccddp attest: {e}", file=sys.stderr)
        return 1
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
    print("gpu            not attested by this version (NVIDIA GPU attestation is not built yet)")
    if args.out:
        with open(args.out, "wb") as f:
            f.write(encode_evidence(report, vcek))
        print(f"saved          {args.out}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    import datetime as dt
    from pathlib import Path

    from ccddp.crypto.attest import AttestationPolicy, TrustStore, verify_snp
    from ccddp.crypto.attest.evidence import MAX_EVIDENCE_BYTES, decode_evidence
    from ccddp.crypto.attest.snp import Verdict, load_certificates
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
            blob = path.read_bytes() if size <= MAX_EVIDENCE_BYTES else b"\0" * (MAX_EVIDENCE_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"cannot read evidence {path}: {e.strerror}") from None
        report, vcek_der = decode_evidence(blob)
        policy = AttestationPolicy.from_file(args.policy)
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
