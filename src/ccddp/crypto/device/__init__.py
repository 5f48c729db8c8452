"""AES-256-GCM on device tensors, written in Triton (NVIDIA and AMD GPUs; the CPU through
Triton's interpreter, for tests).

Frames are byte-identical to OpenSSL's (``cryptography``'s ``AESGCM``): NIST SP 800-38D
with 96-bit nonces, 16-byte tags, any plaintext and AAD length (0 and non-multiples of 16
included).

- ``keyschedule``: what the host computes once per key: AES-256 round keys, H = AES_K(0),
  powers of H and their 4-bit multiplication tables.
- ``kernels``: the Triton kernels: GHASH pass (fused with CTR when sealing), tag finish,
  verdict-gated CTR decryption, keystream (pads).
- ``engine``: :class:`DeviceAESGCM`, the ``AESGCM``-shaped API and the batched entry
  points (many segments, each with its own nonce, AAD and tag, in one launch).
- ``pads``: per-link keystream generated ahead for known counters, used once each; a
  pad's bytes are written again only after the kernels that used them are done (fences).

**CTR: T-tables, not bitsliced.** Each counter block runs in its own lane as four 32-bit
column words: a round is four gathers from 1 KiB tables (SubBytes+MixColumns of a byte)
with ShiftRows as rotations of the columns they come from (``tl.gather``, warp shuffles
on a GPU), the last round through the S-box. Triton has gathers (``tl.load`` of an index
tensor, served by L1 for 5 KiB of tables) but no register shuffles across bit-planes, so
a bitsliced AES would be 128 live tensors per 32 blocks written out by hand, far from
readable; and the interpreter, which runs every test, pays per tensor operation: ~25 a
round here against hundreds for a bitsliced circuit. The price: table lookups indexed by
key-dependent state are not constant-time. GPU cache and shared-memory timing has
recovered AES keys from table implementations (Jiang, Fei, Kaeli, HPCA 2016), and a host
that times kernels could try it; ccddp's threat model leaves side channels out of scope,
as the README says. Not measured against a bitsliced variant (no GPU was available to
this work).

**GHASH: parallel, from powers of H.** GHASH = XOR of X_k · H^(m-k) over the m blocks of
AAD, ciphertext and lengths, the same value as the serial chain. Each program multiplies
its tile's blocks by tile-local powers H^1..H^B, reduces them with a tree of XORs, and
multiplies the tile's sum by H^(qB); a finish kernel XORs the tiles and the tag mask
AES_K(J0), one block per message that OpenSSL computes on the host with the descriptors.
Multiplications are 4-bit-table (Shoup) Horner steps over the data's nibbles: indices are
public ciphertext and AAD, the tables hold powers of H (the GHASH key lives in device
memory, like the round keys).

**Opening never writes unverified plaintext**: the tag is checked on the device first and
the decryption kernel writes zeros for a segment that failed.

Example::

    from ccddp.crypto.device import DeviceAESGCM
    aead = DeviceAESGCM(key)
    aead.encrypt_into(nonce, data, aad, frame)      # uint8 tensors on one device
    aead.decrypt_into(nonce, frame, aad, out)       # InvalidTag, out zeroed, if altered

Importing this package does not import Triton; using the engine without Triton raises a
one-line :class:`ccddp.errors.ConfigError` (install the ``gpu`` extra).
"""

from ccddp.crypto.device.engine import TAG_BYTES, DeviceAESGCM, Segment, interpreting, pad_bytes, triton_available
from ccddp.crypto.device.pads import Fence, Pad, PadBuffer, PadEvent, stream_fence

__all__ = ["TAG_BYTES", "DeviceAESGCM", "Segment", "interpreting", "pad_bytes", "triton_available", "Fence", "Pad",
           "PadBuffer", "PadEvent", "stream_fence"]
