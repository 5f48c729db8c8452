"""Testing tools outside the product: what ``ccddp selftest`` and the test suite use to
attack and probe the engine, never imported by the backend, the engine or DDP.

- :mod:`ccddp.testing.adversary`: an adversary on the link (a ``Transport`` that
  tampers with, drops, replays or holds the frames it carries).
- :mod:`ccddp.testing.snp_chain`: a TEST SEV-SNP certificate chain and report signer (the
  self-test's attestation rows and the tests); trusted only by a verifier given its pins
  in code, never through the environment.
"""
