"""Hardware attestation: evidence that a peer runs in a confidential VM the user's policy
accepts, bound to this run's key exchange (see docs/security.md, "Attestation").

- :mod:`.snp`: SEV-SNP reports, AMD's certificate chain (ARK pinned), :func:`verify_snp`;
- :mod:`.policy`: the user's TOML policy;
- :mod:`.evidence`: the wire format of a rank's evidence;
- :mod:`.provider`: this machine's report (configfs-tsm, /dev/sev-guest);
- :mod:`.tdx`: TDX v4 quotes, Intel's PCK chain (root pinned), :func:`verify_tdx`;
- :mod:`.gpu`: NVIDIA GPU SPDM reports, NVIDIA's device chain (root pinned), :func:`verify_gpu`;
- :mod:`.verifier`: :class:`TeeVerifier`, the ``AttestationVerifier`` for key establishment.
"""

from ccddp.crypto.attest.gpu import GpuReport, parse_gpu_report, verify_gpu
from ccddp.crypto.attest.policy import AttestationPolicy, GpuPolicy, SnpPolicy, TdxPolicy
from ccddp.crypto.attest.snp import SnpReport, TrustStore, Verdict, parse_report, verify_snp
from ccddp.crypto.attest.tdx import TdxQuote, parse_quote, verify_tdx
from ccddp.crypto.attest.verifier import TeeVerifier

__all__ = ["AttestationPolicy", "SnpPolicy", "TdxPolicy", "SnpReport", "TrustStore", "Verdict", "parse_report",
           "verify_snp", "TdxQuote", "parse_quote", "verify_tdx", "TeeVerifier", "GpuPolicy", "GpuReport",
           "parse_gpu_report", "verify_gpu"]
