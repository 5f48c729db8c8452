"""Hardware attestation: evidence that a peer runs in a confidential VM the user's policy
accepts, bound to this run's key exchange (see docs/security.md, "Attestation").

- :mod:`.snp`: SEV-SNP reports, AMD's certificate chain (ARK pinned), :func:`verify_snp`;
- :mod:`.policy`: the user's TOML policy;
- :mod:`.evidence`: the wire format of a rank's evidence;
- :mod:`.provider`: this machine's report (configfs-tsm, /dev/sev-guest);
- :mod:`.verifier`: :class:`SnpVerifier`, the ``AttestationVerifier`` for key establishment.
"""

from ccddp.crypto.attest.policy import AttestationPolicy, SnpPolicy
from ccddp.crypto.attest.snp import SnpReport, TrustStore, Verdict, parse_report, verify_snp
from ccddp.crypto.attest.verifier import SnpVerifier

__all__ = ["AttestationPolicy", "SnpPolicy", "SnpReport", "TrustStore", "Verdict", "parse_report", "verify_snp",
           "SnpVerifier"]
