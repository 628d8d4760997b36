"""64-bit record fingerprints: what verify compares, record by record, between source and archive."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keygroups._numba import njit
from keygroups.envelope.buffers import EnvelopeBuffers
from keygroups.envelope.schema import conform


@njit(cache=True, nogil=True)
def _mix(h: np.uint64, x: np.uint64) -> np.uint64:
    # splitmix64 finaliser over (h ^ x): cheap and well spread; wrap-around is intended
    z = (h ^ x) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.uint64 = z ^ (z >> np.uint64(31))
    return out


@njit(cache=True, nogil=True)
def _mix_bytes(h: np.uint64, data: np.ndarray, start: int, end: int, valid: bool) -> np.uint64:
    if not valid:
        return _mix(h, np.uint64(0xA5A5A5A5A5A5A5A5))
    f = np.uint64(0xCBF29CE484222325)  # FNV-1a 64 over the bytes, then mixed with the length
    for i in range(start, end):
        f = (f ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    return _mix(_mix(h, f), np.uint64(end - start))


@njit(cache=True, nogil=True)
def _fingerprints(
    part: np.ndarray,
    off: np.ndarray,
    ts: np.ndarray,
    k_off: np.ndarray,
    k_data: np.ndarray,
    k_valid: np.ndarray,
    v_off: np.ndarray,
    v_data: np.ndarray,
    v_valid: np.ndarray,
    h_off: np.ndarray,
    hk_off: np.ndarray,
    hk_data: np.ndarray,
    hv_off: np.ndarray,
    hv_data: np.ndarray,
    hv_valid: np.ndarray,
) -> np.ndarray:
    n = part.shape[0]
    out = np.empty(n, np.uint64)
    for i in range(n):
        h = _mix(np.uint64(0), np.uint64(np.int64(part[i])))
        h = _mix(h, np.uint64(off[i]))
        h = _mix(h, np.uint64(ts[i]))
        h = _mix_bytes(h, k_data, k_off[i], k_off[i + 1], k_valid[i])
        h = _mix_bytes(h, v_data, v_off[i], v_off[i + 1], v_valid[i])
        h = _mix(h, np.uint64(h_off[i + 1] - h_off[i]))
        for j in range(h_off[i], h_off[i + 1]):
            h = _mix_bytes(h, hk_data, hk_off[j], hk_off[j + 1], True)
            h = _mix_bytes(h, hv_data, hv_off[j], hv_off[j + 1], hv_valid[j])
        out[i] = h
    return out


def record_fingerprints(batch: pa.RecordBatch) -> np.ndarray:
    """A 64-bit hash of every field of each record. Summed (mod 2**64) over a partition they
    give an order-independent digest: equal multisets of records, equal sums."""
    batch = conform(batch)
    return _fingerprints(*EnvelopeBuffers.from_batch(batch).arrays())
