"""Packing keys into volume-balanced key groups: k-way largest differencing (Karmarkar–Karp).

Replay runs at the pace of the heaviest group, so the packer minimises the maximum group
load. The core is the textbook k-way largest differencing method (LDM), organised so it
costs little more than a sort: single weights are read from the sorted stream instead of
being turned into k-tuples, a tuple meeting a single weight is an O(log k) LPT step on the
tuple's own min-heap, and only tuple-meets-tuple steps pay O(k). Item membership is
tracked by linking item ids and resolved once at the end. When LDM misses the lower bound,
greedy LPT is tried as a guard and single-key exchanges lower the heaviest group.

Hand-written on purpose: the packaged Python implementations (numberpartitioning, prtpy)
are far too slow for a million keys, and none places new keys onto existing loads. See
docs/packing.md for the algorithm, its cost and the measured quality and speed.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from keygroups.errors import OptionError
from keygroups.packing.ldm import MAX_WEIGHT, _greedy, _ldm
from keygroups.packing.refine import LOW_MASK, SPLIT, _refine, _split_sums

__all__ = ["pack", "place", "group_loads", "assign_threads", "MAX_WEIGHT"]

_MAX_GROUPS = (1 << 31) - 1  # group ids are int32


def _as_weights(values: Any, name: str = "weights") -> np.ndarray:
    """Validate once at the boundary so the compiled core can trust its input."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise OptionError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, np.int64)
    kind = a.dtype.kind
    if kind == "O":
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in a):
            raise OptionError(f"{name} must be integers")
        if any(v < 0 for v in a):
            raise OptionError(f"{name} must be non-negative")
        if any(v > MAX_WEIGHT for v in a):
            raise OptionError(f"{name} must be at most 2**62 - 1")
        return a.astype(np.int64)
    if kind not in "iu":
        raise OptionError(f"{name} must be integers, got dtype {a.dtype}")
    if kind == "i" and a.min() < 0:
        raise OptionError(f"{name} must be non-negative")
    if a.max() > MAX_WEIGHT:
        raise OptionError(f"{name} must be at most 2**62 - 1")
    return np.ascontiguousarray(a, dtype=np.int64)


def _as_count(k: Any, name: str) -> int:
    if isinstance(k, (bool, np.bool_)):
        raise OptionError(f"{name} must be an integer, got {k!r}")
    try:
        count = operator.index(k)
    except TypeError:
        raise OptionError(f"{name} must be an integer, got {k!r}") from None
    if count < 1:
        raise OptionError(f"{name} must be at least 1, got {count}")
    if count > _MAX_GROUPS:
        raise OptionError(f"{name} must be below 2**31, got {count}")
    return count


def _sort_desc(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable descending order and the sorted weights.

    Ties keep input order, so every machine agrees (numpy's default sort dispatches to
    SIMD kernels that order ties differently). When weight and position fit one int64
    the keys are unique and the fast unstable sort is used on them (much faster than a
    stable argsort: docs/packing.md#cost); otherwise the stable argsort.
    """
    n = w.shape[0]
    top = int(w.max())
    bits = max(n - 1, 1).bit_length()
    if top < 1 << (63 - bits):
        key = (top - w) << bits
        key |= np.arange(n, dtype=np.int64)
        key.sort()
        order = key & ((1 << bits) - 1)
        key >>= bits
        return order, top - key
    order = np.argsort(-w, kind="stable")
    return order, w[order]


def _max_load(ws: np.ndarray, groups: np.ndarray, k: int, init: np.ndarray) -> int:
    hi, lo = _split_sums(ws, groups, k, init)
    j = int(np.lexsort((lo, hi))[-1])
    return (int(hi[j]) << SPLIT) + int(lo[j])


def _total(w: np.ndarray) -> int:
    return (int((w >> SPLIT).sum()) << SPLIT) + int((w & LOW_MASK).sum())


def _solve(ws: np.ndarray, k: int, init: np.ndarray, lower_bound: int) -> np.ndarray:
    """LDM; if it misses the lower bound, greedy LPT when strictly better (LDM loses on a few
    small instances: docs/packing.md#algorithm), then exchanges that lower the heaviest group."""
    groups: np.ndarray = _ldm(ws, k, init)
    best = _max_load(ws, groups, k, init)
    if best > lower_bound:
        alt = _greedy(ws, k, init)
        alt_best = _max_load(ws, alt, k, init)
        if alt_best < best:
            groups, best = alt, alt_best
    if best > lower_bound and _total(ws) + _total(init) < 1 << 62:
        n = ws.shape[0]
        _refine(ws, groups, k, init, 32 * (n + k))
    return groups


def pack(weights: Any, k: int) -> np.ndarray:
    """Group id in [0, k) per item, keeping the heaviest group light.

    The textbook LDM result whenever that reaches max(ceil(total / k), largest weight);
    otherwise never heavier than LDM's or greedy LPT's. Deterministic: depends only on the
    weights and their order, never on hashing.
    """
    w = _as_weights(weights)
    k = _as_count(k, "k")
    n = w.shape[0]
    out = np.zeros(n, np.int32)
    if k == 1 or n <= 1:
        return out
    order, ws = _sort_desc(w)
    if k >= n:  # every item alone; avoids k-wide tuples for a huge k
        out[order] = np.arange(n, dtype=np.int32)
        return out
    lb = max(-(-_total(ws) // k), int(ws[0]))
    out[order] = _solve(ws, k, np.zeros(0, np.int64), lb)
    return out


def place(weights: Any, loads: Any) -> np.ndarray:
    """Group id per new item, placed onto groups that already carry `loads`.

    For incremental compaction: existing keys keep their groups, new keys go where they
    keep the maximum lowest. It is the same LDM, started with the existing loads as one
    tuple. `loads` is copied, never modified.
    """
    w = _as_weights(weights)
    base = _as_weights(loads, "loads")
    k = base.shape[0]
    if k < 1:
        raise OptionError("loads must hold at least one group")
    n = w.shape[0]
    out = np.zeros(n, np.int32)
    if n == 0 or k == 1:
        return out
    lo = int(base.min())
    init = base - lo
    order, ws = _sort_desc(w)
    lb = max(-(-(_total(ws) + _total(init)) // k), int(init.max()), int(init.min()) + int(ws[0]))
    out[order] = _solve(ws, k, init, lb)
    return out


def group_loads(weights: Any, groups: Any, k: int) -> np.ndarray:
    """Sum of weights per group, exact; raises OverflowError if a sum exceeds int64."""
    w = _as_weights(weights)
    k = _as_count(k, "k")
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != w.shape[0]:
        raise OptionError(f"groups must be 1-D with one entry per weight ({w.shape[0]})")
    if g.size and (g.dtype.kind not in "iu" or int(g.min()) < 0 or int(g.max()) >= k):
        raise OptionError(f"groups must be integers in [0, {k})")
    g = g.astype(np.int32)
    hi, lo = _split_sums(w, g, k, np.zeros(0, np.int64))
    if hi.size and int(hi.max()) >= 1 << (63 - SPLIT):
        raise OverflowError("a group load exceeds the int64 range")
    loads: np.ndarray = (hi << SPLIT) + lo
    return loads


def assign_threads(group_weights: Any, threads: int) -> np.ndarray:
    """Thread id per key group. Round-robin would let one heavy group stall a barrier;
    the same packing as for keys balances the bytes each thread reads per slice."""
    return pack(group_weights, _as_count(threads, "threads"))
