"""The Triton kernels of the device AES-256-GCM engine (see ``ccddp.crypto.device``).

Every kernel works on a batch of segments described by a descriptor table (one row of
``DESC_FIELDS`` int64 per segment: where its input and output start, its length, where
its AAD and pad start, its nonce as three 32-bit words, and its tag mask AES_K(J0) as two
64-bit words, one OpenSSL block per segment on the host), so one launch serves any number
of segments, each with its own nonce, AAD and tag.

- ``gcm_pass``: GHASH partial sums of one tile of ``B`` GHASH blocks per program; when
  sealing it also encrypts (CTR) the ciphertext blocks of its tile, fused.
- ``gcm_finish``: XOR of a segment's tile partials = its tag; written (seal) or compared
  in constant time with the received tag, giving one verdict per segment (open).
- ``ctr_open``: decryption gated by the verdict: a segment whose tag failed gets zeros,
  so unverified plaintext is never written to device memory.
- ``keystream``: pads, the keystream of a frame generated before its data exists.

Counter blocks are ``nonce || ctr`` (big-endian): ctr 1 is J0, whose encryption masks the
tag (computed on the host); ciphertext block i uses ctr i + 2 (inc32 of J0, SP 800-38D
for 96-bit nonces).

GHASH: the GHASH input of a segment is X = AAD ‖ 0-pad ‖ C ‖ 0-pad ‖ [len(A)]64 ‖ [len(C)]64,
m blocks, and GHASH = XOR_k X_k · H^(m-k) (0-based k): the same value as the serial
chain, each product independent. Blocks are numbered from the end, u = m-1-k, so that
block k needs H^(u+1) = H^(r+1) · H^(qB) with u = qB + r: program q multiplies lane r by
the tile-local power H^(r+1), XOR-reduces its tile (a tree of halvings), and multiplies
the tile's sum by H^(qB) once. Multiplications use 4-bit tables of the constant factor
(v · H^j for the 16 values v of a nibble, computed on the host per key): 32 nibble steps
of shift-by-4 (with a fixed 16-entry reduction table) and one table lookup each. Table
indices are ciphertext or AAD nibbles (public), never key bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Descriptor row: input offset, length, output offset, AAD offset, AAD length, pad offset,
# nonce words 0..2, tag mask high and low word.
DESC_FIELDS = tl.constexpr(11)


@triton.jit
def _probe():
    pass


# Triton chose at decoration time: compiled kernels, or the interpreter's.
INTERPRETED = not isinstance(_probe, triton.runtime.JITFunction)


@triton.jit
def _aes256(n0, n1, n2, ctr, rk_ptr, te_ptr):
    """AES-256 of the counter blocks ``n0 n1 n2 ctr`` (uint32 words; ``ctr`` a tensor of
    lanes) as a [lanes, 4] tensor of big-endian words. T-table rounds: Te0..Te3 at
    te_ptr + 0/256/512/768, the S-box at +1024; ShiftRows is a rotation of the columns
    that the second to fourth table's lookups come from."""
    LANES: tl.constexpr = ctr.shape[0]
    col = tl.arange(0, 4)[None, :]
    rot1 = tl.broadcast_to((col + 1) % 4, [LANES, 4])
    rot2 = tl.broadcast_to((col + 2) % 4, [LANES, 4])
    rot3 = tl.broadcast_to((col + 3) % 4, [LANES, 4])
    s = tl.where(col == 0, n0, tl.where(col == 1, n1, tl.where(col == 2, n2, ctr[:, None])))
    s ^= tl.load(rk_ptr + col)
    for r in range(1, 14):
        s = (tl.load(te_ptr + (s >> 24))
             ^ tl.gather(tl.load(te_ptr + 256 + ((s >> 16) & 255)), rot1, 1)
             ^ tl.gather(tl.load(te_ptr + 512 + ((s >> 8) & 255)), rot2, 1)
             ^ tl.gather(tl.load(te_ptr + 768 + (s & 255)), rot3, 1)
             ^ tl.load(rk_ptr + 4 * r + col))
    sb = te_ptr + 1024
    return ((tl.load(sb + (s >> 24)) << 24)
            ^ (tl.gather(tl.load(sb + ((s >> 16) & 255)), rot1, 1) << 16)
            ^ (tl.gather(tl.load(sb + ((s >> 8) & 255)), rot2, 1) << 8)
            ^ tl.gather(tl.load(sb + (s & 255)), rot3, 1)
            ^ tl.load(rk_ptr + 56 + col))


@triton.jit
def _keystream_bytes(n0, n1, n2, ctr, valid, pad_ptr, rk_ptr, te_ptr, USE_PAD: tl.constexpr):
    """Keystream of counter blocks ``ctr`` (>= 2) as a [lanes, 16] uint8 tile: read from a
    pad (block ctr-2 of the frame's pad) or computed."""
    col = tl.arange(0, 16)
    if USE_PAD:
        pos = (ctr.to(tl.int64) - 2)[:, None] * 16 + col[None, :]
        ks = tl.load(pad_ptr + pos, mask=valid[:, None], other=0)
    else:
        LANES: tl.constexpr = ctr.shape[0]
        words = _aes256(n0, n1, n2, ctr, rk_ptr, te_ptr)
        shift = (24 - 8 * tl.arange(0, 4))[None, None, :]
        ks = tl.reshape((words[:, :, None] >> shift) & 255, [LANES, 16]).to(tl.uint8)
    return ks


@triton.jit
def _to_words(x):
    """[lanes, 16] bytes -> (high, low) uint64 big-endian words."""
    col = tl.arange(0, 16)
    v = x.to(tl.uint64) << tl.where(col < 8, 56 - 8 * col, 120 - 8 * col).to(tl.uint64)[None, :]
    hi = tl.sum(tl.where(col[None, :] < 8, v, 0), axis=1)
    lo = tl.sum(tl.where(col[None, :] >= 8, v, 0), axis=1)
    return hi, lo


@triton.jit
def _to_bytes(hi, lo):
    """(high, low) uint64 words -> [lanes, 16] bytes."""
    col = tl.arange(0, 16)
    w = tl.where(col[None, :] < 8, hi[:, None], lo[:, None])
    return ((w >> tl.where(col < 8, 56 - 8 * col, 120 - 8 * col).to(tl.uint64)[None, :]) & 255).to(tl.uint8)


@triton.jit
def _gf_mul(xh, xl, table_ptr, row, r4_ptr):
    """GF(2^128) products X · Y_row, with Y's 4-bit table at ``table_ptr`` (per row: 16
    high words, then 16 low words): Horner over X's 32 nibbles, last first,
    Z = Z·x^4 ^ table[nibble]."""
    zh = xh * 0
    zl = xl * 0
    hi_ptr = table_ptr + row.to(tl.int64) * 32
    lo_ptr = hi_ptr + 16
    for half in range(2):
        x = tl.where(half == 0, xl, xh)
        for j in range(16):
            nib = (x >> (4 * j)) & 15
            out = zl & 15
            zl = ((zl >> 4) | (zh << 60)) ^ tl.load(lo_ptr + nib)
            zh = (zh >> 4) ^ tl.load(r4_ptr + out) ^ tl.load(hi_ptr + nib)
    return zh, zl


@triton.jit
def _xor_rows(x, ROWS: tl.constexpr, LOG_COLS: tl.constexpr):
    """XOR of each row of a [ROWS, 2^LOG_COLS] tensor, by halving (a reduction tree)."""
    for i in tl.static_range(LOG_COLS):
        a, b = tl.split(tl.reshape(x, [ROWS, (1 << LOG_COLS) >> (i + 1), 2]))
        x = a ^ b
    return tl.reshape(x, [ROWS])


@triton.jit
def _segment(desc_ptr, s):
    d = desc_ptr + s * DESC_FIELDS
    return (tl.load(d), tl.load(d + 1), tl.load(d + 2), tl.load(d + 3), tl.load(d + 4), tl.load(d + 5),
            tl.load(d + 6).to(tl.uint32), tl.load(d + 7).to(tl.uint32), tl.load(d + 8).to(tl.uint32))


@triton.jit
def gcm_pass(desc_ptr, src_ptr, dst_ptr, aad_ptr, pad_ptr, rk_ptr, te_ptr, p4_ptr, q4_ptr, r4_ptr, part_ptr,
             max_tiles, SEAL: tl.constexpr, USE_PAD: tl.constexpr, B: tl.constexpr, LOG_B: tl.constexpr):
    """Program (q, s): tile q of segment s. SEAL: read plaintext, write ciphertext;
    else read ciphertext. Writes the tile's GHASH partial, times H^(qB)."""
    q = tl.program_id(0)
    s = tl.program_id(1)
    src_off, n, dst_off, aad_off, aad_len, pad_off, n0, n1, n2 = _segment(desc_ptr, s)
    a = (aad_len + 15) // 16
    c = (n + 15) // 16
    m = a + c + 1
    if q * B >= m:
        return
    lane = tl.arange(0, B)
    col = tl.arange(0, 16)
    r = B - 1 - lane                      # lanes ascend in memory, exponents descend
    k = m - 1 - (q * B + r)               # GHASH block of this lane (< 0: none)
    i = k - a                             # its ciphertext block
    is_ct = (k >= a) & (k < a + c)
    pos = i[:, None] * 16 + col[None, :]
    ct_mask = is_ct[:, None] & (pos < n)
    if SEAL:
        ks = _keystream_bytes(n0, n1, n2, (i + 2).to(tl.uint32), is_ct, pad_ptr + pad_off, rk_ptr, te_ptr, USE_PAD)
        ct = tl.where(ct_mask, tl.load(src_ptr + src_off + pos, mask=ct_mask, other=0) ^ ks, 0).to(tl.uint8)
        tl.store(dst_ptr + dst_off + pos, ct, mask=ct_mask)
    else:
        ct = tl.load(src_ptr + src_off + pos, mask=ct_mask, other=0)
    is_aad = (k >= 0) & (k < a)
    apos = k[:, None] * 16 + col[None, :]
    x = ct | tl.load(aad_ptr + aad_off + apos, mask=is_aad[:, None] & (apos < aad_len), other=0)
    xh, xl = _to_words(x)
    is_len = k == m - 1
    xh ^= tl.where(is_len, aad_len * 8, 0).to(tl.uint64)
    xl ^= tl.where(is_len, n * 8, 0).to(tl.uint64)
    zh, zl = _gf_mul(xh, xl, p4_ptr, r, r4_ptr)
    th = tl.sum(_xor_rows(tl.reshape(zh, [1, B]), 1, LOG_B))
    tl_ = tl.sum(_xor_rows(tl.reshape(zl, [1, B]), 1, LOG_B))
    if q > 0:
        th, tl_ = _gf_mul(th, tl_, q4_ptr, q, r4_ptr)
    out = part_ptr + (s * max_tiles + q) * 2
    tl.store(out, th)
    tl.store(out + 1, tl_)


@triton.jit
def gcm_finish(desc_ptr, src_ptr, dst_ptr, part_ptr, ok_ptr, max_tiles, SEAL: tl.constexpr, B: tl.constexpr,
               T: tl.constexpr, LOG_T: tl.constexpr):
    """Program s: tag of segment s = its tag mask XOR its tile partials (T at a time).
    SEAL: write it after the ciphertext; else compare it with the received tag in
    constant time and write the verdict (1 = authentic)."""
    s = tl.program_id(0)
    src_off, n, dst_off, aad_off, aad_len, pad_off, n0, n1, n2 = _segment(desc_ptr, s)
    tiles = ((aad_len + 15) // 16 + (n + 15) // 16 + 1 + B - 1) // B
    mask = desc_ptr + s * DESC_FIELDS + 9
    acc_h = tl.zeros([1], tl.uint64) + tl.load(mask).to(tl.uint64, bitcast=True)
    acc_l = tl.zeros([1], tl.uint64) + tl.load(mask + 1).to(tl.uint64, bitcast=True)
    # A while loop, not range(0, tiles, T): Triton 3.6's interpreter cannot take a range
    # whose bound is a kernel value ("only 0-dimensional arrays can be converted to Python
    # scalars"); a while loop interprets on 3.6 and 3.9 and compiles to the same loop.
    t0 = 0
    while t0 < tiles:
        t = t0 + tl.arange(0, T)
        at = part_ptr + (s * max_tiles + t) * 2
        acc_h ^= _xor_rows(tl.reshape(tl.load(at, mask=t < tiles, other=0), [1, T]), 1, LOG_T)
        acc_l ^= _xor_rows(tl.reshape(tl.load(at + 1, mask=t < tiles, other=0), [1, T]), 1, LOG_T)
        t0 += T
    tag = tl.reshape(_to_bytes(acc_h, acc_l), [16])
    col = tl.arange(0, 16)
    if SEAL:
        tl.store(dst_ptr + dst_off + n + col, tag)
    else:
        differs = tl.max(tag ^ tl.load(src_ptr + src_off + n + col))
        tl.store(ok_ptr + s, (differs == 0).to(tl.int32))


@triton.jit
def ctr_open(desc_ptr, src_ptr, dst_ptr, pad_ptr, rk_ptr, te_ptr, ok_ptr, USE_PAD: tl.constexpr, B: tl.constexpr):
    """Program (q, s): plaintext of ciphertext blocks qB .. qB+B-1 of segment s if its
    tag verified, zeros if not."""
    q = tl.program_id(0)
    s = tl.program_id(1)
    src_off, n, dst_off, aad_off, aad_len, pad_off, n0, n1, n2 = _segment(desc_ptr, s)
    if q * B * 16 >= n:
        return
    i = q * B + tl.arange(0, B)
    col = tl.arange(0, 16)
    pos = i[:, None] * 16 + col[None, :]
    mask = pos < n
    ks = _keystream_bytes(n0, n1, n2, (i + 2).to(tl.uint32), i * 16 < n, pad_ptr + pad_off, rk_ptr, te_ptr,
                          USE_PAD)
    ct = tl.load(src_ptr + src_off + pos, mask=mask, other=0)
    authentic = tl.load(ok_ptr + s) != 0
    tl.store(dst_ptr + dst_off + pos, tl.where(authentic, ct ^ ks, 0).to(tl.uint8), mask=mask)


@triton.jit
def keystream(desc_ptr, pad_ptr, rk_ptr, te_ptr, B: tl.constexpr):
    """Program (q, s): pad blocks qB .. qB+B-1 of segment s; pad block i is the keystream
    of ciphertext block i, AES_K(nonce || i+2)."""
    q = tl.program_id(0)
    s = tl.program_id(1)
    src_off, n, dst_off, aad_off, aad_len, pad_off, n0, n1, n2 = _segment(desc_ptr, s)
    if q * B * 16 >= n:
        return
    i = q * B + tl.arange(0, B)
    ks = _keystream_bytes(n0, n1, n2, (i + 2).to(tl.uint32), i * 16 < n, pad_ptr, rk_ptr, te_ptr, False)
    pos = i[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(pad_ptr + pad_off + pos, ks, mask=(i * 16 < n)[:, None])
