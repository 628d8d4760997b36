"""Shuffle partitioner speed: `reader.flink_keyby.partition_batches` against a per-record
Python loop doing the same Flink routing, measured in one run on the same batches.

    python -m bench.bench_partitioner [--records 1000000] [--batch-rows 65536] [--consumers 4 16 64]

Records come from keyfill's generator (Zipf-distributed `user-%08d` keys, 1% null keys,
JSON payment values, headers), read back as the archive's Arrow batches. Rates are the best
of --repeat runs over all batches (the loops: one run), numba warmed up first. Columns:

- route: `consumer_indexes` only (hash + key group + operator index per row);
- split: `partition_batches` (route, counting sort, one `take`, slices);
- loop: per record in Python: decode the key, String.hashCode, murmurHash, operator
  index, append the row id to its consumer's list; then one `take` per consumer;
- memo loop: the same, with a dict cache key -> consumer (what a careful loop would do).

Ratios divide records/s: route/loop is the hashing alone, split/loop and split/memo the
whole job. Most of split's time is Arrow's `take` of the variable-width columns (the
headers list<struct> column alone is about half).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial

import pyarrow as pa

_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _murmur(code: int) -> int:
    """Flink's MathUtils.murmurHash on Python ints (unsigned 32-bit in, non-negative out)."""
    h = _rotl((code * 0xCC9E2D51) & _MASK, 15)
    h = _rotl((h * 0x1B873593) & _MASK, 13)
    h = ((h * 5 + 0xE6546B64) & _MASK) ^ 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h if h < 0x80000000 else (0 if h == 0x80000000 else (1 << 32) - h)


def _string_hash(key: bytes) -> int:
    """String.hashCode of the UTF-8 key (unsigned). Invalid UTF-8 decoded as Python does,
    which is the JDK's result for these (valid ASCII) benchmark keys."""
    h = 0
    for ch in key.decode("utf-8", "replace"):
        c = ord(ch)
        if c > 0xFFFF:
            c -= 0x10000
            h = (h * 31 + 0xD800 + (c >> 10)) & _MASK
            c = 0xDC00 + (c & 0x3FF)
        h = (h * 31 + c) & _MASK
    return h


def loop_partition(batch: pa.RecordBatch, d: int, max_p: int, memo: dict | None) -> list[pa.RecordBatch]:
    rows: list[list[int]] = [[] for _ in range(d)]
    keys = batch.column("key").to_pylist()
    parts = batch.column("partition").to_pylist()
    for i, key in enumerate(keys):
        if memo is not None and key is not None and key in memo:
            rows[memo[key]].append(i)
            continue
        code = parts[i] & _MASK if key is None else _string_hash(key)
        c = (_murmur(code) % max_p) * d // max_p
        if memo is not None and key is not None:
            memo[key] = c
        rows[c].append(i)
    return [batch.take(pa.array(r, pa.int64())) for r in rows]


def best_rate(fn, batches: list[pa.RecordBatch], repeat: int) -> float:
    n = sum(b.num_rows for b in batches)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for b in batches:
            fn(b)
        best = min(best, time.perf_counter() - t)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=65_536, help="rows per record batch")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct users")
    ap.add_argument("--consumers", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--max-parallelism", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from compactor.sources.envelope import build_index, read_chunk
    from keyfill.synth.generate import GeneratorConfig, generate
    from keygroups.storage import open_storage
    from reader.flink_keyby import consumer_indexes, partition_batches

    with tempfile.TemporaryDirectory() as tmp:
        generate(
            GeneratorConfig(
                out=tmp, records=args.records, partitions=4, keys=args.keys, chunk_records=args.batch_rows, headers=True
            ),
            progress=False,
        )
        store = open_storage(tmp)
        batches = [read_chunk(store, c) for c in build_index(store).all_chunks()]
    n = sum(b.num_rows for b in batches)
    nulls = sum(b.column("key").null_count for b in batches)
    print(
        f"{n:,} records in {len(batches)} batches (~{args.batch_rows:,} rows), {args.keys:,} users, "
        f"{nulls / n:.1%} null keys, max_parallelism {args.max_parallelism}, "
        f"{os.cpu_count()} CPUs, one thread"
    )
    partition_batches(batches[0], 2, args.max_parallelism)  # warm numba (load or compile)

    header = (
        f"{'D':>4} {'route rec/s':>13} {'split rec/s':>13} {'loop rec/s':>12} {'memo rec/s':>12} "
        f"{'route/loop':>11} {'split/loop':>11} {'split/memo':>11}"
    )
    print(header)
    print("-" * len(header))
    for d in args.consumers:
        mp = args.max_parallelism
        for b in batches[:2]:  # the loop must produce exactly what the partitioner does
            want = [o.column("offset").to_pylist() for o in partition_batches(b, d, mp)]
            got = [o.column("offset").to_pylist() for o in loop_partition(b, d, mp, None)]
            assert want == got, f"loop and partitioner disagree at D={d}"
        route = best_rate(partial(consumer_indexes, consumers=d, max_parallelism=mp), batches, args.repeat)
        split = best_rate(partial(partition_batches, consumers=d, max_parallelism=mp), batches, args.repeat)
        loop = best_rate(partial(loop_partition, d=d, max_p=mp, memo=None), batches, 1)
        memo_rate = best_rate(partial(loop_partition, d=d, max_p=mp, memo={}), batches, 1)
        print(
            f"{d:>4} {route:>13,.0f} {split:>13,.0f} {loop:>12,.0f} {memo_rate:>12,.0f} "
            f"{route / loop:>10.0f}x {split / loop:>10.0f}x {split / memo_rate:>10.0f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
