"""What hashing the long tail into buckets costs the balance (docs/packing.md, "Heavy keys
and buckets"): the largest group of the bucketed assignment against the exact packing of
every key, in the same run, over skewed key-size distributions.

    python -m bench.bench_buckets            # 1M keys, 16 / 64 / 1,024 groups: ~1 minute
    python -m bench.bench_buckets --keys 5000000

Baseline: `pack` over one item per key (what keyfill does below the bucket limit). Both are
measured against LB = max(total / groups, largest key). Also printed: the items packed
(what the driver and every task hold) and the largest bucket as a share of a mean group.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from keygroups import group_loads, pack
from keygroups.assignment import bucket_count, heavy_threshold

WIDTHS = (13, 6, 10, 10, 9, 15, 7)


def sizes(kind: str, n: int, rng) -> np.ndarray:
    if kind == "zipf 1.1":
        return np.maximum(1, (1e9 / np.arange(1, n + 1) ** 1.1).astype(np.int64)) + rng.integers(0, 200, n)
    if kind == "lognormal 2":
        return rng.lognormal(6, 2, n).astype(np.int64) + 1
    return rng.integers(100, 300, n)  # uniform: a payments topic keyed by card


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--groups", default="16,64,1024")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"{args.keys:,} keys; max group / LB - 1, exact packing and with buckets")
    head = ["distribution", "groups", "exact", "buckets", "items", "largest bucket", "pack s"]
    print("  " + " ".join(f"{h:<13}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(head, WIDTHS))))
    for kind in ("zipf 1.1", "lognormal 2", "uniform"):
        w = sizes(kind, args.keys, rng)
        hashes = rng.integers(0, 2**63, args.keys, dtype=np.int64).astype(np.uint64)  # a key's hash: uniform
        total = int(w.sum())
        for g in [int(x) for x in args.groups.split(",")]:
            lb = max(-(-total // g), int(w.max()))
            exact = int(group_loads(w, pack(w, g), g).max())
            b = bucket_count(g)
            heavy = w > heavy_threshold(total, g)
            light_bucket = (hashes[~heavy] & np.uint64(b - 1)).astype(np.int64)
            per_bucket = np.bincount(light_bucket, weights=w[~heavy], minlength=b).astype(np.int64)
            items = np.concatenate([w[heavy], per_bucket])
            t = time.perf_counter()
            bucketed = int(group_loads(items, pack(items, g), g).max())
            seconds = time.perf_counter() - t
            print(
                f"  {kind:<13} {g:>6} {exact / lb - 1:>10.2e} {bucketed / lb - 1:>10.2e} {len(items):>9,} "
                f"{per_bucket.max() * g / total:>14.2%} {seconds:>7.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
