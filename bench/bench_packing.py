"""Key-group packing benchmark: time and quality of hash mod k, greedy LPT, textbook LDM
and keyfill's `pack` on the same inputs, in one run.

    python -m bench.bench_packing            # full grid (n up to 5M, k up to 4096)
    python -m bench.bench_packing --quick    # small grid, about a minute

Quality is the excess of the heaviest group over the lower bound
LB = max(ceil(total / k), largest weight): excess = max / LB - 1, "0" means exactly LB.
Times are the best of --repeat runs (textbook LDM: one run), after numba is warmed up.
The textbook LDM runs only for n <= --ldm-max-n (default 1M; at 5M it would need minutes)
and is stopped after --ldm-budget seconds (default 60).
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections.abc import Callable

import numpy as np

from keygroups import packing
from keygroups.packing import group_loads, pack

DISTRIBUTIONS = ("zipf0.8", "zipf1.1", "lognormal1", "lognormal2", "hot90")


def weights(dist: str, n: int, seed: int = 7) -> np.ndarray:
    """Bytes per key. Keys come in arbitrary order (shuffled), as from a statistics pass."""
    rng = np.random.default_rng([seed, DISTRIBUTIONS.index(dist), n])
    if dist.startswith("zipf"):
        s = float(dist[4:])
        i = np.arange(1, n + 1, dtype=np.float64)
        w = np.floor(1e6 / i**s).astype(np.int64) + rng.integers(0, 16, n)  # small noise
    elif dist.startswith("lognormal"):
        sigma = float(dist[9:])
        w = np.rint(1000.0 * rng.lognormal(0.0, sigma, n)).astype(np.int64) + 1
    elif dist == "hot90":  # one key holds 90% of the bytes; n = 10 is "10 keys, one 90%"
        w = np.rint(1000.0 * rng.lognormal(0.0, 1.0, n)).astype(np.int64) + 1
        w[0] = 9 * int(w[1:].sum())
    else:
        raise ValueError(dist)
    rng.shuffle(w)
    return w


# ----------------------------------------------------------------------------- baselines


def hash_mod_k(w: np.ndarray, k: int) -> np.ndarray:
    """What a hash partitioner does: splitmix64 of the key id, mod k."""
    x = np.arange(w.shape[0], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(k)).astype(np.int32)


def greedy_lpt(w: np.ndarray, k: int) -> np.ndarray:
    """Greedy LPT: sort descending, each key to the least loaded group (numba heap)."""
    order = np.argsort(-w, kind="stable")
    out = np.empty(w.shape[0], np.int32)
    out[order] = packing._greedy(w[order], k, np.zeros(0, np.int64))
    return out


class Timeout(Exception):
    pass


def textbook_ldm(w: np.ndarray, k: int, deadline: float = float("inf")) -> int:
    """Plain k-way LDM: every key a k-tuple in one max-heap by spread; merge the top two
    (largest with smallest), re-sort, repeat. Returns only the maximum group load
    (tracking membership would make it slower still)."""
    if k == 1:
        return int(w.sum())
    heap: list[tuple[int, int, int, np.ndarray | None, int]] = [
        (-int(x), 0, p, None, int(x)) for p, x in enumerate(w.tolist())
    ]
    heapq.heapify(heap)
    zeros = np.zeros(k, np.int64)
    seq = 0
    while len(heap) > 1:
        if seq & 1023 == 0 and time.perf_counter() > deadline:
            raise Timeout
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        ta = a[3] if a[3] is not None else _single(zeros, a[4])
        tb = b[3] if b[3] is not None else _single(zeros, b[4])
        c = np.sort(ta[::-1] + tb)  # tuples kept ascending: a descending + b ascending
        seq += 1
        heapq.heappush(heap, (-int(c[-1] - c[0]), -1, -seq, c, 0))
    last = heap[0]
    return int(last[3][-1]) if last[3] is not None else last[4]


def _single(zeros: np.ndarray, x: int) -> np.ndarray:
    t = zeros.copy()
    t[-1] = x
    return t


# ----------------------------------------------------------------------------- measuring


def best_time(fn: Callable[[], np.ndarray], repeat: int) -> tuple[float, np.ndarray]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def excess(maximum: int, lb: int) -> str:
    if maximum == lb:
        return "0"
    return f"{maximum / lb - 1:.1e}"


def run(ns: list[int], ks: list[int], dists: list[str], repeat: int, budget: float, ldm_max_n: int) -> list[dict]:
    t = time.perf_counter()
    pack([3, 2, 2, 1], 2)  # numba: compile, or load the on-disk cache
    print(f"# numba warm-up (compile or cache load): {time.perf_counter() - t:.2f} s")
    header = (
        f"{'dist':<11}{'n':>8}{'k':>6} | {'hash s':>7} {'excess':>8} | {'LPT s':>7} {'excess':>8}"
        f" | {'LDM s':>7} {'excess':>8} | {'pack s':>7} {'excess':>8} | notes"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for dist in dists:
        for n in ns:
            w = weights(dist, n)
            total, top = int(w.sum()), int(w.max())
            for k in ks:
                lb = max(-(-total // k), top)
                th, gh = best_time(lambda w=w, k=k: hash_mod_k(w, k), repeat)
                tl, gl = best_time(lambda w=w, k=k: greedy_lpt(w, k), repeat)
                tp, gp = best_time(lambda w=w, k=k: pack(w, k), repeat)
                mh = int(group_loads(w, gh, k).max())
                ml = int(group_loads(w, gl, k).max())
                mp = int(group_loads(w, gp, k).max())
                if n > ldm_max_n and k > 1:
                    ldm_cell = f"{'skip':>7} {'':>8}"
                    ldm_note = ""
                    tt = mt = None
                else:
                    t0 = time.perf_counter()
                    try:
                        mt = textbook_ldm(w, k, deadline=t0 + budget)
                        tt = time.perf_counter() - t0
                        ldm_cell = f"{tt:>7.3f} {excess(mt, lb):>8}"
                        ldm_note = ""
                    except Timeout:
                        tt = mt = None
                        ldm_cell = f"{'>' + str(int(budget)):>7} {'':>8}"
                        ldm_note = "LDM timeout"
                notes = [x for x in (ldm_note,) if x]
                if mp > ml:
                    notes.append("WORSE THAN LPT")
                if mt is not None and mp > mt:
                    notes.append("worse than textbook LDM")
                if n >= 10_000 and mp > lb * (1 + 1e-4):
                    notes.append("> LB(1+1e-4)")
                if (k >= n or top * k > total) and mp != lb:
                    notes.append("not exact LB")
                print(
                    f"{dist:<11}{n:>8}{k:>6} | {th:>7.3f} {excess(mh, lb):>8} | {tl:>7.3f}"
                    f" {excess(ml, lb):>8} | {ldm_cell} | {tp:>7.3f} {excess(mp, lb):>8} | " + "; ".join(notes),
                    flush=True,
                )
                rows.append(dict(dist=dist, n=n, k=k, lb=lb, pack_s=tp, pack_max=mp, lpt_max=ml))
    return rows


def check_targets(rows: list[dict]) -> None:
    print("\n# targets")
    for n, k, secs in ((1_000_000, 1024, 0.5), (5_000_000, 4096, 2.0)):
        cells = [r for r in rows if r["n"] == n and r["k"] == k]
        if not cells:
            continue
        slow = max(r["pack_s"] for r in cells)
        worst = max(r["pack_max"] / r["lb"] - 1 for r in cells)
        ok = slow <= secs and worst <= 1e-5
        print(
            f"n={n} k={k}: slowest pack {slow:.3f} s (target {secs} s), worst excess"
            f" {worst:.1e} (target 1e-5): {'met' if ok else 'MISSED'}"
        )
    big = [r for r in rows if r["n"] >= 10_000]
    if big:
        worst = max(r["pack_max"] / r["lb"] - 1 for r in big)
        lpt = sum(r["pack_max"] > r["lpt_max"] for r in big)
        print(f"n>=10k: worst excess {worst:.1e} (target 1e-4); cells worse than LPT: {lpt}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small grid")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing, best kept")
    ap.add_argument("--ldm-budget", type=float, default=60.0, help="seconds for textbook LDM")
    ap.add_argument("--ldm-max-n", type=int, default=1_000_000, help="textbook LDM size rule")
    ap.add_argument("--dist", action="append", choices=DISTRIBUTIONS, help="only these")
    args = ap.parse_args(argv)
    if args.quick:
        ns, ks = [10, 10_000, 1_000_000], [1, 16, 1024]
        budget, ldm_max_n = min(args.ldm_budget, 10.0), min(args.ldm_max_n, 100_000)
    else:
        ns = [10, 1_000, 10_000, 100_000, 1_000_000, 5_000_000]
        ks = [1, 16, 256, 1024, 4096]
        budget, ldm_max_n = args.ldm_budget, args.ldm_max_n
    print(f"# excess = max group / LB - 1, LB = max(ceil(total/k), largest); best of {args.repeat}")
    print(f"# textbook LDM: n <= {ldm_max_n} ('skip' above), stopped after {budget:.0f} s")
    rows = run(ns, ks, list(args.dist or DISTRIBUTIONS), args.repeat, budget, ldm_max_n)
    check_targets(rows)


if __name__ == "__main__":
    main()
