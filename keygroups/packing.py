"""Packing keys into volume-balanced key groups: k-way largest differencing (Karmarkar–Karp).

Replay runs at the pace of the heaviest group, so the packer minimises the maximum group
load. The core is the textbook k-way largest differencing method (LDM), organised so it
costs little more than a sort: single weights are read from the sorted stream instead of
being turned into k-tuples, a tuple meeting a single weight is an O(log k) LPT step on the
tuple's own min-heap, and only tuple-meets-tuple steps pay O(k). Item membership is
tracked by linking item ids and resolved once at the end. When LDM misses the lower bound,
greedy LPT is tried as a guard and single-key exchanges lower the heaviest group.

Hand-written on purpose: every packaged Python implementation we measured
(numberpartitioning, prtpy) needs minutes for a million keys, and none places new keys onto
existing loads. See docs/packing.md for the algorithm, its cost and the measured quality.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from keygroups._numba import njit

__all__ = ["pack", "place", "group_loads", "assign_threads", "MAX_WEIGHT"]

#: Largest accepted weight. Tuples are kept normalised (minimum slot near zero), so every
#: value the packer stores stays below 2**62 + 2**61 and a sum of two stays below 2**63.
MAX_WEIGHT = (1 << 62) - 1

# A tuple whose smallest slot reaches this is shifted down (amortised O(1) per item).
_RENORM = 1 << 61
# Group loads are summed as (high, low) halves split at this bit, so no sum overflows.
_SPLIT = 31
_LOW_MASK = (1 << _SPLIT) - 1
_MAX_GROUPS = (1 << 31) - 1  # group ids are int32


# ----------------------------------------------------------------------------- compiled core


@njit(cache=True, nogil=True)
def _better(a: int, b: int, loads: Any, tmax: Any, seq: Any) -> bool:
    """Global heap order: larger spread first; on equal spread the newer tuple first."""
    sa = tmax[a] - loads[a, 0]
    sb = tmax[b] - loads[b, 0]
    if sa != sb:
        return sa > sb
    return seq[a] > seq[b]


@njit(cache=True, nogil=True)
def _sift_down(heap: Any, size: int, pos: int, loads: Any, tmax: Any, seq: Any) -> None:
    t = heap[pos]
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and _better(heap[c + 1], heap[c], loads, tmax, seq):
            c += 1
        if not _better(heap[c], t, loads, tmax, seq):
            break
        heap[pos] = heap[c]
        pos = c
    heap[pos] = t


@njit(cache=True, nogil=True)
def _sift_up(heap: Any, pos: int, loads: Any, tmax: Any, seq: Any) -> None:
    t = heap[pos]
    while pos > 0:
        p = (pos - 1) // 2
        if not _better(t, heap[p], loads, tmax, seq):
            break
        heap[pos] = heap[p]
        pos = p
    heap[pos] = t


@njit(cache=True, nogil=True)
def _ascending(vals: Any, lo: int, span: int, key: Any, idx: Any, key2: Any, idx2: Any, count: Any) -> Any:
    """Stable ascending order of `vals` (all within [lo, lo + span]).

    numba's own sorts cost 40-60 ns per element; slot loads of one tuple sit within one
    spread of each other, so a few byte-wide LSD radix passes over (value - lo) are much
    cheaper. Small tuples use insertion sort instead (a 256-bucket pass would dominate).
    Returns the index array (one of `idx`, `idx2`).
    """
    k = vals.shape[0]
    if k <= 32:
        for j in range(k):
            v = vals[j]
            q = j
            while q > 0 and key[q - 1] > v:
                key[q] = key[q - 1]
                idx[q] = idx[q - 1]
                q -= 1
            key[q] = v
            idx[q] = j
        return idx
    for j in range(k):
        key[j] = vals[j] - lo
        idx[j] = j
    shift = 0
    while shift < 63 and (span >> shift) > 0:
        count[:] = 0
        for j in range(k):
            count[(key[j] >> shift) & 255] += 1
        if count[(key[0] >> shift) & 255] != k:  # skip a pass where every digit is equal
            total = 0
            for d in range(256):
                c = count[d]
                count[d] = total
                total += c
            for j in range(k):
                d = (key[j] >> shift) & 255
                q = count[d]
                count[d] = q + 1
                key2[q] = key[j]
                idx2[q] = idx[j]
            key, key2 = key2, key
            idx, idx2 = idx2, idx
        shift += 8
    return idx


@njit(cache=True, nogil=True)
def _heapify(vals: Any, tags: Any) -> None:
    """Floyd's O(k) min-heap construction, moving `tags` along with `vals`."""
    k = vals.shape[0]
    for start in range(k // 2 - 1, -1, -1):
        pos = start
        v = vals[pos]
        t = tags[pos]
        while True:
            c = 2 * pos + 1
            if c >= k:
                break
            if c + 1 < k and vals[c + 1] < vals[c]:
                c += 1
            if vals[c] >= v:
                break
            vals[pos] = vals[c]
            tags[pos] = tags[c]
            pos = c
        vals[pos] = v
        tags[pos] = t


@njit(cache=True, nogil=True)
def _ldm(ws: Any, k: int, init: Any) -> Any:
    """Exact k-way LDM over `ws` (sorted descending), optionally starting from one tuple.

    `init` is empty for a fresh packing, or the k existing group loads (normalised, spread
    at most MAX_WEIGHT) for placement. Returns, per sorted position, the final slot (fresh
    packing) or the index into `init` whose group the item joins (placement).

    Order of the candidates, which decides every step: larger spread first; on equal
    spread a tuple before a single weight (else duplicate weights open ~n/2 tuples), a
    newer tuple before an older one, and single weights in sorted order.
    """
    n = ws.shape[0]
    has_init = init.shape[0] > 0
    nodes = n + (k if has_init else 0)

    cap = n // k + 4
    loads = np.empty((cap, k), np.int64)  # each row: a min-heap of slot loads
    roots = np.empty((cap, k), np.int32)  # node id representing each slot's items, -1 empty
    tmax = np.empty(cap, np.int64)
    seq = np.empty(cap, np.int64)
    free = np.empty(cap, np.int32)
    nfree = 0
    used = 0
    heap = np.empty(cap, np.int32)
    hsize = 0
    ev_child = np.empty(nodes, np.int32)  # link events: child's items join parent's slot
    ev_parent = np.empty(nodes, np.int32)
    nev = 0
    counter = 0

    tmp_l = np.empty(k, np.int64)
    tmp_r = np.empty(k, np.int32)
    key_a = np.empty(k, np.int64)  # radix-sort scratch, allocated once
    key_b = np.empty(k, np.int64)
    key_c = np.empty(k, np.int64)
    key_d = np.empty(k, np.int64)
    idx_a = np.empty(k, np.int64)
    idx_b = np.empty(k, np.int64)
    idx_c = np.empty(k, np.int64)
    idx_d = np.empty(k, np.int64)
    count = np.empty(256, np.int64)

    if has_init:
        order = np.argsort(init, kind="mergesort")
        for j in range(k):
            loads[0, j] = init[order[j]]
            roots[0, j] = n + order[j]
        tmax[0] = loads[0, k - 1]
        seq[0] = counter
        counter += 1
        used = 1
        heap[0] = 0
        hsize = 1

    i = 0
    while hsize + (n - i) > 1:
        rem = n - i
        # --- decide the two largest candidates
        lpt = False
        diff = False
        t1 = -1
        p2 = -1
        if hsize > 0:
            t1 = heap[0]
            s1 = tmax[t1] - loads[t1, 0]
            if rem == 0 or s1 >= ws[i]:
                # top is a tuple; second is the better root child or the next weight
                if hsize >= 2:
                    p2 = 1
                    if hsize >= 3 and _better(heap[2], heap[1], loads, tmax, seq):
                        p2 = 2
                if p2 >= 0:
                    t2 = heap[p2]
                    if rem == 0 or tmax[t2] - loads[t2, 0] >= ws[i]:
                        diff = True
                if not diff:
                    lpt = True
            elif rem == 1 or s1 >= ws[i + 1]:
                lpt = True  # top is the weight, second the tuple

        if lpt:
            # put ws[i] into t1's smallest slot: an LPT step on the tuple's own heap
            lrow = loads[t1]
            rrow = roots[t1]
            v = lrow[0] + ws[i]
            r = rrow[0]
            if r < 0:
                r = i
            else:
                ev_child[nev] = i
                ev_parent[nev] = r
                nev += 1
            # bottom-up sift: the grown slot usually belongs near the leaves, so walk the
            # smaller-child path to a leaf first and climb back (one compare per level)
            pos = 0
            while True:
                c = 2 * pos + 1
                if c >= k:
                    break
                if c + 1 < k and lrow[c + 1] < lrow[c]:
                    c += 1
                lrow[pos] = lrow[c]
                rrow[pos] = rrow[c]
                pos = c
            while pos > 0:
                q = (pos - 1) // 2
                if lrow[q] <= v:
                    break
                lrow[pos] = lrow[q]
                rrow[pos] = rrow[q]
                pos = q
            lrow[pos] = v
            rrow[pos] = r
            if v > tmax[t1]:
                tmax[t1] = v
            m = loads[t1, 0]
            if m >= _RENORM:
                for j in range(k):
                    loads[t1, j] -= m
                tmax[t1] -= m
            seq[t1] = counter
            counter += 1
            i += 1
            _sift_down(heap, hsize, 0, loads, tmax, seq)
        elif diff:
            # difference t1 and t2: largest slot of one with smallest of the other
            t2 = heap[p2]
            mina = loads[t1, 0]  # heap tops are the minima
            minb = loads[t2, 0]
            oa = _ascending(loads[t1], mina, tmax[t1] - mina, key_a, idx_a, key_b, idx_b, count)
            ob = _ascending(loads[t2], minb, tmax[t2] - minb, key_c, idx_c, key_d, idx_d, count)
            minc = MAX_WEIGHT + MAX_WEIGHT
            for j in range(k):
                a = oa[k - 1 - j]
                b = ob[j]
                tmp_l[j] = (loads[t1, a] - mina) + (loads[t2, b] - minb)
                if tmp_l[j] < minc:
                    minc = tmp_l[j]
                ra = roots[t1, a]
                rb = roots[t2, b]
                if ra < 0:
                    tmp_r[j] = rb
                else:
                    if rb >= 0:
                        ev_child[nev] = rb
                        ev_parent[nev] = ra
                        nev += 1
                    tmp_r[j] = ra
            top = 0
            for j in range(k):
                v = tmp_l[j] - minc
                loads[t1, j] = v
                roots[t1, j] = tmp_r[j]
                if v > top:
                    top = v
            _heapify(loads[t1], roots[t1])
            tmax[t1] = top
            seq[t1] = counter
            counter += 1
            # drop t2 from the heap (its slot is a root child), then re-seat t1
            hsize -= 1
            if p2 < hsize:
                heap[p2] = heap[hsize]
                _sift_down(heap, hsize, p2, loads, tmax, seq)
            _sift_down(heap, hsize, 0, loads, tmax, seq)
            free[nfree] = t2
            nfree += 1
        else:
            # two single weights on top: open a tuple
            if nfree > 0:
                nfree -= 1
                t = free[nfree]
            else:
                if used == loads.shape[0]:
                    grow = loads.shape[0] * 2
                    nl = np.empty((grow, k), np.int64)
                    nl[:used] = loads
                    loads = nl
                    nr = np.empty((grow, k), np.int32)
                    nr[:used] = roots
                    roots = nr
                    nt = np.empty(grow, np.int64)
                    nt[:used] = tmax
                    tmax = nt
                    ns = np.empty(grow, np.int64)
                    ns[:used] = seq
                    seq = ns
                    nf = np.empty(grow, np.int32)
                    nf[:nfree] = free[:nfree]
                    free = nf
                    nh = np.empty(grow, np.int32)
                    nh[:hsize] = heap[:hsize]
                    heap = nh
                t = used
                used += 1
            for j in range(k - 2):
                loads[t, j] = 0
                roots[t, j] = -1
            loads[t, k - 2] = ws[i + 1]
            roots[t, k - 2] = i + 1
            loads[t, k - 1] = ws[i]
            roots[t, k - 1] = i
            tmax[t] = ws[i]
            seq[t] = counter
            counter += 1
            i += 2
            heap[hsize] = t
            hsize += 1
            _sift_up(heap, hsize - 1, loads, tmax, seq)

    # resolve membership: replay the links backwards, parents are settled before children
    slot = np.empty(nodes, np.int32)
    tf = heap[0]
    for j in range(k):
        r = roots[tf, j]
        if r >= 0:
            slot[r] = j
    for e in range(nev - 1, -1, -1):
        slot[ev_child[e]] = slot[ev_parent[e]]
    out = np.empty(n, np.int32)
    if has_init:
        group_of_slot = np.empty(k, np.int32)
        for j in range(k):
            group_of_slot[slot[n + j]] = j
        for p in range(n):
            out[p] = group_of_slot[slot[p]]
    else:
        for p in range(n):
            out[p] = slot[p]
    return out


@njit(cache=True, nogil=True)
def _greedy(ws: Any, k: int, init: Any) -> Any:
    """Greedy LPT over `ws` (sorted descending): each weight to the least loaded group.

    Ties go to the lowest group index. `init` as in `_ldm`. Returns group per position.
    """
    n = ws.shape[0]
    hl = np.zeros(k, np.int64)  # min-heap of (load, group)
    hg = np.arange(k).astype(np.int32)
    if init.shape[0] > 0:
        order = np.argsort(init, kind="mergesort")
        for j in range(k):
            hl[j] = init[order[j]]
            hg[j] = order[j]
    out = np.empty(n, np.int32)
    for p in range(n):
        g = hg[0]
        out[p] = g
        v = hl[0] + ws[p]
        pos = 0
        while True:
            c = 2 * pos + 1
            if c >= k:
                break
            if c + 1 < k and (hl[c + 1] < hl[c] or (hl[c + 1] == hl[c] and hg[c + 1] < hg[c])):
                c += 1
            if hl[c] > v or (hl[c] == v and hg[c] > g):
                break
            hl[pos] = hl[c]
            hg[pos] = hg[c]
            pos = c
        hl[pos] = v
        hg[pos] = g
        m = hl[0]
        if m >= _RENORM:
            for j in range(k):
                hl[j] -= m
    return out


@njit(cache=True, nogil=True)
def _best_exchange(ws: Any, g: int, h: int, gap: int, head: Any, tail: Any, nxt: Any, prv: Any) -> Any:
    """Best single move or swap between groups g (heavier) and h: key a of g against key b
    of h or no key, with w_a - w_b in (0, gap) and closest to gap / 2. Returns (a, b, steps),
    a = -1 if none; b = -2 means a move. Lists run by descending weight, so a two-pointer
    walk finds it in O(|g| + |h|)."""
    best = gap
    best_a = -1
    best_b = -1
    steps = 0
    b = head[h]
    a = head[g]
    while a >= 0:
        wa = ws[a]
        target = 2 * wa - gap  # want 2 * w_b as close as possible to this
        while b >= 0 and 2 * ws[b] > target:
            b = nxt[b]
            steps += 1
        above = prv[b] if b >= 0 else tail[h]
        for t in range(3):
            cand = above if t == 0 else (b if t == 1 else -2)
            if cand == -1:
                continue
            d = wa - (ws[cand] if cand >= 0 else 0)
            if 0 < d < gap:
                dev = abs(2 * d - gap)
                if dev < best:
                    best = dev
                    best_a = a
                    best_b = cand
        a = nxt[a]
        steps += 1
    return best_a, best_b, steps


@njit(cache=True, nogil=True)
def _relink(p: int, src: int, dst: int, head: Any, tail: Any, nxt: Any, prv: Any) -> None:
    """Move position p from group src's list to dst's, keeping position (weight) order."""
    if prv[p] >= 0:
        nxt[prv[p]] = nxt[p]
    else:
        head[src] = nxt[p]
    if nxt[p] >= 0:
        prv[nxt[p]] = prv[p]
    else:
        tail[src] = prv[p]
    q = head[dst]
    last = -1
    while q >= 0 and q < p:
        last = q
        q = nxt[q]
    prv[p] = last
    nxt[p] = q
    if last >= 0:
        nxt[last] = p
    else:
        head[dst] = p
    if q >= 0:
        prv[q] = p
    else:
        tail[dst] = p


@njit(cache=True, nogil=True)
def _refine(ws: Any, groups: Any, k: int, init: Any, budget: int) -> int:
    """Lower the heaviest group by single moves and swaps with lighter groups.

    LDM leaves about 2e-4..1e-3 above the lower bound when groups hold a few dozen
    similar keys (lognormal, 25-50 keys per group); one exchange between the heaviest
    and a lighter group at a time closes that. Each exchange strictly lowers the larger
    of the two loads, so the sorted load vector falls and the loop ends; `budget` caps
    the list steps. Totals must fit in 2**62. Rewrites `groups` in place; returns the
    number of exchanges.
    """
    n = ws.shape[0]
    load = np.zeros(k, np.int64)
    for j in range(init.shape[0]):
        load[j] = init[j]
    head = np.full(k, -1, np.int64)
    tail = np.full(k, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    prv = np.full(n, -1, np.int64)
    for p in range(n):  # ascending positions = descending weights
        g = groups[p]
        load[g] += ws[p]
        if tail[g] < 0:
            head[g] = p
        else:
            nxt[tail[g]] = p
            prv[p] = tail[g]
        tail[g] = p
    work = 0
    exchanges = 0
    while work < budget:
        g = 0
        h = 0
        for j in range(1, k):
            if load[j] > load[g]:
                g = j
            if load[j] < load[h]:
                h = j
        if load[g] - load[h] <= 1:
            break
        a, b, steps = _best_exchange(ws, g, h, load[g] - load[h], head, tail, nxt, prv)
        work += steps
        if a < 0:  # the lightest group cannot help: try the others, lightest first
            order = np.argsort(load, kind="mergesort")
            work += k
            for r in range(1, k):
                h = order[r]
                gap = load[g] - load[h]
                if gap <= 1 or work >= budget:
                    break
                a, b, steps = _best_exchange(ws, g, h, gap, head, tail, nxt, prv)
                work += steps
                if a >= 0:
                    break
            if a < 0:
                break
        d = ws[a] - (ws[b] if b >= 0 else 0)
        load[g] -= d
        load[h] += d
        _relink(a, g, h, head, tail, nxt, prv)
        groups[a] = h
        if b >= 0:
            _relink(b, h, g, head, tail, nxt, prv)
            groups[b] = g
        exchanges += 1
    return exchanges


@njit(cache=True, nogil=True)
def _split_sums(ws: Any, groups: Any, k: int, init: Any) -> Any:
    """Per-group sums as (high, low) halves so that no partial sum can overflow int64."""
    hi = np.zeros(k, np.int64)
    lo = np.zeros(k, np.int64)
    for j in range(init.shape[0]):
        hi[j] += init[j] >> _SPLIT
        lo[j] += init[j] & _LOW_MASK
    for p in range(ws.shape[0]):
        g = groups[p]
        hi[g] += ws[p] >> _SPLIT
        lo[g] += ws[p] & _LOW_MASK
    for j in range(k):
        hi[j] += lo[j] >> _SPLIT
        lo[j] &= _LOW_MASK
    return hi, lo


# ----------------------------------------------------------------------------- Python API


def _as_weights(values: Any, name: str = "weights") -> np.ndarray:
    """Validate once at the boundary so the compiled core can trust its input."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, np.int64)
    kind = a.dtype.kind
    if kind == "O":
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in a):
            raise ValueError(f"{name} must be integers")
        if any(v < 0 for v in a):
            raise ValueError(f"{name} must be non-negative")
        if any(v > MAX_WEIGHT for v in a):
            raise ValueError(f"{name} must be at most 2**62 - 1")
        return a.astype(np.int64)
    if kind not in "iu":
        raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
    if kind == "i" and a.min() < 0:
        raise ValueError(f"{name} must be non-negative")
    if a.max() > MAX_WEIGHT:
        raise ValueError(f"{name} must be at most 2**62 - 1")
    return np.ascontiguousarray(a, dtype=np.int64)


def _as_count(k: Any, name: str) -> int:
    if isinstance(k, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {k!r}") from None
    if k < 1:
        raise ValueError(f"{name} must be at least 1, got {k}")
    if k > _MAX_GROUPS:
        raise ValueError(f"{name} must be below 2**31, got {k}")
    return k


def _sort_desc(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable descending order and the sorted weights.

    Ties keep input order, so every machine agrees (numpy's default sort dispatches to
    SIMD kernels that order ties differently). When weight and position fit one int64
    the keys are unique and the fast unstable sort is used on them (5x faster than a
    stable argsort); otherwise the stable argsort.
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
    return (int(hi[j]) << _SPLIT) + int(lo[j])


def _total(w: np.ndarray) -> int:
    return (int((w >> _SPLIT).sum()) << _SPLIT) + int((w & _LOW_MASK).sum())


def _solve(ws: np.ndarray, k: int, init: np.ndarray, lower_bound: int) -> np.ndarray:
    """LDM; if it misses the lower bound, greedy LPT when strictly better (LDM loses on
    ~0.5% of small instances), then exchanges that lower the heaviest group."""
    groups = _ldm(ws, k, init)
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
        raise ValueError("loads must hold at least one group")
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
        raise ValueError(f"groups must be 1-D with one entry per weight ({w.shape[0]})")
    if g.size and (g.dtype.kind not in "iu" or int(g.min()) < 0 or int(g.max()) >= k):
        raise ValueError(f"groups must be integers in [0, {k})")
    g = g.astype(np.int32)
    hi, lo = _split_sums(w, g, k, np.zeros(0, np.int64))
    if hi.size and int(hi.max()) >= 1 << (63 - _SPLIT):
        raise OverflowError("a group load exceeds the int64 range")
    return (hi << _SPLIT) + lo


def assign_threads(group_weights: Any, threads: int) -> np.ndarray:
    """Thread id per key group. Round-robin would let one heavy group stall a barrier;
    the same packing as for keys balances the bytes each thread reads per slice."""
    return pack(group_weights, _as_count(threads, "threads"))
