"""Compaction speed against a plain sequential fastavro read of the same archive, measured
in the same run, plus group balance.

    python -m bench.bench_compact                    # generates ~2 GB (uncompressed Avro) once, then measures
    python -m bench.bench_compact --records 2000000  # smaller, quicker

The archive is cached under --dir between runs (generation is not what is measured here).
Baseline: one process reading every chunk with fastavro's record reader, in offset order,
doing nothing with the records — what any partition-ordered replay pays at least.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=13_000_000, help="records in the generated archive")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--slice-duration", default="10m")
    ap.add_argument("--codec", default="null", help="codec of the generated source archive")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-compact")
    args = ap.parse_args()

    import fastavro

    from bench.archives import cached_source
    from compactor.job import CompactConfig, compact
    from compactor.spark_session import local_spark
    from keyfill.synth.generate import GeneratorConfig
    from keygroups.storage import open_storage

    src = cached_source(
        GeneratorConfig(
            out=os.path.join(args.dir, f"source-{args.records}-{args.keys}-{args.partitions}-{args.codec}"),
            records=args.records,
            keys=args.keys,
            partitions=args.partitions,
            chunk_records=250_000,
            headers=True,
            codec=args.codec,
            rate=2_000.0,
        ),
        progress=True,
    )
    store = open_storage(src)
    chunks = [o for o in store.list() if o.key.endswith(".avro")]
    size = sum(o.size for o in chunks)

    # Baseline: sequential fastavro read.
    t = time.perf_counter()
    n = 0
    for o in chunks:
        with open(os.path.join(src, o.key), "rb") as f:
            for _ in fastavro.reader(f):
                n += 1
    base_s = time.perf_counter() - t

    dest = os.path.join(args.dir, "compacted")
    spark = local_spark(args.master, app="keyfill bench", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        t = time.perf_counter()
        r = compact(
            CompactConfig(
                source=src, dest=dest, groups=args.groups, slice_duration=args.slice_duration, overwrite=True
            ),
            spark,
        )
        comp_s = time.perf_counter() - t
    finally:
        spark.stop()

    print(
        f"\narchive: {n:,} records, {size / 1e9:.2f} GB in {len(chunks)} chunks ({args.codec}), "
        f"{args.partitions} partitions, {args.keys:,} keys; Spark {args.master}"
    )
    print(f"{'':<34} {'seconds':>8} {'records/s':>11} {'MB/s':>7}")
    print(f"{'sequential fastavro read':<34} {base_s:>8.1f} {n / base_s:>11,.0f} {size / 1e6 / base_s:>7.1f}")
    print(f"{'keyfill compact':<34} {comp_s:>8.1f} {r.records / comp_s:>11,.0f} {size / 1e6 / comp_s:>7.1f}")
    print(f"compaction / sequential read: {comp_s / base_s:.2f}x the time (target <= 3x)")
    print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items()))
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"driver Python peak RSS {rss:,.0f} MB with {r.keys:,} keys (the JVM driver is separate)")
    print(
        f"groups: {r.groups}, max/mean group bytes {r.max_group_bytes / r.mean_group_bytes:.3f} "
        f"(max {r.max_group_bytes:,}, largest key sets the floor); {r.files} files, {r.slices} slices"
    )


if __name__ == "__main__":
    main()
