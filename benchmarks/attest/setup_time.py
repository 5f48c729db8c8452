"""Setup time with SEV-SNP attestation vs without (allowlist identities), on this machine.

    PYTHONPATH=src python benchmarks/attest/setup_time.py [--reps 7]

1. verify_snp of the genuine go-sev-guest report and verify_tdx of the genuine SPR quote (one
   peer's check: chain, signatures, policy), and TrustStore.from_dir (once per process);
2. the three-round key establishment on threads (in-memory exchange), world size 2 and 4:
   allowlist vs TeeVerifier with the TEST chain of tests/_snp_test_chain.py (its report
   signing stands in for the firmware's, which this machine does not have);
3. SecureGroup construction on real gloo ranks (world size 2): allowlist vs attested.
Prints medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

FIX = ROOT / "tests" / "fixtures" / "attestation"


def _median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _rank(rank, n, exported, policy_text, reps):
    from _snp_test_chain import TestChain, TestProvider
    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
    from ccddp.crypto.establish import Allowlist, Identity, KeyEstablishment

    import torch.distributed as dist

    chain = TestChain.load(exported)
    s = CommSettings(timeout_s=30)
    idents = [Identity(__import__("cryptography.hazmat.primitives.asymmetric.ed25519", fromlist=["x"])
                       .Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32), f"rank{i}") for i in range(n)]
    allow = Allowlist({i.name: i.public_bytes for i in idents})
    snp = TeeVerifier(AttestationPolicy.from_toml(policy_text), TrustStore([chain.ask, chain.ark], pins=chain.pins),
                      provider=TestProvider(chain))
    times: dict[str, list[float]] = {"allowlist": [], "snp": []}
    # One warm-up of each, then the two interleaved, so neither gets the warm caches.
    for i in range(reps + 1):
        for name, ver in (("allowlist", allow), ("snp", snp)) if i % 2 else (("snp", snp), ("allowlist", allow)):
            dist.barrier()
            t0 = time.perf_counter()
            SecureGroup(s, establishment=KeyEstablishment(idents[rank], ver), transport=Transport.open(None, 30))
            if i:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    from _snp_test_chain import MEASUREMENT, TestChain, TestProvider
    from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore, parse_report, verify_snp
    from ccddp.crypto.attest.snp import load_certificates
    from ccddp.crypto.establish import Allowlist, Identity
    from test_establish import establish

    report = (FIX / "gosev_milan_report.bin").read_bytes()
    vcek = load_certificates((FIX / "gosev_milan_vcek.der").read_bytes(), "vcek")[0]
    policy = AttestationPolicy.from_file(FIX / "policy_gosev.toml")
    trust = TrustStore.from_dir(FIX / "amd")
    rd = parse_report(report).report_data
    print(f"TrustStore.from_dir (Milan+Genoa chains)   {_median_ms(lambda: TrustStore.from_dir(FIX / 'amd'), args.reps):8.2f} ms")
    print(f"verify_snp, genuine report (one peer)      "
          f"{_median_ms(lambda: verify_snp(report, trust, policy.snp, expected_report_data=rd, vcek=vcek), args.reps * 3):8.2f} ms")

    from ccddp.crypto.attest import parse_quote, verify_tdx

    raw = (FIX / "tdx" / "spr_e4_quote.dat").read_bytes()
    quote = raw[:raw.index(b"\nextra")]
    tpol = AttestationPolicy.from_file(FIX / "tdx" / "policy_spr.toml").tdx
    qrd = parse_quote(quote).report_data
    print(f"verify_tdx, genuine quote (one peer)       "
          f"{_median_ms(lambda: verify_tdx(quote, tpol, expected_report_data=qrd), args.reps * 3):8.2f} ms")

    chain = TestChain()
    text = (f'format = "ccddp-attestation-policy/1"\n[snp]\nmeasurements = ["{MEASUREMENT.hex()}"]\n')
    pol = AttestationPolicy.from_toml(text)
    tstore = TrustStore([chain.ask, chain.ark], pins=chain.pins)
    for n in (2, 4):
        ids = [Identity.generate(f"rank{i}") for i in range(n)]
        allow = Allowlist({i.name: i.public_bytes for i in ids})

        def run(verifiers):
            res, _ = establish(ids, allow, verifiers=verifiers)
            assert not any(isinstance(r, Exception) for r in res), res

        a = _median_ms(lambda: run([allow] * n), args.reps)
        b = _median_ms(lambda: run([TeeVerifier(pol, tstore, provider=TestProvider(chain)) for _ in range(n)]),
                       args.reps)
        print(f"establishment, threads, n={n}: allowlist {a:8.2f} ms   snp {b:8.2f} ms   (+{b - a:.2f} ms)")

    from dist_util import run_ranks

    res = run_ranks(_rank, 2, chain.export(), text, args.reps, timeout=600)
    for r, out in enumerate(res):
        print(f"SecureGroup on real ranks, n=2, rank {r}: allowlist {out['allowlist']:8.2f} ms   "
              f"snp {out['snp']:8.2f} ms   (+{out['snp'] - out['allowlist']:.2f} ms)")


if __name__ == "__main__":
    main()
