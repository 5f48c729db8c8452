"""TDX quote verification on genuine, publicly published v4 quotes
(tests/fixtures/attestation/tdx, origins in the README): each verifies end to end to
Intel's pinned root, and each tampered variant is refused naming the claim it breaks.
"""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path

import pytest
from cryptography import x509

from _tdx_test_chain import MRTD, TdxTestChain
from ccddp.crypto.attest import AttestationPolicy
from ccddp.crypto.attest.tdx import SIGNED_BYTES, parse_quote, verify_tdx
from ccddp.errors import AttestationError
from _attest_util import ANY_BUT_MRTD, flip as _flip, refused as _refused

T = Path(__file__).parent / "fixtures" / "attestation" / "tdx"
UTC = dt.timezone.utc
IN_CRL_WINDOW = dt.datetime(2023, 6, 20, tzinfo=UTC)   # the sample CRLs' validity (and the SPR PCK's)


def _spr() -> bytes:
    # The published file has 39 bytes of text appended by its authors ("extra bytes..."),
    # to test trailing-data handling; the quote is what precedes them.
    raw = (T / "spr_e4_quote.dat").read_bytes()
    return raw[:raw.index(b"\nextra")]


def _cos() -> bytes:
    return (T / "cos113_quote.dat").read_bytes()   # as read through an 8000-byte buffer: zero padded


def _policy(name: str):
    return AttestationPolicy.from_file(T / f"policy_{name}.toml").tdx


def _crls():
    return [x509.load_der_x509_crl((T / n).read_bytes()) for n in ("pckcrl_platform.der", "rootcrl.der")]


def _verify(quote: bytes, name: str = "spr", *, expected=None, at=IN_CRL_WINDOW, policy=None, **kw):
    expected = parse_quote(_spr() if name == "spr" else _cos()).report_data if expected is None else expected
    return verify_tdx(quote, policy or _policy(name), expected_report_data=expected, at=at, **kw)


def test_genuine_quotes_verify_end_to_end():
    v = _verify(_spr(), crls=_crls())
    claims = [x.claim for x in v]
    for c in ("certs.chain", "certs.crl", "qe_report.signature", "qe_report.identity", "qe_report.binding",
              "quote.signature", "report_data", "policy.debug", "mrtd", "rtmr0", "tee_tcb_svn"):
        assert c in claims
    assert claims.index("quote.signature") < claims.index("report_data") < claims.index("mrtd")
    assert _verify(_cos(), "cos", at=dt.datetime(2025, 6, 1, tzinfo=UTC))


@pytest.mark.parametrize("offset, claim", [
    (48 + 136 + 5, "quote.signature"),           # one bit of MRTD
    (48 + 328 + 1, "quote.signature"),           # RTMR0
    (48 + 520, "quote.signature"),               # REPORTDATA
    (636 + 10, "quote.signature"),               # the quote's signature
    (636 + 64 + 3, "qe_report.binding"),         # the attestation key (the QE vouched for another)
    (636 + 134 + 100, "qe_report.signature"),    # the QE report
    (636 + 134 + 384 + 7, "qe_report.signature"),  # the QE report's signature
])
def test_tampered_quote_is_refused_by_the_claim_it_breaks(offset, claim):
    _refused(claim, _verify, _flip(_spr(), offset))


def test_quote_for_another_binding_is_refused():
    e = _refused("report_data", _verify, _spr(), expected=bytes(64))
    assert "replayed" in str(e)


def test_swapped_pck_chain_is_refused():
    # The cos-113 quote's PCK chain (genuine, same length, another platform) in the SPR
    # quote: the chain verifies to Intel, but its PCK did not sign this QE report.
    spr, cos = bytearray(_spr()), _cos()
    start = spr.index(b"-----BEGIN CERTIFICATE-----")
    other = cos[cos.index(b"-----BEGIN CERTIFICATE-----"):parse_quote(cos).raw.__len__()]
    assert len(other) == len(spr) - start
    spr[start:] = other
    _refused("qe_report.signature", _verify, bytes(spr), at=dt.datetime(2025, 6, 1, tzinfo=UTC))


def test_chain_to_another_root_is_refused():
    fake = TdxTestChain().quote(bytes(64))
    _refused("certs.root", verify_tdx, fake, None, expected_report_data=bytes(64))


@pytest.mark.parametrize("when", [dt.datetime(2029, 10, 1, tzinfo=UTC), dt.datetime(2022, 9, 1, tzinfo=UTC)])
def test_chain_outside_its_validity_is_refused(when):
    _refused("certs.validity", _verify, _spr(), at=when)      # the SPR PCK: 2022-09-20 .. 2029-09-20


def test_expired_crl_is_refused():
    _refused("certs.crl", _verify, _spr(), crls=_crls(), at=dt.datetime(2024, 6, 1, tzinfo=UTC))


def test_crl_from_outside_the_chain_is_refused():
    _refused("certs.crl", _verify, _spr(), crls=[TdxTestChain().crl([])])


def test_revoked_pck_is_refused():
    chain = TdxTestChain()
    quote = chain.quote(bytes(64))
    pol = AttestationPolicy.from_toml(f'format = "ccddp-attestation-policy/1"\n[tdx]\nmrtds = ["{MRTD.hex()}"]\n'
                                      + ANY_BUT_MRTD).tdx
    assert verify_tdx(quote, pol, expected_report_data=bytes(64), root_pin=chain.pin, crls=[chain.crl([])])
    _refused("certs.crl", verify_tdx, quote, pol, expected_report_data=bytes(64), root_pin=chain.pin,
             crls=[chain.crl([chain.pck])])
    _refused("policy.debug", verify_tdx, chain.quote(bytes(64), td_attributes=1), pol,
             expected_report_data=bytes(64), root_pin=chain.pin)


@pytest.mark.parametrize("field", ["rtmr0", "rtmr1", "rtmr2", "min_tee_tcb_svn"])
def test_a_tdx_policy_must_say_which_rtmrs_and_tcb_it_accepts(field):
    """MRTD measures only the firmware: the host chooses what RTMR0..2 measure (firmware
    configuration, kernel, command line) and may run an old TDX module. A [tdx] table that
    leaves one out is refused, naming it; \"any\" accepts whatever the quote shows, on purpose."""
    lines = (T / "policy_cos.toml").read_text().splitlines()
    without = "\n".join(ln for ln in lines if not ln.startswith(field + " "))
    err = _refused(f"policy_file.tdx.{field}", AttestationPolicy.from_toml, without)
    assert "is required" in str(err) and '"any"' in str(err)
    claims = dict(_policy("cos").check(parse_quote(_cos())))
    assert claims["rtmr1"] == "any (as the policy says)" and claims["tee_tcb_svn"].endswith(">= " + "00" * 16)


def test_policy_claims_on_the_genuine_quote():
    text = (T / "policy_spr.toml").read_text()
    q = _spr()
    _refused("mrtd", _verify, q, policy=AttestationPolicy.from_file(T / "policy_cos.toml").tdx)
    _refused("rtmr2", _verify, q, policy=AttestationPolicy.from_toml(
        text.replace('rtmr2 = "any"', f'rtmr2 = ["{"00" * 48}"]')).tdx)
    _refused("tee_tcb_svn", _verify, q,
             policy=AttestationPolicy.from_toml(text.replace('min_tee_tcb_svn = "03', 'min_tee_tcb_svn = "04')).tdx)
    raw = bytearray(q)
    struct.pack_into("<Q", raw, 48 + 120, 0x40000001)          # DEBUG on (checked on its own: the
    _refused("policy.debug", _policy("spr").check, parse_quote(bytes(raw)))   # signature refuses it first)


@pytest.mark.parametrize("mutate, claim", [
    (lambda q: q[:SIGNED_BYTES], "quote.size"),
    (lambda q: q[:-1], "quote.size"),
    (lambda q: q + b"x", "quote.size"),
    (lambda q: q + bytes(1 << 16), "quote.size"),
    (lambda q: struct.pack("<H", 3) + q[2:], "quote.version"),
    (lambda q: q[:2] + struct.pack("<H", 3) + q[4:], "quote.att_key_type"),
    (lambda q: q[:4] + struct.pack("<I", 0) + q[8:], "quote.tee_type"),
    (lambda q: q[:636 + 128] + struct.pack("<H", 5) + q[636 + 130:], "quote.certification"),
    (lambda q: q[:SIGNED_BYTES] + struct.pack("<I", 10 ** 6) + q[SIGNED_BYTES + 4:], "quote.size"),
])
def test_malformed_quotes_are_refused(mutate, claim):
    _refused(claim, parse_quote, mutate(_spr()))


def test_published_file_with_trailing_text_is_refused():
    _refused("quote.size", parse_quote, (T / "spr_e4_quote.dat").read_bytes())


# -- fuzz: whatever a host hands over, only AttestationError --------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ccddp.crypto.attest.evidence import decode_any, encode_evidence, encode_tdx_evidence  # noqa: E402

_FUZZ_FIX = Path(__file__).parent / "fixtures" / "attestation"
_SEEDS = [encode_tdx_evidence(_spr()),
          encode_evidence((_FUZZ_FIX / "virtee_milan_report.bin").read_bytes(),
                          (_FUZZ_FIX / "virtee_milan_vcek.der").read_bytes())]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_evidence_raises_only_attestation_errors(data):
    from ccddp.crypto.attest import TrustStore, verify_snp
    from ccddp.crypto.attest.snp import load_certificates

    seed = data.draw(st.sampled_from(_SEEDS))
    blob = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "grow", "byte"]))
        if kind == "flip" and blob:
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut" and blob:
            del blob[data.draw(st.integers(0, len(blob) - 1)):]
        elif kind == "grow":
            blob += data.draw(st.binary(max_size=64))
        elif blob:
            # Length fields and type codes live near the front of each part.
            i = data.draw(st.integers(0, min(len(blob) - 1, 1500)))
            blob[i] = data.draw(st.integers(0, 255))
    try:
        kind, payload, vcek = decode_any(bytes(blob))
        if kind == "tdx":
            verify_tdx(payload, None, expected_report_data=None, at=IN_CRL_WINDOW)
        else:
            trust = TrustStore.from_dir(_FUZZ_FIX / "amd")
            cert = load_certificates(vcek, "vcek")[0] if vcek else None
            verify_snp(payload, trust, None, expected_report_data=None, vcek=cert)
    except AttestationError:
        pass
