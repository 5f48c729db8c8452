"""NIST CAVP AES-GCM test vectors (``cryptography_vectors``): AES-256, 96-bit IVs.

Where ``CCDDP_GCM_VECTORS`` names a folder, the files are read from there instead, laid out
as in the package (``ciphers/AES/GCM/<name>``): the GPU check carries only the two files
these tests read (scripts/gpu_wheels.sh), the package being a 56 MB wheel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GcmVector:
    count: int
    key: bytes
    iv: bytes
    pt: bytes | None          # None: a decryption vector that must fail
    aad: bytes
    ct: bytes
    tag: bytes                # 4..16 bytes: the vector's tag length

    @property
    def shape(self) -> tuple[int, int, int]:
        """(plaintext, AAD, tag) lengths in bits, as the file's sections name them."""
        return 8 * len(self.ct), 8 * len(self.aad), 8 * len(self.tag)


def gcm_vectors(name: str) -> list[GcmVector]:
    """Every vector of ``ciphers/AES/GCM/<name>`` with a 96-bit IV, in file order."""
    path = f"ciphers/AES/GCM/{name}"
    folder = os.environ.get("CCDDP_GCM_VECTORS")
    if folder:
        with open(os.path.join(folder, path)) as f:
            text = f.read()
    else:
        import cryptography_vectors

        with cryptography_vectors.open_vector_file(path, "r") as f:
            text = f.read()
    lines = [line.strip() for line in text.splitlines()] + [""]
    vectors, cur, header = [], {}, {}
    for line in lines:
        if line.startswith("[") and "=" in line:
            k, v = line[1:-1].split("=")
            header[k.strip()] = int(v)
        elif "=" in line:
            k, v = line.split("=", 1)
            cur[k.strip()] = v.strip()
        elif line == "FAIL":
            cur["FAIL"] = ""
        elif not line and cur:
            if header.get("IVlen") == 96 and "Tag" in cur:
                vectors.append(GcmVector(int(cur["Count"]), bytes.fromhex(cur["Key"]), bytes.fromhex(cur["IV"]),
                                         None if "FAIL" in cur else bytes.fromhex(cur.get("PT", "")),
                                         bytes.fromhex(cur["AAD"]), bytes.fromhex(cur["CT"]), bytes.fromhex(cur["Tag"])))
            cur = {}
    return vectors
