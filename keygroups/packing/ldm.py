"""The compiled core of the packer: k-way largest differencing (LDM) and greedy LPT.

See keygroups/packing/__init__.py for why it is hand-written and docs/packing.md for the
algorithm. Inputs are validated by the Python API, so these loops trust them. Over 400
lines on purpose: one algorithm whose compiled kernels (the differencing heap, the merge of
partitions, the LPT fallback) call each other and share one heap layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keygroups._numba import njit

#: Largest accepted weight. Tuples are kept normalised (minimum slot near zero), so every
#: value the packer stores stays below 2**62 + 2**61 and a sum of two stays below 2**63.
MAX_WEIGHT = (1 << 62) - 1

# A tuple whose smallest slot reaches this is shifted down (amortised O(1) per item).
_RENORM = 1 << 61


@njit(cache=True, nogil=True)
def _better(a: int, b: int, loads: Any, tmax: Any, seq: Any) -> bool:
    """Global heap order: larger spread first; on equal spread the newer tuple first."""
    sa: int = tmax[a] - loads[a, 0]
    sb: int = tmax[b] - loads[b, 0]
    if sa != sb:
        return sa > sb
    newer: bool = seq[a] > seq[b]
    return newer


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
def _ascending(vals: Any, lo: int, width: int, key: Any, idx: Any, key2: Any, idx2: Any, count: Any) -> Any:
    """Stable ascending order of `vals` (all within [lo, lo + width]).

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
    while shift < 63 and (width >> shift) > 0:
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
