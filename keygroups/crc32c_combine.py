"""CRC-32C of consecutive byte ranges from their own CRC-32Cs, so a span of pieces is checked
with one pass over its bytes instead of one call per piece.

A reader checks every piece against its index CRC before it emits anything. With 10 s slices
a piece is a few KB, and a call per piece (a copy, a GIL hand-off) cost more than the
checksum: here the run's bytes go through `google_crc32c` once (hardware CRC) and the
pieces' CRCs are combined into what that one value must be. No library we use exposes CRC
combination (zlib's `crc32_combine` is CRC-32, not CRC-32C, and not in Python's zlib), so
it is written here: multiplication modulo the CRC polynomial, as in zlib's `crc32_combine`.
"""

from __future__ import annotations

import numpy as np

from keygroups._numba import njit

POLY = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected


@njit(cache=True, nogil=True)
def _mult(a: int, b: int) -> int:
    """a x b modulo the polynomial, both bit-reflected (bit 31 is x^0)."""
    p = 0
    m = 1 << 31
    while m:
        if a & m:
            p ^= b
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
        m >>= 1
    return p


@njit(cache=True, nogil=True)
def _powers() -> np.ndarray:
    """x^(2^k) modulo the polynomial, k = 0..66: enough for any length below 2^63 bytes,
    without relying on the powers repeating."""
    out = np.empty(67, np.int64)
    out[0] = 1 << 30  # x^1
    for k in range(1, 67):
        out[k] = _mult(out[k - 1], out[k - 1])
    return out


@njit(cache=True, nogil=True)
def _shift(crc: int, n: int, powers: np.ndarray) -> int:
    """crc x x^(8n): the CRC of some bytes carried past n more zero bytes (before conditioning)."""
    p = 1 << 31  # x^0
    k = 3  # x^(8n) = x^(2^3 n)
    while n:
        if n & 1:
            p = _mult(powers[k], p)
        n >>= 1
        k += 1
    return _mult(p, crc)


@njit(cache=True, nogil=True)
def _combine(crcs: np.ndarray, lengths: np.ndarray, powers: np.ndarray) -> int:
    out: int = crcs[0]
    for i in range(1, len(crcs)):
        out = _shift(out, lengths[i], powers) ^ crcs[i]
    return out


_POWERS = _powers()


def combine(crcs: np.ndarray, lengths: np.ndarray) -> int:
    """The CRC-32C of byte strings laid back to back, from each one's CRC-32C and length."""
    if not len(crcs):
        return 0
    return int(_combine(np.asarray(crcs, np.int64), np.asarray(lengths, np.int64), _POWERS))
