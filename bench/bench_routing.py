"""Routing cost against the number of distinct keys: the key -> group lookup of the rewrite
and verify passes, per 100K-record batch, at 10K, 1M and (with --large) 10M and 20M keys.

    python -m bench.bench_routing
    python -m bench.bench_routing --large

Baseline, measured in the same run: the lookup keyfill used before (`pc.index_in` against
every key of the assignment, which builds a hash table of all keys for every batch). Both
sides route the same batches (keys drawn from the assignment with a Zipf-like skew) and
must agree. Prints per-batch milliseconds, each side's ratio to its own 10K-key time, and
the lookup's resident size.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups.assignment import ASSIGNMENT_SCHEMA, KeyAssignment

BATCH = 100_000


def assignment_table(n: int, rng) -> pa.Table:
    keys = pa.array([f"user-{i:010d}".encode() for i in range(n)], pa.binary())
    return pa.Table.from_arrays(
        [
            keys,
            pa.nulls(n, pa.int32()),
            pa.array(rng.integers(0, 1024, n).astype(np.int32)),
            pa.array(np.ones(n, np.int64)),
            pa.array(np.ones(n, np.int64)),
            pa.nulls(n, pa.int32()),
            pa.nulls(n, pa.int64()),
        ],
        schema=ASSIGNMENT_SCHEMA,
    )


def old_group_of(keys_all: pa.Array, groups_all: np.ndarray, keys: pa.Array) -> np.ndarray:
    idx = pc.index_in(keys, value_set=keys_all).to_numpy(zero_copy_only=False).astype(np.float64)
    out = np.full(len(keys), -1, np.int32)
    ok = ~np.isnan(idx)
    out[ok] = groups_all[idx[ok].astype(np.int64)]
    return out


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", action="store_true", help="also 10M and 20M keys (several GB of memory)")
    args = ap.parse_args()
    sizes = [10_000, 1_000_000] + ([10_000_000, 20_000_000] if args.large else [])
    rng = np.random.default_rng(1)
    base_new = base_old = None
    print(
        f"{'keys':>12} {'old ms/batch':>13} {'x10K':>6} {'new ms/batch':>13} {'x10K':>6} {'build s':>8}"
        f" {'lookup MB':>10}"
    )
    for n in sizes:
        t = assignment_table(n, rng)
        pick = np.minimum((rng.pareto(1.2, BATCH) * n / 50).astype(np.int64), n - 1)
        batch = t.column("key").combine_chunks().take(pa.array(pick))
        parts = np.zeros(BATCH, np.int32)
        built = time.perf_counter()
        lookup = KeyAssignment.from_table(t)
        built = time.perf_counter() - built
        size = (lookup.keys.nbytes + lookup.hashes.nbytes + lookup.groups.nbytes) / 1e6
        keys_all, groups_all = t.column("key").combine_chunks(), t.column("group").to_numpy()
        assert np.array_equal(lookup.group_of(batch, parts), old_group_of(keys_all, groups_all, batch))
        new = timed(lambda: lookup.group_of(batch, parts), 5)  # noqa: B023 - called before the loop moves on
        old = timed(lambda: old_group_of(keys_all, groups_all, batch), 3 if n <= 1_000_000 else 1)  # noqa: B023
        base_new, base_old = base_new or new, base_old or old
        print(
            f"{n:>12,} {old * 1e3:>13.1f} {old / base_old:>6.2f} {new * 1e3:>13.1f} {new / base_new:>6.2f} "
            f"{built:>8.1f} {size:>10.0f}"
        )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:,.0f} MB")


if __name__ == "__main__":
    main()
