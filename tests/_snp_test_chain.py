"""TEST ONLY: the SEV-SNP test chain, which lives in :mod:`ccddp.testing.snp_chain` so the
self-test's attestation rows can use it too (see why there)."""

from ccddp.testing.snp_chain import (CHIP_ID, MEASUREMENT, POLICY_OK, PRODUCT, TCB, TestChain,  # noqa: F401
                                     TestProvider)
