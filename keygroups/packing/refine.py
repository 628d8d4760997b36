"""Refining a packing: single-key exchanges that lower the heaviest group, and exact group
sums that cannot overflow. Compiled; inputs are validated by the Python API."""

from __future__ import annotations

from typing import Any

import numpy as np

from keygroups._numba import njit

# Group loads are summed as (high, low) halves split at this bit, so no sum overflows.
SPLIT = 31
LOW_MASK = (1 << SPLIT) - 1


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
        hi[j] += init[j] >> SPLIT
        lo[j] += init[j] & LOW_MASK
    for p in range(ws.shape[0]):
        g = groups[p]
        hi[g] += ws[p] >> SPLIT
        lo[g] += ws[p] & LOW_MASK
    for j in range(k):
        hi[j] += lo[j] >> SPLIT
        lo[j] &= LOW_MASK
    return hi, lo
