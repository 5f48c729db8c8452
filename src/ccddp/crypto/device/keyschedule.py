"""What the device engine computes on the host: once per key, AES round keys, the AES
tables every key shares, and the powers of the GHASH key H with their 4-bit tables; per
message, its tag mask AES_K(J0) (one block).

GHASH arithmetic here follows NIST SP 800-38D: a 16-byte block is the big-endian
128-bit integer of its bytes; bit ``i`` of the spec (coefficient of x^i) is that integer's
bit ``127 - i``, so multiplying by x is a right shift by one, reduced by R = 0xE1 << 120.
Arrays of blocks are two uint64 columns (high word, low word).

Example::

    rk = round_keys(key)                     # 60 big-endian words of AES-256
    h = ghash_key(key)                       # H = AES_K(0^128) as an int
    masks = tag_masks(key, [nonce])          # AES_K(J0) of each message
    hi, lo = powers(h, 8)                    # H^1 .. H^8
    m = nibble_tables(hi, lo)                # [8, 2, 16]: v * H^(r+1) for each 4-bit v
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_R_HI = np.uint64(0xE1 << 56)
_ONE = np.uint64(1)
_MASK64 = (1 << 64) - 1


def _sbox() -> list[int]:
    """The AES S-box: multiplicative inverse in GF(2^8) followed by the affine map."""

    def mul(a: int, b: int) -> int:
        p = 0
        for _ in range(8):
            if b & 1:
                p ^= a
            a = ((a << 1) ^ (0x11B if a & 0x80 else 0)) & 0xFF
            b >>= 1
        return p

    inv = [0] * 256
    for a in range(1, 256):
        inv[a] = next(b for b in range(1, 256) if mul(a, b) == 1)
    box = []
    for x in inv:
        y = x
        for shift in range(1, 5):
            y ^= ((x << shift) | (x >> (8 - shift))) & 0xFF
        box.append(y ^ 0x63)
    return box


SBOX = _sbox()


def _xtime(b: int) -> int:
    return ((b << 1) ^ (0x1B if b & 0x80 else 0)) & 0xFF


def aes_tables() -> np.ndarray:
    """Te0..Te3 (SubBytes, ShiftRows and MixColumns of one byte as a column word, in
    the four byte rotations) followed by the S-box: 1280 uint32, the same for every key."""
    te0 = [(_xtime(s) << 24) | (s << 16) | (s << 8) | (_xtime(s) ^ s) for s in SBOX]
    tables = [te0]
    for rot in (8, 16, 24):
        tables.append([((w >> rot) | (w << (32 - rot))) & 0xFFFFFFFF for w in te0])
    tables.append(SBOX)
    return np.array([w for t in tables for w in t], dtype=np.uint32)


def round_keys(key: bytes) -> np.ndarray:
    """The 60 round-key words of AES-256 (FIPS 197 key expansion), big-endian."""
    if len(key) != 32:
        raise ValueError("AES-256 needs a 32-byte key")
    w = [int.from_bytes(key[4 * i:4 * i + 4], "big") for i in range(8)]
    rcon = 1
    for i in range(8, 60):
        t = w[i - 1]
        if i % 8 == 0:
            t = ((t << 8) | (t >> 24)) & 0xFFFFFFFF
            t = int.from_bytes(bytes(SBOX[b] for b in t.to_bytes(4, "big")), "big") ^ (rcon << 24)
            rcon = _xtime(rcon)
        elif i % 8 == 4:
            t = int.from_bytes(bytes(SBOX[b] for b in t.to_bytes(4, "big")), "big")
        w.append(w[i - 8] ^ t)
    return np.array(w, dtype=np.uint32)


def ghash_key(key: bytes) -> int:
    """H = AES_K(0^128), through OpenSSL (one block, once per key)."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return int.from_bytes(enc.update(bytes(16)) + enc.finalize(), "big")


def tag_masks(key: bytes, nonces: list[bytes]) -> np.ndarray:
    """AES_K(J0), J0 = nonce || 0^31 || 1, for each 96-bit nonce, through OpenSSL (one
    block per message): uint64 array [n, 2] (high, low)."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blocks = enc.update(b"".join(n + b"\0\0\0\1" for n in nonces)) + enc.finalize()
    return np.frombuffer(blocks, dtype=">u8").astype(np.uint64).reshape(-1, 2)


def split(x: int) -> tuple[np.ndarray, np.ndarray]:
    """One block as (high, low) uint64 arrays of length 1."""
    return np.array([x >> 64], dtype=np.uint64), np.array([x & _MASK64], dtype=np.uint64)


def join(hi: np.ndarray, lo: np.ndarray, i: int = 0) -> int:
    return (int(hi[i]) << 64) | int(lo[i])


def times_x(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every block times x (one right shift, reduced)."""
    carry = lo & _ONE
    return (hi >> _ONE) ^ (_R_HI * carry), (lo >> _ONE) | (hi << np.uint64(63))


def multiply(hi: np.ndarray, lo: np.ndarray, y: int) -> tuple[np.ndarray, np.ndarray]:
    """Every block times the constant ``y`` (SP 800-38D algorithm 1, vectorized over blocks)."""
    zh, zl = np.zeros_like(hi), np.zeros_like(lo)
    for i in range(128):
        if (y >> (127 - i)) & 1:
            zh ^= hi
            zl ^= lo
        hi, lo = times_x(hi, lo)
    return zh, zl


ONE = 1 << 127   # the field's 1: the block 0x80 00 .. 00


def powers(base: int, count: int, first: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``first * base^j`` for j = 0 .. count-1 (``first`` defaults to ``base``), by doubling:
    the second half of a table is the first half times base^(len)."""
    hi, lo = split(base if first is None else first)
    step = base                      # base^len(table)
    while len(hi) < count:
        h2, l2 = multiply(hi, lo, step)
        hi, lo = np.concatenate([hi, h2]), np.concatenate([lo, l2])
        sh, sl = multiply(*split(step), step)
        step = join(sh, sl)
    return hi[:count].copy(), lo[:count].copy()


def nibble_tables(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """For each block Y, the 16 products ``Y * v`` for the 4-bit values v of one nibble of
    the other factor (v's top bit is x^0): uint64 array [n, 2, 16] (16 high words, then
    16 low words)."""
    shifted = [(hi, lo)]
    for _ in range(3):
        shifted.append(times_x(*shifted[-1]))
    out = np.zeros((len(hi), 2, 16), dtype=np.uint64)
    for v in range(16):
        for b in range(4):
            if (v >> (3 - b)) & 1:
                out[:, 0, v] ^= shifted[b][0]
                out[:, 1, v] ^= shifted[b][1]
    return out


def shift4_reduction() -> np.ndarray:
    """What the 4 bits shifted out of a block by a multiplication by x^4 add to its high
    word: 16 uint64 values, indexed by those bits (the block's low nibble)."""
    lo = np.arange(16, dtype=np.uint64)
    hi = np.zeros(16, dtype=np.uint64)
    for _ in range(4):
        hi, lo = times_x(hi, lo)
    assert not lo.any()
    return hi
