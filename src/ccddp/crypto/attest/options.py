"""``--attestation-policy PATH`` / ``--attestation-certs DIR`` of ``ccddp launch`` and
``ccddp train``: checked once, before anything starts, and turned into the environment
every rank reads (``CCDDP_ATTESTATION_POLICY`` / ``CCDDP_ATTESTATION_CERTS``, see
:meth:`ccddp.crypto.establish.KeyEstablishment.from_env`).

The checks are the ones every rank would make when it forms its group (the policy parsed
by its own loader, AMD's certificates and the CRLs read from the directory), so a typo is
one line here (exit 2) instead of the same refusal from every rank after torch loaded.

Example::

    env.update(attestation_environment("policy.toml", "certs/", os.environ))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ccddp.crypto.establish import ENV_ATTESTATION_CERTS, ENV_ATTESTATION_POLICY
from ccddp.errors import ConfigError

POLICY_OPTION = "--attestation-policy"
CERTS_OPTION = "--attestation-certs"


def attestation_environment(policy: str | None, certs: str | None,
                            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ranks' attestation variables for the two options, after checking them; ``{}``
    when neither is given (the caller's environment then stays as it is).

    ``certs`` may be left out when the caller's ``CCDDP_ATTESTATION_CERTS`` names the
    directory (``environ``, default this process's): the directory the ranks will read is
    the one checked. Paths are made absolute, so a rank started in another directory reads
    the same files. Raises :class:`~ccddp.errors.AttestationError` (the policy loader's
    claim, e.g. ``policy_file.snp.allow_debgu``) or :class:`ConfigError`."""
    environ = os.environ if environ is None else environ
    if policy is None:
        if certs is not None:
            # Certificates alone turn nothing on: refused rather than silently ignored.
            raise ConfigError(f"{CERTS_OPTION} needs {POLICY_OPTION}: the certificates are only read to verify "
                              "evidence against a policy")
        return {}
    if not policy.strip():
        raise ConfigError(f"{POLICY_OPTION} needs a path to a policy TOML file")
    from ccddp.crypto.attest.policy import AttestationPolicy

    parsed = AttestationPolicy.from_file(policy)        # typed, names the field that is wrong
    if parsed.snp is None and parsed.tdx is None:
        from ccddp.errors import AttestationError

        # What every rank's TeeVerifier would refuse, said once here.
        raise AttestationError(f"attestation policy refused, claim 'policy_file.tee': {policy} has only a [gpu] "
                               "table: GPU evidence is checked beside a CPU TEE's ([snp] or [tdx]), never alone, "
                               "so no rank would be accepted",
                               claim="policy_file.tee")
    certs = certs if certs is not None else (environ.get(ENV_ATTESTATION_CERTS) or None)
    out = {ENV_ATTESTATION_POLICY: str(Path(policy).resolve())}
    if certs is None:
        if parsed.snp is not None:
            raise ConfigError(f"the policy {policy} accepts SEV-SNP evidence: give {CERTS_OPTION} DIR, the "
                              "directory holding AMD's ASK/ARK certificates")
        return out
    where = Path(certs)
    if not where.is_dir():
        raise ConfigError(f"{CERTS_OPTION} {certs}: no such directory")
    # What each rank will load from it (KeyEstablishment.from_env), loaded here first.
    if parsed.snp is not None:
        from ccddp.crypto.attest.snp import TrustStore

        TrustStore.from_dir(where)
    if parsed.tdx is not None:
        from ccddp.crypto.attest.tdx import load_crls

        load_crls(where)
    out[ENV_ATTESTATION_CERTS] = str(where.resolve())
    return out
